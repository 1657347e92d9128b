#include "mlp.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "data/sampler.h"
#include "nn/losses.h"

namespace consumer {

MlpBlock::MlpBlock(int64_t in, int64_t out, uint64_t seed) {
  fc_ = RegisterModule("fc", std::make_shared<nn::Linear>(in, out, /*bias=*/true, seed));
  act_ = RegisterModule("act", std::make_shared<nn::ReLU>());
}

absl::StatusOr<core::Tensor> MlpBlock::ForwardImpl(const core::Tensor& x) {
  ASSIGN_OR_RETURN(core::Tensor h, fc_->Forward(x));
  return act_->Forward(h);
}

absl::StatusOr<core::Tensor> MlpBlock::BackwardImpl(const core::Tensor& grad_output) {
  ASSIGN_OR_RETURN(core::Tensor g, act_->Backward(grad_output));
  return fc_->Backward(g);
}

absl::StatusOr<std::shared_ptr<Mlp>> Mlp::Create(const std::vector<int64_t>& sizes,
                                                 uint64_t seed) {
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
    mlp->layers_.push_back(mlp->RegisterModule(
        absl::StrCat("block", i), std::make_shared<MlpBlock>(sizes[i], sizes[i + 1], seed + i)));
  }
  const size_t n = sizes.size();
  mlp->layers_.push_back(mlp->RegisterModule(
      "head", std::make_shared<nn::Linear>(sizes[n - 2], sizes[n - 1], /*bias=*/true, seed + n)));
  return mlp;
}

absl::StatusOr<core::Tensor> Mlp::ForwardImpl(const core::Tensor& x) {
  core::Tensor h = x;
  for (const auto& layer : layers_) {
    ASSIGN_OR_RETURN(h, layer->Forward(h));
  }
  return h;
}

absl::StatusOr<core::Tensor> Mlp::BackwardImpl(const core::Tensor& grad_output) {
  core::Tensor g = grad_output;
  for (auto it = layers_.rbegin(); it != layers_.rend(); ++it) {
    ASSIGN_OR_RETURN(g, (*it)->Backward(g));
  }
  return g;
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
  ASSIGN_OR_RETURN(core::Tensor out, mlp_->Forward(batch.inputs));
  ASSIGN_OR_RETURN(nn::LossResult loss, nn::MseLoss(out, batch.targets));
  RETURN_IF_ERROR(mlp_->Backward(loss.grad).status());
  return integration::StepOutput{loss.loss, batch.inputs.size(0)};
}

absl::StatusOr<integration::StepOutput> RegressionModule::EvaluationStep(
    const integration::StepContext& ctx) {
  // Held-out batches: validation from 1,000,000 on, test from 2,000,000 on.
  const int64_t base = ctx.stage == integration::Stage::kTest ? 2000000 : 1000000;
  ASSIGN_OR_RETURN(data::RegressionBatch batch, LocalBatch(base + ctx.step, ctx));
  ASSIGN_OR_RETURN(core::Tensor out, mlp_->Forward(batch.inputs));
  ASSIGN_OR_RETURN(nn::LossResult loss, nn::MseLoss(out, batch.targets));
  return integration::StepOutput{loss.loss, batch.inputs.size(0)};
}

absl::StatusOr<std::unique_ptr<optim::Optimizer>> RegressionModule::ConfigureOptimizer(
    std::vector<core::NamedParameter> params) {
  ASSIGN_OR_RETURN(std::unique_ptr<optim::AdamW> adamw,
                   optim::AdamW::Create(std::move(params), options_.adamw));
  return std::unique_ptr<optim::Optimizer>(std::move(adamw));
}

}  // namespace consumer
