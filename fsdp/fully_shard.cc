#include "fsdp/fully_shard.h"

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"
#include "flatten/flat_parameter.h"
#include "policy/plan.h"
#include "fsdp/unit.h"

namespace fsdp {
namespace {

std::string Prefix(const core::Module& module) {
  return absl::StrCat("FullyShard(", module.Describe(), "): ");
}

absl::Status Annotate(const absl::Status& s, const std::string& prefix) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(prefix, s.message()));
}

// All-gathers `local` (int32, same length on every rank) over `group`.
absl::StatusOr<std::vector<int32_t>> AllGatherInts(comm::ProcessGroup& group,
                                                   const std::vector<int32_t>& local,
                                                   absl::Duration timeout) {
  ASSIGN_OR_RETURN(core::Tensor in,
                   core::Tensor::FromInts(local, {static_cast<int64_t>(local.size())},
                                          core::MemoryTag::kComm));
  ASSIGN_OR_RETURN(core::Tensor out,
                   core::Tensor::Allocate({static_cast<int64_t>(local.size()) * group.size()},
                                          core::DType::kInt32, core::MemoryTag::kComm));
  comm::AllGatherOptions options;
  options.timeout = timeout;
  ASSIGN_OR_RETURN(std::shared_ptr<comm::Work> work, group.AllGather(in, out, options));
  RETURN_IF_ERROR(work->Wait(timeout));
  const int32_t* p = out.data<int32_t>();
  return std::vector<int32_t>(p, p + out.numel());
}

void PushU64(uint64_t v, std::vector<int32_t>* out) {
  out->push_back(static_cast<int32_t>(static_cast<uint32_t>(v & 0xffffffffu)));
  out->push_back(static_cast<int32_t>(static_cast<uint32_t>(v >> 32)));
}

uint64_t ReadU64(const int32_t* p) {
  return static_cast<uint64_t>(static_cast<uint32_t>(p[0])) |
         (static_cast<uint64_t>(static_cast<uint32_t>(p[1])) << 32);
}

// The cross-rank plan check: every rank runs the same two (or one) fixed-size
// all-gathers, so a disagreement is reported everywhere and never hangs.
absl::Status CheckPlansAgree(const policy::WrapPlan& plan, comm::ProcessGroup& group,
                             absl::Duration timeout, const std::string& prefix) {
  const int n = group.size();
  if (n == 1) return absl::OkStatus();
  std::vector<int32_t> summary = {plan.units_size()};
  PushU64(policy::Fingerprint(plan), &summary);
  ASSIGN_OR_RETURN(std::vector<int32_t> all, AllGatherInts(group, summary, timeout));
  const size_t width = summary.size();
  auto row_equal = [&](int a, int b) {
    for (size_t i = 0; i < width; ++i) {
      if (all[a * width + i] != all[b * width + i]) return false;
    }
    return true;
  };
  int bad = -1;
  int max_units = 0;
  for (int r = 0; r < n; ++r) {
    if (bad < 0 && !row_equal(r, 0)) bad = r;
    max_units = std::max(max_units, all[r * width]);
  }
  if (bad < 0) return absl::OkStatus();

  // Every rank saw the same summaries, so every rank takes this branch and gathers the
  // per-unit fingerprints, padded to the largest unit count.
  std::vector<int32_t> fps;
  for (uint64_t fp : policy::UnitFingerprints(plan)) PushU64(fp, &fps);
  fps.resize(2 * static_cast<size_t>(max_units), 0);
  ASSIGN_OR_RETURN(std::vector<int32_t> all_fps, AllGatherInts(group, fps, timeout));
  auto fingerprints_of = [&](int r) {
    std::vector<uint64_t> out;
    for (int u = 0; u < all[r * width]; ++u) {
      out.push_back(ReadU64(&all_fps[(static_cast<size_t>(r) * max_units + u) * 2]));
    }
    return out;
  };
  const int me = group.rank();
  const int other = row_equal(me, 0) ? bad : 0;
  std::string diff = policy::FirstDifferingUnit(plan, fingerprints_of(other));
  if (diff.empty()) {
    diff = "the units agree but the plans differ in their ignored parameters or world size";
  }
  return absl::FailedPreconditionError(absl::StrCat(
      prefix, "ranks disagree on the wrap plan (rank ", bad, " vs rank 0; this is rank ", me,
      ", compared with rank ", other, "): ", diff,
      ". Nothing was sharded; every rank must wrap the same model with the same policy"));
}

}  // namespace

