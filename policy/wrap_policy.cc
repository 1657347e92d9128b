#include "policy/wrap_policy.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"

namespace policy {

std::string WrapPolicy::Explain(const core::Module& /*module*/,
                                const WrapContext& /*context*/) const {
  return Name();
}

std::string WrapPolicy::Identity() const {
  return absl::StrCat(Name(), "@", absl::Hex(reinterpret_cast<uintptr_t>(this)));
}

namespace {

bool Contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

std::string ListToString(const std::vector<std::string>& names) {
  return absl::StrCat("[", absl::StrJoin(names, ", "), "]");
}

class SizeBasedPolicy : public WrapPolicy {
 public:
  explicit SizeBasedPolicy(SizeBasedOptions options) : options_(std::move(options)) {}

  bool ShouldWrap(const core::Module& /*module*/, const WrapContext& context) const override {
    if (context.unwrapped_subtree_numel < options_.min_num_params) return false;
    if (Contains(options_.excluded_types, context.type_name)) return false;
    for (const std::string& ancestor : context.ancestor_types) {
      if (Contains(options_.force_leaf_types, ancestor)) return false;
    }
    return true;
  }

  std::string Name() const override {
    std::string name = absl::StrCat("size_based(min_num_params=", options_.min_num_params);
    if (!options_.excluded_types.empty()) {
      absl::StrAppend(&name, ", excluded_types=", ListToString(options_.excluded_types));
    }
    if (!options_.force_leaf_types.empty()) {
      absl::StrAppend(&name, ", force_leaf_types=", ListToString(options_.force_leaf_types));
    }
    return name + ")";
  }
  std::string Identity() const override { return Name(); }

  std::string Explain(const core::Module& /*module*/, const WrapContext& context) const override {
    return absl::StrCat("size_based: ", context.unwrapped_subtree_numel,
                        " unwrapped >= min_num_params ", options_.min_num_params);
  }

  absl::Status Validate() const override {
    if (options_.min_num_params < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("size_based: min_num_params must be >= 0, got ", options_.min_num_params));
    }
    return absl::OkStatus();
  }

 private:
  SizeBasedOptions options_;
};

class ModuleTypesPolicy : public WrapPolicy {
 public:
  explicit ModuleTypesPolicy(std::vector<std::string> types) : types_(std::move(types)) {}

  bool ShouldWrap(const core::Module& /*module*/, const WrapContext& context) const override {
    return Contains(types_, context.type_name);
  }
  std::string Name() const override {
    return absl::StrCat("module_types(", absl::StrJoin(types_, ", "), ")");
  }
  std::string Identity() const override { return Name(); }
  std::string Explain(const core::Module& /*module*/, const WrapContext& context) const override {
    return absl::StrCat("module_types: type ", context.type_name);
  }

 private:
  std::vector<std::string> types_;
};

class EveryKthPolicy : public WrapPolicy {
 public:
  EveryKthPolicy(std::vector<std::string> types, int64_t k) : types_(std::move(types)), k_(k) {}

  bool ShouldWrap(const core::Module& /*module*/, const WrapContext& context) const override {
    if (k_ < 1 || !Contains(types_, context.type_name)) return false;
    const int64_t index = PathIndex(context.path);
    return index >= 0 && index % k_ == 0;
  }
  std::string Name() const override {
    return absl::StrCat("every_kth(", absl::StrJoin(types_, ", "), "; k=", k_, ")");
  }
  std::string Identity() const override { return Name(); }
  std::string Explain(const core::Module& /*module*/, const WrapContext& context) const override {
    return absl::StrCat("every_kth: type ", context.type_name, ", index ", PathIndex(context.path),
                        " % ", k_, " == 0");
  }
  absl::Status Validate() const override {
    if (k_ < 1) {
      return absl::InvalidArgumentError(absl::StrCat("every_kth: k must be >= 1, got ", k_));
    }
    if (types_.empty()) {
      return absl::InvalidArgumentError("every_kth: needs at least one type name");
    }
    return absl::OkStatus();
  }

 private:
  // The last component of a dotted path as a non-negative integer, or -1.
  static int64_t PathIndex(const std::string& path) {
    const size_t dot = path.rfind('.');
    const std::string last = dot == std::string::npos ? path : path.substr(dot + 1);
    int64_t index = 0;
    if (last.empty() || last.size() > 18 || !absl::SimpleAtoi(last, &index) || index < 0 ||
        last.find_first_not_of("0123456789") != std::string::npos) {
      return -1;
    }
    return index;
  }

  std::vector<std::string> types_;
  int64_t k_;
};

class ConstantPolicy : public WrapPolicy {
 public:
  explicit ConstantPolicy(bool value) : value_(value) {}
  bool ShouldWrap(const core::Module&, const WrapContext&) const override { return value_; }
  std::string Name() const override { return value_ ? "always" : "never"; }
  std::string Identity() const override { return Name(); }

 private:
  bool value_;
};

class LambdaPolicy : public WrapPolicy {
 public:
  LambdaPolicy(WrapPredicate predicate, std::string name)
      : predicate_(std::move(predicate)), name_(std::move(name)), serial_(NextSerial()) {}
  bool ShouldWrap(const core::Module& module, const WrapContext& context) const override {
    return predicate_ && predicate_(module, context);
  }
  std::string Name() const override { return name_; }
  // A serial number per Lambda() call, never reused (an address could be, once the
  // policy is gone).
  std::string Identity() const override { return absl::StrCat(name_, "#lambda", serial_); }
  absl::Status Validate() const override {
    if (!predicate_) {
      return absl::InvalidArgumentError(
          absl::StrCat("lambda policy '", name_, "': the predicate is empty"));
    }
    return absl::OkStatus();
  }

