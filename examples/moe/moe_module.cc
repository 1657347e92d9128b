#include "examples/moe/moe_module.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/autograd.h"
#include "core/status_macros.h"
#include "data/sampler.h"
#include "nn/functional/elementwise.h"
#include "nn/functional/loss.h"

namespace moe {
namespace {

namespace F = ::nn::functional;

constexpr int64_t kValidateBatches = 1'000'000;
constexpr int64_t kTestBatches = 2'000'000;

absl::Status Validate(const MoeModuleOptions& o) {
  const MoeConfig& m = o.model;
  if (m.vocab < 1 || m.width < 1 || m.heads < 1 || m.width % m.heads != 0 || m.expert_hidden < 1 ||
      m.experts < 2 || m.blocks < 1 || m.max_positions < 1 || !(m.aux_weight >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MoeModuleOptions.model: vocab ", m.vocab, ", width ", m.width, ", heads ", m.heads,
        ", expert_hidden ", m.expert_hidden, ", experts ", m.experts, ", blocks ", m.blocks,
        ", max_positions ", m.max_positions, ", aux_weight ", m.aux_weight,
        " (need positive sizes, heads dividing width, at least 2 experts, aux_weight >= 0)"));
  }
  if (o.seq_len < 1 || o.seq_len > m.max_positions) {
    return absl::InvalidArgumentError(absl::StrCat("MoeModuleOptions.seq_len is ", o.seq_len,
                                                   "; need 1 .. model.max_positions (",
                                                   m.max_positions, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

MoeModule::MoeModule(const MoeModuleOptions& options, data::TokenFile train, data::TokenFile eval)
    : options_(options),
      model_(std::make_shared<MoeDecoder>(options.model)),
      train_(std::move(train)),
      eval_(std::move(eval)) {}

absl::StatusOr<std::unique_ptr<MoeModule>> MoeModule::Create(const MoeModuleOptions& options) {
  RETURN_IF_ERROR(Validate(options));
  ASSIGN_OR_RETURN(data::TokenFile train, data::TokenFile::Open(options.train_tokens));
  ASSIGN_OR_RETURN(data::TokenFile eval,
                   data::TokenFile::Open(options.eval_tokens.empty() ? options.train_tokens
                                                                     : options.eval_tokens));
  std::unique_ptr<MoeModule> module(new MoeModule(options, std::move(train), std::move(eval)));
  RETURN_IF_ERROR(module->model_->ConstructionStatus());
  return module;
}

absl::StatusOr<data::TokenBatch> MoeModule::StepBatch(const data::TokenFile& tokens, int64_t index,
                                                      const integration::StepContext& ctx) const {
  ASSIGN_OR_RETURN(data::TokenBatch global, tokens.Batch(index, ctx.batch_size, options_.seq_len,
                                                         options_.model.vocab, options_.data_seed));
  ASSIGN_OR_RETURN(auto rows, integration::StepRows(ctx));
  return data::Rows(global, rows.first, rows.second);
}

absl::StatusOr<core::Tensor> MoeModule::Loss(const data::TokenBatch& batch) {
  return MoeLoss(*model_, batch.inputs, batch.targets);
}

absl::StatusOr<integration::StepOutput> MoeModule::TrainingStep(
    const integration::StepContext& ctx) {
  ASSIGN_OR_RETURN(data::TokenBatch batch, StepBatch(train_, ctx.step, ctx));
  ASSIGN_OR_RETURN(core::Tensor loss, Loss(batch));
  RETURN_IF_ERROR(core::Backward(loss));
  return integration::StepOutput{loss.ToVector()[0], batch.targets.numel()};
}

absl::StatusOr<integration::StepOutput> MoeModule::EvaluationStep(
    const integration::StepContext& ctx) {
  const int64_t index =
      (ctx.stage == integration::Stage::kTest ? kTestBatches : kValidateBatches) + ctx.step;
  ASSIGN_OR_RETURN(data::TokenBatch batch, StepBatch(eval_, index, ctx));
  ASSIGN_OR_RETURN(core::Tensor loss, Loss(batch));
  return integration::StepOutput{loss.ToVector()[0], batch.targets.numel()};
}

absl::StatusOr<std::unique_ptr<optim::Optimizer>> MoeModule::ConfigureOptimizer(
    std::vector<core::NamedParameter> params) {
  return optim::MakeOptimizer(std::move(params), options_.optimizer);
}

absl::StatusOr<core::Tensor> MoeLoss(MoeDecoder& model, const core::Tensor& inputs,
                                     const core::Tensor& targets) {
  ASSIGN_OR_RETURN(core::Tensors out, model.Call({inputs}));
  return F::Add(F::CrossEntropy(out[0], targets),
                F::MulScalar(out[1], static_cast<float>(model.config().aux_weight)));
}

policy::WrapPolicyPtr BlockPolicy() { return policy::ModuleTypes({"MoeBlock"}); }

}  // namespace moe
