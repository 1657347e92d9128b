// CPU offload (NOTE [CPU offload] in fsdp/options.h). On CPU parameters the option is
// refused; the logic is tested here through fsdp::internal::SetHostOffloadOnCpuForThisThread,
// which runs the code path of a CUDA unit with its host <-> device copies as host copies
// and its shards in the pinned host allocator (ordinary host memory without CUDA, counted
// apart from each rank's allocator). With it: training is bit for bit the training without
// offload at N = 1, 2, 4 under every strategy and under bf16 mixed precision; between
// steps the rank's allocator (the "device") holds no parameter or gradient bytes while the
// pinned allocator holds every rank's shards, gradient shards and staging; gradients of two
// backwards accumulate in the host shard as on the device; a deferred model's shards are
// filled on the host without touching the device. The GPU run is fsdp:device_test's.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "comm/testing/thread_ranks.h"
#include "core/allocator.h"
#include "core/param_init.h"
#include "core/status_macros.h"
#include "data/sampler.h"
#include "fsdp/fully_shard.h"
#include "fsdp/internal/host_offload.h"
#include "fsdp/testing/gpt_training.h"
#include "gtest/gtest.h"

namespace fsdp {
namespace {

// Allows offload on the CPU for the rank thread it lives on.
class ScopedHostOffload {
 public:
  ScopedHostOffload() : previous_(internal::SetHostOffloadOnCpuForThisThread(true)) {}
  ~ScopedHostOffload() { internal::SetHostOffloadOnCpuForThisThread(previous_); }

