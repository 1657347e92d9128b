#include "fsdp/registry.h"

#include <map>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/status_macros.h"

namespace fsdp {
namespace {

// NOTE [One registry per module]: which registry holds each unit root, process-wide, so
// a wrap through another registry is refused instead of wrapping a wrapped module.
struct Claim {
  std::weak_ptr<core::Module> module;
  const WrapperRegistry* registry = nullptr;
};

absl::Mutex& ClaimsMutex() {
  static absl::Mutex* mu = new absl::Mutex;
  return *mu;
}

std::map<const core::Module*, Claim>& Claims() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ClaimsMutex()) {
  static auto* claims = new std::map<const core::Module*, Claim>;
  return *claims;
}

}  // namespace

WrapperRegistry::WrapperRegistry() : runtime_(std::make_shared<Runtime>()) {}

WrapperRegistry::~WrapperRegistry() {
  absl::MutexLock lock(&ClaimsMutex());
  for (auto it = Claims().begin(); it != Claims().end();) {
    it = it->second.registry == this ? Claims().erase(it) : std::next(it);
  }
}

bool WrapperRegistry::HeldByAnotherRegistry(const core::Module& module) const {
  absl::MutexLock lock(&ClaimsMutex());
  auto it = Claims().find(&module);
  if (it == Claims().end()) return false;
  std::shared_ptr<core::Module> live = it->second.module.lock();
  if (live == nullptr || live.get() != &module) {
    Claims().erase(it);  // the module was destroyed
    return false;
  }
  return it->second.registry != this;
}

WrapperRegistry::Entry* WrapperRegistry::Lookup(const core::Module& module) {
  auto it = entries_.find(&module);
  if (it == entries_.end()) return nullptr;
  std::shared_ptr<core::Module> live = it->second.module.lock();
  if (live == nullptr || live.get() != &module) {
    entries_.erase(it);
    return nullptr;
  }
  if (it->second.unit != nullptr && it->second.unit->state() == UnitState::kReleased) {
    it->second.unit.reset();
  }
  return &it->second;
}

void WrapperRegistry::Sweep() {
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.module.expired()) {
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
}

int WrapperRegistry::NumUnits() {
  Sweep();
  int n = 0;
  for (const auto& [ptr, entry] : entries_) {
    if (entry.unit != nullptr && entry.unit->state() != UnitState::kReleased) ++n;
  }
  return n;
}

std::shared_ptr<Unit> WrapperRegistry::FindUnit(const core::Module& module) {
  Entry* e = Lookup(module);
  return e == nullptr ? nullptr : e->unit;
}

std::shared_ptr<FullyShardHandle> WrapperRegistry::FindHandle(const core::Module& module) {
  Entry* e = Lookup(module);
  if (e == nullptr || e->handle == nullptr) return nullptr;
  if (e->handle->released()) {
    e->handle.reset();
    return nullptr;
  }
  return e->handle;
}

absl::StatusOr<std::vector<std::shared_ptr<Unit>>> WrapperRegistry::UnitsForOperation(
    core::Module& module, const std::string& prefix, const std::string& idle_what,
    const std::string& inside_hint) {
  RETURN_IF_ERROR(runtime_->CheckIdle(prefix + idle_what));
  if (std::shared_ptr<Unit> owner = OwningUnit(module)) {
    return absl::FailedPreconditionError(
        absl::StrCat(prefix, "the module is inside unit ", owner->label(), "; ", inside_hint));
  }
  return UnitsIn(module);
}

std::shared_ptr<Unit> WrapperRegistry::OwningUnit(core::Module& module) {
  Sweep();
  std::shared_ptr<Unit> best;
  size_t best_size = 0;
  for (const auto& [ptr, entry] : entries_) {
    if (ptr == &module || entry.unit == nullptr || entry.unit->state() == UnitState::kReleased) {
      continue;
    }
    std::shared_ptr<core::Module> root = entry.module.lock();
    if (root == nullptr) continue;
    const std::vector<core::NamedModule> subtree = root->NamedModules();
    bool contains = false;
    for (const auto& [path, m] : subtree) contains = contains || m.get() == &module;
    if (contains && (best == nullptr || subtree.size() < best_size)) {
      best = entry.unit;
      best_size = subtree.size();
    }
  }
  return best;
}

std::vector<std::shared_ptr<Unit>> WrapperRegistry::UnitsIn(core::Module& module) {
  std::vector<std::shared_ptr<Unit>> out;
  for (const auto& [path, m] : module.NamedModules()) {
    if (std::shared_ptr<Unit> u = FindUnit(*m)) out.push_back(std::move(u));
  }
  return out;
}

absl::StatusOr<UnitGroups> WrapperRegistry::GroupsFor(
    const std::shared_ptr<comm::ProcessGroup>& group, const FullyShardOptions& options) {
  ASSIGN_OR_RETURN(UnitGroups out, ShardingGroupsFor(group, options));
  if (!options.deterministic || group->size() == 1) return out;
  CachedTree& cached = tree_cache_[group.get()];
  if (cached.tree == nullptr || cached.parent.lock() != group) {
    absl::StatusOr<std::unique_ptr<comm::TreeReducer>> tree =
        comm::TreeReducer::Create(group, options.timeout);
    if (!tree.ok()) {
      tree_cache_.erase(group.get());
      return core::Annotate(tree.status(), "FullyShardOptions.deterministic");
    }
    cached = CachedTree{group, std::shared_ptr<comm::TreeReducer>(*std::move(tree))};
  }
  out.tree = cached.tree;
  return out;
}

