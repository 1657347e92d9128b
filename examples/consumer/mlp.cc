#include "mlp.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/autograd.h"
#include "core/param_init.h"
#include "core/status_macros.h"
#include "data/sampler.h"
#include "nn/functional/linear.h"
#include "nn/functional/loss.h"
#include "squared_relu.h"

namespace consumer {
namespace {

namespace F = ::nn::functional;

// InvalidArgument naming `module` unless it got exactly one input.
absl::Status CheckOneInput(const core::Module& module, const core::Tensors& inputs) {
  if (inputs.size() == 1) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(module.Describe(), ": takes 1 input, got ", inputs.size()));
}

}  // namespace

MlpBlock::MlpBlock(int64_t in, int64_t out, uint64_t seed) {
  // nn::Linear's initialisation (nn/linear.h): one stream from `seed`, weight then bias.
  // Sizes below 1 are Mlp::Create's to refuse; a negative one still leaves a well-formed
  // module whose ConstructionStatus() says so. The tensors are fp32 CPU (or deferred), so
  // InitParameter cannot fail.
  const float bound = in > 0 ? 1.0f / std::sqrt(static_cast<float>(in)) : 0.0f;
  weight_ = AllocateParameter("weight", {out, in});
  bias_ = AllocateParameter("bias", {out});
  (void)core::InitParameter(*weight_, core::ParamInit::Uniform(seed, 0, -bound, bound));
  (void)core::InitParameter(*bias_, core::ParamInit::Uniform(seed, out * in, -bound, bound));
}

absl::StatusOr<core::Tensors> MlpBlock::ForwardGraph(const core::Tensors& inputs) {
  RETURN_IF_ERROR(CheckOneInput(*this, inputs));
  absl::StatusOr<core::Tensor> y = SquaredRelu(F::Linear(inputs[0], weight_, bias_));
  RETURN_IF_ERROR(y.status());
  return core::Tensors{*y};
}

absl::StatusOr<std::shared_ptr<Mlp>> Mlp::Create(const std::vector<int64_t>& sizes, uint64_t seed) {
  if (sizes.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("Mlp: sizes needs at least 2 entries, got ", sizes.size()));
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("Mlp: sizes[", i, "] must be >= 1, got ", sizes[i]));
    }
  }
  std::shared_ptr<Mlp> mlp(new Mlp());
  for (size_t i = 0; i + 2 < sizes.size(); ++i) {
    mlp->blocks_.push_back(mlp->RegisterModule(
        absl::StrCat("block", i), std::make_shared<MlpBlock>(sizes[i], sizes[i + 1], seed + i)));
  }
  const size_t n = sizes.size();
  mlp->head_ = mlp->RegisterModule(
      "head", std::make_shared<nn::Linear>(sizes[n - 2], sizes[n - 1], /*bias=*/true, seed + n));
  RETURN_IF_ERROR(mlp->ConstructionStatus());
  return mlp;
}

absl::StatusOr<core::Tensors> Mlp::ForwardGraph(const core::Tensors& inputs) {
  RETURN_IF_ERROR(CheckOneInput(*this, inputs));
  // Each child through CallOne, so the hooks FSDP placed on it (a unit's all-gather and
  // reduce-scatter) run; an error stops the chain at the op that made it.
  absl::StatusOr<core::Tensor> h = inputs[0];
  for (const std::shared_ptr<MlpBlock>& block : blocks_) h = block->CallOne({h});
  h = head_->CallOne({h});
  RETURN_IF_ERROR(h.status());
  return core::Tensors{*h};
}

absl::StatusOr<std::unique_ptr<RegressionModule>> RegressionModule::Create(
    const RegressionModuleOptions& options) {
  data::RegressionOptions task_options;
  task_options.in_features = options.in_features;
  task_options.out_features = options.out_features;
  task_options.seed = options.seed;
  ASSIGN_OR_RETURN(data::RegressionTask task, data::RegressionTask::Create(task_options));
  if (options.blocks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("RegressionModuleOptions.blocks must be >= 1, got ", options.blocks));
  }
  std::vector<int64_t> sizes = {options.in_features};
  for (int b = 0; b < options.blocks; ++b) sizes.push_back(options.hidden);
  sizes.push_back(options.out_features);
  ASSIGN_OR_RETURN(std::shared_ptr<Mlp> mlp, Mlp::Create(sizes, options.seed + 100));
  return std::unique_ptr<RegressionModule>(
      new RegressionModule(options, std::move(task), std::move(mlp)));
}

absl::StatusOr<data::RegressionBatch> RegressionModule::LocalBatch(
    int64_t index, const integration::StepContext& ctx) const {
  ASSIGN_OR_RETURN(data::RegressionBatch global, task_.Batch(index, ctx.batch_size));
  ASSIGN_OR_RETURN(data::RankSampler sampler, data::RankSampler::Create(ctx.rank, ctx.world_size));
  return sampler.Local(global);
}

absl::StatusOr<integration::StepOutput> RegressionModule::TrainingStep(
    const integration::StepContext& ctx) {
  ASSIGN_OR_RETURN(data::RegressionBatch batch, LocalBatch(ctx.step, ctx));
  ASSIGN_OR_RETURN(core::Tensor loss, F::Mse(mlp_->CallOne({batch.inputs}), batch.targets));
  RETURN_IF_ERROR(core::Backward(loss));
  return integration::StepOutput{loss.ToVector()[0], batch.inputs.size(0)};
}

absl::StatusOr<integration::StepOutput> RegressionModule::EvaluationStep(
    const integration::StepContext& ctx) {
  // Held-out batches: validation from 1,000,000 on, test from 2,000,000 on. Forward only:
  // the runner calls this under core::NoGradScope, so no graph is recorded.
  const int64_t base = ctx.stage == integration::Stage::kTest ? 2000000 : 1000000;
  ASSIGN_OR_RETURN(data::RegressionBatch batch, LocalBatch(base + ctx.step, ctx));
  ASSIGN_OR_RETURN(core::Tensor loss, F::Mse(mlp_->CallOne({batch.inputs}), batch.targets));
  return integration::StepOutput{loss.ToVector()[0], batch.inputs.size(0)};
}

absl::StatusOr<std::unique_ptr<optim::Optimizer>> RegressionModule::ConfigureOptimizer(
    std::vector<core::NamedParameter> params) {
  ASSIGN_OR_RETURN(std::unique_ptr<optim::AdamW> adamw,
                   optim::AdamW::Create(std::move(params), options_.adamw));
  return std::unique_ptr<optim::Optimizer>(std::move(adamw));
}

}  // namespace consumer
