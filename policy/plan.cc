#include "policy/plan.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"
#include "flatten/shard_math.h"

namespace policy {
namespace {

// One module of the tree of first registrations.
struct Node {
  const core::Module* module = nullptr;
  std::string path;
  int depth = 0;
  int parent = -1;
  std::vector<int> children;
  int ignored_root = -1;   // the ignored module this node is in (itself included), or -1
  int existing_unit = -1;  // index into options.existing_units when this is one
  bool managed = false;    // strictly inside an existing unit
  std::vector<int> homed;  // parameters whose home is this node
};

struct ParamInfo {
  core::ParameterPtr param;
  int order = -1;                  // index in root.NamedParameters()
  std::string name;                // its name there
  std::vector<std::string> names;  // every name it is reachable under
  std::vector<int> sites;          // node of each use (see Walk)
  int ignored_root = -1;           // node of the ignored module it belongs to, or -1
  int existing_unit = -1;          // existing unit that holds it, or -1
  int home = -1;
  int unit = -1;  // index into the plan's units
};

std::string Describe(const Node& node) {
  return absl::StrCat(node.path.empty() ? "<root>" : node.path, " (", node.module->TypeName(), ")");
}

class Planner {
 public:
  Planner(const core::Module& root, const WrapPolicy& policy, int world_size,
          const PlanOptions& options)
      : root_(root), policy_(policy), world_size_(world_size), options_(options) {}

  absl::StatusOr<WrapPlan> Run() {
    RETURN_IF_ERROR(flatten::CheckWorldSize(world_size_));
    RETURN_IF_ERROR(policy_.Validate());
    if (options_.checkpoint_policy != nullptr) {
      absl::Status s = options_.checkpoint_policy->Validate();
      if (!s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("PlanOptions.checkpoint_policy (",
                                                       options_.checkpoint_policy->Name(),
                                                       "): ", s.message()));
      }
    }
    BuildTree(&root_, "", -1);
    std::unordered_set<const core::Module*> on_stack;
    std::unordered_set<const core::Module*> walked;
    RETURN_IF_ERROR(Walk(&root_, "", -1, &on_stack, &walked));
    RETURN_IF_ERROR(NameParameters());
    RETURN_IF_ERROR(MarkIgnored());
    RETURN_IF_ERROR(MarkExisting());
    AssignHomes();
    plan_.set_world_size(world_size_);
    plan_.set_policy(policy_.Name());
    const std::vector<int> left = Visit(0);
    if (!left.empty()) {
      // Only possible when the root is an existing unit that does not hold them.
      std::vector<std::string> names;
      for (int p : left) names.push_back(params_[p].name);
      return absl::InvalidArgumentError(
          absl::StrCat("PlanOptions.existing_units: the root ", Describe(nodes_[0]),
                       " is an existing unit but does not hold ", absl::StrJoin(names, ", "),
                       ", and no other unit can"));
    }
    RETURN_IF_ERROR(FillUnits());
    FillIgnoredAndTied();
    FillCheckpointed();
    return std::move(plan_);
  }

 private:
  // Pre-order over first registrations, as Module::NamedModules().
  void BuildTree(const core::Module* module, const std::string& path, int parent) {
    const int index = static_cast<int>(nodes_.size());
    node_of_[module] = index;
    Node node;
    node.module = module;
    node.path = path;
    node.parent = parent;
    node.depth = parent < 0 ? 0 : nodes_[parent].depth + 1;
    nodes_.push_back(std::move(node));
    if (parent >= 0) nodes_[parent].children.push_back(index);
    for (const auto& [name, child] : module->NamedChildren()) {
      if (child == nullptr || node_of_.count(child.get())) continue;
      BuildTree(child.get(), path.empty() ? name : path + "." + name, index);
    }
  }

