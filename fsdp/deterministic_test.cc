// NOTE [Deterministic reduction] (fsdp/options.h): with FullyShardOptions::deterministic,
// N ranks that each run their aligned range of a step's M micro-batches (the first ones
// under no_sync()) give, bit for bit, the losses and parameters of one rank running all M,
// for every strategy at N = 1, 2, 4 over 20 AdamW steps. The normal mode at N = 4 differs
// from one rank in its bits (the reason for the mode). Also: the options it refuses.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "comm/testing/thread_ranks.h"
#include "core/status_macros.h"
#include "data/sampler.h"
#include "fsdp/fully_shard.h"
#include "fsdp/grad_utils.h"
#include "fsdp/testing/gpt_training.h"
#include "gtest/gtest.h"
#include "nn/losses.h"
#include "optim/adamw.h"

namespace fsdp {
namespace {

constexpr int kMicroBatches = 4;  // M: rows of a global batch of 16 in micro-batches of 4

testing::GptTrainingSetup Setup() {
  testing::GptTrainingSetup setup = testing::TinySetup();
  setup.global_batch = 16;
  setup.steps = 20;
  return setup;
}

// The bits of a run: each step's loss and every final parameter.
struct Bits {
  std::vector<double> losses;
  std::vector<std::pair<std::string, std::vector<float>>> params;
};

bool SameBits(const Bits& a, const Bits& b, std::string* where) {
  if (a.losses.size() != b.losses.size() || a.params.size() != b.params.size()) {
    *where = "sizes";
    return false;
  }
  for (size_t s = 0; s < a.losses.size(); ++s) {
    if (std::memcmp(&a.losses[s], &b.losses[s], sizeof(double)) != 0) {
      *where = absl::StrCat("loss at step ", s, ": ", a.losses[s], " vs ", b.losses[s]);
      return false;
    }
  }
  for (size_t i = 0; i < a.params.size(); ++i) {
    const auto& x = a.params[i].second;
    const auto& y = b.params[i].second;
    if (x.size() != y.size() || std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) != 0) {
      *where = absl::StrCat("parameter ", a.params[i].first);
      return false;
    }
  }
  return true;
}

// One rank's training: each step its micro-batches [r M / N, (r + 1) M / N) of the global
// batch, every one but the last under no_sync(), each loss's gradient scaled by 1 / M; the
// step's loss is the mean of all M micro-batch losses, gathered and added in micro-batch
// order. Without `options.deterministic` (the normal mode) one backward over the rank's
// rows, averaged by the reduce-scatter, as the parity tests train.
absl::StatusOr<Bits> Train(comm::testing::RankContext& ctx, const testing::GptTrainingSetup& setup,
                           const FullyShardOptions& options) {
  ASSIGN_OR_RETURN(data::MarkovLanguage language, testing::MakeLanguage(setup));
  ASSIGN_OR_RETURN(std::shared_ptr<nn::Gpt> gpt, testing::MakeGpt(setup));
  WrapperRegistry registry;
  ASSIGN_OR_RETURN(auto handle, FullyShard(gpt, ctx.group, options, &registry));
  ASSIGN_OR_RETURN(auto adamw, optim::AdamW::Create(gpt->NamedParameters(), setup.adamw));
  const int mine = kMicroBatches / ctx.world_size;
  Bits bits;
  for (int step = 0; step < setup.steps; ++step) {
    ASSIGN_OR_RETURN(data::TokenBatch global,
                     language.Batch(step, setup.global_batch, setup.seq_len));
    adamw->ZeroGrad();
    std::vector<float> losses;
    if (!options.deterministic) {
      ASSIGN_OR_RETURN(data::RankSampler sampler,
                       data::RankSampler::Create(ctx.rank, ctx.world_size));
      ASSIGN_OR_RETURN(data::TokenBatch local, sampler.Local(global));
      ASSIGN_OR_RETURN(double loss, testing::ForwardBackward(*gpt, local));
      losses.push_back(static_cast<float>(loss));
    }
    for (int j = 0; options.deterministic && j < mine; ++j) {
      // Micro-batch m: rows [m B / M, (m + 1) B / M), as a sampler over M slots cuts them.
      ASSIGN_OR_RETURN(data::RankSampler slot,
                       data::RankSampler::Create(ctx.rank * mine + j, kMicroBatches));
      ASSIGN_OR_RETURN(data::TokenBatch micro, slot.Local(global));
      std::unique_ptr<NoSyncScope> no_sync;
      if (j + 1 < mine) {
        ASSIGN_OR_RETURN(no_sync, NoSync(*gpt, &registry));
      }
      ASSIGN_OR_RETURN(core::Tensor logits, gpt->Forward(micro.inputs));
      ASSIGN_OR_RETURN(nn::LossResult loss, nn::CrossEntropyLoss(logits, micro.targets));
      float* g = loss.grad.data<float>();
      for (int64_t i = 0; i < loss.grad.numel(); ++i) g[i] *= 1.0f / kMicroBatches;  // exact
      RETURN_IF_ERROR(gpt->Backward(loss.grad).status());
      losses.push_back(loss.loss);
    }
    RETURN_IF_ERROR(adamw->Step());
    // Every rank's losses, in rank order: micro-batch order.
    ASSIGN_OR_RETURN(double loss, testing::MicroBatchMeanLoss(ctx, losses));
    bits.losses.push_back(loss);
  }
  RETURN_IF_ERROR(Release(*gpt, &registry));
  bits.params = testing::ParameterValues(*gpt);
  return bits;
}

absl::StatusOr<Bits> TrainOn(int world, const FullyShardOptions& options) {
  std::vector<Bits> out(world);
  RETURN_IF_ERROR(
      comm::testing::RunThreadRanks(world, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(out[ctx.rank], Train(ctx, Setup(), options));
        return absl::OkStatus();
      }));
  for (int r = 1; r < world; ++r) {
    std::string where;
    if (!SameBits(out[0], out[r], &where)) {
      return absl::InternalError(absl::StrCat("rank ", r, " differs from rank 0 at ", where));
    }
  }
  return out[0];
}

