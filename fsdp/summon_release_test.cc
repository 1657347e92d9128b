// SummonFullParams (values, writeback on and off, rank 0 only, hooks refused while open,
// mixed precision gives the exact master) and Release (trained weights in independent
// storage, no group needed afterwards, errors).
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "comm/testing/thread_ranks.h"
#include "core/status_macros.h"
#include "fsdp/fully_shard.h"
#include "fsdp/registry.h"
#include "fsdp/summon.h"
#include "fsdp/testing/gpt_training.h"
#include "gtest/gtest.h"
#include "nn/nn.h"

namespace fsdp {
namespace {

using testing::ParameterValues;

TEST(SummonFullParamsTest, FullValuesWhileOpenShardsAfterAndHooksRefused) {
  const testing::GptTrainingSetup setup = testing::TinySetup();
  absl::Status s =
      comm::testing::RunThreadRanks(2, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(setup));
        const auto initial = ParameterValues(*gpt);
        WrapperRegistry registry;
        ASSIGN_OR_RETURN(
            auto handle,
            FullyShard(gpt, ctx.group, testing::PerBlockOptions(ShardingStrategy::kFullShard),
                       &registry));
        {
          ASSIGN_OR_RETURN(auto scope, SummonFullParams(*gpt, &registry, {/*writeback=*/false}));
          EXPECT_TRUE(scope->holds_full());
          EXPECT_EQ(ParameterValues(*gpt), initial);  // full shapes, exact values
          ASSIGN_OR_RETURN(data::MarkovLanguage language, testing::MakeLanguage(setup));
          ASSIGN_OR_RETURN(data::TokenBatch batch, language.Batch(0, 2, setup.seq_len));
          absl::Status fwd = gpt->Forward(batch.inputs).status();
          EXPECT_EQ(fwd.code(), absl::StatusCode::kFailedPrecondition);
          EXPECT_TRUE(absl::StrContains(fwd.message(),
                                        "<root> (Gpt): forward inside "
                                        "SummonFullParams"))
              << fwd;
          absl::StatusOr<std::unique_ptr<FullParamsScope>> nested =
              SummonFullParams(*gpt, &registry);
          EXPECT_EQ(nested.status().code(), absl::StatusCode::kFailedPrecondition);
          RETURN_IF_ERROR(scope->Close());
          EXPECT_FALSE(scope->open());
        }
        for (const auto& [name, p] : gpt->NamedParameters()) EXPECT_EQ(p->data.dim(), 1) << name;
        for (const auto& u : handle->units()) EXPECT_EQ(u->state(), UnitState::kSharded);
        // Forward works again after the scope closed.
        ASSIGN_OR_RETURN(data::MarkovLanguage language, testing::MakeLanguage(setup));
        ASSIGN_OR_RETURN(data::TokenBatch batch, language.Batch(0, 2, setup.seq_len));
        return gpt->Forward(batch.inputs).status();
      });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(SummonFullParamsTest, WritebackKeepsEditsAndNoWritebackDiscardsThem) {
  const testing::GptTrainingSetup setup = testing::TinySetup();
  absl::Status s =
      comm::testing::RunThreadRanks(3, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(setup));
        WrapperRegistry registry;
        ASSIGN_OR_RETURN(
            auto handle,
            FullyShard(gpt, ctx.group, testing::PerBlockOptions(ShardingStrategy::kFullShard),
                       &registry));
        const core::ParameterPtr wpe = gpt->wpe()->weight();
        {
          ASSIGN_OR_RETURN(auto scope, SummonFullParams(*gpt, &registry, {/*writeback=*/false}));
          wpe->data.Fill(7.0f);
        }
        {
          ASSIGN_OR_RETURN(auto scope, SummonFullParams(*gpt, &registry, {/*writeback=*/false}));
          for (float v : wpe->data.ToVector()) EXPECT_NE(v, 7.0f);
          wpe->data.Fill(0.25f);            // the same edit on every rank
          RETURN_IF_ERROR(scope->Close());  // writeback false: discarded
        }
        {
          ASSIGN_OR_RETURN(auto scope, SummonFullParams(*gpt, &registry, {/*writeback=*/true}));
          for (float v : wpe->data.ToVector()) EXPECT_NE(v, 0.25f);
          wpe->data.Fill(0.25f);
          RETURN_IF_ERROR(scope->Close());  // written back into every rank's shard
        }
        for (float v : wpe->data.ToVector()) EXPECT_EQ(v, 0.25f);  // the local slice
        ASSIGN_OR_RETURN(auto scope, SummonFullParams(*gpt, &registry, {/*writeback=*/false}));
        EXPECT_EQ(wpe->data.shape(), (core::Shape{setup.gpt.block_size, setup.gpt.n_embd}));
        for (float v : wpe->data.ToVector()) EXPECT_EQ(v, 0.25f);
        return scope->Close();
      });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(SummonFullParamsTest, Rank0OnlyAndItsIncompatibilityWithWriteback) {
  const testing::GptTrainingSetup setup = testing::TinySetup();
  absl::Status s =
      comm::testing::RunThreadRanks(2, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(setup));
        const auto initial = ParameterValues(*gpt);
        WrapperRegistry registry;
        ASSIGN_OR_RETURN(
            auto handle,
            FullyShard(gpt, ctx.group, testing::PerBlockOptions(ShardingStrategy::kFullShard),
                       &registry));
        SummonOptions bad;
        bad.rank0_only = true;
        absl::Status st = SummonFullParams(*gpt, &registry, bad).status();
        EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
        EXPECT_TRUE(absl::StrContains(st.message(), "SummonOptions.writeback")) << st;
        SummonOptions rank0;
        rank0.rank0_only = true;
        rank0.writeback = false;
        ASSIGN_OR_RETURN(auto scope, SummonFullParams(*gpt, &registry, rank0));
        EXPECT_EQ(scope->holds_full(), ctx.rank == 0);
        if (ctx.rank == 0) {
          EXPECT_EQ(ParameterValues(*gpt), initial);
        } else {
          for (const auto& [name, p] : gpt->NamedParameters()) EXPECT_EQ(p->data.dim(), 1) << name;
        }
        return scope->Close();
      });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(SummonFullParamsTest, MixedPrecisionAndShardGradOpGiveTheExactMaster) {
  const testing::GptTrainingSetup setup = testing::TinySetup();
  absl::Status s =
      comm::testing::RunThreadRanks(2, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(setup));
        const auto initial = ParameterValues(*gpt);
        WrapperRegistry registry;
        FullyShardOptions options = testing::PerBlockOptions(ShardingStrategy::kShardGradOp);
        options.mixed_precision.param_dtype = core::DType::kBFloat16;
        ASSIGN_OR_RETURN(auto handle, FullyShard(gpt, ctx.group, options, &registry));
        ASSIGN_OR_RETURN(data::MarkovLanguage language, testing::MakeLanguage(setup));
        ASSIGN_OR_RETURN(data::TokenBatch batch, language.Batch(0, 2, setup.seq_len));
        RETURN_IF_ERROR(gpt->Forward(batch.inputs).status());  // SHARD_GRAD_OP: stays unsharded
        EXPECT_EQ(handle->root_unit()->state(), UnitState::kUnsharded);
        ASSIGN_OR_RETURN(auto scope, SummonFullParams(*gpt, &registry, {/*writeback=*/false}));
        EXPECT_EQ(ParameterValues(*gpt), initial);  // not the bf16-rounded compute copy
        RETURN_IF_ERROR(scope->Close());
        EXPECT_EQ(handle->root_unit()->state(), UnitState::kSharded);
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
}

