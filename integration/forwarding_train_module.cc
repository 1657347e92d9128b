#include "integration/forwarding_train_module.h"

#include <utility>

namespace integration {

std::shared_ptr<core::Module> ForwardingTrainModule::model() { return inner_->model(); }

absl::StatusOr<StepOutput> ForwardingTrainModule::TrainingStep(const StepContext& ctx) {
  return inner_->TrainingStep(ctx);
}

bool ForwardingTrainModule::SupportsMicroBatches() const { return inner_->SupportsMicroBatches(); }

absl::StatusOr<StepOutput> ForwardingTrainModule::EvaluationStep(const StepContext& ctx) {
  return inner_->EvaluationStep(ctx);
}

absl::StatusOr<core::Tensor> ForwardingTrainModule::PredictStep(const StepContext& ctx) {
  return inner_->PredictStep(ctx);
}

absl::StatusOr<std::unique_ptr<optim::Optimizer>> ForwardingTrainModule::ConfigureOptimizer(
    std::vector<core::NamedParameter> params) {
  return inner_->ConfigureOptimizer(std::move(params));
}

std::string ForwardingTrainModule::CountUnit() const { return inner_->CountUnit(); }

std::optional<double> ForwardingTrainModule::LearningRate(int64_t step) {
  return inner_->LearningRate(step);
}

std::map<std::string, std::string> ForwardingTrainModule::DataIdentity() const {
  return inner_->DataIdentity();
}

}  // namespace integration
