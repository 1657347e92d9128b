#include "fsdp/summon.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "fsdp/internal/unit_agreement.h"
#include "glog/logging.h"

namespace fsdp {

FullParamsScope::FullParamsScope(std::vector<std::shared_ptr<Unit>> units, bool writeback,
                                 bool holds_full)
    : units_(std::move(units)), writeback_(writeback), holds_full_(holds_full) {}

FullParamsScope::~FullParamsScope() {
  absl::Status s = Close();
  if (!s.ok()) LOG(ERROR) << "fsdp::FullParamsScope closed with an error: " << s;
}

absl::Status FullParamsScope::Close() {
  if (!open_) return absl::OkStatus();
  open_ = false;
  absl::Status first;
  for (const auto& u : units_) {
    absl::Status s;
    if (u->state() == UnitState::kUnsharded) {
      if (writeback_) s = u->WriteBackLocalChunk();
      if (s.ok()) s = u->Reshard();
    }
    u->set_summoned(false);
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

namespace {

// SummonFullParams' checks on this rank; the units to gather.
absl::StatusOr<std::vector<std::shared_ptr<Unit>>> CheckSummonable(core::Module& module,
                                                                   WrapperRegistry* registry,
                                                                   const std::string& prefix) {
  ASSIGN_OR_RETURN(
      std::vector<std::shared_ptr<Unit>> units,
      registry->UnitsForOperation(module, prefix, "cannot summon", "summon that unit's root"));
  for (const auto& u : units) {
    RETURN_IF_ERROR(u->CheckUsable("summon full parameters"));
    if (u->summoned()) {
      return absl::FailedPreconditionError(
          absl::StrCat(prefix, "unit ", u->label(), " is already inside SummonFullParams"));
    }
  }
  return units;
}

}  // namespace

absl::StatusOr<std::unique_ptr<FullParamsScope>> SummonFullParams(core::Module& module,
                                                                  WrapperRegistry* registry,
                                                                  const SummonOptions& options) {
  const std::string prefix = absl::StrCat("SummonFullParams(", module.Describe(), "): ");
  if (registry == nullptr) return absl::InvalidArgumentError(prefix + "the registry is null");
  if (options.writeback && options.rank0_only) {
    return absl::InvalidArgumentError(
        prefix +
        "SummonOptions.writeback cannot be combined with SummonOptions.rank0_only: "
        "ranks other than 0 hold no full values to write back");
  }
  // Checks on this rank, then every rank agrees (NOTE [Agree before acting] in
  // fsdp/internal/unit_agreement.h) before the gathers.
  absl::StatusOr<std::vector<std::shared_ptr<Unit>>> units =
      CheckSummonable(module, registry, prefix);
  RETURN_IF_ERROR(internal::AgreeAcrossUnitGroups(
      module, registry, units.status(), absl::StrCat("SummonFullParams(", module.Describe(), ")")));
  RETURN_IF_ERROR(registry->runtime().FinishAllReductions());
  // Issue every all-gather first, then wait: the gathers overlap.
  for (const auto& u : *units) {
    if (u->state() == UnitState::kUnsharding) RETURN_IF_ERROR(u->FinishUnshard());
    if (u->state() == UnitState::kUnsharded && !u->full_is_exact()) RETURN_IF_ERROR(u->Reshard());
    if (u->state() == UnitState::kSharded)
      RETURN_IF_ERROR(u->IssueUnshard(/*full_precision=*/true));
  }
  bool holds_full = true;
  for (const auto& u : *units) {
    if (u->state() == UnitState::kUnsharding) RETURN_IF_ERROR(u->FinishUnshard());
    if (options.rank0_only && u->groups().world->rank() != 0) {
      RETURN_IF_ERROR(u->Reshard());
      holds_full = false;
    }
    u->set_summoned(true);
  }
  return std::make_unique<FullParamsScope>(*std::move(units), options.writeback, holds_full);
}

}  // namespace fsdp