struct Released {
  std::shared_ptr<nn::Gpt> gpt;
  std::vector<std::pair<std::string, std::vector<float>>> summoned;
  std::vector<float> logits;
};

TEST(ReleaseTest, TrainedWeightsInIndependentStorageAndNoGroupNeeded) {
  const testing::GptTrainingSetup setup = testing::TinySetup();
  std::vector<Released> out(2);
  absl::Status s =
      comm::testing::RunThreadRanks(2, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(setup));
        const std::vector<core::ParameterPtr> before = gpt->Parameters();
        WrapperRegistry registry;
        ASSIGN_OR_RETURN(
            auto handle,
            FullyShard(gpt, ctx.group, testing::PerBlockOptions(ShardingStrategy::kFullShard),
                       &registry));
        ASSIGN_OR_RETURN(auto adamw, optim::AdamW::Create(gpt->NamedParameters(), setup.adamw));
        ASSIGN_OR_RETURN(data::MarkovLanguage language, testing::MakeLanguage(setup));
        for (int step = 0; step < 3; ++step) {
          ASSIGN_OR_RETURN(data::TokenBatch batch, language.Batch(step, 4, setup.seq_len));
          adamw->ZeroGrad();
          RETURN_IF_ERROR(testing::ForwardBackward(*gpt, batch).status());
          RETURN_IF_ERROR(adamw->Step());
        }
        {
          ASSIGN_OR_RETURN(auto scope, SummonFullParams(*gpt, &registry, {/*writeback=*/false}));
          out[ctx.rank].summoned = ParameterValues(*gpt);
        }
        ASSIGN_OR_RETURN(data::TokenBatch batch, language.Batch(9, 2, setup.seq_len));
        ASSIGN_OR_RETURN(core::Tensor logits, gpt->Forward(batch.inputs));
        out[ctx.rank].logits = logits.ToVector();

        // Errors first: a module inside a unit, and a module with no unit.
        absl::Status inside = Release(*gpt->ln_f(), &registry);
        EXPECT_EQ(inside.code(), absl::StatusCode::kFailedPrecondition);
        EXPECT_TRUE(absl::StrContains(inside.message(), "inside unit <root> (Gpt)")) << inside;
        auto stray = std::make_shared<nn::Linear>(2, 2);
        EXPECT_EQ(Release(*stray, &registry).code(), absl::StatusCode::kNotFound);

        RETURN_IF_ERROR(Release(*gpt, &registry));
        EXPECT_TRUE(handle->released());
        EXPECT_EQ(registry.NumUnits(), 0);
        EXPECT_EQ(registry.counters().units_released, 3);
        EXPECT_EQ(gpt->Parameters(), before);  // the same Parameter objects
        EXPECT_EQ(ParameterValues(*gpt), out[ctx.rank].summoned);
        // Independent storage: no two parameters share a block, and no grads remain.
        const std::vector<core::ParameterPtr> params = gpt->Parameters();
        for (size_t i = 0; i < params.size(); ++i) {
          EXPECT_FALSE(params[i]->grad.defined());
          for (size_t j = i + 1; j < params.size(); ++j) {
            EXPECT_FALSE(params[i]->data.SharesStorage(params[j]->data)) << i << " " << j;
          }
        }
        EXPECT_EQ(Release(*gpt, &registry).code(), absl::StatusCode::kNotFound);
        out[ctx.rank].gpt = gpt;
        return absl::OkStatus();
      });
  ASSERT_TRUE(s.ok()) << s;
  // Every group is destroyed now; the plain modules still run, identically.
  absl::StatusOr<data::MarkovLanguage> language = testing::MakeLanguage(setup);
  ASSERT_TRUE(language.ok());
  data::TokenBatch batch = language->Batch(9, 2, setup.seq_len).value();
  for (int r = 0; r < 2; ++r) {
    absl::StatusOr<core::Tensor> logits = out[r].gpt->Forward(batch.inputs);
    ASSERT_TRUE(logits.ok()) << logits.status();
    EXPECT_EQ(logits->ToVector(), out[r].logits) << "rank " << r;
  }
  EXPECT_EQ(out[0].summoned, out[1].summoned);
}