  // Every use of every parameter, shared modules included: a use inside a repeated
  // occurrence of a module counts at the nearest first-registration node above it
  // (`site`), since that is where the shared module runs a second time.
  absl::Status Walk(const core::Module* module, const std::string& prefix, int site,
                    std::unordered_set<const core::Module*>* on_stack,
                    std::unordered_set<const core::Module*>* walked) {
    if (walked->insert(module).second) site = node_of_.at(module);
    on_stack->insert(module);
    for (const auto& [name, p] : module->OwnParameters()) {
      if (p == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(Describe(nodes_[node_of_.at(module)]),
                                                       " registers a null parameter '", name, "'"));
      }
      auto [it, inserted] = param_of_.emplace(p.get(), static_cast<int>(params_.size()));
      if (inserted) {
        ParamInfo info;
        info.param = p;
        params_.push_back(std::move(info));
      }
      ParamInfo& info = params_[it->second];
      info.names.push_back(prefix + name);
      info.sites.push_back(site);
    }
    for (const auto& [name, child] : module->NamedChildren()) {
      if (child == nullptr || on_stack->count(child.get())) continue;
      RETURN_IF_ERROR(Walk(child.get(), prefix + name + ".", site, on_stack, walked));
    }
    on_stack->erase(module);
    return absl::OkStatus();
  }

  absl::Status NameParameters() {
    const std::vector<core::NamedParameter> named = root_.NamedParameters();
    for (int i = 0; i < static_cast<int>(named.size()); ++i) {
      auto it = param_of_.find(named[i].second.get());
      if (it == param_of_.end()) {
        return absl::InternalError(absl::StrCat("parameter ", named[i].first, " of ",
                                                Describe(nodes_[0]), " was not found in its tree"));
      }
      params_[it->second].order = i;
      params_[it->second].name = named[i].first;
    }
    for (const ParamInfo& info : params_) {
      if (info.order < 0) {
        return absl::InternalError(absl::StrCat("parameter ", info.names.front(), " of ",
                                                Describe(nodes_[0]),
                                                " is missing from NamedParameters()"));
      }
    }
    return absl::OkStatus();
  }

  void MarkIgnoredSubtree(int node, int ignored_root) {
    if (nodes_[node].ignored_root >= 0) return;  // inside an ignored module already
    nodes_[node].ignored_root = ignored_root;
    for (int child : nodes_[node].children) MarkIgnoredSubtree(child, ignored_root);
  }

