#include "policy/registry.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/status_macros.h"

namespace policy {

// ---- PolicyParams ----

void PolicyParams::Add(const std::string& key, std::string value) {
  values_[key].push_back(std::move(value));
}

std::vector<std::string> PolicyParams::Keys() const {
  std::vector<std::string> keys;
  for (const auto& [key, values] : values_) keys.push_back(key);
  return keys;
}

absl::Status PolicyParams::CheckKeys(const std::vector<std::string>& known) const {
  for (const auto& [key, values] : values_) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(context_, ": unknown parameter '", key,
                       "'; accepted: ", known.empty() ? "none" : absl::StrJoin(known, ", ")));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> PolicyParams::GetString(const std::string& key,
                                                    const std::string& default_value) const {
  auto it = values_.find(key);
  if (it == values_.end()) return default_value;
  if (it->second.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(context_, ": parameter '", key, "' takes one value, got ", it->second.size()));
  }
  return it->second.front();
}

absl::StatusOr<int64_t> PolicyParams::GetInt64(const std::string& key,
                                               int64_t default_value) const {
  if (!Has(key)) return default_value;
  ASSIGN_OR_RETURN(std::string text, GetString(key, ""));
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(context_, ": parameter '", key, "' must be an integer, got '", text, "'"));
  }
  return value;
}

std::vector<std::string> PolicyParams::GetList(const std::string& key) const {
  std::vector<std::string> out;
  auto it = values_.find(key);
  if (it == values_.end()) return out;
  for (const std::string& value : it->second) {
    for (absl::string_view piece : absl::StrSplit(value, ',')) {
      piece = absl::StripAsciiWhitespace(piece);
      if (!piece.empty()) out.emplace_back(piece);
    }
  }
  return out;
}

// ---- PolicyRegistry ----

PolicyRegistry& PolicyRegistry::Global() {
  static PolicyRegistry* const registry = [] {
    auto* r = new PolicyRegistry();
    RegisterBuiltinPolicies(r);
    return r;
  }();
  return *registry;
}

bool PolicyRegistry::Register(absl::string_view name, PolicyFactory factory,
                              absl::string_view where) {
  const std::string site = where.empty() ? std::string("<unknown site>") : std::string(where);
  absl::MutexLock lock(&mu_);
  if (name.empty()) {
    invalid_.push_back(absl::StrCat("a policy with an empty name (", site, ")"));
    return false;
  }
  if (!factory) {
    invalid_.push_back(absl::StrCat("policy '", name, "' with an empty factory (", site, ")"));
    return false;
  }
  auto it = entries_.find(name);
  if (it != entries_.end()) {
    it->second.where.push_back(site);
    return false;
  }
  Entry entry;
  entry.factory = std::move(factory);
  entry.where.push_back(site);
  entries_.emplace(std::string(name), std::move(entry));
  return true;
}

namespace {

std::string DuplicateMessage(absl::string_view name, const std::vector<std::string>& where) {
  return absl::StrCat("wrap policy '", name, "' is registered ", where.size(), " times (",
                      absl::StrJoin(where, ", "), "); each name may be registered once");
}

}  // namespace

absl::StatusOr<WrapPolicyPtr> PolicyRegistry::Create(absl::string_view name,
                                                     const PolicyParams& params) const {
  PolicyFactory factory;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(name);
    if (it == entries_.end()) {
      std::vector<std::string> names;
      for (const auto& [known, entry] : entries_) names.push_back(known);
      return absl::NotFoundError(absl::StrCat("unknown wrap policy '", name, "'; known policies: ",
                                              names.empty() ? "none" : absl::StrJoin(names, ", ")));
    }
    if (it->second.where.size() > 1) {
      return absl::FailedPreconditionError(DuplicateMessage(name, it->second.where));
    }
    factory = it->second.factory;
  }
  // The factory runs outside the lock: it may itself create registered policies.
  PolicyParams named = params;
  if (named.context().empty()) named.set_context(std::string(name));
  absl::StatusOr<WrapPolicyPtr> made = factory(named);
  if (!made.ok()) return made.status();
  if (*made == nullptr) {
    return absl::InternalError(
        absl::StrCat("wrap policy '", name, "': the factory returned a null policy"));
  }
  absl::Status valid = (*made)->Validate();
  if (!valid.ok()) {
    return core::Annotate(valid, named.context());
  }
  return made;
}

bool PolicyRegistry::Contains(absl::string_view name) const {
  absl::MutexLock lock(&mu_);
  return entries_.find(name) != entries_.end();
}

std::vector<std::string> PolicyRegistry::Names() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> names;
  for (const auto& [name, entry] : entries_) names.push_back(name);
  return names;
}

absl::Status PolicyRegistry::CheckRegistrations() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> problems = invalid_;
  for (const auto& [name, entry] : entries_) {
    if (entry.where.size() > 1) problems.push_back(DuplicateMessage(name, entry.where));
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("bad wrap policy registrations: ", absl::StrJoin(problems, "; ")));
}

// ---- Built-ins ----

namespace {

absl::StatusOr<WrapPolicyPtr> MakeSizeBased(const PolicyParams& params) {
  RETURN_IF_ERROR(params.CheckKeys({"min_num_params", "excluded_types", "force_leaf_types"}));
  SizeBasedOptions options;
  ASSIGN_OR_RETURN(options.min_num_params,
                   params.GetInt64("min_num_params", options.min_num_params));
  if (options.min_num_params < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(params.context(), ": parameter 'min_num_params' must be >= 0, got ",
                     options.min_num_params));
  }
  options.excluded_types = params.GetList("excluded_types");
  options.force_leaf_types = params.GetList("force_leaf_types");
  return SizeBased(std::move(options));
}

absl::StatusOr<WrapPolicyPtr> MakeModuleTypes(const PolicyParams& params) {
  RETURN_IF_ERROR(params.CheckKeys({"types"}));
  std::vector<std::string> types = params.GetList("types");
  if (types.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(params.context(), ": parameter 'types' needs at least one type name"));
  }
  return ModuleTypes(std::move(types));
}

absl::StatusOr<WrapPolicyPtr> MakeEveryKth(const PolicyParams& params) {
  RETURN_IF_ERROR(params.CheckKeys({"types", "k"}));
  std::vector<std::string> types = params.GetList("types");
  if (types.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(params.context(), ": parameter 'types' needs at least one type name"));
  }
  ASSIGN_OR_RETURN(const int64_t k, params.GetInt64("k", 1));
  if (k < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(params.context(), ": parameter 'k' must be >= 1, got ", k));
  }
  return EveryKth(std::move(types), k);
}

absl::StatusOr<WrapPolicyPtr> MakeAlways(const PolicyParams& params) {
  RETURN_IF_ERROR(params.CheckKeys({}));
  return Always();
}

absl::StatusOr<WrapPolicyPtr> MakeNever(const PolicyParams& params) {
  RETURN_IF_ERROR(params.CheckKeys({}));
  return Never();
}

}  // namespace

void RegisterBuiltinPolicies(PolicyRegistry* registry) {
  registry->Register("size_based", MakeSizeBased, "policy/registry.cc (built-in)");
  registry->Register("module_types", MakeModuleTypes, "policy/registry.cc (built-in)");
  registry->Register("every_kth", MakeEveryKth, "policy/registry.cc (built-in)");
  registry->Register("always", MakeAlways, "policy/registry.cc (built-in)");
  registry->Register("never", MakeNever, "policy/registry.cc (built-in)");
}

}  // namespace policy
