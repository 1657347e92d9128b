// Deferred initialisation (NOTE [Deferred initialisation] in core/param_init.h) under
// FullyShard: a model built under core::DeferredInitScope holds no parameter memory; its
// wrap allocates only each rank's shards and fills them from the layers' recipes, giving,
// bit for bit and at N = 1, 2, 3, 4 under every strategy, the parameters (and the training)
// of a full construction; using it before the wrap is FailedPrecondition naming the
// parameter; and a model whose full parameters exceed a per-rank cap by 25% trains under
// that cap at N = 8, where a full construction fails naming the cap.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "comm/testing/thread_ranks.h"
#include "core/allocator.h"
#include "core/format_bytes.h"
#include "core/param_init.h"
#include "core/status_macros.h"
#include "data/sampler.h"
#include "fsdp/fully_shard.h"
#include "fsdp/testing/gpt_training.h"
#include "gtest/gtest.h"
#include "nn/to_device.h"
#include "optim/adamw.h"

namespace fsdp {
namespace {

absl::StatusOr<std::shared_ptr<nn::Gpt>> MakeDeferredGpt(const testing::GptTrainingSetup& setup) {
  core::DeferredInitScope deferred;
  return testing::MakeGpt(setup);
}

TEST(DeferredInitTest, ADeferredModelHoldsNoParameterMemoryAndRefusesToRun) {
  testing::GptTrainingSetup setup = testing::TinySetup();
  auto allocator = std::make_shared<core::Allocator>(core::Device::Cpu());
  core::ScopedAllocator scope(allocator);
  absl::StatusOr<std::shared_ptr<nn::Gpt>> gpt = MakeDeferredGpt(setup);
  ASSERT_TRUE(gpt.ok()) << gpt.status();
  EXPECT_EQ(allocator->Stats().current(core::MemoryTag::kParam), 0);
  for (const auto& [name, p] : (*gpt)->NamedParameters()) {
    EXPECT_TRUE(p->deferred()) << name;
    EXPECT_NE(p->init, nullptr) << name;
  }
  EXPECT_GT((*gpt)->NumParameterElements(), 0);  // the shapes are there
  absl::StatusOr<data::MarkovLanguage> language = testing::MakeLanguage(setup);
  ASSERT_TRUE(language.ok());
  absl::StatusOr<data::TokenBatch> batch = language->Batch(0, 2, setup.seq_len);
  ASSERT_TRUE(batch.ok());
  absl::StatusOr<core::Tensor> out = (*gpt)->Forward(batch->inputs);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(out.status().message(),
                                "wte (Embedding): parameter 'weight' Tensor(float32, [16, 16], "
                                "meta cpu) is deferred and not materialized yet"))
      << out.status();
}

// nn::ToDevice moves a deferred model without allocating: its parameters stay deferred,
// to be materialized on the target device (even in a build without CUDA, nothing is
// allocated there).
TEST(DeferredInitTest, ToDeviceKeepsADeferredModelDeferredOnTheTarget) {
  absl::StatusOr<std::shared_ptr<nn::Gpt>> gpt = MakeDeferredGpt(testing::TinySetup());
  ASSERT_TRUE(gpt.ok()) << gpt.status();
  ASSERT_TRUE(nn::ToDevice(**gpt, core::Device::Cuda(0)).ok());
  for (const auto& [name, p] : (*gpt)->NamedParameters()) {
    EXPECT_TRUE(p->deferred()) << name;
    EXPECT_EQ(p->data.device(), core::Device::Cuda(0)) << name;
  }
}

using Case = testing::StrategyCase;

class DeferredParityTest : public ::testing::TestWithParam<Case> {};

// The wrap's shards hold exactly the full construction's values (read back through
// Release), and 8 steps of training from them are the full construction's, to the bit.
TEST_P(DeferredParityTest, ShardsAndTrainingAreBitwiseThoseOfAFullConstruction) {
  const Case c = GetParam();
  testing::GptTrainingSetup setup = testing::TinySetup();
  setup.steps = 8;
  const FullyShardOptions options = testing::PerBlockOptions(c.strategy, c.hybrid_shard_size);
  absl::Status s = comm::testing::RunThreadRanks(
      c.world_size, [&](comm::testing::RankContext& ctx) -> absl::Status {
        // Parameters right after the wrap.
        ASSIGN_OR_RETURN(std::shared_ptr<nn::Gpt> full, testing::MakeGpt(setup));
        const auto want = testing::ParameterValues(*full);
        ASSIGN_OR_RETURN(std::shared_ptr<nn::Gpt> deferred, MakeDeferredGpt(setup));
        const int64_t before = ctx.allocator->Stats().current(core::MemoryTag::kParam);
        ctx.allocator->ResetPeaks();
        WrapperRegistry registry;
        ASSIGN_OR_RETURN(auto handle, FullyShard(deferred, ctx.group, options, &registry));
        // The wrap's peak is the rank's shards: no unit is ever whole.
        int64_t shards = 0;
        for (const auto& unit : handle->units()) shards += 4 * unit->flat().shard_numel();
        const int64_t wrap_peak = ctx.allocator->Stats().peak(core::MemoryTag::kParam) - before;
        if (wrap_peak > shards) {
          return absl::InternalError(absl::StrCat("the deferred wrap's parameter peak ", wrap_peak,
                                                  " B is above the rank's shards, ", shards, " B"));
        }
        if (registry.counters().param_bytes_copied != 0) {
          return absl::InternalError(absl::StrCat("a deferred wrap copied ",
                                                  registry.counters().param_bytes_copied,
                                                  " parameter bytes; it should fill shards only"));
        }
        RETURN_IF_ERROR(Release(*deferred, &registry));
        testing::TrainingRun got_params, want_params;
        got_params.params = testing::ParameterValues(*deferred);
        want_params.params = want;
        RETURN_IF_ERROR(testing::CompareRuns(want_params, got_params, 0, 0));

        // Training.
        ASSIGN_OR_RETURN(testing::TrainingRun want_run,
                         testing::TrainFullyShardedRank(ctx, setup, options));
        ASSIGN_OR_RETURN(std::shared_ptr<nn::Gpt> fresh, MakeDeferredGpt(setup));
        WrapperRegistry train_registry;
        ASSIGN_OR_RETURN(
            testing::TrainingRun got_run,
            testing::TrainFullyShardedModel(ctx, setup, options, fresh, &train_registry));
        return testing::CompareRuns(want_run, got_run, 0, 0);
      });
  EXPECT_TRUE(s.ok()) << s;
}

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  return testing::StrategyCaseName(info.param);
}