  absl::Status MarkIgnored() {
    std::unordered_map<std::string, int> by_path;
    for (int i = 0; i < static_cast<int>(nodes_.size()); ++i) by_path[nodes_[i].path] = i;
    std::vector<int> ignored;
    for (const std::string& path : options_.ignored_paths) {
      auto it = by_path.find(path);
      if (it == by_path.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "PlanOptions.ignored_paths: no module at path '", path, "' in ", Describe(nodes_[0])));
      }
      if (it->second == 0) {
        return absl::InvalidArgumentError(absl::StrCat("PlanOptions.ignored_paths: the root ",
                                                       Describe(nodes_[0]), " cannot be ignored"));
      }
      ignored.push_back(it->second);
    }
    for (const core::Module* module : options_.ignored_modules) {
      auto it = node_of_.find(module);
      if (it == node_of_.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("PlanOptions.ignored_modules: ", module ? module->Describe() : "null",
                         " is not in the tree of ", Describe(nodes_[0])));
      }
      if (it->second == 0) {
        return absl::InvalidArgumentError(absl::StrCat("PlanOptions.ignored_modules: the root ",
                                                       Describe(nodes_[0]), " cannot be ignored"));
      }
      ignored.push_back(it->second);
    }
    // Outermost first (pre-order index), so a node records the highest ignored module.
    std::sort(ignored.begin(), ignored.end());
    for (int node : ignored) MarkIgnoredSubtree(node, node);
    for (ParamInfo& info : params_) {
      for (int site : info.sites) {
        if (nodes_[site].ignored_root >= 0) {
          info.ignored_root = nodes_[site].ignored_root;
          break;
        }
      }
    }
    return absl::OkStatus();
  }

  bool InSubtree(int node, int ancestor) const {
    for (int n = node; n >= 0; n = nodes_[n].parent) {
      if (n == ancestor) return true;
    }
    return false;
  }

  void MarkManaged(int node) {
    for (int child : nodes_[node].children) {
      nodes_[child].managed = true;
      MarkManaged(child);
    }
  }

  absl::Status MarkExisting() {
    for (int u = 0; u < static_cast<int>(options_.existing_units.size()); ++u) {
      const ExistingUnit& unit = options_.existing_units[u];
      auto it = node_of_.find(unit.module);
      if (it == node_of_.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "PlanOptions.existing_units[", u, "]: ", unit.module ? unit.module->Describe() : "null",
            " is not in the tree of ", Describe(nodes_[0])));
      }
      Node& node = nodes_[it->second];
      if (node.existing_unit >= 0) {
        return absl::InvalidArgumentError(absl::StrCat("PlanOptions.existing_units[", u,
                                                       "]: ", Describe(node), " is listed twice"));
      }
      if (node.ignored_root >= 0) {
        return absl::InvalidArgumentError(absl::StrCat("PlanOptions.existing_units[", u,
                                                       "]: ", Describe(node), " is ignored (",
                                                       Describe(nodes_[node.ignored_root]), ")"));
      }
      node.existing_unit = u;
      for (size_t k = 0; k < unit.params.size(); ++k) {
        const std::string where =
            absl::StrCat("PlanOptions.existing_units[", u, "] (", Describe(node), ") param ", k);
        auto p = param_of_.find(unit.params[k].get());
        if (p == param_of_.end()) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": not a parameter of ", Describe(nodes_[0])));
        }
        ParamInfo& info = params_[p->second];
        if (info.ignored_root >= 0) {
          return absl::InvalidArgumentError(absl::StrCat(where, " (", info.name, ") is ignored"));
        }
        if (info.existing_unit >= 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, " (", info.name, ") is also held by existing unit ",
              Describe(nodes_[node_of_.at(options_.existing_units[info.existing_unit].module)])));
        }
        bool reachable = false;
        for (int site : info.sites) reachable = reachable || InSubtree(site, it->second);
        if (!reachable) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, " (", info.name, ") is not used inside that module"));
        }
        info.existing_unit = u;
      }
    }
    for (int i = 0; i < static_cast<int>(nodes_.size()); ++i) {
      if (nodes_[i].existing_unit >= 0) MarkManaged(i);
    }
    return absl::OkStatus();
  }

  int Lca(int a, int b) const {
    while (nodes_[a].depth > nodes_[b].depth) a = nodes_[a].parent;
    while (nodes_[b].depth > nodes_[a].depth) b = nodes_[b].parent;
    while (a != b) {
      a = nodes_[a].parent;
      b = nodes_[b].parent;
    }
    return a;
  }

  void AssignHomes() {
    for (int i = 0; i < static_cast<int>(params_.size()); ++i) {
      ParamInfo& info = params_[i];
      int home = info.sites.front();
      for (int site : info.sites) home = Lca(home, site);
      info.home = home;
      if (info.ignored_root < 0 && info.existing_unit < 0) nodes_[home].homed.push_back(i);
    }
  }

  WrapContext Context(int index, int64_t pending_numel) const {
    const Node& node = nodes_[index];
    WrapContext context;
    context.path = node.path;
    context.type_name = node.module->TypeName();
    context.depth = node.depth;
    std::unordered_set<const core::Parameter*> seen;
    for (const auto& [name, p] : node.module->OwnParameters()) {
      if (!seen.insert(p.get()).second) continue;
      if (params_[param_of_.at(p.get())].ignored_root >= 0) continue;
      context.own_numel += p->data.numel();
    }
    context.unwrapped_subtree_numel = pending_numel;
    for (int a = node.parent; a >= 0; a = nodes_[a].parent) {
      context.ancestor_types.push_back(nodes_[a].module->TypeName());
    }
    std::reverse(context.ancestor_types.begin(), context.ancestor_types.end());
    return context;
  }

  void AddUnit(int index, std::vector<int> members, std::string reason, bool existing) {
    const int unit = plan_.units_size();
    WrapUnit* out = plan_.add_units();
    out->set_path(nodes_[index].path);
    out->set_type_name(nodes_[index].module->TypeName());
    out->set_depth(nodes_[index].depth);
    out->set_reason(std::move(reason));
    out->set_existing(existing);
    for (int m : members) params_[m].unit = unit;
    unit_node_.push_back(index);
  }

  // Post-order; returns the parameters still pending after this subtree.
  std::vector<int> Visit(int index) {
    Node& node = nodes_[index];
    if (node.ignored_root >= 0) return {};
    std::vector<int> pending = node.homed;
    for (int child : node.children) {
      std::vector<int> up = Visit(child);
      pending.insert(pending.end(), up.begin(), up.end());
    }
    if (node.existing_unit >= 0) {
      std::vector<int> held;
      for (int i = 0; i < static_cast<int>(params_.size()); ++i) {
        if (params_[i].existing_unit == node.existing_unit) held.push_back(i);
      }
      AddUnit(index, std::move(held), "existing unit", /*existing=*/true);
      return pending;
    }
    if (index == 0) {
      AddUnit(index, std::move(pending), "root", /*existing=*/false);
      return {};
    }
    if (node.managed || pending.empty()) return pending;
    int64_t numel = 0;
    for (int p : pending) numel += params_[p].param->data.numel();
    const WrapContext context = Context(index, numel);
    if (policy_.ShouldWrap(*node.module, context)) {
      AddUnit(index, std::move(pending), policy_.Explain(*node.module, context),
              /*existing=*/false);
      return {};
    }
    return pending;
  }

  absl::Status FillUnits() {
    std::vector<std::vector<int>> members(plan_.units_size());
    for (int i = 0; i < static_cast<int>(params_.size()); ++i) {
      if (params_[i].unit >= 0) members[params_[i].unit].push_back(i);
    }
    PlanTotals* totals = plan_.mutable_totals();
    for (int u = 0; u < plan_.units_size(); ++u) {
      std::sort(members[u].begin(), members[u].end(),
                [this](int a, int b) { return params_[a].order < params_[b].order; });
      WrapUnit* unit = plan_.mutable_units(u);
      int64_t numel = 0;
      for (int m : members[u]) {
        unit->add_param_names(params_[m].name);
        numel += params_[m].param->data.numel();
      }
      ASSIGN_OR_RETURN(const int64_t padded, flatten::PaddedNumel(numel, world_size_));
      const int64_t shard = padded / world_size_;
      unit->set_numel(numel);
      unit->set_padded_numel(padded);
      unit->set_shard_numel(shard);
      // NOTE [Plan memory accounting] in plan.proto.
      UnitMemory* fp32 = unit->mutable_fp32();
      fp32->set_params_bytes(4 * shard);
      fp32->set_grads_bytes(4 * shard);
      fp32->set_optim_bytes(8 * shard);
      fp32->set_total_bytes(16 * shard);
      fp32->set_gathered_params_bytes(4 * padded);
      UnitMemory* mixed = unit->mutable_bf16_mixed();
      mixed->set_params_bytes(2 * shard);
      mixed->set_grads_bytes(2 * shard);
      mixed->set_optim_bytes(12 * shard);
      mixed->set_total_bytes(16 * shard);
      mixed->set_gathered_params_bytes(2 * padded);

      totals->set_numel(totals->numel() + numel);
      totals->set_padded_numel(totals->padded_numel() + padded);
      totals->set_per_rank_fp32_bytes(totals->per_rank_fp32_bytes() + fp32->total_bytes());
      totals->set_per_rank_bf16_mixed_bytes(totals->per_rank_bf16_mixed_bytes() +
                                            mixed->total_bytes());
      totals->set_max_gathered_fp32_bytes(
          std::max(totals->max_gathered_fp32_bytes(), fp32->gathered_params_bytes()));
      totals->set_max_gathered_bf16_bytes(
          std::max(totals->max_gathered_bf16_bytes(), mixed->gathered_params_bytes()));
    }
    totals->set_unsharded_fp32_bytes(16 * totals->numel());
    totals->set_unsharded_bf16_mixed_bytes(16 * totals->numel());
    return absl::OkStatus();
  }

  void FillIgnoredAndTied() {
    std::vector<int> by_order(params_.size());
    for (int i = 0; i < static_cast<int>(params_.size()); ++i) by_order[params_[i].order] = i;
    PlanTotals* totals = plan_.mutable_totals();
    for (int i : by_order) {
      const ParamInfo& info = params_[i];
      if (info.ignored_root >= 0) {
        IgnoredParameter* ignored = plan_.add_ignored();
        ignored->set_name(info.name);
        ignored->set_numel(info.param->data.numel());
        ignored->set_ignored_module(nodes_[info.ignored_root].path);
        totals->set_ignored_numel(totals->ignored_numel() + info.param->data.numel());
      }
      if (info.names.size() < 2) continue;
      TiedParameter* tied = plan_.add_tied();
      for (const std::string& name : info.names) tied->add_names(name);
      tied->set_lca_path(nodes_[info.home].path);
      std::vector<std::string> others(info.names.begin() + 1, info.names.end());
      const std::string what =
          absl::StrCat("tied parameter ", info.name, " (also ", absl::StrJoin(others, ", "), ")");
      if (info.ignored_root >= 0) {
        tied->set_note(
            absl::StrCat(what, " is ignored, with ", Describe(nodes_[info.ignored_root])));
        continue;
      }
      const Node& unit = nodes_[unit_node_[info.unit]];
      tied->set_unit_path(unit.path);
      if (info.existing_unit >= 0) {
        tied->set_note(absl::StrCat(what, " stays in existing unit ", Describe(unit),
                                    ", which already holds it; lowest common ancestor of its "
                                    "uses: ",
                                    Describe(nodes_[info.home])));
      } else {
        tied->set_note(absl::StrCat(what, " placed in unit ", Describe(unit),
                                    ", their lowest common ancestor unit (lowest common "
                                    "ancestor module: ",
                                    Describe(nodes_[info.home]), ")"));
      }
    }
  }

  // PlanOptions::checkpoint_policy over the tree, in pre-order (node index order).
  void FillCheckpointed() {
    const WrapPolicy* checkpoint = options_.checkpoint_policy;
    if (checkpoint == nullptr) return;
    plan_.set_checkpoint_policy(checkpoint->Name());
    // Managed elements homed in each subtree (children have higher indices).
    std::vector<int64_t> subtree(nodes_.size(), 0);
    for (int i = static_cast<int>(nodes_.size()) - 1; i >= 0; --i) {
      for (int p : nodes_[i].homed) subtree[i] += params_[p].param->data.numel();
      if (nodes_[i].parent >= 0) subtree[nodes_[i].parent] += subtree[i];
    }
    for (int i = 1; i < static_cast<int>(nodes_.size()); ++i) {
      const Node& node = nodes_[i];
      if (node.ignored_root >= 0 || node.managed || node.existing_unit >= 0) continue;
      const WrapContext context = Context(i, subtree[i]);
      if (!checkpoint->ShouldWrap(*node.module, context)) continue;
      CheckpointedModule* out = plan_.add_checkpointed();
      out->set_path(node.path);
      out->set_type_name(node.module->TypeName());
      out->set_reason(checkpoint->Explain(*node.module, context));
    }
  }

  const core::Module& root_;
  const WrapPolicy& policy_;
  const int world_size_;
  const PlanOptions& options_;

  std::vector<Node> nodes_;
  std::unordered_map<const core::Module*, int> node_of_;
  std::vector<ParamInfo> params_;
  std::unordered_map<const core::Parameter*, int> param_of_;
  std::vector<int> unit_node_;  // node of each plan unit
  WrapPlan plan_;
};

