// Communication and memory per training step, read from comm's byte counters and the
// rank's allocator, against the formulas written out below.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/testing/thread_ranks.h"
#include "core/status_macros.h"
#include "fsdp/fully_shard.h"
#include "fsdp/testing/gpt_training.h"
#include "gtest/gtest.h"
#include "optim/adamw.h"

namespace fsdp {
namespace {

constexpr int64_t kF32 = 4;  // bytes per float32 element

// One training step: forward, backward, AdamW step.
absl::Status Step(nn::Gpt& gpt, optim::AdamW& adamw, const data::MarkovLanguage& language, int step,
                  const testing::GptTrainingSetup& setup, int world_size) {
  ASSIGN_OR_RETURN(data::TokenBatch batch, language.Batch(step, 2 * world_size, setup.seq_len));
  adamw.ZeroGrad();
  RETURN_IF_ERROR(testing::ForwardBackward(gpt, batch).status());
  return adamw.Step();
}

struct CommCase {
  ShardingStrategy strategy;
  int world_size;
};

class CommunicationTest : public ::testing::TestWithParam<CommCase> {};

// NOTE [Byte counters] (comm/process_group.h): with P = the sum over units of
// padded_numel * 4 bytes (padded to the shard group size) and N ranks, one training
// step sends and receives, per rank:
//   FULL_SHARD:    all-gather in forward + all-gather in backward + reduce-scatter
//                  = 3 P (N - 1) / N;
//   SHARD_GRAD_OP: all-gather in forward + reduce-scatter = 2 P (N - 1) / N;
//   NO_SHARD:      one all-reduce of each unit's gradient, 2 S (N - 1) / N for S bytes
//                  (rounded down per call) = 2 P (N - 1) / N.
TEST_P(CommunicationTest, BytesPerStepMatchTheStrategysFormula) {
  const CommCase c = GetParam();
  testing::GptTrainingSetup setup = testing::TinySetup();
  absl::Status s = comm::testing::RunThreadRanks(
      c.world_size, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(setup));
        ASSIGN_OR_RETURN(data::MarkovLanguage language, testing::MakeLanguage(setup));
        WrapperRegistry registry;
        ASSIGN_OR_RETURN(auto handle, FullyShard(gpt, ctx.group,
                                                 testing::PerBlockOptions(c.strategy), &registry));
        ASSIGN_OR_RETURN(auto adamw, optim::AdamW::Create(gpt->NamedParameters(), setup.adamw));
        RETURN_IF_ERROR(Step(*gpt, *adamw, language, 0, setup, c.world_size));  // warm-up
        const int64_t n = c.world_size;
        int64_t padded_bytes = 0;
        int64_t all_reduce_bytes = 0;  // NO_SHARD: per-call rounding
        for (const auto& u : handle->units()) {
          const int64_t bytes = u->flat().padded_numel() * kF32;
          padded_bytes += bytes;
          all_reduce_bytes += 2 * bytes * (n - 1) / n;
        }
        const int num_units = static_cast<int>(handle->units().size());
        for (int step = 1; step <= 2; ++step) {
          ctx.group->ResetStats();
          RETURN_IF_ERROR(Step(*gpt, *adamw, language, step, setup, c.world_size));
          const comm::CommStats stats = ctx.group->Stats();
          int64_t expected = 0;
          int ag_calls = 0, rs_calls = 0, ar_calls = 0;
          switch (c.strategy) {
            case ShardingStrategy::kFullShard:
              EXPECT_EQ(padded_bytes % n, 0);
              expected = 3 * padded_bytes * (n - 1) / n;
              ag_calls = 2 * num_units;
              rs_calls = num_units;
              break;
            case ShardingStrategy::kShardGradOp:
              expected = 2 * padded_bytes * (n - 1) / n;
              ag_calls = num_units;
              rs_calls = num_units;
              break;
            default:  // NO_SHARD
              expected = all_reduce_bytes;
              ar_calls = num_units;
              EXPECT_LE(2 * padded_bytes * (n - 1) / n - expected, num_units);  // rounding only
              break;
          }
          const comm::CollectiveStats total = stats.Total();
          EXPECT_EQ(total.bytes_sent, expected)
              << "rank " << ctx.rank << " step " << step << ": " << stats.ToString();
          EXPECT_EQ(total.bytes_received, expected) << stats.ToString();
          EXPECT_EQ(stats.of(comm::CollectiveKind::kAllGather).calls, ag_calls) << stats.ToString();
          EXPECT_EQ(stats.of(comm::CollectiveKind::kReduceScatter).calls, rs_calls)
              << stats.ToString();
          EXPECT_EQ(stats.of(comm::CollectiveKind::kAllReduce).calls, ar_calls) << stats.ToString();
        }
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(Strategies, CommunicationTest,
                         ::testing::Values(CommCase{ShardingStrategy::kFullShard, 2},
                                           CommCase{ShardingStrategy::kFullShard, 4},
                                           CommCase{ShardingStrategy::kShardGradOp, 2},
                                           CommCase{ShardingStrategy::kShardGradOp, 4},
                                           CommCase{ShardingStrategy::kNoShard, 2},
                                           CommCase{ShardingStrategy::kNoShard, 3}),
                         [](const ::testing::TestParamInfo<CommCase>& info) {
                           std::string name = ShardingStrategyName(info.param.strategy);
                           name.erase(std::remove(name.begin(), name.end(), '_'), name.end());
                           return absl::StrCat(name, "_N", info.param.world_size);
                         });

// HYBRID_SHARD 2 x 2: shard groups carry FULL_SHARD's traffic over 2 ranks; the
// replicate groups all-reduce each rank's gradient shard, P / 2 bytes, over 2 ranks.
TEST(CommunicationTest, HybridShardSplitsTrafficBetweenShardAndReplicateGroups) {
  testing::GptTrainingSetup setup = testing::TinySetup();
  absl::Status s =
      comm::testing::RunThreadRanks(4, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(setup));
        ASSIGN_OR_RETURN(data::MarkovLanguage language, testing::MakeLanguage(setup));
        WrapperRegistry registry;
        ASSIGN_OR_RETURN(
            auto handle,
            FullyShard(gpt, ctx.group, testing::PerBlockOptions(ShardingStrategy::kHybridShard, 2),
                       &registry));
        ASSIGN_OR_RETURN(auto adamw, optim::AdamW::Create(gpt->NamedParameters(), setup.adamw));
        RETURN_IF_ERROR(Step(*gpt, *adamw, language, 0, setup, 4));
        const UnitGroups& groups = handle->root_unit()->groups();
        EXPECT_EQ(groups.shard->size(), 2);
        EXPECT_EQ(groups.replicate->size(), 2);
        int64_t padded_bytes = 0;
        for (const auto& u : handle->units()) padded_bytes += u->flat().padded_numel() * kF32;
        ctx.group->ResetStats();
        groups.shard->ResetStats();
        groups.replicate->ResetStats();
        RETURN_IF_ERROR(Step(*gpt, *adamw, language, 1, setup, 4));
        EXPECT_EQ(ctx.group->Stats().Total().bytes_sent, 0);  // everything goes over subgroups
        EXPECT_EQ(groups.shard->Stats().Total().bytes_sent, 3 * padded_bytes * 1 / 2);
        EXPECT_EQ(groups.replicate->Stats().Total().bytes_sent, 2 * (padded_bytes / 2) * 1 / 2);
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
}

// NOTE [FULL_SHARD memory bound]: per rank, with N ranks, L = limit_all_gathers,
// P_u = unit u's padded_numel, R the root unit (wte, wpe, ln_f) and B a block unit (all
// blocks have the same size), the peak of param + grad + optim bytes is
//   sharded:   sum_u (4 + 4 + 8) P_u / N   (fp32 shard, gradient shard, AdamW's two
//                                           states) = the unsharded total / N
//   transient: 4 P_R (root parameters, unsharded for the whole backward)
//            + 4 P_B (1 + L) (the computing block's parameters and L prefetched blocks')
//            + 4 P_R (root full gradient, accumulated over the whole backward)
//            + 4 P_B * 2     (the computing block's full gradient, and the previous
//                             block's, held until its reduce-scatter completes)
// which occurs in the backward once a block has a predecessor and L successors in
// backward order (hence 4 blocks with L = 2). On one rank the last two terms are absent:
// the backward adds straight into the gradient shards (Unit::PrepareGradients), which the
// sharded term counts. fsdp::testing::FullShardMemoryBound computes it. The AdamW states
// cover only each rank's unpadded slices, fewer than N elements per unit below the
// formula; the 5% margin the issue allows covers that and nothing else (the measured peak
// is checked from both sides).
class MemoryTest : public ::testing::TestWithParam<int> {};

TEST_P(MemoryTest, FullShardPeakMatchesTheBound) {
  const int world = GetParam();
  testing::GptTrainingSetup setup = testing::TinySetup();
  setup.gpt.n_layer = 4;
  absl::Status s =
      comm::testing::RunThreadRanks(world, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(setup));
        ASSIGN_OR_RETURN(data::MarkovLanguage language, testing::MakeLanguage(setup));
        WrapperRegistry registry;
        const FullyShardOptions options = testing::PerBlockOptions(ShardingStrategy::kFullShard);
        ASSIGN_OR_RETURN(auto handle, FullyShard(gpt, ctx.group, options, &registry));
        ASSIGN_OR_RETURN(auto adamw, optim::AdamW::Create(gpt->NamedParameters(), setup.adamw));
        RETURN_IF_ERROR(Step(*gpt, *adamw, language, 0, setup, world));  // optimizer state exists
        ctx.allocator->ResetPeaks();
        for (int step = 1; step <= 2; ++step) {
          RETURN_IF_ERROR(Step(*gpt, *adamw, language, step, setup, world));
        }
        const core::MemoryStats m = ctx.allocator->Stats();
        const int64_t measured = m.peak(core::MemoryTag::kParam) + m.peak(core::MemoryTag::kGrad) +
                                 m.peak(core::MemoryTag::kOptim);

        const std::vector<std::shared_ptr<Unit>> units = handle->units();
        EXPECT_EQ(units.size(), 5u);
        const int64_t p_block = units[0]->flat().padded_numel();
        int64_t numel_total = 0;  // unpadded: every parameter element once
        for (const auto& u : units) {
          numel_total += u->flat().numel();
          if (u != handle->root_unit()) {
            EXPECT_EQ(u->flat().padded_numel(), p_block);
          }
        }
        const testing::MemoryBound b =
            testing::FullShardMemoryBound(*handle, options.limit_all_gathers, world);
        const int64_t bound = b.total();
        EXPECT_LE(measured, bound * 105 / 100) << "rank " << ctx.rank << ": " << m.PeakSummary();
        EXPECT_GE(measured, bound * 95 / 100) << "rank " << ctx.rank << ": " << m.PeakSummary();
        // And, on several ranks, a saving: well below holding everything unsharded.
        const int64_t unsharded = 16 * numel_total;
        if (world > 1) {
          EXPECT_LT(measured, unsharded);
        }
        if (ctx.rank == 0) {
          std::printf(
              "N=%d measured %lld bound %lld (sharded %lld + transient %lld) unsharded %lld\n",
              world, static_cast<long long>(measured), static_cast<long long>(bound),
              static_cast<long long>(b.sharded), static_cast<long long>(b.transient),
              static_cast<long long>(unsharded));
        }
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, MemoryTest, ::testing::Values(1, 2, 4));

}  // namespace
}  // namespace fsdp
