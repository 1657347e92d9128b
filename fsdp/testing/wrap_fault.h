// Test-only: makes FullyShard fail at a chosen step of a chosen new unit on the calling
// thread (fsdp/internal/wrap_fault.h), to test NOTE [Wrap rollback] (fully_shard.cc).
//
//   // In one rank thread: the second new unit fails right after its hooks are attached.
//   fsdp::testing::ScopedWrapFault fault(1, fsdp::internal::WrapStep::kAttachHooks);
//   absl::Status s = fsdp::FullyShard(model, ctx.group, options, &registry).status();
//   EXPECT_EQ(fault.hits(), 1);   // the fault really fired
#ifndef FSDP_TESTING_WRAP_FAULT_H_
#define FSDP_TESTING_WRAP_FAULT_H_

#include <memory>

#include "absl/status/status.h"
#include "fsdp/internal/wrap_fault.h"

namespace fsdp {
namespace testing {

class ScopedWrapFault {
 public:
  // While this object lives, FullyShard calls on this thread fail with `error` right
  // after `step` of the new unit `unit_index` (0-based, plan order). The hook installed
  // before is restored on destruction.
  ScopedWrapFault(int unit_index, internal::WrapStep step,
                  absl::Status error = absl::InternalError("injected wrap fault"));
  ~ScopedWrapFault();
  ScopedWrapFault(const ScopedWrapFault&) = delete;
  ScopedWrapFault& operator=(const ScopedWrapFault&) = delete;

  // How many times the fault fired.
  int hits() const { return *hits_; }

 private:
  std::shared_ptr<int> hits_;
  internal::WrapFaultHook previous_;
};

}  // namespace testing
}  // namespace fsdp

#endif  // FSDP_TESTING_WRAP_FAULT_H_
