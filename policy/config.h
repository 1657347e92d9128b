// Text-format WrapPolicyConfig (policy/policy.proto): parse it, check it, and build the
// policy it describes from a PolicyRegistry.
//
//   ASSIGN_OR_RETURN(policy::ConfiguredPolicy configured, policy::BuildPolicyFromText(R"pb(
//     any_of { name: "module_types" param { key: "types" value: "TransformerBlock" } }
//     any_of { name: "size_based" param { key: "min_num_params" value: "1000000" } }
//     ignored_modules: "wpe"
//   )pb"));
//   policy::PlanOptions options;
//   options.ignored_paths = configured.ignored_paths;
//   ASSIGN_OR_RETURN(policy::WrapPlan plan,
//                    policy::Plan(*model, *configured.policy, /*world_size=*/8, options));
//
// Errors are InvalidArgument: syntax errors say "line L, column C" (both 1-based, at the
// token where protobuf's parser stopped: for an unknown field, the token after its name);
// semantic errors name the option by its path in the config, such as
// "WrapPolicyConfig.any_of[1] (size_based): unknown parameter 'min_params'". An unknown
// policy name is NotFound listing the registered names.
#ifndef POLICY_CONFIG_H_
#define POLICY_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "policy/policy.pb.h"
#include "policy/registry.h"
#include "policy/wrap_policy.h"

namespace policy {

// What a config selects: the policy and the module paths to ignore.
struct ConfiguredPolicy {
  WrapPolicyPtr policy;
  std::vector<std::string> ignored_paths;
};

// Parses text format. InvalidArgument "WrapPolicyConfig: line L, column C: <what>" for
// the first syntax error (unknown fields included); no semantic checks.
absl::StatusOr<WrapPolicyConfig> ParseWrapPolicyConfig(absl::string_view text);

// ParseWrapPolicyConfig on a file's contents; the message starts with the file name.
// NotFound when the file cannot be read.
absl::StatusOr<WrapPolicyConfig> ReadWrapPolicyConfigFile(const std::string& path);

// Checks `config` and builds its policy with `registry`'s factories. InvalidArgument
// (naming the option) unless every expression sets exactly one of name / any_of /
// all_of / negate, params appear only beside a name, and ignored_modules only at the
// top; errors from the registry and factories carry the option's path.
absl::StatusOr<ConfiguredPolicy> BuildPolicy(
    const WrapPolicyConfig& config, const PolicyRegistry& registry = PolicyRegistry::Global());

// ParseWrapPolicyConfig then BuildPolicy.
absl::StatusOr<ConfiguredPolicy> BuildPolicyFromText(
    absl::string_view text, const PolicyRegistry& registry = PolicyRegistry::Global());

}  // namespace policy

#endif  // POLICY_CONFIG_H_
