#include "fsdp/fully_shard.h"

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "comm/agreement.h"
#include "core/status_macros.h"
#include "flatten/flat_parameter.h"
#include "fsdp/internal/host_offload.h"
#include "fsdp/internal/unit_agreement.h"
#include "fsdp/internal/wrap_fault.h"
#include "fsdp/unit.h"
#include "policy/plan.h"

namespace fsdp {
namespace {

// "FullyShard(<module>)": what FullyShard's errors name.
std::string Context(const core::Module& module) {
  return absl::StrCat("FullyShard(", module.Describe(), ")");
}

// All-gathers `local` (int32, same length on every rank) over `group`.
absl::StatusOr<std::vector<int32_t>> AllGatherInts(comm::ProcessGroup& group,
                                                   const std::vector<int32_t>& local,
                                                   absl::Duration timeout) {
  ASSIGN_OR_RETURN(
      core::Tensor in,
      core::Tensor::FromInts(local, {static_cast<int64_t>(local.size())}, core::MemoryTag::kComm));
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

// NOTE [Wrap rollback]: FullyShard works in two phases, and every rank agrees on the
// outcome of each (comm::AgreeOnStatus) before going on, so a failure on one rank
// reaches every rank as the same error, "rank r: ...", instead of leaving the others
// blocked in the next collective.
//   Phase 1 only reads: it checks the arguments and the registry and plans the units
// (CheckAndPlan). The ranks agree on its status, then on the plan (CheckPlansAgree).
//   Phase 2 changes the module, one new unit at a time in plan order: flatten, create
// the unit (which shards), attach its hooks, register it (internal::WrapStep). A
// WrapUndo records every change, starting with each affected Parameter's data, grad
// and requires_grad as they were. The ranks agree on its status; on any error (on any
// rank, or in the agreement itself) every rank rolls back: registry entries and claims
// removed, hooks removed, the new units destroyed and every Parameter pointed back at
// its original tensors (so the same storage and values, and its gradient). The module
// is then exactly as before and a later FullyShard is a fresh wrap.
//   The price is memory: the original parameter storage lives until the wrap is agreed,
// next to the shards made so far and one unit's full buffer (units are flattened and
// sharded one at a time, so the full buffers never coexist).
// A re-wrap answered from the registry (NOTE [Registry reuse]) communicates nothing.
class WrapUndo {
 public:
  explicit WrapUndo(WrapperRegistry* registry) : registry_(registry) {}
  WrapUndo(const WrapUndo&) = delete;
  WrapUndo& operator=(const WrapUndo&) = delete;
  // Rolls back unless Commit() was called.
  ~WrapUndo() { Rollback(); }

  // Records the state of `params` (each Parameter object once) before they change.
  void SaveParameters(const std::vector<core::NamedParameter>& params) {
    for (const auto& [name, p] : params) {
      if (!seen_.insert(p.get()).second) continue;
      saved_.push_back(Saved{p, p->data, p->grad, p->requires_grad});
    }
  }
  // A unit was created (its hooks, if attached, go with it).
  void Created(std::shared_ptr<Unit> unit) { units_.push_back(std::move(unit)); }
  // A registry entry (and claim) was added for `module`.
  void Registered(const core::Module* module) { registered_.push_back(module); }

  // Keeps every change; the original storage is released.
  void Commit() {
    done_ = true;
    saved_.clear();
    units_.clear();
    registered_.clear();
  }

  // Undoes every recorded change, newest first. Idempotent.
  void Rollback() {
    if (done_) return;
    done_ = true;
    for (auto it = registered_.rbegin(); it != registered_.rend(); ++it) registry_->Remove(**it);
    for (const auto& u : units_) u->RemoveHooks();
    units_.clear();  // destroys the units and their FlatParameters
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      it->param->data = it->data;
      it->param->grad = it->grad;
      it->param->requires_grad = it->requires_grad;
    }
    saved_.clear();
    registry_->DropUnusedGroups();  // subgroups made for the failed wrap
  }

 private:
  struct Saved {
    core::ParameterPtr param;
    core::Tensor data;
    core::Tensor grad;
    bool requires_grad = true;
  };
  WrapperRegistry* registry_;
  bool done_ = false;
  std::set<const core::Parameter*> seen_;
  std::vector<Saved> saved_;
  std::vector<std::shared_ptr<Unit>> units_;
  std::vector<const core::Module*> registered_;
};

// The modules of `module`'s tree by path, and its parameters by name (the plan's keys).
std::map<std::string, std::shared_ptr<core::Module>> ModulesByPath(core::Module& module) {
  std::map<std::string, std::shared_ptr<core::Module>> out;
  for (auto& [path, m] : module.NamedModules()) out.emplace(path, m);
  return out;
}
std::map<std::string, core::ParameterPtr> ParametersByName(const core::Module& module) {
  std::map<std::string, core::ParameterPtr> out;
  for (auto& [name, p] : module.NamedParameters()) out.emplace(name, p);
  return out;
}

// NOTE [Activation checkpointing] (core/module.h): turns on the plan's checkpointed
// modules, recorded in the registry so that Release turns them off again.
void ApplyCheckpointing(core::Module& module, const policy::WrapPlan& plan,
                        WrapperRegistry* registry) {
  if (plan.checkpointed().empty()) return;
  const auto modules = ModulesByPath(module);
  for (const policy::CheckpointedModule& c : plan.checkpointed()) {
    auto m = modules.find(c.path());
    if (m == modules.end()) continue;  // the planner walked the same tree
    m->second->set_checkpoint_activations(true);
    registry->AddCheckpointed(m->second);
  }
}

// What phase 1 decided on this rank: a handle from the registry, or a plan.
struct LocalPlan {
  std::shared_ptr<FullyShardHandle> reused;  // set: the answer, nothing more to do
  std::vector<std::shared_ptr<Unit>> existing;
  policy::WrapPlan plan;
};

// Phase 1 (NOTE [Wrap rollback]): argument, option and registry checks, then the plan.
// Changes nothing, except that a reuse gets its handle (and is counted).
absl::StatusOr<LocalPlan> CheckAndPlan(const std::shared_ptr<core::Module>& module,
                                       const std::shared_ptr<comm::ProcessGroup>& group,
                                       const FullyShardOptions& options, WrapperRegistry* registry,
                                       const std::string& what) {
  const std::string prefix = absl::StrCat(what, ": ");
  if (module == nullptr) return absl::InvalidArgumentError(prefix + "the module is null");
  if (registry == nullptr) return absl::InvalidArgumentError(prefix + "the registry is null");
  RETURN_IF_ERROR(core::Annotate(options.Validate(group->size()), what));
  RETURN_IF_ERROR(registry->runtime().CheckIdle(prefix + "cannot wrap"));

  LocalPlan out;
  // A unit root wrapped again (NOTE [Registry reuse]).
  if (std::shared_ptr<Unit> unit = registry->FindUnit(*module)) {
    std::shared_ptr<FullyShardHandle> handle = registry->FindHandle(*module);
    const FullyShardOptions& have = handle ? handle->options() : unit->options();
    const std::shared_ptr<comm::ProcessGroup>& have_group =
        handle ? handle->group() : unit->groups().world;
    const std::string diff = FirstDifferingOption(have, options);
    if (!diff.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat(prefix, "already a unit root with different options (", diff,
                       "); Release it first to wrap it differently"));
    }
    if (have_group != group) {
      return absl::FailedPreconditionError(absl::StrCat(
          prefix, "already a unit root over another group (option group: ", have_group->Describe(),
          " vs ", group->Describe(), "); units keep the group object they were made with"));
    }
    if (handle == nullptr) {
      // A unit another wrap created: this call gets a handle of its own for it.
      handle = std::make_shared<FullyShardHandle>(module, group, options,
                                                  std::vector<std::shared_ptr<Unit>>{unit},
                                                  registry->shared_runtime());
      registry->SetHandle(module, handle);
    }
    ++registry->mutable_counters().reuses;
    out.reused = std::move(handle);
    return out;
  }
  if (std::shared_ptr<Unit> owner = registry->OwningUnit(*module)) {
    return absl::FailedPreconditionError(
        absl::StrCat(prefix, "the module is already inside unit ", owner->label(),
                     "; wrap that unit's root instead, or Release it first"));
  }
  for (const auto& [name, m] : module->NamedModules()) {
    if (registry->HeldByAnotherRegistry(*m)) {
      return absl::FailedPreconditionError(absl::StrCat(
          prefix, m->Describe(),
          " is already a unit root of another WrapperRegistry; wrap "
          "through that registry (keep one per rank for every stage), or Release it there "
          "first"));
    }
  }

