#include "fsdp/internal/wrap_fault.h"

#include <utility>

namespace fsdp {
namespace internal {
namespace {

WrapFaultHook& ThreadHook() {
  thread_local WrapFaultHook hook;
  return hook;
}

}  // namespace

std::string WrapStepName(WrapStep step) {
  switch (step) {
    case WrapStep::kFlatten:
      return "flatten";
    case WrapStep::kCreateUnit:
      return "create unit";
    case WrapStep::kAttachHooks:
      return "attach hooks";
    case WrapStep::kRegister:
      return "register";
  }
  return "unknown";
}

WrapFaultHook SetWrapFaultHookForThisThread(WrapFaultHook hook) {
  WrapFaultHook previous = std::move(ThreadHook());
  ThreadHook() = std::move(hook);
  return previous;
}

absl::Status CheckWrapFault(int unit_index, WrapStep step) {
  const WrapFaultHook& hook = ThreadHook();
  if (!hook) return absl::OkStatus();
  return hook(unit_index, step);
}

}  // namespace internal
}  // namespace fsdp
