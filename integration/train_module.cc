#include "integration/train_module.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace integration {

std::string StageName(Stage stage) {
  switch (stage) {
    case Stage::kFit:
      return "fit";
    case Stage::kValidate:
      return "validate";
    case Stage::kTest:
      return "test";
    case Stage::kPredict:
      return "predict";
  }
  return "unknown";
}

absl::StatusOr<core::Tensor> TrainModule::PredictStep(const StepContext& ctx) {
  std::shared_ptr<core::Module> m = model();
  return absl::UnimplementedError(absl::StrCat(
      "TrainModule::PredictStep is not implemented for ", m ? m->Describe() : "<no model>",
      " (batch ", ctx.step, "): override it to run the predict stage"));
}

}  // namespace integration
