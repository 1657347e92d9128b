#include "fsdp/testing/gpt_training.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "comm/process_group.h"
#include "core/autograd.h"
#include "core/status_macros.h"
#include "data/sampler.h"
#include "fsdp/fully_shard.h"
#include "nn/functional/loss.h"
#include "nn/losses.h"
#include "policy/plan.h"
#include "policy/wrap_policy.h"

namespace fsdp {
namespace testing {

GptTrainingSetup TinySetup() {
  GptTrainingSetup setup;
  setup.gpt.vocab_size = 16;
  setup.gpt.block_size = 8;
  setup.gpt.n_embd = 16;
  setup.gpt.n_layer = 2;
  setup.gpt.n_head = 2;
  setup.gpt.seed = 11;
  setup.language.vocab_size = 16;
  setup.language.order = 1;
  setup.language.likely_tokens = 2;
  setup.language.seed = 5;
  setup.adamw.lr = 1e-2;
  // NOTE [AdamW eps in parity runs]: the attention's key bias (qkv.bias[C, 2C)) has an
  // exact gradient of zero (softmax ignores a constant added to every score of a
  // query); what the float32 backward computes there is rounding noise of ~1e-13 whose
  // sign depends on the summation order. With PyTorch's default eps 1e-8, AdamW's
  // m / (sqrt(v) + eps) turns that noise into steps of ~lr * 1e-5 in directions no
  // implementation controls, so two correct runs drift apart by more than atol 1e-6.
  // eps 1e-5 makes those steps ~lr * 1e-8 while every real gradient here (>= 1e-6)
  // still takes a normalised step.
  setup.adamw.eps = 1e-5;
  return setup;
}

absl::StatusOr<data::MarkovLanguage> MakeLanguage(const GptTrainingSetup& setup) {
  return data::MarkovLanguage::Create(setup.language);
}

absl::StatusOr<std::shared_ptr<nn::Gpt>> MakeGpt(const GptTrainingSetup& setup) {
  ASSIGN_OR_RETURN(std::shared_ptr<nn::Gpt> gpt, nn::Gpt::Create(setup.gpt));
  for (const std::string& name : setup.frozen) {
    bool found = false;
    for (const auto& [n, p] : gpt->NamedParameters()) {
      if (n == name) {
        p->requires_grad = false;
        found = true;
      }
    }
    if (!found) {
      return absl::InvalidArgumentError(
          absl::StrCat("GptTrainingSetup.frozen: no parameter '", name, "'"));
    }
  }
  return gpt;
}

std::string StrategyCaseName(const StrategyCase& c) {
  std::string name = ShardingStrategyName(c.strategy);
  name.erase(std::remove(name.begin(), name.end(), '_'), name.end());
  return absl::StrCat(name, "_N", c.world_size,
                      c.hybrid_shard_size ? absl::StrCat("_H", c.hybrid_shard_size) : "");
}

std::vector<StrategyCase> SomeStrategyCases() {
  return {{ShardingStrategy::kFullShard, 1, 0}, {ShardingStrategy::kFullShard, 2, 0},
          {ShardingStrategy::kFullShard, 4, 0}, {ShardingStrategy::kShardGradOp, 2, 0},
          {ShardingStrategy::kNoShard, 2, 0},   {ShardingStrategy::kHybridShard, 4, 2}};
}

FullyShardOptions PerBlockOptions(ShardingStrategy strategy, int hybrid_shard_size,
                                  const std::string& block_type) {
  FullyShardOptions options;
  options.policy = policy::ModuleTypes({block_type});
  options.strategy = strategy;
  options.hybrid_shard_size = hybrid_shard_size;
  options.timeout = absl::Seconds(30);
  return options;
}

absl::StatusOr<double> ForwardBackward(core::Module& model, const data::TokenBatch& batch) {
  ASSIGN_OR_RETURN(core::Tensor logits, model.Forward(batch.inputs));
  ASSIGN_OR_RETURN(nn::LossResult loss, nn::CrossEntropyLoss(logits, batch.targets));
  RETURN_IF_ERROR(model.Backward(loss.grad).status());
  return static_cast<double>(loss.loss);
}

absl::StatusOr<double> ForwardBackwardGraph(core::Module& model, const data::TokenBatch& batch) {
  absl::StatusOr<core::Tensor> loss =
      nn::functional::CrossEntropy(model.CallOne({batch.inputs}), batch.targets);
  RETURN_IF_ERROR(loss.status());
  RETURN_IF_ERROR(core::Backward(*loss));
  return static_cast<double>(loss->ToVector()[0]);
}

absl::StatusOr<double> MicroBatchMeanLoss(comm::testing::RankContext& ctx,
                                          const std::vector<float>& losses) {
  ASSIGN_OR_RETURN(core::Tensor mine,
                   core::Tensor::FromVector(losses, {static_cast<int64_t>(losses.size())}));
  core::Tensor all = core::Tensor::Zeros({ctx.world_size * mine.numel()});
  ASSIGN_OR_RETURN(auto work, ctx.group->AllGather(mine, all, comm::AllGatherOptions{}));
  RETURN_IF_ERROR(work->Wait(absl::Seconds(30)));
  double sum = 0;
  for (float l : all.ToVector()) sum += l;
  return sum / static_cast<double>(all.numel());
}

std::vector<std::pair<std::string, std::vector<float>>> ParameterValues(const core::Module& m) {
  std::vector<std::pair<std::string, std::vector<float>>> out;
  for (const auto& [name, p] : m.NamedParameters()) out.emplace_back(name, p->data.ToVector());
  return out;
}

namespace {

// NOTE [Parity training loop]: the one training loop of the fsdp tests' runs, unwrapped
// and FullyShard-ed alike. It is test-only and separate from integration::StageRunner::Fit
// (the library's training loop, which the main job runs) on purpose: fsdp is a floor
// below integration, and the parity tests compare FSDP against a loop that shares no
// code with the runner, so a runner bug cannot sit on both sides of the comparison.
//
// `setup.steps` AdamW steps over the language's global batches; with a `sampler` (and
// its `group`), on this rank's rows, the step's loss averaged over the ranks.
absl::StatusOr<std::vector<double>> TrainSteps(const GptTrainingSetup& setup,
                                               const data::MarkovLanguage& language,
                                               const data::RankSampler* sampler,
                                               comm::ProcessGroup* group, core::Module& model,
                                               optim::AdamW& adamw) {
  std::vector<double> losses;
  for (int step = 0; step < setup.steps; ++step) {
    ASSIGN_OR_RETURN(data::TokenBatch global,
                     language.Batch(step, setup.global_batch, setup.seq_len));
    data::TokenBatch local;
    if (sampler != nullptr) {
      ASSIGN_OR_RETURN(local, sampler->Local(global));
    }
    adamw.ZeroGrad();
    const data::TokenBatch& batch = sampler != nullptr ? local : global;
    ASSIGN_OR_RETURN(double loss, setup.graph_model ? ForwardBackwardGraph(model, batch)
                                                    : ForwardBackward(model, batch));
    RETURN_IF_ERROR(adamw.Step());
    if (group != nullptr) {
      // The global loss: the mean of equal-sized local means.
      ASSIGN_OR_RETURN(core::Tensor t, core::Tensor::FromVector({static_cast<float>(loss)}, {1}));
      comm::AllReduceOptions ar;
      ar.reduce_op = comm::ReduceOp::kAverage;
      ASSIGN_OR_RETURN(std::shared_ptr<comm::Work> work, group->AllReduce(t, ar));
      RETURN_IF_ERROR(work->Wait(absl::Seconds(30)));
      loss = t.data<float>()[0];
    }
    losses.push_back(loss);
  }
  return losses;
}

}  // namespace

namespace {

// MakeGpt(setup) as a ModelFactory.
ModelFactory GptFactory(const GptTrainingSetup& setup) {
  return [&setup]() -> absl::StatusOr<std::shared_ptr<core::Module>> {
    ASSIGN_OR_RETURN(std::shared_ptr<nn::Gpt> gpt, MakeGpt(setup));
    return std::shared_ptr<core::Module>(std::move(gpt));
  };
}

}  // namespace

absl::StatusOr<TrainingRun> TrainUnwrapped(const GptTrainingSetup& setup) {
  return TrainUnwrapped(setup, GptFactory(setup));
}

absl::StatusOr<TrainingRun> TrainUnwrapped(const GptTrainingSetup& setup,
                                           const ModelFactory& make) {
  ASSIGN_OR_RETURN(data::MarkovLanguage language, MakeLanguage(setup));
  ASSIGN_OR_RETURN(std::shared_ptr<core::Module> model, make());
  ASSIGN_OR_RETURN(std::unique_ptr<optim::AdamW> adamw,
                   optim::AdamW::Create(model->NamedParameters(), setup.adamw));
  TrainingRun run;
  ASSIGN_OR_RETURN(run.losses, TrainSteps(setup, language, /*sampler=*/nullptr,
                                          /*group=*/nullptr, *model, *adamw));
  run.params = ParameterValues(*model);
  return run;
}

absl::StatusOr<TrainingRun> TrainFullyShardedRank(comm::testing::RankContext& ctx,
                                                  const GptTrainingSetup& setup,
                                                  const FullyShardOptions& options) {
  return TrainFullyShardedRank(ctx, setup, options, GptFactory(setup));
}

absl::StatusOr<TrainingRun> TrainFullyShardedRank(comm::testing::RankContext& ctx,
                                                  const GptTrainingSetup& setup,
                                                  const FullyShardOptions& options,
                                                  const ModelFactory& make) {
  ASSIGN_OR_RETURN(std::shared_ptr<core::Module> model, make());
  WrapperRegistry registry;
  return TrainFullyShardedModel(ctx, setup, options, model, &registry);
}

absl::StatusOr<TrainingRun> TrainFullyShardedModel(comm::testing::RankContext& ctx,
                                                   const GptTrainingSetup& setup,
                                                   const FullyShardOptions& options,
                                                   const std::shared_ptr<core::Module>& model,
                                                   WrapperRegistry* registry) {
  ASSIGN_OR_RETURN(data::MarkovLanguage language, MakeLanguage(setup));
  ASSIGN_OR_RETURN(data::RankSampler sampler, data::RankSampler::Create(ctx.rank, ctx.world_size));
  ASSIGN_OR_RETURN(std::shared_ptr<FullyShardHandle> handle,
                   FullyShard(model, ctx.group, options, registry));
  ASSIGN_OR_RETURN(std::unique_ptr<optim::AdamW> adamw,
                   optim::AdamW::Create(model->NamedParameters(), setup.adamw));
  TrainingRun run;
  ASSIGN_OR_RETURN(run.losses,
                   TrainSteps(setup, language, &sampler, ctx.group.get(), *model, *adamw));
  RETURN_IF_ERROR(Release(*model, registry));
  run.params = ParameterValues(*model);
  return run;
}

absl::Status CompareRuns(const TrainingRun& expected, const TrainingRun& actual, double rtol,
                         double atol, double* worst_ratio) {
  double worst = 0;  // largest |a - e| / (atol + rtol |e|) seen
  auto close = [&](double e, double a) {
    // Equal values pass even with both tolerances 0 (bitwise comparisons), where the
    // quotient would be 0 / 0.
    const double diff = std::abs(a - e);
    const double ratio = diff == 0 ? 0 : diff / (atol + rtol * std::abs(e));
    worst = std::max(worst, ratio);
    return ratio <= 1.0;
  };
  if (expected.losses.size() != actual.losses.size()) {
    return absl::InternalError(
        absl::StrCat("losses: ", expected.losses.size(), " steps vs ", actual.losses.size()));
  }
  for (size_t s = 0; s < expected.losses.size(); ++s) {
    if (!close(expected.losses[s], actual.losses[s])) {
      return absl::InternalError(absl::StrFormat("loss at step %d: expected %.17g, got %.17g", s,
                                                 expected.losses[s], actual.losses[s]));
    }
  }
  if (expected.params.size() != actual.params.size()) {
    return absl::InternalError(
        absl::StrCat("parameters: ", expected.params.size(), " vs ", actual.params.size()));
  }
  for (size_t i = 0; i < expected.params.size(); ++i) {
    const auto& [name, e] = expected.params[i];
    const auto& [actual_name, a] = actual.params[i];
    if (name != actual_name || e.size() != a.size()) {
      return absl::InternalError(absl::StrCat("parameter ", i, ": ", name, " [", e.size(), "] vs ",
                                              actual_name, " [", a.size(), "]"));
    }
    for (size_t k = 0; k < e.size(); ++k) {
      if (!close(e[k], a[k])) {
        return absl::InternalError(
            absl::StrFormat("parameter %s[%d]: expected %.9g, got %.9g", name, k, e[k], a[k]));
      }
    }
  }
  if (worst_ratio != nullptr) *worst_ratio = worst;
  return absl::OkStatus();
}

MemoryBound FullShardMemoryBound(const FullyShardHandle& handle, int limit_all_gathers, int world) {
  constexpr int64_t kF32 = 4;  // bytes per fp32 element
  const std::vector<std::shared_ptr<Unit>> units = handle.units();
  int64_t padded_total = 0;
  for (const auto& u : units) padded_total += u->flat().padded_numel();
  const int64_t p_root = handle.root_unit()->flat().padded_numel();
  const int64_t p_block = units.front()->flat().padded_numel();
  MemoryBound bound;
  bound.sharded = 4 * kF32 * padded_total / world;
  // The root's parameters for the whole backward, the computing block's and L prefetched.
  bound.transient = kF32 * p_root + kF32 * p_block * (1 + limit_all_gathers);
  // The root's full gradient for the whole backward, the computing block's and the
  // previous block's until its reduce-scatter completes. One rank has none: its backward
  // adds straight into the gradient shards.
  if (world > 1) bound.transient += kF32 * p_root + 2 * kF32 * p_block;
  return bound;
}

absl::Status CheckUnits(const core::Module& model, const FullyShardOptions& options, int world_size,
                        const std::vector<std::string>& paths) {
  ASSIGN_OR_RETURN(const policy::WrapPlan plan, policy::Plan(model, *options.policy, world_size));
  for (const std::string& path : paths) {
    const auto& units = plan.units();
    if (std::none_of(units.begin(), units.end(),
                     [&](const policy::WrapUnit& u) { return u.path() == path; })) {
      return absl::NotFoundError(absl::StrCat("'", path, "' is not a unit of ", plan.policy()));
    }
  }
  return absl::OkStatus();
}

}  // namespace testing
}  // namespace fsdp
