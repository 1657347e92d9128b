#include "fsdp/grad_utils.h"

#include <cmath>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "fsdp/device_ops.h"
#include "fsdp/internal/unit_agreement.h"

namespace fsdp {
namespace {

// The checks NoSync and ClipGradNorm share; returns the units of `module`.
absl::StatusOr<std::vector<std::shared_ptr<Unit>>> UnitsFor(core::Module& module,
                                                            WrapperRegistry* registry,
                                                            const std::string& prefix) {
  if (registry == nullptr) return absl::InvalidArgumentError(prefix + "the registry is null");
  return registry->UnitsForOperation(module, prefix, "not allowed", "use that unit's root");
}

// ClipGradNorm's and ScaleGrads' checks on this rank (`action` names the operation); the
// units whose gradients they change.
absl::StatusOr<std::vector<std::shared_ptr<Unit>>> CheckClippable(core::Module& module,
                                                                  WrapperRegistry* registry,
                                                                  const std::string& prefix,
                                                                  const char* action) {
  ASSIGN_OR_RETURN(std::vector<std::shared_ptr<Unit>> units, UnitsFor(module, registry, prefix));
  for (const auto& u : units) {
    RETURN_IF_ERROR(u->CheckUsable(action));
    if (u->flat().full_grad().defined()) {
      return absl::FailedPreconditionError(
          absl::StrCat(prefix, "unit ", u->label(),
                       " holds unreduced gradients (NoSync); run a backward "
                       "outside NoSync first"));
    }
  }
  return units;
}

}  // namespace

NoSyncScope::NoSyncScope(std::vector<std::shared_ptr<Unit>> units) : units_(std::move(units)) {
  for (const auto& u : units_) {
    previous_.push_back(u->no_sync());
    u->set_no_sync(true);
  }
}

NoSyncScope::~NoSyncScope() {
  for (size_t i = 0; i < units_.size(); ++i) units_[i]->set_no_sync(previous_[i]);
}

absl::StatusOr<std::unique_ptr<NoSyncScope>> NoSync(core::Module& module,
                                                    WrapperRegistry* registry) {
  ASSIGN_OR_RETURN(std::vector<std::shared_ptr<Unit>> units,
                   UnitsFor(module, registry, absl::StrCat("NoSync(", module.Describe(), "): ")));
  return std::make_unique<NoSyncScope>(std::move(units));
}

absl::StatusOr<double> ClipGradNorm(core::Module& module, WrapperRegistry* registry,
                                    double max_norm) {
  const std::string prefix = absl::StrCat("ClipGradNorm(", module.Describe(), "): ");
  if (!(max_norm > 0) || !std::isfinite(max_norm)) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "max_norm is ", max_norm, "; it must be positive and finite"));
  }
  // Checks on this rank, then every rank agrees (NOTE [Agree before acting] in
  // fsdp/internal/unit_agreement.h) before the all-gathers.
  absl::StatusOr<std::vector<std::shared_ptr<Unit>>> checked =
      CheckClippable(module, registry, prefix, "clip gradients");
  RETURN_IF_ERROR(internal::AgreeAcrossUnitGroups(
      module, registry, checked.status(), absl::StrCat("ClipGradNorm(", module.Describe(), ")")));
  const std::vector<std::shared_ptr<Unit>>& units = *checked;
  RETURN_IF_ERROR(registry->runtime().FinishAllReductions());
  std::set<const core::Parameter*> managed;
  // Per shard group (in the units' order, the same on every rank), this rank's sum.
  std::vector<std::pair<std::shared_ptr<comm::ProcessGroup>, double>> sums;
  double local = 0;  // one-rank shard groups and unmanaged parameters
  std::vector<core::Tensor> grads;
  for (const auto& u : units) {
    double sum = 0;
    for (const core::ParameterPtr& p : u->flat().params()) {
      managed.insert(p.get());
      if (!p->grad.defined()) continue;
      ASSIGN_OR_RETURN(double sq,
                       internal::SumOfSquares(p->grad, prefix + "gradient of " + u->label()));
      sum += sq;
      grads.push_back(p->grad);
    }
    const std::shared_ptr<comm::ProcessGroup>& g = u->groups().shard;
    if (g == nullptr) {
      local += sum;
      continue;
    }
    bool found = false;
    for (auto& [group, s] : sums) {
      if (group == g) {
        s += sum;
        found = true;
      }
    }
    if (!found) sums.emplace_back(g, sum);
  }
  for (const auto& [name, p] : module.NamedParameters()) {
    if (managed.count(p.get()) || !p->grad.defined()) continue;
    ASSIGN_OR_RETURN(double sq,
                     internal::SumOfSquares(p->grad, prefix + "gradient of '" + name + "'"));
    local += sq;
    grads.push_back(p->grad);
  }
  double total = local;
  for (const auto& [group, sum] : sums) {
    // All-gather each rank's sum as two floats (high and low part, ~1e-14 relative) and
    // add them in rank order in double, so every rank gets the same total. Host tensors:
    // an NCCL group stages them through its device.
    const float hi = static_cast<float>(sum);
    const float lo = static_cast<float>(sum - static_cast<double>(hi));
    ASSIGN_OR_RETURN(core::Tensor in,
                     core::Tensor::FromVector({hi, lo}, {2}, core::MemoryTag::kComm));
    ASSIGN_OR_RETURN(
        core::Tensor out,
        core::Tensor::Allocate({2 * group->size()}, core::DType::kFloat32, core::MemoryTag::kComm));
    comm::AllGatherOptions options;
    options.timeout = units.front()->options().timeout;
    ASSIGN_OR_RETURN(std::shared_ptr<comm::Work> work, group->AllGather(in, out, options));
    RETURN_IF_ERROR(work->Wait(options.timeout));
    const float* v = out.data<float>();
    for (int r = 0; r < group->size(); ++r) total += static_cast<double>(v[2 * r]) + v[2 * r + 1];
  }
  const double norm = std::sqrt(total);
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) {
    for (const core::Tensor& g : grads) {
      RETURN_IF_ERROR(internal::Scale(g, static_cast<float>(coef), prefix + "clipping"));
    }
  }
  return norm;
}

absl::Status ScaleGrads(core::Module& module, WrapperRegistry* registry, double factor) {
  const std::string prefix = absl::StrCat("ScaleGrads(", module.Describe(), "): ");
  if (!std::isfinite(factor)) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "factor is ", factor, "; it must be finite"));
  }
  ASSIGN_OR_RETURN(std::vector<std::shared_ptr<Unit>> units,
                   CheckClippable(module, registry, prefix, "scale gradients"));
  RETURN_IF_ERROR(registry->runtime().FinishAllReductions());
  std::set<const core::Parameter*> managed;
  for (const auto& u : units) {
    for (const core::ParameterPtr& p : u->flat().params()) {
      managed.insert(p.get());
      if (p->grad.defined()) {
        RETURN_IF_ERROR(internal::Scale(p->grad, static_cast<float>(factor),
                                        prefix + "gradient of " + u->label()));
      }
    }
  }
  for (const auto& [name, p] : module.NamedParameters()) {
    if (managed.count(p.get()) || !p->grad.defined()) continue;
    RETURN_IF_ERROR(internal::Scale(p->grad, static_cast<float>(factor),
                                    prefix + "gradient of '" + name + "'"));
  }
  return absl::OkStatus();
}

}  // namespace fsdp
