// ForwardingTrainModule: a TrainModule that hands every call to another TrainModule, the
// base of wrappers that change one or two calls (timing the training steps, injecting a
// fault) and must pass the rest through unchanged. A wrapper derives from it and
// overrides only what it changes, so a method added to TrainModule reaches the inner
// module through every wrapper once it is forwarded here.
//
//   class CountingTrainModule : public integration::ForwardingTrainModule {
//    public:
//     using ForwardingTrainModule::ForwardingTrainModule;
//     absl::StatusOr<integration::StepOutput> TrainingStep(
//         const integration::StepContext& ctx) override {
//       ++steps_;
//       return ForwardingTrainModule::TrainingStep(ctx);
//     }
//    private:
//     int64_t steps_ = 0;
//   };
//
//   CountingTrainModule counted(&gpt_module);  // counted.CountUnit() == "tokens"
#ifndef INTEGRATION_FORWARDING_TRAIN_MODULE_H_
#define INTEGRATION_FORWARDING_TRAIN_MODULE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/module.h"
#include "core/tensor.h"
#include "integration/train_module.h"
#include "optim/optimizer.h"

namespace integration {

class ForwardingTrainModule : public TrainModule {
 public:
  // Forwards to `inner`, which is not owned and must outlive this module; not null.
  explicit ForwardingTrainModule(TrainModule* inner) : inner_(inner) {}

  // Each returns what the inner module's method returns for the same arguments.
  std::shared_ptr<core::Module> model() override;
  absl::StatusOr<StepOutput> TrainingStep(const StepContext& ctx) override;
  bool SupportsMicroBatches() const override;
  absl::StatusOr<StepOutput> EvaluationStep(const StepContext& ctx) override;
  absl::StatusOr<core::Tensor> PredictStep(const StepContext& ctx) override;
  absl::StatusOr<std::unique_ptr<optim::Optimizer>> ConfigureOptimizer(
      std::vector<core::NamedParameter> params) override;
  std::string CountUnit() const override;
  std::optional<double> LearningRate(int64_t step) override;
  std::map<std::string, std::string> DataIdentity() const override;
  std::map<std::string, std::string> DataPosition(int64_t global_step,
                                                  int batch_size) const override;
  std::optional<int64_t> EvaluationBatches(Stage stage, int batch_size) const override;

 private:
  TrainModule* inner_;
};

}  // namespace integration

#endif  // INTEGRATION_FORWARDING_TRAIN_MODULE_H_