absl::StatusOr<std::shared_ptr<FullyShardHandle>> FullyShard(
    const std::shared_ptr<core::Module>& module, const std::shared_ptr<comm::ProcessGroup>& group,
    const FullyShardOptions& options, WrapperRegistry* registry) {
  if (module == nullptr) return absl::InvalidArgumentError("FullyShard: the module is null");
  const std::string prefix = Prefix(*module);
  if (group == nullptr) return absl::InvalidArgumentError(prefix + "the process group is null");
  if (registry == nullptr) return absl::InvalidArgumentError(prefix + "the registry is null");
  RETURN_IF_ERROR(Annotate(options.Validate(group->size()), prefix));
  RETURN_IF_ERROR(registry->runtime().CheckIdle(prefix + "cannot wrap"));

  // A unit root wrapped again (NOTE [Registry reuse]).
  if (std::shared_ptr<Unit> unit = registry->FindUnit(*module)) {
    std::shared_ptr<FullyShardHandle> handle = registry->FindHandle(*module);
    const FullyShardOptions& have = handle ? handle->options() : unit->options();
    const std::shared_ptr<comm::ProcessGroup>& have_group =
        handle ? handle->group() : unit->groups().world;
    const std::string diff = FirstDifferingOption(have, options);
    if (!diff.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          prefix, "already a unit root with different options (", diff,
          "); Release it first to wrap it differently"));
    }
    if (have_group != group) {
      return absl::FailedPreconditionError(absl::StrCat(
          prefix, "already a unit root over another group (option group: ",
          have_group->Describe(), " vs ", group->Describe(),
          "); units keep the group object they were made with"));
    }
    if (handle == nullptr) {
      // A unit another wrap created: this call gets a handle of its own for it.
      handle = std::make_shared<FullyShardHandle>(module, group, options,
                                                  std::vector<std::shared_ptr<Unit>>{unit},
                                                  registry->shared_runtime());
      registry->SetHandle(module, handle);
    }
    ++registry->mutable_counters().reuses;
    return handle;
  }
  if (std::shared_ptr<Unit> owner = registry->OwningUnit(*module)) {
    return absl::FailedPreconditionError(absl::StrCat(
        prefix, "the module is already inside unit ", owner->label(),
        "; wrap that unit's root instead, or Release it first"));
  }
  for (const auto& [name, m] : module->NamedModules()) {
    if (registry->HeldByAnotherRegistry(*m)) {
      return absl::FailedPreconditionError(absl::StrCat(
          prefix, m->Describe(), " is already a unit root of another WrapperRegistry; wrap "
          "through that registry (keep one per rank for every stage), or Release it there "
          "first"));
    }
  }

  // Units already below `module` stay as they are.
  std::vector<std::shared_ptr<Unit>> existing = registry->UnitsIn(*module);
  policy::PlanOptions plan_options;
  plan_options.ignored_paths = options.ignored_paths;
  for (const auto& u : existing) {
    policy::ExistingUnit e;
    e.module = u->module_ptr();
    e.params = u->flat().params();
    plan_options.existing_units.push_back(std::move(e));
  }
  ASSIGN_OR_RETURN(UnitGroups groups, registry->GroupsFor(group, options));
  const policy::WrapPolicyPtr wrap_policy =
      options.policy != nullptr ? options.policy : policy::Never();
  absl::StatusOr<policy::WrapPlan> plan =
      policy::Plan(*module, *wrap_policy, groups.shard_size, plan_options);
  RETURN_IF_ERROR(Annotate(plan.status(), prefix));
  RETURN_IF_ERROR(CheckPlansAgree(*plan, *group, options.timeout, prefix));

  // Flatten every new unit first; roll back (unflatten) if any fails, so an error leaves
  // every parameter as it was.
  std::map<std::string, std::shared_ptr<core::Module>> modules;
  for (auto& [path, m] : module->NamedModules()) modules.emplace(path, m);
  std::map<std::string, core::ParameterPtr> params;
  for (auto& [name, p] : module->NamedParameters()) params.emplace(name, p);
  struct NewUnit {
    std::shared_ptr<core::Module> module;
    std::unique_ptr<flatten::FlatParameter> flat;
  };
  std::vector<NewUnit> fresh;
  std::vector<int> plan_slot;  // per plan unit: index into `fresh`, or -1 when existing
  auto rollback = [&fresh]() {
    for (NewUnit& u : fresh) (void)u.flat->Unflatten();
  };
  for (const policy::WrapUnit& wu : plan->units()) {
    if (wu.existing()) {
      plan_slot.push_back(-1);
      continue;
    }
    auto m = modules.find(wu.path());
    if (m == modules.end()) {
      rollback();
      return absl::InternalError(absl::StrCat(prefix, "the plan names module '", wu.path(),
                                              "', which is not in the tree"));
    }
    std::vector<core::NamedParameter> unit_params;
    for (const std::string& name : wu.param_names()) {
      auto p = params.find(name);
      if (p == params.end()) {
        rollback();
        return absl::InternalError(
            absl::StrCat(prefix, "the plan names parameter '", name, "', which is not in the tree"));
      }
      unit_params.emplace_back(name, p->second);
    }
    flatten::FlattenOptions flatten_options;
    flatten_options.label = m->second->Describe();
    absl::StatusOr<std::unique_ptr<flatten::FlatParameter>> flat = flatten::FlatParameter::Flatten(
        unit_params, groups.shard_size, groups.shard_rank, flatten_options);
    if (!flat.ok()) {
      rollback();
      return Annotate(flat.status(), prefix);
    }
    plan_slot.push_back(static_cast<int>(fresh.size()));
    fresh.push_back(NewUnit{m->second, *std::move(flat)});
  }

  // Shard, hook and register, bottom-up in plan order.
  std::vector<std::shared_ptr<Unit>> units;
  std::map<const core::Module*, std::shared_ptr<Unit>> existing_by_module;
  for (const auto& u : existing) existing_by_module[u->module_ptr()] = u;
  for (int i = 0; i < plan->units_size(); ++i) {
    if (plan_slot[i] < 0) {
      const std::string& path = plan->units(i).path();
      units.push_back(existing_by_module.at(modules.at(path).get()));
      continue;
    }
    NewUnit& nu = fresh[plan_slot[i]];
    const int64_t copied = nu.flat->bytes_copied();
    ASSIGN_OR_RETURN(std::shared_ptr<Unit> unit,
                     Unit::Create(nu.module, std::move(nu.flat), groups, options));
    RETURN_IF_ERROR(registry->shared_runtime()->Attach(unit));
    registry->AddUnit(nu.module, unit);
    RegistryCounters& c = registry->mutable_counters();
    ++c.units_created;
    c.param_bytes_copied += copied;
    units.push_back(std::move(unit));
  }
  auto handle = std::make_shared<FullyShardHandle>(module, group, options, std::move(units),
                                                   registry->shared_runtime());
  registry->SetHandle(module, handle);
  ++registry->mutable_counters().wraps;
  return handle;
}

