#include "kernels/tuning_switches.h"

#include <cstdlib>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kernels {

bool TuningSwitchOn(const char* value) { return value == nullptr || std::strcmp(value, "0") != 0; }

absl::StatusOr<FlashShapePolicy> ParseFlashShapePolicy(const char* shapes, const char* tuning) {
  FlashShapePolicy policy;
  const std::string shapes_text = shapes != nullptr ? shapes : "";
  if (shapes_text == "reference") {
    policy.mode = FlashShapeMode::kReference;
    policy.switch_text = absl::StrCat(kAttentionShapesEnv, "=reference");
    return policy;
  }
  if (!shapes_text.empty() && shapes_text != "tuned") {
    return absl::InvalidArgumentError(
        absl::StrCat(kAttentionShapesEnv, "=", shapes_text,
                     " in the environment: use reference (every fused attention kernel runs "
                     "its shape 0) or tuned (the default)"));
  }
  if (!TuningSwitchOn(tuning)) {
    policy.mode = FlashShapeMode::kUntuned;
    policy.switch_text = absl::StrCat(kAttentionTuningEnv, "=0");
  }
  return policy;
}

const absl::StatusOr<FlashShapePolicy>& FlashShapePolicyFromEnvironment() {
  static const auto* policy = new absl::StatusOr<FlashShapePolicy>(
      ParseFlashShapePolicy(std::getenv(kAttentionShapesEnv), std::getenv(kAttentionTuningEnv)));
  return *policy;
}

}  // namespace kernels
