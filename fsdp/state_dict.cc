#include "fsdp/state_dict.h"

#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "fsdp/internal/unit_agreement.h"
#include "fsdp/summon.h"

namespace fsdp {
namespace {

// Where a parameter lives: its unit and record, or neither for an unmanaged one.
struct Location {
  std::shared_ptr<Unit> unit;
  const flatten::ParamRecord* record = nullptr;
};

absl::StatusOr<std::map<const core::Parameter*, Location>> Locate(core::Module& module,
                                                                  WrapperRegistry* registry,
                                                                  const std::string& prefix) {
  if (registry == nullptr) return absl::InvalidArgumentError(prefix + "the registry is null");
  ASSIGN_OR_RETURN(
      std::vector<std::shared_ptr<Unit>> units,
      registry->UnitsForOperation(module, prefix, "not allowed", "use that unit's root"));
  std::map<const core::Parameter*, Location> out;
  for (const auto& u : units) {
    RETURN_IF_ERROR(u->CheckUsable("use a state dict"));
    if (u->summoned()) {
      return absl::FailedPreconditionError(
          absl::StrCat(prefix, "unit ", u->label(), " is inside SummonFullParams"));
    }
    for (size_t i = 0; i < u->flat().records().size(); ++i) {
      out[u->flat().params()[i].get()] = Location{u, &u->flat().records()[i]};
    }
  }
  return out;
}

// Reshards units an evaluation forward left unsharded, so their shards are the truth.
absl::Status ReshardAll(const std::map<const core::Parameter*, Location>& where) {
  std::set<Unit*> done;
  for (const auto& [p, loc] : where) {
    if (!done.insert(loc.unit.get()).second) continue;
    if (loc.unit->state() == UnitState::kUnsharding || loc.unit->state() == UnitState::kUnsharded) {
      RETURN_IF_ERROR(loc.unit->Reshard());
    }
  }
  return absl::OkStatus();
}

// The entries of `dict` by name; InvalidArgument for a repeated or unexpected key.
template <typename Entry, typename NameOf>
absl::StatusOr<std::map<std::string, const Entry*>> Index(
    const std::vector<Entry>& dict, const std::vector<core::NamedParameter>& params, NameOf name_of,
    const std::string& prefix) {
  std::set<std::string> expected;
  for (const auto& [name, p] : params) expected.insert(name);
  std::map<std::string, const Entry*> out;
  for (const Entry& e : dict) {
    const std::string& name = name_of(e);
    if (!expected.count(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "unexpected key '", name, "': the module has no such parameter"));
    }
    if (!out.emplace(name, &e).second) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, "key '", name, "' appears twice"));
    }
  }
  for (const auto& [name, p] : params) {
    if (!out.count(name)) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, "missing key '", name, "'"));
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<StateDict> FullStateDict(core::Module& module, WrapperRegistry* registry,
                                        const FullStateDictOptions& options) {
  SummonOptions summon;
  summon.writeback = false;
  summon.rank0_only = options.rank0_only;
  ASSIGN_OR_RETURN(std::unique_ptr<FullParamsScope> scope,
                   SummonFullParams(module, registry, summon));
  StateDict out;
  if (scope->holds_full()) {
    for (const auto& [name, p] : module.NamedParameters()) {
      ASSIGN_OR_RETURN(core::Tensor copy,
                       p->data.ToDType(core::DType::kFloat32, core::MemoryTag::kOther));
      out.emplace_back(name, std::move(copy));
    }
  }
  RETURN_IF_ERROR(scope->Close());
  return out;
}

