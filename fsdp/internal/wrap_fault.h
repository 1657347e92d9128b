// Test-only fault injection into the second phase of fsdp::FullyShard (NOTE [Wrap
// rollback] in fsdp/fully_shard.cc): a test makes one step of one new unit fail and
// checks that the wrap rolls back completely. Production code installs no hook; then
// the check is one thread-local read.
//
//   // Rank thread of a test (each thread installs its own):
//   fsdp::internal::SetWrapFaultHookForThisThread(
//       [](int unit_index, fsdp::internal::WrapStep step) {
//         return unit_index == 1 && step == fsdp::internal::WrapStep::kAttachHooks
//                    ? absl::InternalError("injected") : absl::OkStatus();
//       });
//   absl::Status s = fsdp::FullyShard(model, group, options, &registry).status();  // fails
//   fsdp::internal::SetWrapFaultHookForThisThread(nullptr);
//
// Tests use fsdp::testing::ScopedWrapFault (fsdp/testing/wrap_fault.h) instead.
#ifndef FSDP_INTERNAL_WRAP_FAULT_H_
#define FSDP_INTERNAL_WRAP_FAULT_H_

#include <functional>
#include <string>

#include "absl/status/status.h"

namespace fsdp {
namespace internal {

// The steps of FullyShard's second phase, in the order each new unit goes through them.
// The hook runs right after the step took effect, so a fault at a step leaves that
// step's changes for the rollback to undo.
enum class WrapStep {
  kFlatten,      // the unit's parameters now view its FlatParameter's full buffer
  kCreateUnit,   // the unit exists and holds only the rank's shard
  kAttachHooks,  // the unit's hooks are registered on its root module
  kRegister,     // the unit is in the WrapperRegistry (and claims its root module)
};
inline constexpr WrapStep kAllWrapSteps[] = {WrapStep::kFlatten, WrapStep::kCreateUnit,
                                             WrapStep::kAttachHooks, WrapStep::kRegister};

// "flatten", "create unit", "attach hooks", "register".
std::string WrapStepName(WrapStep step);

// Called with the index of the new unit (0-based, in plan order: children before
// parents, existing units not counted) and the step it just finished; a non-OK status
// fails the wrap there, as if the step itself had failed.
using WrapFaultHook = std::function<absl::Status(int unit_index, WrapStep step)>;

// Installs `hook` for FullyShard calls made on the calling thread (null removes it) and
// returns the hook installed before.
WrapFaultHook SetWrapFaultHookForThisThread(WrapFaultHook hook);

// What FullyShard calls after each step: the hook's status, or OK without a hook.
absl::Status CheckWrapFault(int unit_index, WrapStep step);

}  // namespace internal
}  // namespace fsdp

#endif  // FSDP_INTERNAL_WRAP_FAULT_H_