 private:
  static int64_t NextSerial() {
    static std::atomic<int64_t> next{1};
    return next.fetch_add(1);
  }

  WrapPredicate predicate_;
  std::string name_;
  int64_t serial_;
};

// Shared by Or and And: the children, their names and validation.
class CombinatorPolicy : public WrapPolicy {
 public:
  CombinatorPolicy(std::string op, std::vector<WrapPolicyPtr> children)
      : op_(std::move(op)), children_(std::move(children)) {}

  std::string Name() const override {
    std::vector<std::string> names;
    for (const WrapPolicyPtr& child : children_) names.push_back(child ? child->Name() : "null");
    return absl::StrCat(op_, "(", absl::StrJoin(names, ", "), ")");
  }

  std::string Identity() const override {
    std::vector<std::string> ids;
    for (const WrapPolicyPtr& child : children_) ids.push_back(child ? child->Identity() : "null");
    return absl::StrCat(op_, "(", absl::StrJoin(ids, ", "), ")");
  }

  absl::Status Validate() const override {
    for (size_t i = 0; i < children_.size(); ++i) {
      if (children_[i] == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat(op_, ": policy ", i, " of ", children_.size(), " is null"));
      }
      absl::Status s = children_[i]->Validate();
      if (!s.ok()) {
        return core::Annotate(s, absl::StrCat(op_, "[", i, "]"));
      }
    }
    return absl::OkStatus();
  }

 protected:
  std::string op_;
  std::vector<WrapPolicyPtr> children_;
};

class OrPolicy : public CombinatorPolicy {
 public:
  explicit OrPolicy(std::vector<WrapPolicyPtr> children)
      : CombinatorPolicy("or", std::move(children)) {}

  bool ShouldWrap(const core::Module& module, const WrapContext& context) const override {
    for (const WrapPolicyPtr& child : children_) {
      if (child && child->ShouldWrap(module, context)) return true;
    }
    return false;
  }
  std::string Explain(const core::Module& module, const WrapContext& context) const override {
    for (const WrapPolicyPtr& child : children_) {
      if (child && child->ShouldWrap(module, context)) return child->Explain(module, context);
    }
    return Name();
  }
};

class AndPolicy : public CombinatorPolicy {
 public:
  explicit AndPolicy(std::vector<WrapPolicyPtr> children)
      : CombinatorPolicy("and", std::move(children)) {}

  bool ShouldWrap(const core::Module& module, const WrapContext& context) const override {
    for (const WrapPolicyPtr& child : children_) {
      if (!child || !child->ShouldWrap(module, context)) return false;
    }
    return true;
  }
  std::string Explain(const core::Module& module, const WrapContext& context) const override {
    std::vector<std::string> parts;
    for (const WrapPolicyPtr& child : children_) {
      if (child) parts.push_back(child->Explain(module, context));
    }
    return absl::StrCat("and(", absl::StrJoin(parts, "; "), ")");
  }
};

class NotPolicy : public WrapPolicy {
 public:
  explicit NotPolicy(WrapPolicyPtr child) : child_(std::move(child)) {}

  bool ShouldWrap(const core::Module& module, const WrapContext& context) const override {
    return child_ && !child_->ShouldWrap(module, context);
  }
  std::string Name() const override {
    return absl::StrCat("not(", child_ ? child_->Name() : "null", ")");
  }
  std::string Identity() const override {
    return absl::StrCat("not(", child_ ? child_->Identity() : "null", ")");
  }
  absl::Status Validate() const override {
    if (child_ == nullptr) return absl::InvalidArgumentError("not: the policy is null");
    return core::Annotate(child_->Validate(), "not");
  }

 private:
  WrapPolicyPtr child_;
};

}  // namespace

WrapPolicyPtr SizeBased(SizeBasedOptions options) {
  return std::make_shared<SizeBasedPolicy>(std::move(options));
}

WrapPolicyPtr ModuleTypes(std::vector<std::string> type_names) {
  return std::make_shared<ModuleTypesPolicy>(std::move(type_names));
}

WrapPolicyPtr EveryKth(std::vector<std::string> type_names, int64_t k) {
  return std::make_shared<EveryKthPolicy>(std::move(type_names), k);
}

WrapPolicyPtr Always() { return std::make_shared<ConstantPolicy>(true); }

WrapPolicyPtr Never() { return std::make_shared<ConstantPolicy>(false); }

WrapPolicyPtr Lambda(WrapPredicate predicate, std::string name) {
  return std::make_shared<LambdaPolicy>(std::move(predicate), std::move(name));
}

WrapPolicyPtr Or(std::vector<WrapPolicyPtr> policies) {
  return std::make_shared<OrPolicy>(std::move(policies));
}

WrapPolicyPtr And(std::vector<WrapPolicyPtr> policies) {
  return std::make_shared<AndPolicy>(std::move(policies));
}

WrapPolicyPtr Not(WrapPolicyPtr policy) { return std::make_shared<NotPolicy>(std::move(policy)); }

}  // namespace policy
