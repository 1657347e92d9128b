// The unit state machine on its own (no hooks): every transition, its preconditions and
// their messages, and the failed state.
#include "fsdp/unit.h"

#include <memory>

#include "absl/strings/match.h"
#include "comm/testing/thread_ranks.h"
#include "core/bf16_hd.h"
#include "core/op_profile.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"
#include "nn/linear.h"

namespace fsdp {
namespace {

absl::StatusOr<std::shared_ptr<Unit>> MakeUnit(comm::testing::RankContext& ctx,
                                               const std::shared_ptr<nn::Linear>& fc,
                                               FullyShardOptions options = {}) {
  ASSIGN_OR_RETURN(
      auto flat, flatten::FlatParameter::Flatten(fc->NamedParameters(), ctx.world_size, ctx.rank));
  UnitGroups groups;
  groups.world = ctx.group;
  groups.shard = ctx.world_size > 1 ? ctx.group : nullptr;
  groups.shard_size = ctx.world_size;
  groups.shard_rank = ctx.rank;
  options.timeout = absl::Seconds(20);
  return Unit::Create(fc, std::move(flat), groups, options);
}

// With a one-rank shard group there is no all-gather: the shard goes into the full
// buffer in one op, a cast to param_dtype (or a copy in fp32), with no buffer between.
TEST(UnitTest, AOneRankUnitCastsItsShardIntoTheFullBufferInOneOp) {
  absl::Status s =
      comm::testing::RunThreadRanks(1, [](comm::testing::RankContext& ctx) -> absl::Status {
        auto fc = std::make_shared<nn::Linear>(5, 7, true, 3);
        const std::vector<float> w = fc->weight()->data.ToVector();
        FullyShardOptions options;
        options.mixed_precision.param_dtype = core::DType::kBFloat16;
        ASSIGN_OR_RETURN(std::shared_ptr<Unit> unit, MakeUnit(ctx, fc, options));
        for (const bool full_precision : {false, true}) {
          SCOPED_TRACE(full_precision ? "fp32" : "bf16");
          core::OpProfile profile;
          {
            core::ScopedOpProfile on(&profile);
            RETURN_IF_ERROR(unit->IssueUnshard(full_precision));
            RETURN_IF_ERROR(unit->FinishUnshard());
          }
          EXPECT_EQ(profile.records().size(), 1u);
          if (profile.records().size() != 1) return absl::InternalError("expected one op");
          EXPECT_EQ(profile.records()[0].name, full_precision ? "copy" : "convert");
          EXPECT_EQ(profile.records()[0].cost.bytes,
                    (full_precision ? 8.0 : 6.0) * unit->flat().full().numel());
          const core::DType want = full_precision ? core::DType::kFloat32 : core::DType::kBFloat16;
          EXPECT_EQ(fc->weight()->data.dtype(), want);
          std::vector<float> rounded = w;
          if (!full_precision) {
            for (float& v : rounded) v = core::Bf16BitsToFloat(core::FloatToBf16Bits(v));
          }
          ASSIGN_OR_RETURN(core::Tensor wide, fc->weight()->data.ToDType(core::DType::kFloat32,
                                                                         core::MemoryTag::kOther));
          EXPECT_EQ(wide.ToVector(), rounded);
          RETURN_IF_ERROR(unit->Reshard());
        }
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(UnitTest, TransitionsMoveViewsBetweenShardAndFull) {
  absl::Status s =
      comm::testing::RunThreadRanks(2, [](comm::testing::RankContext& ctx) -> absl::Status {
        auto fc = std::make_shared<nn::Linear>(3, 4, true, 9);
        const std::vector<float> w = fc->weight()->data.ToVector();
        ASSIGN_OR_RETURN(std::shared_ptr<Unit> unit, MakeUnit(ctx, fc));
        EXPECT_EQ(unit->label(), "<root> (Linear)");
        EXPECT_EQ(unit->state(), UnitState::kSharded);
        EXPECT_EQ(fc->weight()->data.dim(), 1);
        EXPECT_FALSE(unit->flat().full().defined());

        // Preconditions: nothing to finish, nothing to reshard.
        absl::Status bad = unit->FinishUnshard();
        EXPECT_EQ(bad.code(), absl::StatusCode::kFailedPrecondition);
        EXPECT_TRUE(
            absl::StrContains(bad.message(),
                              "<root> (Linear): finish unsharding needs state unsharding but "
                              "the unit is sharded"))
            << bad;
        bad = unit->Reshard();
        EXPECT_TRUE(absl::StrContains(bad.message(), "reshard needs state unsharded")) << bad;
        EXPECT_TRUE(absl::StrContains(unit->PrepareGradients().message(),
                                      "prepare gradients needs state unsharded"));

        RETURN_IF_ERROR(unit->IssueUnshard(false));
        EXPECT_EQ(unit->state(), UnitState::kUnsharding);
        EXPECT_TRUE(absl::StrContains(unit->IssueUnshard(false).message(),
                                      "unshard needs state sharded but the unit is unsharding"));
        RETURN_IF_ERROR(unit->FinishUnshard());
        EXPECT_EQ(unit->state(), UnitState::kUnsharded);
        EXPECT_TRUE(unit->full_is_exact());
        EXPECT_EQ(fc->weight()->data.shape(), (core::Shape{4, 3}));
        EXPECT_EQ(fc->weight()->data.ToVector(), w);  // the all-gather restored every rank's part

        EXPECT_TRUE(
            absl::StrContains(unit->ReduceGradients().message(), "without a full gradient buffer"));
        RETURN_IF_ERROR(unit->PrepareGradients());
        EXPECT_EQ(fc->weight()->grad.shape(), (core::Shape{4, 3}));
        fc->weight()->grad.Fill(static_cast<float>(ctx.rank + 1));  // average: 1.5
        RETURN_IF_ERROR(unit->ReduceGradients());
        EXPECT_TRUE(unit->reduction_pending());
        EXPECT_EQ(fc->weight()->grad.dim(), 1);
        RETURN_IF_ERROR(unit->FinishReduction());
        for (float g : fc->weight()->grad.ToVector()) EXPECT_EQ(g, 1.5f);
        RETURN_IF_ERROR(unit->Reshard());
        EXPECT_EQ(unit->state(), UnitState::kSharded);
        EXPECT_EQ(fc->weight()->data.dim(), 1);
        EXPECT_FALSE(unit->flat().full().defined());
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
}

// NOTE [Gradient reduction]: a one-rank fp32 unit's layers add straight into the gradient
// shard: no full gradient buffer of its own, nothing zeroed or added per backward, and
// over two backwards the shard holds the plain module's gradients bit for bit. With
// reduce_dtype bf16 the buffer stays (the reduction rounds the gradient).
TEST(UnitTest, AOneRankFp32UnitAddsItsGradientsStraightIntoTheShard) {
  absl::Status s =
      comm::testing::RunThreadRanks(1, [](comm::testing::RankContext& ctx) -> absl::Status {
        const core::Tensor x =
            core::Tensor::FromVector({0.5f, -1, 2, 0.25f, 3, -0.75f}, {2, 3}).value();
        const core::Tensor g =
            core::Tensor::FromVector({1, -2, 0.5f, 3, -0.25f, 1.5f, 2, -1}, {2, 4}).value();
        nn::Linear plain(3, 4, true, 9);
        for (int pass = 0; pass < 2; ++pass) {
          RETURN_IF_ERROR(plain.Forward(x).status());
          RETURN_IF_ERROR(plain.Backward(g).status());
        }
        for (const bool bf16_reduce : {false, true}) {
          SCOPED_TRACE(bf16_reduce ? "reduce in bf16" : "reduce in fp32");
          auto fc = std::make_shared<nn::Linear>(3, 4, true, 9);
          FullyShardOptions options;
          if (bf16_reduce) options.mixed_precision.reduce_dtype = core::DType::kBFloat16;
          ASSIGN_OR_RETURN(std::shared_ptr<Unit> unit, MakeUnit(ctx, fc, options));
          RETURN_IF_ERROR(unit->IssueUnshard(false));
          RETURN_IF_ERROR(unit->FinishUnshard());
          for (int pass = 0; pass < 2; ++pass) {
            core::OpProfile profile;
            {
              core::ScopedOpProfile on(&profile);
              RETURN_IF_ERROR(unit->PrepareGradients());
            }
            EXPECT_EQ(unit->flat().full_grad_is_shard_grad(), !bf16_reduce);
            if (!bf16_reduce) {
              EXPECT_TRUE(unit->flat().full_grad().SharesStorage(unit->flat().shard_grad()));
              // The first backward zeroes the new shard; no backward zeroes a full buffer.
              EXPECT_EQ(profile.records().size(), pass == 0 ? 1u : 0u) << pass;
            }
            RETURN_IF_ERROR(fc->Forward(x).status());
            RETURN_IF_ERROR(fc->Backward(g).status());
            core::OpProfile reduce;
            {
              core::ScopedOpProfile on(&reduce);
              RETURN_IF_ERROR(unit->ReduceGradients());
              RETURN_IF_ERROR(unit->FinishReduction());
            }
            if (!bf16_reduce) {
              EXPECT_EQ(reduce.records().size(), 0u) << pass;  // no convert, no add
            }
            EXPECT_FALSE(unit->flat().full_grad().defined());
            EXPECT_EQ(fc->weight()->grad.dim(), 1);
          }
          if (!bf16_reduce) {
            EXPECT_EQ(fc->weight()->grad.ToVector(), plain.weight()->grad.ToVector());
            EXPECT_EQ(fc->bias()->grad.ToVector(), plain.bias()->grad.ToVector());
          }
          RETURN_IF_ERROR(unit->Reshard());
        }
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
}

// NOTE [Gradient reduction]: a new accumulation restarts the dropped gradients from zero
// with one memset per run of adjacent slices (ZeroGrad(set_to_none) of every parameter:
// one for the shard), and keeps the others.
TEST(UnitTest, RestartingDroppedGradientsZeroesEachRunOfSlicesOnce) {
  absl::Status s =
      comm::testing::RunThreadRanks(2, [](comm::testing::RankContext& ctx) -> absl::Status {
        // 12 weight and 4 bias elements: rank 0 holds weight[0, 8), rank 1 weight[8, 12) and
        // the bias.
        auto fc = std::make_shared<nn::Linear>(3, 4, true, 9);
        ASSIGN_OR_RETURN(std::shared_ptr<Unit> unit, MakeUnit(ctx, fc));
        RETURN_IF_ERROR(unit->IssueUnshard(false));
        RETURN_IF_ERROR(unit->FinishUnshard());
        auto backward = [&]() -> absl::Status {
          RETURN_IF_ERROR(unit->PrepareGradients());
          fc->weight()->grad.Fill(2.0f);
          fc->bias()->grad.Fill(3.0f);
          RETURN_IF_ERROR(unit->ReduceGradients());
          return unit->FinishReduction();
        };
        // The bytes of each memset PrepareGradients records: the shard's runs, then the new
        // full gradient buffer (16 fp32 elements).
        auto zeros_when_preparing = [&]() -> absl::StatusOr<std::vector<double>> {
          core::OpProfile profile;
          {
            core::ScopedOpProfile on(&profile);
            RETURN_IF_ERROR(unit->PrepareGradients());
          }
          std::vector<double> bytes;
          for (const core::OpRecord& r : profile.records()) {
            if (r.name == "zero") bytes.push_back(r.cost.bytes);
          }
          return bytes;
        };
        RETURN_IF_ERROR(backward());
        // Every grad dropped: one memset of the 8-element shard on each rank (rank 1's two
        // slices are adjacent).
        fc->weight()->grad = core::Tensor();
        fc->bias()->grad = core::Tensor();
        ASSIGN_OR_RETURN(std::vector<double> zeros, zeros_when_preparing());
        EXPECT_EQ(zeros, (std::vector<double>{32, 64}));
        for (float v : unit->flat().shard_grad().ToVector()) EXPECT_EQ(v, 0.0f);
        fc->weight()->grad.Fill(2.0f);
        fc->bias()->grad.Fill(3.0f);
        RETURN_IF_ERROR(unit->ReduceGradients());
        RETURN_IF_ERROR(unit->FinishReduction());
        // Only the bias dropped: rank 1 zeroes the bias's slice, rank 0 nothing, and the
        // weight's gradient stays.
        fc->bias()->grad = core::Tensor();
        ASSIGN_OR_RETURN(zeros, zeros_when_preparing());
        EXPECT_EQ(zeros, (ctx.rank == 0 ? std::vector<double>{64} : std::vector<double>{16, 64}));
        const std::vector<float> shard = unit->flat().shard_grad().ToVector();
        const std::vector<float> want = ctx.rank == 0 ? std::vector<float>(8, 2.0f)
                                                      : std::vector<float>{2, 2, 2, 2, 0, 0, 0, 0};
        EXPECT_EQ(shard, want);
        RETURN_IF_ERROR(unit->ReduceGradients());
        RETURN_IF_ERROR(unit->FinishReduction());
        return unit->Reshard();
      });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(UnitTest, ACollectiveErrorMovesTheUnitToFailedForGood) {
  // A one-rank "shard group" that is really a group of two: the all-gather sizes do not
  // fit, the collective refuses, and the unit must report that from then on.
  absl::Status s =
      comm::testing::RunThreadRanks(2, [](comm::testing::RankContext& ctx) -> absl::Status {
        auto fc = std::make_shared<nn::Linear>(3, 4, true, 9);
        ASSIGN_OR_RETURN(auto flat, flatten::FlatParameter::Flatten(fc->NamedParameters(), 1, 0));
        UnitGroups groups;
        groups.world = ctx.group;
        groups.shard = ctx.group;  // inconsistent on purpose: size 2 group, 1-rank layout
        groups.shard_size = 1;
        groups.shard_rank = 0;
        ASSIGN_OR_RETURN(std::shared_ptr<Unit> unit, Unit::Create(fc, std::move(flat), groups, {}));
        absl::Status first = unit->IssueUnshard(false);
        EXPECT_EQ(first.code(), absl::StatusCode::kInvalidArgument) << first;
        EXPECT_EQ(unit->state(), UnitState::kFailed);
        absl::Status later = unit->Reshard();
        EXPECT_EQ(later.code(), absl::StatusCode::kFailedPrecondition);
        EXPECT_TRUE(absl::StrContains(later.message(),
                                      "fsdp unit <root> (Linear): cannot reshard "
                                      "after an earlier error"))
            << later;
        EXPECT_TRUE(absl::StrContains(unit->IssueUnshard(false).message(), "earlier error"));
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(UnitTest, MixedPrecisionUnshardIsRoundedAndCannotWriteBack) {
  absl::Status s =
      comm::testing::RunThreadRanks(2, [](comm::testing::RankContext& ctx) -> absl::Status {
        auto fc = std::make_shared<nn::Linear>(3, 4, true, 9);
        const std::vector<float> w = fc->weight()->data.ToVector();
        FullyShardOptions options;
        options.mixed_precision.param_dtype = core::DType::kBFloat16;
        ASSIGN_OR_RETURN(std::shared_ptr<Unit> unit, MakeUnit(ctx, fc, options));
        RETURN_IF_ERROR(unit->IssueUnshard(false));
        RETURN_IF_ERROR(unit->FinishUnshard());
        EXPECT_FALSE(unit->full_is_exact());
        // The layers see bf16 views of the gathered buffer (NOTE [Mixed precision on the device]).
        EXPECT_EQ(fc->weight()->data.dtype(), core::DType::kBFloat16);
        const std::vector<float> got = fc->weight()->data.ToVector();
        for (size_t i = 0; i < w.size(); ++i) {
          EXPECT_EQ(got[i], core::BFloat16::FromFloat(w[i]).ToFloat()) << i;
        }
        absl::Status wb = unit->WriteBackLocalChunk();
        EXPECT_EQ(wb.code(), absl::StatusCode::kFailedPrecondition);
        EXPECT_TRUE(absl::StrContains(wb.message(), "float32 master")) << wb;
        RETURN_IF_ERROR(unit->Reshard());
        // The exact unshard gives back the unrounded master values.
        RETURN_IF_ERROR(unit->IssueUnshard(true));
        RETURN_IF_ERROR(unit->FinishUnshard());
        EXPECT_EQ(fc->weight()->data.ToVector(), w);
        return unit->Reshard();
      });
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace fsdp