  if (options.sync_module_states) {
    for (const auto& [name, p] : module->NamedParameters()) {
      if (p->deferred()) {
        return absl::InvalidArgumentError(absl::StrCat(
            prefix, "FullyShardOptions.sync_module_states with deferred parameter '", name,
            "': deferred parameters are filled from their recipes, the same on every rank "
            "(NOTE [Deferred initialisation] in core/param_init.h); leave it off"));
      }
    }
  }
  for (const auto& [name, p] : module->NamedParameters()) {
    if (options.cpu_offload && !internal::HostOffloadOnCpuAllowed() && p->data.device().is_cpu()) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "FullyShardOptions.cpu_offload with parameter '", name,
          "' on the cpu: offload keeps the shards of a CUDA model in host memory (NOTE [CPU "
          "offload] in fsdp/options.h); move the model to a CUDA device or leave it off"));
    }
    if (options.deterministic && !p->data.device().is_cpu()) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "FullyShardOptions.deterministic with parameter '", name, "' on ",
                       p->data.device().ToString(),
                       ": the tree reduction runs on the CPU backends (NOTE "
                       "[Deterministic reduction] in fsdp/options.h)"));
    }
  }
  // Units already below `module` stay as they are.
  out.existing = registry->UnitsIn(*module);
  policy::PlanOptions plan_options;
  plan_options.ignored_paths = options.ignored_paths;
  plan_options.checkpoint_policy = options.checkpoint_policy.get();
  for (const auto& u : out.existing) {
    policy::ExistingUnit e;
    e.module = u->module_ptr();
    e.params = u->flat().params();
    plan_options.existing_units.push_back(std::move(e));
  }
  const policy::WrapPolicyPtr wrap_policy =
      options.policy != nullptr ? options.policy : policy::Never();
  absl::StatusOr<policy::WrapPlan> plan =
      policy::Plan(*module, *wrap_policy, ShardGroupSize(options, group->size()), plan_options);
  RETURN_IF_ERROR(core::Annotate(plan.status(), what));
  out.plan = *std::move(plan);
  return out;
}

