// WrapperRegistry: which modules of this rank are FSDP units, and what each repeated wrap
// gets. Trainers keep one registry per rank across stages (fit, validate, test), so a
// stage that wraps a model the previous stage wrapped gets the existing units back
// instead of wrapping a wrapper.
//
//   fsdp::WrapperRegistry registry;                       // one per rank
//   auto first = fsdp::FullyShard(model, group, options, &registry);   // shards
//   auto again = fsdp::FullyShard(model, group, options, &registry);   // *again == *first
//   registry.counters().reuses;                           // 1
//   registry.counters().param_bytes_copied;               // unchanged by the re-wrap
//
// NOTE [Registry reuse]: entries are keyed by module identity and hold weak references
// to the modules, so a destroyed module leaves no entry (expired entries are dropped on
// every lookup). FullyShard applies these rules (DESIGN.md's table):
//   - a unit root wrapped again with equal options (FirstDifferingOption == "") and the
//     same group object: the existing handle; nothing allocated, no parameter byte
//     copied; counted in `reuses`. Policies are equal when their
//     WrapPolicy::Identity() is (what they decide), never by Name() alone;
//   - a unit root wrapped again with other options (another policy under the same name
//     included: a second policy::Lambda is never equal to the first), or another group
//     object: FailedPrecondition naming the module and the first differing option;
//   - a module whose descendants are units: those units are kept as children (the
//     planner's existing units) and the policy sees only unmanaged subtrees;
//   - a module inside another unit: FailedPrecondition naming the owning unit;
//   - after Release: the entries are gone, so a wrap is fresh;
//   - ranks that disagree on the plan: FailedPrecondition on every rank, before any
//     sharding (see fully_shard.h);
//   - a module whose subtree holds a unit root of ANOTHER live registry:
//     FailedPrecondition naming that module (NOTE [One registry per module] in
//     registry.cc): a stage that made a registry of its own would otherwise wrap a
//     wrapped module. Keep one registry per rank for every stage: stage objects share
//     it as a std::shared_ptr<WrapperRegistry> (integration::StageRunner::Create takes
//     one), so separate fit and test runners reuse the same units.
// "The same group" means the same ProcessGroup object: a group with the same name made
// again is a different connection, and units keep talking over the one they were made
// with.
//
// Not thread-safe: one registry per rank, used by that rank's thread.
#ifndef FSDP_REGISTRY_H_
#define FSDP_REGISTRY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/process_group.h"
#include "core/module.h"
#include "fsdp/handle.h"
#include "fsdp/options.h"
#include "fsdp/runtime.h"
#include "fsdp/unit.h"

namespace fsdp {

struct RegistryCounters {
  // FullyShard calls that created units (fresh wraps).
  int64_t wraps = 0;
  // FullyShard calls answered with an existing handle.
  int64_t reuses = 0;
  // Units created, over the registry's life.
  int64_t units_created = 0;
  // Units released.
  int64_t units_released = 0;
  // Parameter bytes copied by wrapping (FlatParameter::bytes_copied() of each new unit
  // when FullyShard created it); a re-wrap adds nothing.
  int64_t param_bytes_copied = 0;
};

class WrapperRegistry {
 public:
  WrapperRegistry();
  ~WrapperRegistry();
  WrapperRegistry(const WrapperRegistry&) = delete;
  WrapperRegistry& operator=(const WrapperRegistry&) = delete;

  RegistryCounters counters() const { return counters_; }
  RegistryCounters& mutable_counters() { return counters_; }

  // Live (not released, module not destroyed) units.
  int NumUnits();

  // The unit rooted at `module`, or null.
  std::shared_ptr<Unit> FindUnit(const core::Module& module);
  // The handle of the FullyShard call that wrapped `module` (or that a re-wrap of a
  // unit root created), or null.
  std::shared_ptr<FullyShardHandle> FindHandle(const core::Module& module);
  // The unit whose root is the nearest strict ancestor of `module` among units that
  // contain it, or null when `module` is inside no unit (a unit rooted at `module`
  // itself does not count).
  std::shared_ptr<Unit> OwningUnit(core::Module& module);
  // Units rooted in `module`'s subtree (itself included), in module.NamedModules()
  // order, which is the same on every rank.
  std::vector<std::shared_ptr<Unit>> UnitsIn(core::Module& module);