FullyShardOptions Deterministic(ShardingStrategy strategy, int hybrid_shard_size = 0) {
  FullyShardOptions options = testing::PerBlockOptions(strategy, hybrid_shard_size);
  options.deterministic = true;
  return options;
}

using Case = testing::StrategyCase;

class DeterministicTest : public ::testing::TestWithParam<Case> {};

TEST_P(DeterministicTest, NRanksGiveTheBitsOfOneRankOverTwentySteps) {
  const Case c = GetParam();
  absl::StatusOr<Bits> one = TrainOn(1, Deterministic(ShardingStrategy::kFullShard));
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_GT(one->losses.front() - one->losses.back(), 0.1) << "the run learns";
  absl::StatusOr<Bits> many = TrainOn(c.world_size, Deterministic(c.strategy, c.hybrid_shard_size));
  ASSERT_TRUE(many.ok()) << many.status();
  std::string where;
  EXPECT_TRUE(SameBits(*one, *many, &where)) << "first difference: " << where;
  std::printf("%s: 20 losses and %zu parameters bit for bit; final loss %.17g\n",
              testing::StrategyCaseName(c).c_str(), many->params.size(), many->losses.back());
}

INSTANTIATE_TEST_SUITE_P(AllStrategies, DeterministicTest,
                         ::testing::Values(Case{ShardingStrategy::kFullShard, 1, 0},
                                           Case{ShardingStrategy::kFullShard, 2, 0},
                                           Case{ShardingStrategy::kFullShard, 4, 0},
                                           Case{ShardingStrategy::kShardGradOp, 2, 0},
                                           Case{ShardingStrategy::kShardGradOp, 4, 0},
                                           Case{ShardingStrategy::kNoShard, 2, 0},
                                           Case{ShardingStrategy::kNoShard, 4, 0},
                                           Case{ShardingStrategy::kHybridShard, 4, 2}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return testing::StrategyCaseName(info.param);
                         });

// Why the mode exists: the normal mode's reductions (and its one backward over a rank's
// rows) give other bits at N = 4 than at N = 1.
TEST(DeterministicModeTest, TheNormalModeDiffersAcrossWorldSizes) {
  const FullyShardOptions normal = testing::PerBlockOptions(ShardingStrategy::kFullShard);
  absl::StatusOr<Bits> one = TrainOn(1, normal);
  absl::StatusOr<Bits> four = TrainOn(4, normal);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE(four.ok()) << four.status();
  std::string where;
  EXPECT_FALSE(SameBits(*one, *four, &where));
  std::printf("normal mode, N = 4 vs 1: first difference at %s\n", where.c_str());
}

TEST(DeterministicModeTest, RefusesWhatItCannotReduceInATree) {
  FullyShardOptions options = Deterministic(ShardingStrategy::kFullShard);
  EXPECT_TRUE(options.Validate(4).ok());
  absl::Status s = options.Validate(3);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "power-of-two group size")) << s;
  options.mixed_precision.reduce_dtype = core::DType::kBFloat16;
  EXPECT_TRUE(absl::StrContains(options.Validate(4).message(), "reduce_dtype")) << s;
  FullyShardOptions plain = testing::PerBlockOptions(ShardingStrategy::kFullShard);
  EXPECT_EQ(FirstDifferingOption(plain, Deterministic(ShardingStrategy::kFullShard)),
            "deterministic: false vs true");
}

}  // namespace
}  // namespace fsdp
