// The named policy registry: policies that a WrapPolicyConfig (policy/config.h) or the
// plan CLI can select by name.
//
// A policy author registers a factory at namespace scope in their own .cc file, in a
// cc_library with `alwayslink = True`; linking that library into a binary is all it
// takes (see policy/examples/path_glob_policy.cc):
//
//   namespace {
//   absl::StatusOr<policy::WrapPolicyPtr> MakeEveryBlock(const policy::PolicyParams& params) {
//     RETURN_IF_ERROR(params.CheckKeys({}));
//     return policy::ModuleTypes({"TransformerBlock"});
//   }
//   POLICY_REGISTER_WRAP_POLICY("every_block", MakeEveryBlock);
//   }  // namespace
//
//   // Anywhere else:
//   ASSIGN_OR_RETURN(policy::WrapPolicyPtr p,
//                    policy::PolicyRegistry::Global().Create("every_block", {}));
//
// Built-ins, always present in Global(): "size_based" (min_num_params, excluded_types,
// force_leaf_types), "module_types" (types), "every_kth" (types, k; default 1),
// "always", "never".
//
// NOTE [Duplicate registrations]: registration runs during static initialisation, where
// an error cannot be returned and aborting would take down every binary that links the
// two libraries. So a second registration of a name is recorded, not fatal: from then on
// every Create() of that name and every CheckRegistrations() returns FailedPrecondition
// naming the name and where each registration came from. Other names keep working.
#ifndef POLICY_REGISTRY_H_
#define POLICY_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "policy/wrap_policy.h"

namespace policy {

// The parameters a factory receives: string keys, each with one or more string values
// (as written in a WrapPolicyConfig `param` or given on the command line). Getters
// convert and return InvalidArgument naming the context and the key.
class PolicyParams {
 public:
  PolicyParams() = default;
  // `context` names whose parameters these are in error messages, e.g.
  // "WrapPolicyConfig.any_of[1] (size_based)".
  explicit PolicyParams(std::string context) : context_(std::move(context)) {}

  // Appends `value` to `key`'s values.
  void Add(const std::string& key, std::string value);

  const std::string& context() const { return context_; }
  void set_context(std::string context) { context_ = std::move(context); }

  bool Has(const std::string& key) const { return values_.count(key) > 0; }

  // The keys, sorted.
  std::vector<std::string> Keys() const;

  // InvalidArgument naming the first key not in `known` (and listing `known`).
  absl::Status CheckKeys(const std::vector<std::string>& known) const;

  // The single value of `key` as an integer, or `default_value` when absent.
  // InvalidArgument for a value that is not a base-10 int64 or for several values.
  absl::StatusOr<int64_t> GetInt64(const std::string& key, int64_t default_value) const;

  // The single value of `key`, or `default_value` when absent; InvalidArgument for
  // several values.
  absl::StatusOr<std::string> GetString(const std::string& key,
                                        const std::string& default_value) const;

  // Every value of `key`, each also split at commas, empty pieces and surrounding
  // whitespace dropped ("A, B" and two values "A", "B" mean the same). Empty if absent.
  std::vector<std::string> GetList(const std::string& key) const;

 private:
  std::string context_;
  std::map<std::string, std::vector<std::string>> values_;
};

// Builds a policy from its parameters; returns InvalidArgument (naming
// params.context() and the key) for parameters it does not accept.
using PolicyFactory = std::function<absl::StatusOr<WrapPolicyPtr>(const PolicyParams& params)>;

// Maps names to factories. Thread-safe.
class PolicyRegistry {
 public:
  // An empty registry (tests use their own; programs use Global()).
  PolicyRegistry() = default;
  PolicyRegistry(const PolicyRegistry&) = delete;
  PolicyRegistry& operator=(const PolicyRegistry&) = delete;

  // The process-wide registry, holding the built-ins and everything registered with
  // POLICY_REGISTER_WRAP_POLICY in linked-in libraries.
  static PolicyRegistry& Global();

  // Adds `factory` under `name`; `where` says where the registration is (file:line) for
  // messages. Returns true if the name was new and the registration is valid; false for a
  // duplicate, an empty name or an empty factory, all of which are recorded (NOTE
  // [Duplicate registrations]). Never aborts.
  bool Register(absl::string_view name, PolicyFactory factory, absl::string_view where = "");

  // A validated policy from the factory registered under `name`. NotFound listing the
  // known names for an unknown name; FailedPrecondition for a name registered twice;
  // the factory's or Validate()'s error otherwise, prefixed with the policy name.
  absl::StatusOr<WrapPolicyPtr> Create(absl::string_view name, const PolicyParams& params) const;

  // True when `name` is registered (duplicates included).
  bool Contains(absl::string_view name) const;

  // The registered names, sorted.
  std::vector<std::string> Names() const;

  // OK when no registration failed; FailedPrecondition listing every duplicate name
  // (with where each came from) and every invalid registration otherwise.
  absl::Status CheckRegistrations() const;

 private:
  struct Entry {
    PolicyFactory factory;
    std::vector<std::string> where;  // one per registration; more than one: duplicate
  };

  mutable absl::Mutex mu_;
  std::map<std::string, Entry, std::less<>> entries_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> invalid_ ABSL_GUARDED_BY(mu_);
};

// Registers "size_based", "module_types", "always" and "never" in `registry`.
// Global() has them already.
void RegisterBuiltinPolicies(PolicyRegistry* registry);

}  // namespace policy

#define POLICY_REGISTRY_CONCAT_INNER_(a, b) a##b
#define POLICY_REGISTRY_CONCAT_(a, b) POLICY_REGISTRY_CONCAT_INNER_(a, b)
#define POLICY_REGISTRY_STRINGIFY_INNER_(x) #x
#define POLICY_REGISTRY_STRINGIFY_(x) POLICY_REGISTRY_STRINGIFY_INNER_(x)

// Registers `factory` (a PolicyFactory) under `name` in PolicyRegistry::Global() during
// static initialisation. Use at namespace scope in a .cc file of a cc_library with
// `alwayslink = True`.
#define POLICY_REGISTER_WRAP_POLICY(name, factory)                                              \
  [[maybe_unused]] static const bool POLICY_REGISTRY_CONCAT_(policy_registered_, __COUNTER__) = \
      ::policy::PolicyRegistry::Global().Register(                                              \
          name, factory, __FILE__ ":" POLICY_REGISTRY_STRINGIFY_(__LINE__))

#endif  // POLICY_REGISTRY_H_