// What phase 2 made on this rank.
struct Sharded {
  std::vector<std::shared_ptr<Unit>> units;  // every unit of the plan, in plan order
  int created = 0;
  int64_t bytes_copied = 0;
};

// "<prefix>unit <label> (<step>): <message>" for an injected fault.
absl::Status CheckFault(int index, internal::WrapStep step, const std::string& label,
                        const std::string& prefix) {
  absl::Status s = internal::CheckWrapFault(index, step);
  if (s.ok()) return s;
  return core::Annotate(
      s, absl::StrCat(prefix, "unit ", label, " (", internal::WrapStepName(step), ")"));
}

// Phase 2 (NOTE [Wrap rollback]) on this rank, every change recorded in `undo`.
absl::Status ShardNewUnits(const std::shared_ptr<core::Module>& module,
                           const std::shared_ptr<comm::ProcessGroup>& group,
                           const FullyShardOptions& options, const LocalPlan& local,
                           WrapperRegistry* registry, const std::string& what, WrapUndo* undo,
                           Sharded* out) {
  const std::string prefix = absl::StrCat(what, ": ");
  absl::StatusOr<UnitGroups> groups = registry->GroupsFor(group, options);
  RETURN_IF_ERROR(core::Annotate(groups.status(), what));
  const auto modules = ModulesByPath(*module);
  const auto params = ParametersByName(*module);
  std::map<const core::Module*, std::shared_ptr<Unit>> existing_by_module;
  for (const auto& u : local.existing) existing_by_module[u->module_ptr()] = u;

  for (const policy::WrapUnit& wu : local.plan.units()) {
    auto m = modules.find(wu.path());
    if (m == modules.end()) {
      return absl::InternalError(absl::StrCat(prefix, "the plan names module '", wu.path(),
                                              "', which is not in the tree"));
    }
    if (wu.existing()) {
      auto e = existing_by_module.find(m->second.get());
      if (e == existing_by_module.end()) {
        return absl::InternalError(absl::StrCat(prefix, "the plan keeps module '", wu.path(),
                                                "' as an existing unit, but it is none"));
      }
      out->units.push_back(e->second);
      continue;
    }
    const int index = out->created;
    const std::string label = m->second->Describe();
    std::vector<core::NamedParameter> unit_params;
    for (const std::string& name : wu.param_names()) {
      auto p = params.find(name);
      if (p == params.end()) {
        return absl::InternalError(absl::StrCat(prefix, "the plan names parameter '", name,
                                                "', which is not in the tree"));
      }
      unit_params.emplace_back(name, p->second);
    }
    undo->SaveParameters(unit_params);
    flatten::FlattenOptions flatten_options;
    flatten_options.label = label;
    flatten_options.shard_on_host = options.cpu_offload;
    absl::StatusOr<std::unique_ptr<flatten::FlatParameter>> flat = flatten::FlatParameter::Flatten(
        unit_params, groups->shard_size, groups->shard_rank, flatten_options);
    RETURN_IF_ERROR(core::Annotate(flat.status(), what));
    RETURN_IF_ERROR(CheckFault(index, internal::WrapStep::kFlatten, label, prefix));
    const int64_t copied = (*flat)->bytes_copied();
    absl::StatusOr<std::shared_ptr<Unit>> unit =
        Unit::Create(m->second, *std::move(flat), *groups, options);
    RETURN_IF_ERROR(core::Annotate(unit.status(), what));
    undo->Created(*unit);
    RETURN_IF_ERROR(CheckFault(index, internal::WrapStep::kCreateUnit, label, prefix));
    RETURN_IF_ERROR(core::Annotate(registry->shared_runtime()->Attach(*unit), what));
    RETURN_IF_ERROR(CheckFault(index, internal::WrapStep::kAttachHooks, label, prefix));
    registry->AddUnit(m->second, *unit);
    undo->Registered(m->second.get());
    RETURN_IF_ERROR(CheckFault(index, internal::WrapStep::kRegister, label, prefix));
    ++out->created;
    out->bytes_copied += copied;
    out->units.push_back(*std::move(unit));
  }
  return absl::OkStatus();
}