// ---- Fingerprints: NOTE [Plan fingerprint encoding] in plan.h. ----

class Fnv1a64 {
 public:
  void Bytes(const void* data, size_t n) {
    const unsigned char* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) {
      hash_ ^= p[i];
      hash_ *= 0x100000001b3ull;
    }
  }
  // 8 bytes, least significant first, whatever the host's byte order.
  void U64(uint64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
    Bytes(b, 8);
  }
  void I64(int64_t v) { U64(static_cast<uint64_t>(v)); }
  // Length (U64) then the bytes, so concatenations cannot collide.
  void Str(const std::string& s) {
    U64(s.size());
    Bytes(s.data(), s.size());
  }
  uint64_t value() const { return hash_; }

 private:
  uint64_t hash_ = 0xcbf29ce484222325ull;
};

std::string UnitLabel(const WrapUnit& unit) {
  return absl::StrCat(unit.path().empty() ? "<root>" : unit.path(), " (", unit.type_name(), ")");
}

}  // namespace

absl::StatusOr<WrapPlan> Plan(const core::Module& root, const WrapPolicy& policy, int world_size,
                              const PlanOptions& options) {
  return Planner(root, policy, world_size, options).Run();
}

uint64_t UnitFingerprint(const WrapUnit& unit) {
  Fnv1a64 h;
  h.Str("policy.WrapUnit.v1");
  h.Str(unit.path());
  h.Str(unit.type_name());
  h.U64(static_cast<uint64_t>(unit.param_names_size()));
  for (const std::string& name : unit.param_names()) h.Str(name);
  h.I64(unit.numel());
  h.I64(unit.padded_numel());
  h.U64(unit.existing() ? 1 : 0);
  return h.value();
}

