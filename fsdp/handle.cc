#include "fsdp/handle.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace fsdp {

FullyShardHandle::FullyShardHandle(const std::shared_ptr<core::Module>& module,
                                   std::shared_ptr<comm::ProcessGroup> group,
                                   FullyShardOptions options,
                                   std::vector<std::shared_ptr<Unit>> units,
                                   std::shared_ptr<Runtime> runtime)
    : module_(module),
      label_(module->Describe()),
      group_(std::move(group)),
      options_(std::move(options)),
      runtime_(std::move(runtime)) {
  for (const auto& u : units) units_.push_back(u);
}

std::vector<std::shared_ptr<Unit>> FullyShardHandle::units() const {
  std::vector<std::shared_ptr<Unit>> out;
  for (const auto& weak : units_) {
    std::shared_ptr<Unit> u = weak.lock();
    if (u != nullptr && u->state() != UnitState::kReleased) out.push_back(std::move(u));
  }
  return out;
}

std::shared_ptr<Unit> FullyShardHandle::root_unit() const {
  std::shared_ptr<core::Module> m = module();
  for (const auto& u : units()) {
    if (m != nullptr && u->module_ptr() == m.get()) return u;
  }
  return nullptr;
}

absl::Status FullyShardHandle::Reshard() {
  if (std::shared_ptr<Runtime> runtime = runtime_.lock()) {
    RETURN_IF_ERROR(runtime->CheckIdle(absl::StrCat("FullyShardHandle(", label_, ").Reshard")));
  }
  for (const auto& u : units()) {
    if (u->summoned()) {
      return absl::FailedPreconditionError(
          absl::StrCat("FullyShardHandle(", label_, ").Reshard: unit ", u->label(),
                       " is inside SummonFullParams; close it first"));
    }
    if (u->state() == UnitState::kUnsharding || u->state() == UnitState::kUnsharded) {
      RETURN_IF_ERROR(u->Reshard());
    }
  }
  return absl::OkStatus();
}

}  // namespace fsdp