// FullyShardOptions::sync_module_states, between the plan's agreement and the sharding:
// every parameter of every new unit, in plan order, broadcast from rank 0 in place (the
// same sequence on every rank: they agreed on the plan). CheckAndPlan refused deferred
// parameters, so every parameter here has storage.
absl::Status SyncModuleStates(const std::shared_ptr<core::Module>& module,
                              const policy::WrapPlan& plan, comm::ProcessGroup& group,
                              const FullyShardOptions& options, const std::string& what) {
  const auto params = ParametersByName(*module);
  comm::BroadcastOptions broadcast;
  broadcast.root = 0;
  broadcast.timeout = options.timeout;
  for (const policy::WrapUnit& unit : plan.units()) {
    if (unit.existing()) continue;
    for (const std::string& name : unit.param_names()) {
      auto p = params.find(name);
      if (p == params.end()) continue;  // the planner walked the same tree
      const std::string where =
          absl::StrCat(what, ": sync_module_states: broadcasting '", name, "' from rank 0");
      absl::StatusOr<std::shared_ptr<comm::Work>> work =
          group.Broadcast(p->second->data, broadcast);
      RETURN_IF_ERROR(core::Annotate(work.status(), where));
      RETURN_IF_ERROR(core::Annotate((*work)->WaitHost(options.timeout), where));
    }
  }
  return absl::OkStatus();
}

// Release's checks on this rank; the units to release.
absl::StatusOr<std::vector<std::shared_ptr<Unit>>> CheckReleasable(core::Module& module,
                                                                   WrapperRegistry* registry,
                                                                   const std::string& what) {
  const std::string prefix = absl::StrCat(what, ": ");
  ASSIGN_OR_RETURN(
      std::vector<std::shared_ptr<Unit>> units,
      registry->UnitsForOperation(module, prefix, "cannot release",
                                  "release that unit's root (or an ancestor) instead"));
  if (units.empty()) {
    return absl::NotFoundError(prefix + "no FSDP unit is rooted in this module's subtree");
  }
  for (const auto& u : units) {
    if (u->summoned()) {
      return absl::FailedPreconditionError(
          absl::StrCat(prefix, "unit ", u->label(), " is inside SummonFullParams; close it first"));
    }
    RETURN_IF_ERROR(core::Annotate(u->CheckUsable("release"), what));
  }
  return units;
}

}  // namespace

