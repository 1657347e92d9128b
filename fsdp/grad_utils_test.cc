// NoSync (gradient accumulation equals one large batch), ClipGradNorm (the global norm
// equals the unsharded norm under every strategy), and frozen parameters inside units.
#include "fsdp/grad_utils.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "comm/testing/thread_ranks.h"
#include "core/status_macros.h"
#include "data/sampler.h"
#include "fsdp/fully_shard.h"
#include "fsdp/testing/gpt_training.h"
#include "glog/logging.h"
#include "gtest/gtest.h"
#include "nn/nn.h"

namespace fsdp {
namespace {

// NOTE [Gradient tolerance]: sharded gradients are averages of per-rank float32
// gradients whose rows were summed in another order than the single process's. A
// gradient element is a sum of many per-token terms of both signs, and float32
// summation error is relative to the terms, not to their (possibly cancelled) sum, so
// the tolerance is relative to the parameter's gradient scale: 1e-5 x (|expected| +
// the largest |element| of that parameter's gradient), plus atol 1e-9 for parameters
// whose gradient is rounding noise around an exact zero (the attention key bias,
// ~1e-13). Measured errors are ~3e-5 of an element in the worst cancellations and
// < 1e-6 of the scale. A wrong reduction (sum instead of average, a missed rank, a
// shifted slice) is off by O(1) of the scale.
constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-9;

using GradMap = std::map<std::string, std::vector<float>>;

GradMap Grads(const core::Module& m) {
  GradMap out;
  for (const auto& [name, p] : m.NamedParameters()) {
    if (p->grad.defined()) out[name] = p->grad.ToVector();
  }
  return out;
}

// Checks that each managed parameter's local grad slice equals `scale` times the
// matching elements of `full` (the unsharded gradients), and that frozen ones have none.
void ExpectLocalSlicesMatch(const FullyShardHandle& handle, int shard_rank, const GradMap& full,
                            double scale = 1.0) {
  int checked = 0;
  for (const auto& unit : handle.units()) {
    const flatten::FlatParameter& flat = unit->flat();
    for (size_t i = 0; i < flat.records().size(); ++i) {
      const flatten::ParamRecord& rec = flat.records()[i];
      const core::Parameter& p = *flat.params()[i];
      if (!rec.requires_grad) {
        EXPECT_FALSE(p.grad.defined()) << rec.name;
        continue;
      }
      const flatten::ShardSlice& slice = rec.shards[shard_rank];
      ASSERT_TRUE(p.grad.defined()) << rec.name;
      const std::vector<float> got = p.grad.ToVector();
      ASSERT_EQ(static_cast<int64_t>(got.size()), slice.numel()) << rec.name;
      const std::vector<float>& want = full.at(rec.name);
      double param_scale = 0;
      for (float w : want) param_scale = std::max(param_scale, std::abs(scale * w));
      for (int64_t k = 0; k < slice.numel(); ++k) {
        const double e = scale * want[slice.begin + k];
        EXPECT_NEAR(got[k], e, kAtol + kRtol * (std::abs(e) + param_scale))
            << rec.name << "[" << slice.begin + k << "]";
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 0);
}

// The unwrapped model's gradients on `batch` (mean loss), after `scale_loss`.
GradMap ReferenceGrads(const testing::GptTrainingSetup& setup, const data::TokenBatch& batch) {
  std::shared_ptr<nn::Gpt> gpt = testing::MakeGpt(setup).value();
  CHECK(testing::ForwardBackward(*gpt, batch).ok());
  return Grads(*gpt);
}

double Norm(const GradMap& g) {
  double s = 0;
  for (const auto& [name, v] : g) {
    for (float x : v) s += static_cast<double>(x) * x;
  }
  return std::sqrt(s);
}

// Forward/backward of `batch` with the loss gradient multiplied by `factor`.
absl::Status ScaledStep(core::Module& model, const data::TokenBatch& batch, float factor) {
  ASSIGN_OR_RETURN(core::Tensor logits, model.Forward(batch.inputs));
  ASSIGN_OR_RETURN(nn::LossResult loss, nn::CrossEntropyLoss(logits, batch.targets));
  float* g = loss.grad.data<float>();
  for (int64_t i = 0; i < loss.grad.numel(); ++i) g[i] *= factor;
  return model.Backward(loss.grad).status();
}

struct StrategyCase {
  ShardingStrategy strategy;
  int world_size;
  int hybrid_shard_size;
};

class NoSyncTest : public ::testing::TestWithParam<StrategyCase> {};

// Two micro-batches of 4 rows, the first inside NoSync, each with its loss halved, give
// the gradient of the mean loss over the 8 rows, as one large batch.
TEST_P(NoSyncTest, AccumulationEqualsOneLargeBatch) {
  const StrategyCase c = GetParam();
  const testing::GptTrainingSetup setup = testing::TinySetup();
  data::MarkovLanguage language = testing::MakeLanguage(setup).value();
  const data::TokenBatch large = language.Batch(4, 8, setup.seq_len).value();
  const GradMap reference = ReferenceGrads(setup, large);
  absl::Status s = comm::testing::RunThreadRanks(
      c.world_size, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(setup));
        WrapperRegistry registry;
        ASSIGN_OR_RETURN(
            auto handle,
            FullyShard(gpt, ctx.group, testing::PerBlockOptions(c.strategy, c.hybrid_shard_size),
                       &registry));
        ASSIGN_OR_RETURN(auto halves, data::RankSampler::Create(0, 2));
        ASSIGN_OR_RETURN(data::TokenBatch first, halves.Local(large));
        ASSIGN_OR_RETURN(halves, data::RankSampler::Create(1, 2));
        ASSIGN_OR_RETURN(data::TokenBatch second, halves.Local(large));
        ASSIGN_OR_RETURN(auto sampler, data::RankSampler::Create(ctx.rank, ctx.world_size));
        {
          ASSIGN_OR_RETURN(auto no_sync, NoSync(*gpt, &registry));
          ctx.group->ResetStats();
          ASSIGN_OR_RETURN(data::TokenBatch local, sampler.Local(first));
          RETURN_IF_ERROR(ScaledStep(*gpt, local, 0.5f));
          const comm::CommStats stats = ctx.group->Stats();
          EXPECT_EQ(stats.of(comm::CollectiveKind::kReduceScatter).calls, 0) << stats.ToString();
          EXPECT_EQ(stats.of(comm::CollectiveKind::kAllReduce).calls, 0) << stats.ToString();
          // Unreduced and full-shape until a backward outside NoSync.
          for (const auto& unit : handle->units()) {
            for (size_t i = 0; i < unit->flat().records().size(); ++i) {
              EXPECT_EQ(unit->flat().params()[i]->grad.shape(), unit->flat().records()[i].shape)
                  << unit->flat().records()[i].name;
            }
          }
          absl::StatusOr<double> clip = ClipGradNorm(*gpt, &registry, 1.0);
          EXPECT_EQ(clip.status().code(), absl::StatusCode::kFailedPrecondition);
          EXPECT_TRUE(absl::StrContains(clip.status().message(), "unreduced gradients"))
              << clip.status();
        }
        ASSIGN_OR_RETURN(data::TokenBatch local, sampler.Local(second));
        RETURN_IF_ERROR(ScaledStep(*gpt, local, 0.5f));
        ExpectLocalSlicesMatch(*handle, handle->root_unit()->groups().shard_rank, reference);
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(Strategies, NoSyncTest,
                         ::testing::Values(StrategyCase{ShardingStrategy::kFullShard, 2, 0},
                                           StrategyCase{ShardingStrategy::kNoShard, 2, 0},
                                           StrategyCase{ShardingStrategy::kHybridShard, 4, 2}));

class ClipGradNormTest : public ::testing::TestWithParam<StrategyCase> {};

// The returned norm is the unsharded gradient's norm (replicas counted once, padding
// none), and the clipped slices are the reference gradients times max_norm / norm.
TEST_P(ClipGradNormTest, GlobalNormEqualsTheUnshardedNorm) {
  const StrategyCase c = GetParam();
  const testing::GptTrainingSetup setup = testing::TinySetup();
  data::MarkovLanguage language = testing::MakeLanguage(setup).value();
  const data::TokenBatch global = language.Batch(2, 12, setup.seq_len).value();
  const GradMap reference = ReferenceGrads(setup, global);
  const double reference_norm = Norm(reference);
  ASSERT_GT(reference_norm, 0.1);
  const double max_norm = reference_norm / 4;  // forces clipping by ~1/4
  absl::Status s = comm::testing::RunThreadRanks(
      c.world_size, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(setup));
        WrapperRegistry registry;
        ASSIGN_OR_RETURN(
            auto handle,
            FullyShard(gpt, ctx.group, testing::PerBlockOptions(c.strategy, c.hybrid_shard_size),
                       &registry));
        ASSIGN_OR_RETURN(auto sampler, data::RankSampler::Create(ctx.rank, ctx.world_size));
        ASSIGN_OR_RETURN(data::TokenBatch local, sampler.Local(global));
        RETURN_IF_ERROR(testing::ForwardBackward(*gpt, local).status());
        EXPECT_EQ(ClipGradNorm(*gpt, &registry, 0).status().code(),
                  absl::StatusCode::kInvalidArgument);
        ASSIGN_OR_RETURN(double norm, ClipGradNorm(*gpt, &registry, max_norm));
        // The norm is a sum of float32 squares of values that agree to rtol 1e-5.
        EXPECT_NEAR(norm, reference_norm, 1e-5 * reference_norm);
        ExpectLocalSlicesMatch(*handle, handle->root_unit()->groups().shard_rank, reference,
                               max_norm / (reference_norm + 1e-6));
        // A second call sees the clipped gradients: their norm is max_norm.
        ASSIGN_OR_RETURN(double again, ClipGradNorm(*gpt, &registry, 1e9));
        EXPECT_NEAR(again, max_norm, 1e-5 * max_norm);
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(Strategies, ClipGradNormTest,
                         ::testing::Values(StrategyCase{ShardingStrategy::kFullShard, 3, 0},
                                           StrategyCase{ShardingStrategy::kShardGradOp, 2, 0},
                                           StrategyCase{ShardingStrategy::kNoShard, 2, 0},
                                           StrategyCase{ShardingStrategy::kHybridShard, 4, 2}));

// Frozen parameters inside units: no gradient, never change, and the rest trains as
// the unwrapped model with the same parameters frozen (fp32 parity tolerance, NOTE
// [Parity tolerance] in parity_test.cc).
TEST(FrozenParametersTest, FrozenParametersInsideUnitsStayAndTheRestMatchesTheReference) {
  testing::GptTrainingSetup setup = testing::TinySetup();
  setup.steps = 8;
  setup.frozen = {"wpe.weight", "blocks.0.ln_1.weight", "blocks.1.mlp.fc.weight"};
  absl::StatusOr<testing::TrainingRun> reference = testing::TrainUnwrapped(setup);
  ASSERT_TRUE(reference.ok()) << reference.status();
  const auto initial = testing::ParameterValues(*testing::MakeGpt(setup).value());
  absl::Status s =
      comm::testing::RunThreadRanks(3, [&](comm::testing::RankContext& ctx) -> absl::Status {
        // One backward first: frozen parameters get no gradient view.
        {
          ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(setup));
          WrapperRegistry registry;
          ASSIGN_OR_RETURN(
              auto handle,
              FullyShard(gpt, ctx.group, testing::PerBlockOptions(ShardingStrategy::kFullShard),
                         &registry));
          ASSIGN_OR_RETURN(data::MarkovLanguage language, testing::MakeLanguage(setup));
          ASSIGN_OR_RETURN(data::TokenBatch batch, language.Batch(0, 3, setup.seq_len));
          RETURN_IF_ERROR(testing::ForwardBackward(*gpt, batch).status());
          for (const auto& [name, p] : gpt->NamedParameters()) {
            const bool frozen =
                std::find(setup.frozen.begin(), setup.frozen.end(), name) != setup.frozen.end();
            EXPECT_EQ(p->grad.defined(), !frozen) << name;
          }
        }
        ASSIGN_OR_RETURN(testing::TrainingRun run,
                         testing::TrainFullyShardedRank(
                             ctx, setup, testing::PerBlockOptions(ShardingStrategy::kFullShard)));
        RETURN_IF_ERROR(testing::CompareRuns(*reference, run, 1e-5, 1e-6));
        for (size_t i = 0; i < run.params.size(); ++i) {
          const std::string& name = run.params[i].first;
          const bool frozen =
              std::find(setup.frozen.begin(), setup.frozen.end(), name) != setup.frozen.end();
          if (frozen) {
            EXPECT_EQ(run.params[i].second, initial[i].second) << name;
          } else {
            EXPECT_NE(run.params[i].second, initial[i].second) << name;
          }
        }
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
}

// NOTE [Agree before acting]: after a backward under NoSync on both ranks, rank 0 drops
// its unreduced gradients and rank 1 keeps them; ClipGradNorm's check fails on rank 1
// only, and every rank returns rank 1's error within seconds instead of rank 0 waiting
// in the norm's all-gather.
TEST(ClipGradNormAgreementTest, ACheckFailingOnOneRankFailsEveryRankNamingIt) {
  constexpr int kWorld = 2;
  std::vector<absl::Status> errors(kWorld);
  const absl::Time start = absl::Now();
  absl::Status s =
      comm::testing::RunThreadRanks(kWorld, [&](comm::testing::RankContext& ctx) -> absl::Status {
        const testing::GptTrainingSetup setup = testing::TinySetup();
        ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(setup));
        WrapperRegistry registry;
        ASSIGN_OR_RETURN(
            auto handle,
            FullyShard(gpt, ctx.group, testing::PerBlockOptions(ShardingStrategy::kFullShard),
                       &registry));
        ASSIGN_OR_RETURN(data::MarkovLanguage language, testing::MakeLanguage(setup));
        ASSIGN_OR_RETURN(data::TokenBatch batch, language.Batch(0, 2, setup.seq_len));
        {
          ASSIGN_OR_RETURN(auto no_sync, NoSync(*gpt, &registry));
          RETURN_IF_ERROR(testing::ForwardBackward(*gpt, batch).status());
        }
        if (ctx.rank == 0) {
          for (const auto& unit : handle->units()) RETURN_IF_ERROR(unit->DropGradients());
        }
        errors[ctx.rank] = ClipGradNorm(*gpt, &registry, 1.0).status();
        return absl::OkStatus();
      });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));  // the collectives' timeout is 30 s
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(errors[r].code(), absl::StatusCode::kFailedPrecondition) << errors[r];
    EXPECT_TRUE(absl::StrContains(errors[r].message(), "rank 1: ClipGradNorm(<root> (Gpt)): unit "))
        << "rank " << r << ": " << errors[r];
    EXPECT_TRUE(absl::StrContains(errors[r].message(), "holds unreduced gradients")) << errors[r];
  }
}

}  // namespace
}  // namespace fsdp
