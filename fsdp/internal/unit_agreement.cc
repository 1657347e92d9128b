#include "fsdp/internal/unit_agreement.h"

#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "comm/agreement.h"
#include "core/status_macros.h"

namespace fsdp {
namespace internal {

absl::Status AgreeAcrossUnitGroups(core::Module& module, WrapperRegistry* registry,
                                   const absl::Status& local, absl::string_view what) {
  if (registry == nullptr) return local;
  std::vector<std::shared_ptr<comm::ProcessGroup>> groups;
  absl::Duration timeout = comm::kDefaultCollectiveTimeout;
  for (const auto& unit : registry->UnitsIn(module)) {
    const std::shared_ptr<comm::ProcessGroup>& world = unit->groups().world;
    if (world == nullptr) continue;
    bool seen = false;
    for (const auto& g : groups) seen = seen || g == world;
    if (seen) continue;
    if (groups.empty()) timeout = unit->options().timeout;
    groups.push_back(world);
  }
  for (const auto& g : groups) RETURN_IF_ERROR(comm::AgreeOnStatus(g.get(), local, what, timeout));
  return local;
}

}  // namespace internal
}  // namespace fsdp