INSTANTIATE_TEST_SUITE_P(AllStrategies, DeferredParityTest,
                         ::testing::Values(Case{ShardingStrategy::kFullShard, 1, 0},
                                           Case{ShardingStrategy::kFullShard, 2, 0},
                                           Case{ShardingStrategy::kFullShard, 3, 0},
                                           Case{ShardingStrategy::kFullShard, 4, 0},
                                           Case{ShardingStrategy::kShardGradOp, 3, 0},
                                           Case{ShardingStrategy::kNoShard, 2, 0},
                                           Case{ShardingStrategy::kHybridShard, 4, 2}),
                         CaseName);

// sync_module_states: ranks that built different models (a seed per rank) all start from
// rank 0's; with deferred parameters the option is refused on every rank.
TEST(SyncModuleStatesTest, EveryRankStartsFromRankZerosValues) {
  absl::Status s =
      comm::testing::RunThreadRanks(3, [&](comm::testing::RankContext& ctx) -> absl::Status {
        testing::GptTrainingSetup setup = testing::TinySetup();
        ASSIGN_OR_RETURN(std::shared_ptr<nn::Gpt> rank0, testing::MakeGpt(setup));
        const auto want = testing::ParameterValues(*rank0);
        testing::GptTrainingSetup mine = setup;
        mine.gpt.seed = setup.gpt.seed + static_cast<uint64_t>(ctx.rank);  // rank 0: setup's
        ASSIGN_OR_RETURN(std::shared_ptr<nn::Gpt> gpt, testing::MakeGpt(mine));
        FullyShardOptions options = testing::PerBlockOptions(ShardingStrategy::kFullShard);
        options.sync_module_states = true;
        WrapperRegistry registry;
        ASSIGN_OR_RETURN(auto handle, FullyShard(gpt, ctx.group, options, &registry));
        RETURN_IF_ERROR(Release(*gpt, &registry));
        testing::TrainingRun got_params, want_params;
        got_params.params = testing::ParameterValues(*gpt);
        want_params.params = want;
        RETURN_IF_ERROR(testing::CompareRuns(want_params, got_params, 0, 0));

        // Deferred parameters: refused, on every rank alike.
        ASSIGN_OR_RETURN(std::shared_ptr<nn::Gpt> deferred, MakeDeferredGpt(setup));
        absl::StatusOr<std::shared_ptr<FullyShardHandle>> refused =
            FullyShard(deferred, ctx.group, options, &registry);
        if (refused.status().code() != absl::StatusCode::kInvalidArgument ||
            !absl::StrContains(refused.status().message(),
                               "FullyShardOptions.sync_module_states with deferred parameter "
                               "'wte.weight'")) {
          return absl::InternalError(absl::StrCat("sync_module_states over a deferred model gave ",
                                                  refused.status().ToString()));
        }
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
}

// A GPT whose full fp32 parameters (4 Psi bytes) exceed a per-rank cap of 3.2 Psi by 25%:
// a full construction fails naming the cap; a deferred one, with activation checkpointing
// of every block, wraps and trains at N = 8, its peak below the cap.
TEST(DeferredInitTest, AModelLargerThanTheCapTrainsUnderItAtEightRanks) {
  testing::GptTrainingSetup setup = testing::TinySetup();
  setup.gpt.vocab_size = 64;
  setup.gpt.n_embd = 64;
  // Many units, so that what FULL_SHARD holds gathered (about four units' full buffers:
  // computing, prefetched, its gradient, the reduction in flight) stays well inside the
  // 1.2 Psi the cap leaves above the 2 Psi of state: with 48 blocks a unit is 2% of Psi.
  setup.gpt.n_layer = 48;
  setup.gpt.n_head = 4;
  setup.global_batch = 8;
  setup.steps = 3;
  int64_t psi = 0;
  {
    absl::StatusOr<std::shared_ptr<nn::Gpt>> probe = MakeDeferredGpt(setup);
    ASSERT_TRUE(probe.ok()) << probe.status();
    psi = (*probe)->NumParameterElements();
  }
  const int64_t cap = 4 * psi * 8 / 10;  // 3.2 Psi bytes
  const int world = 8;
  std::vector<int64_t> peaks(world, 0), param_peaks(world, 0);
  absl::Status s =
      comm::testing::RunThreadRanks(world, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ctx.allocator->SetLimit(cap);
        absl::StatusOr<std::shared_ptr<nn::Gpt>> full = testing::MakeGpt(setup);
        if (full.status().code() != absl::StatusCode::kResourceExhausted ||
            !absl::StrContains(full.status().message(),
                               absl::StrCat("limit ", core::FormatBytes(cap)))) {
          return absl::InternalError(absl::StrCat(
              "a full construction over the cap should be ResourceExhausted naming the limit ",
              core::FormatBytes(cap), "; got ", full.status().ToString()));
        }
        ASSIGN_OR_RETURN(std::shared_ptr<nn::Gpt> gpt, MakeDeferredGpt(setup));
        ctx.allocator->ResetPeaks();
        WrapperRegistry registry;
        // With every block's activations recomputed (48 blocks x 16 C floats per token would
        // otherwise take as much as the rest).
        FullyShardOptions options = testing::PerBlockOptions(ShardingStrategy::kFullShard);
        options.checkpoint_policy = policy::ModuleTypes({"TransformerBlock"});
        ASSIGN_OR_RETURN(auto handle, FullyShard(gpt, ctx.group, options, &registry));
        ASSIGN_OR_RETURN(std::unique_ptr<optim::AdamW> adamw,
                         optim::AdamW::Create(gpt->NamedParameters(), setup.adamw));
        ASSIGN_OR_RETURN(data::MarkovLanguage language, testing::MakeLanguage(setup));
        ASSIGN_OR_RETURN(data::RankSampler sampler, data::RankSampler::Create(ctx.rank, world));
        double first = 0, last = 0;
        for (int step = 0; step < setup.steps; ++step) {
          ASSIGN_OR_RETURN(data::TokenBatch global,
                           language.Batch(step, setup.global_batch, setup.seq_len));
          ASSIGN_OR_RETURN(data::TokenBatch local, sampler.Local(global));
          adamw->ZeroGrad();
          absl::StatusOr<double> step_loss = testing::ForwardBackward(*gpt, local);
          if (!step_loss.ok()) {
            const core::MemoryStats m = ctx.allocator->Stats();
            return absl::Status(step_loss.status().code(),
                                absl::StrCat(step_loss.status().message(), " [step ", step,
                                             "; in use: param ", m.current(core::MemoryTag::kParam),
                                             " grad ", m.current(core::MemoryTag::kGrad), " optim ",
                                             m.current(core::MemoryTag::kOptim), " activation ",
                                             m.current(core::MemoryTag::kActivation), " comm ",
                                             m.current(core::MemoryTag::kComm), " other ",
                                             m.current(core::MemoryTag::kOther), "]"));
          }
          const double loss = *step_loss;
          RETURN_IF_ERROR(adamw->Step());
          if (step == 0) first = loss;
          last = loss;
        }
        if (!(last < first)) {
          return absl::InternalError(absl::StrCat("rank ", ctx.rank, ": loss ", first, " -> ", last,
                                                  ": it does not train"));
        }
        peaks[ctx.rank] = ctx.allocator->Stats().peak_total;
        param_peaks[ctx.rank] = ctx.allocator->Stats().peak(core::MemoryTag::kParam);
        return absl::OkStatus();
      });
  ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < world; ++r) {
    std::printf(
        "rank %d: Psi %lld elements; full fp32 parameters 4 Psi = %lld B > cap 3.2 Psi = %lld B; "
        "per rank 16 Psi / 8 = 2 Psi = %lld B of parameter, gradient and AdamW state, plus the "
        "gathered units in flight and the activations; measured peak %lld B (parameters %lld B), "
        "so %lld B in flight beyond the state\n",
        r, static_cast<long long>(psi), static_cast<long long>(4 * psi),
        static_cast<long long>(cap), static_cast<long long>(2 * psi),
        static_cast<long long>(peaks[r]), static_cast<long long>(param_peaks[r]),
        static_cast<long long>(peaks[r] - 2 * psi));
    EXPECT_LE(peaks[r], cap) << "rank " << r;
  }
}

}  // namespace
}  // namespace fsdp