absl::StatusOr<std::vector<ShardedTensor>> ShardedStateDict(core::Module& module,
                                                            WrapperRegistry* registry) {
  const std::string prefix = absl::StrCat("ShardedStateDict(", module.Describe(), "): ");
  ASSIGN_OR_RETURN(auto where, Locate(module, registry, prefix));
  std::vector<ShardedTensor> out;
  for (const auto& [name, p] : module.NamedParameters()) {
    ShardedTensor t;
    t.name = name;
    auto it = where.find(p.get());
    if (it == where.end()) {
      if (p->deferred()) {
        return absl::FailedPreconditionError(absl::StrCat(
            prefix, "parameter '", name,
            "' is deferred and not materialized (NOTE [Deferred "
            "initialisation] in core/param_init.h): wrap the model with FullyShard first, then "
            "its shards are saved or loaded"));
      }
      t.full_shape = p->data.shape();
      t.end = p->data.numel();
      t.replicated = true;
      ASSIGN_OR_RETURN(core::Tensor copy,
                       p->data.ToDType(core::DType::kFloat32, core::MemoryTag::kOther));
      t.local = copy.Flat();
    } else {
      const Unit& unit = *it->second.unit;
      const flatten::ParamRecord& rec = *it->second.record;
      const flatten::ShardSlice& slice = rec.shards[unit.groups().shard_rank];
      t.full_shape = rec.shape;
      t.begin = slice.begin;
      t.end = slice.end;
      t.unit = unit.label();
      t.flat_offset = rec.offset + slice.begin;
      t.shard_rank = unit.groups().shard_rank;
      t.shard_size = unit.groups().shard_size;
      t.replicated = t.shard_size == 1;
      ASSIGN_OR_RETURN(core::Tensor part,
                       unit.flat().shard().View(slice.shard_offset, {slice.numel()}));
      ASSIGN_OR_RETURN(t.local, part.ToDType(core::DType::kFloat32, core::MemoryTag::kOther));
    }
    out.push_back(std::move(t));
  }
  return out;
}

namespace {

// One value a load copies: into an unmanaged parameter whole (`param`), or into a
// unit's shard from `shard_offset` on (`unit`).
struct Write {
  core::Parameter* param = nullptr;
  std::shared_ptr<Unit> unit;
  int64_t shard_offset = 0;
  core::Tensor values;
};

struct LoadPlan {
  std::map<const core::Parameter*, Location> where;
  std::vector<Write> writes;
};

// The write of `values` (a parameter's elements [begin, end), or all of an unmanaged
// one) for `p`; none when this rank holds no element of it.
void AddWrite(const std::map<const core::Parameter*, Location>& where, const core::ParameterPtr& p,
              core::Tensor values, std::vector<Write>* writes) {
  auto it = where.find(p.get());
  if (it == where.end()) {
    writes->push_back(Write{p.get(), nullptr, 0, std::move(values)});
    return;
  }
  const Unit& unit = *it->second.unit;
  const flatten::ShardSlice& slice = it->second.record->shards[unit.groups().shard_rank];
  if (slice.empty()) return;
  writes->push_back(Write{nullptr, it->second.unit, slice.shard_offset, std::move(values)});
}

// Validates a full dict against this rank's module and plans its writes.
absl::StatusOr<LoadPlan> PlanFullLoad(core::Module& module, WrapperRegistry* registry,
                                      const StateDict& dict, const std::string& prefix) {
  LoadPlan plan;
  ASSIGN_OR_RETURN(plan.where, Locate(module, registry, prefix));
  const std::vector<core::NamedParameter> params = module.NamedParameters();
  using Entry = std::pair<std::string, core::Tensor>;
  ASSIGN_OR_RETURN(
      auto index,
      Index<Entry>(
          dict, params, [](const Entry& e) -> const std::string& { return e.first; }, prefix));
  for (const auto& [name, p] : params) {
    const core::Tensor& v = index.at(name)->second;
    auto it = plan.where.find(p.get());
    const core::Shape& shape = it == plan.where.end() ? p->data.shape() : it->second.record->shape;
    if (!v.defined() || v.shape() != shape ||
        (v.dtype() != core::DType::kFloat32 && v.dtype() != core::DType::kBFloat16)) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "key '", name, "' holds ", v.defined() ? v.ToString() : "an undefined tensor",
          " but the parameter is float32 ", core::ShapeToString(shape)));
    }
    core::Tensor values = v;
    if (it != plan.where.end()) {
      const Unit& unit = *it->second.unit;
      const flatten::ShardSlice& slice = it->second.record->shards[unit.groups().shard_rank];
      if (slice.empty()) continue;
      absl::StatusOr<core::Tensor> part = v.Flat().View(slice.begin, {slice.numel()});
      if (!part.ok()) {
        return core::Annotate(part.status(), absl::StrCat(prefix, "key '", name, "'"));
      }
      values = *std::move(part);
    }
    AddWrite(plan.where, p, std::move(values), &plan.writes);
  }
  return plan;
}

