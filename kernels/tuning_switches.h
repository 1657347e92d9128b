// The environment switches of the CUDA tuners: FSDP_GEMM_TUNING (NOTE [GEMM tuning] in
// nn/cuda/gemm.h), FSDP_ATTENTION_SHAPES and FSDP_ATTENTION_TUNING (NOTE [Flash block
// shapes] in kernels/cuda/flash_attention.h). Parsed here, in plain C++ that any build
// compiles and tests, and read once per process by the code they steer.
//
//   const absl::StatusOr<kernels::FlashShapePolicy>& policy =
//       kernels::FlashShapePolicyFromEnvironment();
//   if (!policy.ok()) return policy.status();  // InvalidArgument naming the variable
//   if (policy->mode == kernels::FlashShapeMode::kTuned) { ... }
#ifndef KERNELS_TUNING_SWITCHES_H_
#define KERNELS_TUNING_SWITCHES_H_

#include <string>

#include "absl/status/statusor.h"

namespace kernels {

inline constexpr char kGemmTuningEnv[] = "FSDP_GEMM_TUNING";
inline constexpr char kAttentionShapesEnv[] = "FSDP_ATTENTION_SHAPES";
inline constexpr char kAttentionTuningEnv[] = "FSDP_ATTENTION_TUNING";

// A tuner's on/off switch from its variable's value (nullptr: unset): off for "0" only;
// unset, empty or any other value leaves the tuner on.
bool TuningSwitchOn(const char* value);

// How the fused attention picks the block shape of a call that pins none.
enum class FlashShapeMode {
  kTuned,      // the first call of a problem size tunes (the default)
  kReference,  // FSDP_ATTENTION_SHAPES=reference: shape 0 of every kernel, never tuned
  kUntuned,    // FSDP_ATTENTION_TUNING=0: each kernel's default shape, never tuned
};

struct FlashShapePolicy {
  FlashShapeMode mode = FlashShapeMode::kTuned;
  // The switch in force ("FSDP_ATTENTION_SHAPES=reference", "FSDP_ATTENTION_TUNING=0");
  // empty for kTuned.
  std::string switch_text;
};

// The policy from the two variables' values (nullptr: unset). FSDP_ATTENTION_SHAPES:
// unset, empty or "tuned" leaves the choice to FSDP_ATTENTION_TUNING (TuningSwitchOn:
// kTuned, or kUntuned for "0"); "reference" is kReference whatever FSDP_ATTENTION_TUNING
// says; any other value is InvalidArgument naming the variable and its value.
absl::StatusOr<FlashShapePolicy> ParseFlashShapePolicy(const char* shapes, const char* tuning);

// ParseFlashShapePolicy over this process's environment, read on the first call and kept
// for the life of the process (thread-safe).
const absl::StatusOr<FlashShapePolicy>& FlashShapePolicyFromEnvironment();

}  // namespace kernels

#endif  // KERNELS_TUNING_SWITCHES_H_