  // The checks every operation on a wrapped subtree (Release, SummonFullParams, state
  // dicts, NoSync, ClipGradNorm) makes first, then UnitsIn(module): FailedPrecondition
  // "<prefix><idle_what> ..." while a forward or backward is in progress, and
  // "<prefix>the module is inside unit <label>; <inside_hint>" when `module` is inside a
  // unit it is not the root of.
  absl::StatusOr<std::vector<std::shared_ptr<Unit>>> UnitsForOperation(
      core::Module& module, const std::string& prefix, const std::string& idle_what,
      const std::string& inside_hint);

  // True when `module` is a unit root of another live registry (process-wide).
  bool HeldByAnotherRegistry(const core::Module& module) const;

  // The per-rank execution state every unit of this registry shares.
  Runtime& runtime() { return *runtime_; }
  const std::shared_ptr<Runtime>& shared_runtime() const { return runtime_; }

  // The event log of runtime() (Runtime::events()).
  void RecordEvents(bool record) { runtime_->set_record_events(record); }
  const std::vector<std::string>& events() const { return runtime_->events(); }
  void ClearEvents() { runtime_->ClearEvents(); }

  // The shard and replicate groups of `strategy` over `group` (UnitGroups). For
  // HYBRID_SHARD with 1 < hybrid_shard_size < group->size() this creates subgroups
  // with NewSubgroup, a collective every rank must make in the same order, and caches
  // them per (group, size) so later wraps reuse them. With options.deterministic on more
  // than one rank, also the group's comm::TreeReducer (NOTE [Deterministic reduction]),
  // made the same way once per group.
  absl::StatusOr<UnitGroups> GroupsFor(const std::shared_ptr<comm::ProcessGroup>& group,
                                       const FullyShardOptions& options);

  // --- For FullyShard and Release (fully_shard.cc) ---
  void AddUnit(const std::shared_ptr<core::Module>& module, std::shared_ptr<Unit> unit);
  void SetHandle(const std::shared_ptr<core::Module>& module,
                 std::shared_ptr<FullyShardHandle> handle);
  // Drops the entry of `module` (its unit and handle).
  void Remove(const core::Module& module);
  // A module a wrap's checkpoint policy turned activation checkpointing on for;
  // RemoveCheckpointed (Release) turns it off again if it was.
  void AddCheckpointed(const std::shared_ptr<core::Module>& module);
  void RemoveCheckpointed(core::Module& module);
  // Drops cached subgroups that no live unit uses.
  void DropUnusedGroups();

 private:
  struct Entry {
    std::weak_ptr<core::Module> module;
    std::shared_ptr<Unit> unit;
    std::shared_ptr<FullyShardHandle> handle;
  };
  struct CachedGroups {
    std::weak_ptr<comm::ProcessGroup> parent;
    UnitGroups groups;
  };

  // The live entry of `module`, or null (dropping it if expired).
  Entry* Lookup(const core::Module& module);
  // Drops every expired entry.
  void Sweep();

  std::map<const core::Module*, Entry> entries_;
  std::map<std::pair<const comm::ProcessGroup*, int>, CachedGroups> group_cache_;
  struct CachedTree {
    std::weak_ptr<comm::ProcessGroup> parent;
    std::shared_ptr<comm::TreeReducer> tree;
  };
  std::map<const comm::ProcessGroup*, CachedTree> tree_cache_;
  // GroupsFor without the tree.
  absl::StatusOr<UnitGroups> ShardingGroupsFor(const std::shared_ptr<comm::ProcessGroup>& group,
                                               const FullyShardOptions& options);
  std::map<const core::Module*, std::weak_ptr<core::Module>> checkpointed_;
  std::shared_ptr<Runtime> runtime_;
  RegistryCounters counters_;
};

}  // namespace fsdp

#endif  // FSDP_REGISTRY_H_