// Validates this rank's sharded dict against its module and plans its writes.
absl::StatusOr<LoadPlan> PlanShardedLoad(core::Module& module, WrapperRegistry* registry,
                                         const std::vector<ShardedTensor>& dict,
                                         const std::string& prefix) {
  LoadPlan plan;
  ASSIGN_OR_RETURN(plan.where, Locate(module, registry, prefix));
  const std::vector<core::NamedParameter> params = module.NamedParameters();
  ASSIGN_OR_RETURN(
      auto index, Index<ShardedTensor>(
                      dict, params,
                      [](const ShardedTensor& e) -> const std::string& { return e.name; }, prefix));
  for (const auto& [name, p] : params) {
    const ShardedTensor& t = *index.at(name);
    auto it = plan.where.find(p.get());
    core::Shape shape = p->data.shape();
    int64_t begin = 0, end = p->data.numel();
    int shard_rank = 0, shard_size = 1;
    if (it != plan.where.end()) {
      const Unit& unit = *it->second.unit;
      const flatten::ShardSlice& slice = it->second.record->shards[unit.groups().shard_rank];
      shape = it->second.record->shape;
      begin = slice.begin;
      end = slice.end;
      shard_rank = unit.groups().shard_rank;
      shard_size = unit.groups().shard_size;
    }
    if (t.full_shape != shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "key '", name, "' has full shape ", core::ShapeToString(t.full_shape),
          " but the parameter is ", core::ShapeToString(shape)));
    }
    if (t.begin != begin || t.end != end || t.shard_rank != shard_rank ||
        t.shard_size != shard_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "key '", name, "' was saved as elements [", t.begin, ", ", t.end,
                       ") on shard rank ", t.shard_rank, " of ", t.shard_size,
                       ", but this rank holds [", begin, ", ", end, ") on shard rank ", shard_rank,
                       " of ", shard_size, "; a different layout: load a full state dict instead"));
    }
    if (!t.local.defined() || t.local.numel() != end - begin ||
        (t.local.dtype() != core::DType::kFloat32 && t.local.dtype() != core::DType::kBFloat16)) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "key '", name, "' holds ", t.local.defined() ? t.local.ToString() : "no values",
          " for the ", end - begin, " float32 elements [", begin, ", ", end, ")"));
    }
    AddWrite(plan.where, p, t.local, &plan.writes);
  }
  return plan;
}

// Reshards and copies every planned value into this rank's parameters and shards.
absl::Status ApplyLoad(const LoadPlan& plan, const std::string& what) {
  RETURN_IF_ERROR(ReshardAll(plan.where));
  for (const Write& w : plan.writes) {
    absl::Status s = w.unit != nullptr ? w.unit->WriteShard(w.shard_offset, w.values)
                                       : w.param->data.CopyFrom(w.values);
    if (!s.ok()) return core::Annotate(s, what);
  }
  return absl::OkStatus();
}

// Validate, agree, write, agree (NOTE [Agree before acting] in
// fsdp/internal/unit_agreement.h): every rank returns the same outcome, and nothing is
// written anywhere unless every rank's dict fits.
absl::Status Load(core::Module& module, WrapperRegistry* registry,
                  const absl::StatusOr<LoadPlan>& plan, const std::string& what) {
  RETURN_IF_ERROR(internal::AgreeAcrossUnitGroups(module, registry, plan.status(),
                                                  absl::StrCat(what, ", validating")));
  return internal::AgreeAcrossUnitGroups(module, registry, ApplyLoad(*plan, what),
                                         absl::StrCat(what, ", writing"));
}

}  // namespace

absl::Status LoadFullStateDict(core::Module& module, WrapperRegistry* registry,
                               const StateDict& dict) {
  const std::string what = absl::StrCat("LoadFullStateDict(", module.Describe(), ")");
  const std::string prefix = what + ": ";
  return Load(module, registry, PlanFullLoad(module, registry, dict, prefix), what);
}

absl::Status LoadShardedStateDict(core::Module& module, WrapperRegistry* registry,
                                  const std::vector<ShardedTensor>& dict) {
  const std::string what = absl::StrCat("LoadShardedStateDict(", module.Describe(), ")");
  const std::string prefix = what + ": ";
  return Load(module, registry, PlanShardedLoad(module, registry, dict, prefix), what);
}

}  // namespace fsdp