absl::StatusOr<UnitGroups> WrapperRegistry::ShardingGroupsFor(
    const std::shared_ptr<comm::ProcessGroup>& group, const FullyShardOptions& options) {
  const int n = group->size();
  const int rank = group->rank();
  const int shard_size = ShardGroupSize(options, n);
  UnitGroups out;
  out.world = group;
  out.shard_size = shard_size;
  out.shard_rank = rank % shard_size;
  if (shard_size == n) {
    if (n > 1) out.shard = group;
    return out;
  }
  if (shard_size == 1) {
    if (n > 1) out.replicate = group;
    return out;
  }
  const auto key = std::make_pair(static_cast<const comm::ProcessGroup*>(group.get()), shard_size);
  auto it = group_cache_.find(key);
  if (it != group_cache_.end()) {
    if (it->second.parent.lock() == group) return it->second.groups;
    group_cache_.erase(it);
  }
  comm::SubgroupOptions sub;
  sub.timeout = options.timeout;
  // Shard groups: consecutive ranks; then replicate groups: equal index in each.
  for (int k = 0; k < n / shard_size; ++k) {
    std::vector<int> ranks;
    for (int i = 0; i < shard_size; ++i) ranks.push_back(k * shard_size + i);
    absl::StatusOr<std::shared_ptr<comm::ProcessGroup>> g = group->NewSubgroup(ranks, sub);
    if (g.ok()) {
      out.shard = *std::move(g);
    } else if (!absl::IsNotFound(g.status())) {
      return core::Annotate(g.status(), absl::StrCat("HYBRID_SHARD shard group ", k));
    }
  }
  for (int j = 0; j < shard_size; ++j) {
    std::vector<int> ranks;
    for (int k = 0; k < n / shard_size; ++k) ranks.push_back(k * shard_size + j);
    absl::StatusOr<std::shared_ptr<comm::ProcessGroup>> g = group->NewSubgroup(ranks, sub);
    if (g.ok()) {
      out.replicate = *std::move(g);
    } else if (!absl::IsNotFound(g.status())) {
      return core::Annotate(g.status(), absl::StrCat("HYBRID_SHARD replicate group ", j));
    }
  }
  group_cache_[key] = CachedGroups{group, out};
  return out;
}

void WrapperRegistry::AddUnit(const std::shared_ptr<core::Module>& module,
                              std::shared_ptr<Unit> unit) {
  Entry& e = entries_[module.get()];
  e.module = module;
  e.unit = std::move(unit);
  absl::MutexLock lock(&ClaimsMutex());
  Claims()[module.get()] = Claim{module, this};
}

void WrapperRegistry::SetHandle(const std::shared_ptr<core::Module>& module,
                                std::shared_ptr<FullyShardHandle> handle) {
  Entry& e = entries_[module.get()];
  e.module = module;
  e.handle = std::move(handle);
}

void WrapperRegistry::AddCheckpointed(const std::shared_ptr<core::Module>& module) {
  for (auto it = checkpointed_.begin(); it != checkpointed_.end();) {
    it = it->second.expired() ? checkpointed_.erase(it) : std::next(it);
  }
  checkpointed_[module.get()] = module;
}

void WrapperRegistry::RemoveCheckpointed(core::Module& module) {
  auto it = checkpointed_.find(&module);
  if (it == checkpointed_.end()) return;
  // The address may have been reused by another module once the first was destroyed.
  if (it->second.lock().get() == &module) module.set_checkpoint_activations(false);
  checkpointed_.erase(it);
}

void WrapperRegistry::Remove(const core::Module& module) {
  entries_.erase(&module);
  absl::MutexLock lock(&ClaimsMutex());
  auto it = Claims().find(&module);
  if (it != Claims().end() && it->second.registry == this) Claims().erase(it);
}

void WrapperRegistry::DropUnusedGroups() {
  Sweep();
  for (auto it = group_cache_.begin(); it != group_cache_.end();) {
    bool used = false;
    for (const auto& [ptr, entry] : entries_) {
      if (entry.unit != nullptr && entry.unit->state() != UnitState::kReleased &&
          entry.unit->groups().shard == it->second.groups.shard) {
        used = true;
      }
    }
    if (used && !it->second.parent.expired()) {
      ++it;
    } else {
      it = group_cache_.erase(it);
    }
  }
  for (auto it = tree_cache_.begin(); it != tree_cache_.end();) {
    bool used = false;
    for (const auto& [ptr, entry] : entries_) {
      if (entry.unit != nullptr && entry.unit->state() != UnitState::kReleased &&
          entry.unit->groups().tree == it->second.tree) {
        used = true;
      }
    }
    it = used && !it->second.parent.expired() ? std::next(it) : tree_cache_.erase(it);
  }
}

}  // namespace fsdp