// NOTE [Agree before acting]: with a scope still open on rank 1 only, a second
// SummonFullParams and a Release fail there; every rank returns rank 1's error within
// seconds (no rank gathers or releases), and both work once the scope is closed.
TEST(SummonReleaseAgreementTest, ACheckFailingOnOneRankFailsEveryRankNamingIt) {
  constexpr int kWorld = 2;
  std::vector<absl::Status> summon_errors(kWorld), release_errors(kWorld);
  const absl::Time start = absl::Now();
  absl::Status s =
      comm::testing::RunThreadRanks(kWorld, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(testing::TinySetup()));
        const auto initial = ParameterValues(*gpt);
        WrapperRegistry registry;
        ASSIGN_OR_RETURN(
            auto handle,
            FullyShard(gpt, ctx.group, testing::PerBlockOptions(ShardingStrategy::kFullShard),
                       &registry));
        ASSIGN_OR_RETURN(auto scope, SummonFullParams(*gpt, &registry, {/*writeback=*/false}));
        if (ctx.rank == 0) RETURN_IF_ERROR(scope->Close());
        summon_errors[ctx.rank] = SummonFullParams(*gpt, &registry, {/*writeback=*/false}).status();
        release_errors[ctx.rank] = Release(*gpt, &registry);
        EXPECT_EQ(registry.NumUnits(), 3) << "rank " << ctx.rank << " released";
        RETURN_IF_ERROR(scope->Close());
        // In step again: both operations work on every rank.
        {
          ASSIGN_OR_RETURN(auto again, SummonFullParams(*gpt, &registry, {/*writeback=*/false}));
          EXPECT_EQ(ParameterValues(*gpt), initial);
        }
        RETURN_IF_ERROR(Release(*gpt, &registry));
        EXPECT_EQ(ParameterValues(*gpt), initial);
        return absl::OkStatus();
      });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));  // the collectives' timeout is 30 s
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(summon_errors[r].code(), absl::StatusCode::kFailedPrecondition) << summon_errors[r];
    EXPECT_TRUE(absl::StrContains(summon_errors[r].message(),
                                  "rank 1: SummonFullParams(<root> (Gpt)): unit "))
        << "rank " << r << ": " << summon_errors[r];
    EXPECT_TRUE(absl::StrContains(summon_errors[r].message(), "already inside SummonFullParams"))
        << summon_errors[r];
    EXPECT_EQ(release_errors[r].code(), absl::StatusCode::kFailedPrecondition) << release_errors[r];
    EXPECT_TRUE(
        absl::StrContains(release_errors[r].message(), "rank 1: Release(<root> (Gpt)): unit "))
        << "rank " << r << ": " << release_errors[r];
    EXPECT_TRUE(absl::StrContains(release_errors[r].message(), "is inside SummonFullParams"))
        << release_errors[r];
  }
}

}  // namespace
}  // namespace fsdp