absl::Status Release(core::Module& module, WrapperRegistry* registry) {
  const std::string prefix = absl::StrCat("Release(", module.Describe(), "): ");
  if (registry == nullptr) return absl::InvalidArgumentError(prefix + "the registry is null");
  ASSIGN_OR_RETURN(std::vector<std::shared_ptr<Unit>> units,
                   registry->UnitsForOperation(module, prefix, "cannot release",
                                               "release that unit's root (or an ancestor) instead"));
  if (units.empty()) {
    return absl::NotFoundError(prefix + "no FSDP unit is rooted in this module's subtree");
  }
  for (const auto& u : units) {
    if (u->summoned()) {
      return absl::FailedPreconditionError(absl::StrCat(
          prefix, "unit ", u->label(), " is inside SummonFullParams; close it first"));
    }
    RETURN_IF_ERROR(Annotate(u->CheckUsable("release"), prefix));
  }
  RETURN_IF_ERROR(Annotate(registry->runtime().FinishAllReductions(), prefix));
  // Every unit gathers (a collective), even after another failed, so ranks stay in step.
  absl::Status status;
  for (const auto& u : units) {
    const core::Module* root = u->module_ptr();
    absl::Status s = u->Release();
    if (!s.ok()) {
      if (status.ok()) status = Annotate(s, prefix);
      continue;
    }
    ++registry->mutable_counters().units_released;
    registry->Remove(*root);
  }
  if (status.ok()) {
    for (const auto& [path, m] : module.NamedModules()) registry->Remove(*m);
  }
  registry->DropUnusedGroups();
  return status;
}

}  // namespace fsdp