std::vector<uint64_t> UnitFingerprints(const WrapPlan& plan) {
  std::vector<uint64_t> out;
  for (const WrapUnit& unit : plan.units()) out.push_back(UnitFingerprint(unit));
  return out;
}

uint64_t Fingerprint(const WrapPlan& plan) {
  Fnv1a64 h;
  h.Str("policy.WrapPlan.v1");
  h.I64(plan.world_size());
  h.U64(static_cast<uint64_t>(plan.units_size()));
  for (const WrapUnit& unit : plan.units()) h.U64(UnitFingerprint(unit));
  h.U64(static_cast<uint64_t>(plan.ignored_size()));
  for (const IgnoredParameter& ignored : plan.ignored()) {
    h.Str(ignored.name());
    h.I64(ignored.numel());
  }
  return h.value();
}

std::string FirstDifference(const WrapPlan& a, const WrapPlan& b) {
  if (a.world_size() != b.world_size()) {
    return absl::StrCat("world_size ", a.world_size(), " vs ", b.world_size());
  }
  const int common = std::min(a.units_size(), b.units_size());
  for (int i = 0; i < common; ++i) {
    const WrapUnit& x = a.units(i);
    const WrapUnit& y = b.units(i);
    const std::string at = absl::StrCat("unit ", i, ": ");
    if (x.path() != y.path() || x.type_name() != y.type_name()) {
      return absl::StrCat(at, "path ", UnitLabel(x), " vs ", UnitLabel(y));
    }
    const std::string label = absl::StrCat("unit ", i, " (", UnitLabel(x), "): ");
    const int names = std::min(x.param_names_size(), y.param_names_size());
    for (int k = 0; k < names; ++k) {
      if (x.param_names(k) != y.param_names(k)) {
        return absl::StrCat(label, "parameter ", k, " ", x.param_names(k), " vs ",
                            y.param_names(k));
      }
    }
    if (x.param_names_size() != y.param_names_size()) {
      return absl::StrCat(label, x.param_names_size(), " parameters vs ", y.param_names_size());
    }
    if (x.numel() != y.numel()) return absl::StrCat(label, "numel ", x.numel(), " vs ", y.numel());
    if (x.padded_numel() != y.padded_numel()) {
      return absl::StrCat(label, "padded numel ", x.padded_numel(), " vs ", y.padded_numel());
    }
    if (x.existing() != y.existing()) {
      return absl::StrCat(label, "existing ", x.existing() ? "true" : "false", " vs ",
                          y.existing() ? "true" : "false");
    }
  }
  if (a.units_size() != b.units_size()) {
    const bool first_longer = a.units_size() > b.units_size();
    const WrapUnit& extra = first_longer ? a.units(common) : b.units(common);
    return absl::StrCat("unit ", common, ": only in the ", first_longer ? "first" : "second",
                        " plan (", UnitLabel(extra), ")");
  }
  const int ignored = std::min(a.ignored_size(), b.ignored_size());
  for (int i = 0; i < ignored; ++i) {
    if (a.ignored(i).name() != b.ignored(i).name() ||
        a.ignored(i).numel() != b.ignored(i).numel()) {
      return absl::StrCat("ignored parameter ", i, ": ", a.ignored(i).name(), " vs ",
                          b.ignored(i).name());
    }
  }
  if (a.ignored_size() != b.ignored_size()) {
    return absl::StrCat(a.ignored_size(), " ignored parameters vs ", b.ignored_size());
  }
  return "";
}

std::string FirstDifferingUnit(const WrapPlan& local, absl::Span<const uint64_t> remote) {
  const int common = std::min<int>(local.units_size(), static_cast<int>(remote.size()));
  for (int i = 0; i < common; ++i) {
    if (UnitFingerprint(local.units(i)) != remote[i]) {
      return absl::StrCat("unit ", i, " (", UnitLabel(local.units(i)), ") differs");
    }
  }
  if (local.units_size() != static_cast<int>(remote.size())) {
    return absl::StrCat("unit count ", local.units_size(), " vs ", remote.size(), "; the first ",
                        common, " units agree");
  }
  return "";
}

}  // namespace policy