 private:
  bool previous_;
};

FullyShardOptions Offloaded(FullyShardOptions options) {
  options.cpu_offload = true;
  return options;
}

int64_t PinnedCurrent(core::MemoryTag tag) {
  return core::Allocator::PinnedHost()->Stats().current(tag);
}

TEST(CpuOffloadTest, RefusedForParametersOnTheCpuNamingTheOptionAndTheParameter) {
  absl::Status s =
      comm::testing::RunThreadRanks(2, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(std::shared_ptr<nn::Gpt> gpt, testing::MakeGpt(testing::TinySetup()));
        WrapperRegistry registry;
        absl::StatusOr<std::shared_ptr<FullyShardHandle>> handle = FullyShard(
            gpt, ctx.group, Offloaded(testing::PerBlockOptions(ShardingStrategy::kFullShard)),
            &registry);
        if (handle.status().code() != absl::StatusCode::kInvalidArgument ||
            !absl::StrContains(handle.status().message(),
                               "FullyShardOptions.cpu_offload with parameter 'wte.weight' on the "
                               "cpu")) {
          return absl::InternalError(
              absl::StrCat("expected the refusal, got ", handle.status().ToString()));
        }
        if (registry.FindUnit(*gpt) != nullptr)
          return absl::InternalError("a unit was left behind");
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(CpuOffloadTest, ARewrapWithAnotherOffloadChoiceIsRefusedNamingIt) {
  FullyShardOptions a = testing::PerBlockOptions(ShardingStrategy::kFullShard);
  EXPECT_EQ(FirstDifferingOption(a, Offloaded(a)), "cpu_offload: false vs true");
  EXPECT_EQ(FirstDifferingOption(Offloaded(a), Offloaded(a)), "");
}

struct OffloadCase {
  testing::StrategyCase strategy;
  bool bf16 = false;
};

class CpuOffloadParityTest : public ::testing::TestWithParam<OffloadCase> {};

// 8 steps with offload give the losses and parameters of 8 steps without, to the bit, and
// between steps the rank's allocator holds no parameter or gradient while the pinned
// allocator holds the shards, gradient shards and reduction staging of every rank (NOTE
// [Memory estimate]'s offloaded 16 S + 4 S, less AdamW's 8 S, which an optimizer made
// after the wrap keeps in ordinary host memory).
TEST_P(CpuOffloadParityTest, TrainsBitForBitAsWithoutOffloadWithTheShardsOnTheHost) {
  const OffloadCase c = GetParam();
  testing::GptTrainingSetup setup = testing::TinySetup();
  setup.steps = 8;
  FullyShardOptions options =
      testing::PerBlockOptions(c.strategy.strategy, c.strategy.hybrid_shard_size);
  if (c.bf16) options.mixed_precision.param_dtype = core::DType::kBFloat16;
  const int64_t pinned_params_before = PinnedCurrent(core::MemoryTag::kParam);
  const int64_t pinned_grads_before = PinnedCurrent(core::MemoryTag::kGrad);
  const int64_t pinned_comm_before = PinnedCurrent(core::MemoryTag::kComm);
  absl::Status s = comm::testing::RunThreadRanks(
      c.strategy.world_size, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ScopedHostOffload offload;
        ASSIGN_OR_RETURN(testing::TrainingRun want,
                         testing::TrainFullyShardedRank(ctx, setup, options));

        // One step by hand, to look at the memory at rest.
        ASSIGN_OR_RETURN(std::shared_ptr<nn::Gpt> gpt, testing::MakeGpt(setup));
        WrapperRegistry registry;
        ASSIGN_OR_RETURN(auto handle, FullyShard(gpt, ctx.group, Offloaded(options), &registry));
        ASSIGN_OR_RETURN(data::MarkovLanguage language, testing::MakeLanguage(setup));
        ASSIGN_OR_RETURN(data::RankSampler sampler,
                         data::RankSampler::Create(ctx.rank, ctx.world_size));
        ASSIGN_OR_RETURN(data::TokenBatch global,
                         language.Batch(0, setup.global_batch, setup.seq_len));
        ASSIGN_OR_RETURN(data::TokenBatch local, sampler.Local(global));
        RETURN_IF_ERROR(testing::ForwardBackward(*gpt, local).status());
        int64_t shard_bytes = 0;
        for (const auto& unit : handle->units()) {
          shard_bytes += unit->flat().shard().nbytes();
          if (!unit->flat().shard_on_host() || !unit->flat().shard_grad().defined() ||
              unit->host_gradients_pending()) {
            return absl::InternalError(absl::StrCat(unit->label(),
                                                    ": shard not on the host, no gradient "
                                                    "shard, or an add left pending"));
          }
        }
        for (const core::MemoryTag tag : {core::MemoryTag::kParam, core::MemoryTag::kGrad}) {
          if (const int64_t held = ctx.allocator->Stats().current(tag); held != 0) {
            return absl::InternalError(absl::StrCat("the rank's allocator holds ", held, " B of ",
                                                    core::MemoryTagName(tag), " at rest"));
          }
        }
        ASSIGN_OR_RETURN(auto barrier, ctx.group->Barrier({}));
        RETURN_IF_ERROR(barrier->Wait(absl::Seconds(30)));
        // Every rank's shards are the same size: the pinned allocator holds world_size x.
        const int64_t pinned_params = PinnedCurrent(core::MemoryTag::kParam) - pinned_params_before;
        const int64_t pinned_grads = PinnedCurrent(core::MemoryTag::kGrad) - pinned_grads_before;
        // The reduced chunks' staging: one shard per unit (the estimate's 4 S).
        const int64_t pinned_staging = PinnedCurrent(core::MemoryTag::kComm) - pinned_comm_before;
        if (pinned_params != ctx.world_size * shard_bytes ||
            pinned_grads != ctx.world_size * shard_bytes ||
            pinned_staging != ctx.world_size * shard_bytes) {
          return absl::InternalError(absl::StrCat(
              "pinned host memory holds ", pinned_params, " B of parameters, ", pinned_grads,
              " B of gradients and ", pinned_staging, " B of staging; expected ", ctx.world_size,
              " x ", shard_bytes, " B each"));
        }
        ASSIGN_OR_RETURN(barrier, ctx.group->Barrier({}));
        RETURN_IF_ERROR(barrier->Wait(absl::Seconds(30)));
        RETURN_IF_ERROR(Release(*gpt, &registry));

        ASSIGN_OR_RETURN(testing::TrainingRun got,
                         testing::TrainFullyShardedRank(ctx, setup, Offloaded(options)));
        return testing::CompareRuns(want, got, 0, 0);
      });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(PinnedCurrent(core::MemoryTag::kParam), pinned_params_before);
}

std::string OffloadCaseName(const ::testing::TestParamInfo<OffloadCase>& info) {
  return testing::StrategyCaseName(info.param.strategy) + (info.param.bf16 ? "_BF16" : "");
}

INSTANTIATE_TEST_SUITE_P(AllStrategies, CpuOffloadParityTest,
                         ::testing::Values(OffloadCase{{ShardingStrategy::kFullShard, 1, 0}},
                                           OffloadCase{{ShardingStrategy::kFullShard, 2, 0}},
                                           OffloadCase{{ShardingStrategy::kFullShard, 4, 0}},
                                           OffloadCase{{ShardingStrategy::kFullShard, 2, 0},
                                                       /*bf16=*/true},
                                           OffloadCase{{ShardingStrategy::kShardGradOp, 2, 0}},
                                           OffloadCase{{ShardingStrategy::kNoShard, 2, 0}},
                                           OffloadCase{{ShardingStrategy::kHybridShard, 4, 2}}),
                         OffloadCaseName);

// Two backwards without a step add into the host gradient shard as they add into the
// device one: the gradients after them are bitwise those without offload.
TEST(CpuOffloadTest, GradientsOfTwoBackwardsAccumulateInTheHostShard) {
  testing::GptTrainingSetup setup = testing::TinySetup();
  absl::Status s =
      comm::testing::RunThreadRanks(2, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ScopedHostOffload offload;
        ASSIGN_OR_RETURN(data::MarkovLanguage language, testing::MakeLanguage(setup));
        ASSIGN_OR_RETURN(data::RankSampler sampler,
                         data::RankSampler::Create(ctx.rank, ctx.world_size));
        std::vector<std::vector<float>> grads[2];
        for (int offloaded = 0; offloaded < 2; ++offloaded) {
          FullyShardOptions options = testing::PerBlockOptions(ShardingStrategy::kFullShard);
          options.cpu_offload = offloaded == 1;
          ASSIGN_OR_RETURN(std::shared_ptr<nn::Gpt> gpt, testing::MakeGpt(setup));
          WrapperRegistry registry;
          ASSIGN_OR_RETURN(auto handle, FullyShard(gpt, ctx.group, options, &registry));
          for (int step = 0; step < 2; ++step) {
            ASSIGN_OR_RETURN(data::TokenBatch global,
                             language.Batch(step, setup.global_batch, setup.seq_len));
            ASSIGN_OR_RETURN(data::TokenBatch local, sampler.Local(global));
            RETURN_IF_ERROR(testing::ForwardBackward(*gpt, local).status());
          }
          for (const auto& unit : handle->units()) {
            grads[offloaded].push_back(unit->flat().shard_grad().ToVector());
          }
          RETURN_IF_ERROR(Release(*gpt, &registry));
        }
        if (grads[0] != grads[1]) {
          return absl::InternalError("accumulated gradient shards differ with offload");
        }
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
}

// A deferred model's shards are filled on the host: the rank's allocator never holds a
// parameter byte during the wrap, and training is bitwise the eager model's.
TEST(CpuOffloadTest, ADeferredModelMaterializesItsShardsOnTheHost) {
  testing::GptTrainingSetup setup = testing::TinySetup();
  setup.steps = 4;
  const FullyShardOptions options =
      Offloaded(testing::PerBlockOptions(ShardingStrategy::kFullShard));
  absl::Status s =
      comm::testing::RunThreadRanks(2, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ScopedHostOffload offload;
        ASSIGN_OR_RETURN(testing::TrainingRun want,
                         testing::TrainFullyShardedRank(ctx, setup, options));
        std::shared_ptr<nn::Gpt> gpt;
        {
          core::DeferredInitScope deferred;
          ASSIGN_OR_RETURN(gpt, testing::MakeGpt(setup));
        }
        ctx.allocator->ResetPeaks();
        WrapperRegistry registry;
        ASSIGN_OR_RETURN(auto handle, FullyShard(gpt, ctx.group, options, &registry));
        if (const int64_t peak = ctx.allocator->Stats().peak(core::MemoryTag::kParam); peak != 0) {
          return absl::InternalError(absl::StrCat("the deferred offloaded wrap put ", peak,
                                                  " B of parameters on the device"));
        }
        handle.reset();
        RETURN_IF_ERROR(Release(*gpt, &registry));
        std::shared_ptr<nn::Gpt> fresh;
        {
          core::DeferredInitScope deferred;
          ASSIGN_OR_RETURN(fresh, testing::MakeGpt(setup));
        }
        WrapperRegistry train_registry;
        ASSIGN_OR_RETURN(
            testing::TrainingRun got,
            testing::TrainFullyShardedModel(ctx, setup, options, fresh, &train_registry));
        return testing::CompareRuns(want, got, 0, 0);
      });
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace fsdp
