#include "fsdp/testing/wrap_fault.h"

#include <utility>

namespace fsdp {
namespace testing {

ScopedWrapFault::ScopedWrapFault(int unit_index, internal::WrapStep step, absl::Status error)
    : hits_(std::make_shared<int>(0)) {
  std::shared_ptr<int> hits = hits_;
  previous_ = internal::SetWrapFaultHookForThisThread(
      [unit_index, step, error, hits](int index, internal::WrapStep at) {
        if (index != unit_index || at != step) return absl::OkStatus();
        ++*hits;
        return error;
      });
}

ScopedWrapFault::~ScopedWrapFault() {
  internal::SetWrapFaultHookForThisThread(std::move(previous_));
}

}  // namespace testing
}  // namespace fsdp