absl::StatusOr<std::shared_ptr<FullyShardHandle>> FullyShard(
    const std::shared_ptr<core::Module>& module, const std::shared_ptr<comm::ProcessGroup>& group,
    const FullyShardOptions& options, WrapperRegistry* registry) {
  const std::string what = module != nullptr ? Context(*module) : "FullyShard";
  const std::string prefix = absl::StrCat(what, ": ");
  if (group == nullptr) return absl::InvalidArgumentError(prefix + "the process group is null");
  // The agreements' deadline, usable even when the options are not.
  const absl::Duration timeout =
      options.timeout > absl::ZeroDuration() ? options.timeout : comm::kDefaultCollectiveTimeout;

  // Phase 1: check and plan on every rank, then agree (NOTE [Wrap rollback]).
  absl::StatusOr<LocalPlan> local = CheckAndPlan(module, group, options, registry, what);
  if (local.ok() && local->reused != nullptr) return local->reused;
  RETURN_IF_ERROR(comm::AgreeOnStatus(group.get(), local.status(),
                                      absl::StrCat(what, ", checking and planning"), timeout));
  RETURN_IF_ERROR(CheckPlansAgree(local->plan, *group, timeout, prefix));
  if (options.sync_module_states && group->size() > 1) {
    RETURN_IF_ERROR(comm::AgreeOnStatus(
        group.get(), SyncModuleStates(module, local->plan, *group, options, what),
        absl::StrCat(what, ", sync_module_states"), timeout));
  }

  // Phase 2: shard, hook and register, bottom-up in plan order; agree; roll back on error.
  WrapUndo undo(registry);
  Sharded sharded;
  const absl::Status mine =
      ShardNewUnits(module, group, options, *local, registry, what, &undo, &sharded);
  const absl::Status agreed =
      comm::AgreeOnStatus(group.get(), mine, absl::StrCat(what, ", sharding"), timeout);
  if (!agreed.ok()) {
    undo.Rollback();
    return agreed;
  }
  undo.Commit();
  ApplyCheckpointing(*module, local->plan, registry);
  RegistryCounters& c = registry->mutable_counters();
  c.units_created += sharded.created;
  c.param_bytes_copied += sharded.bytes_copied;
  auto handle = std::make_shared<FullyShardHandle>(module, group, options, std::move(sharded.units),
                                                   registry->shared_runtime());
  registry->SetHandle(module, handle);
  ++c.wraps;
  return handle;
}

absl::Status Release(core::Module& module, WrapperRegistry* registry) {
  const std::string what = absl::StrCat("Release(", module.Describe(), ")");
  if (registry == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the registry is null"));
  }
  // Checks on this rank, then every rank agrees (NOTE [Agree before acting] in
  // fsdp/internal/unit_agreement.h) before the gathers.
  absl::StatusOr<std::vector<std::shared_ptr<Unit>>> checked =
      CheckReleasable(module, registry, what);
  RETURN_IF_ERROR(internal::AgreeAcrossUnitGroups(module, registry, checked.status(), what));
  const std::vector<std::shared_ptr<Unit>>& units = *checked;
  RETURN_IF_ERROR(core::Annotate(registry->runtime().FinishAllReductions(), what));
  // Every unit gathers (a collective), even after another failed, so ranks stay in step.
  absl::Status status;
  for (const auto& u : units) {
    const core::Module* root = u->module_ptr();
    absl::Status s = u->Release();
    if (!s.ok()) {
      if (status.ok()) status = core::Annotate(s, what);
      continue;
    }
    ++registry->mutable_counters().units_released;
    registry->Remove(*root);
  }
  if (status.ok()) {
    for (const auto& [path, m] : module.NamedModules()) {
      registry->Remove(*m);
      registry->RemoveCheckpointed(*m);
    }
  }
  registry->DropUnusedGroups();
  return status;
}

}  // namespace fsdp
