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

std::map<std::string, std::string> ForwardingTrainModule::DataPosition(int64_t global_step,
                                                                       int batch_size) const {
  return inner_->DataPosition(global_step, batch_size);
}

std::optional<int64_t> ForwardingTrainModule::EvaluationBatches(Stage stage, int batch_size) const {
  return inner_->EvaluationBatches(stage, batch_size);
}

}  // namespace integration
