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

// How deeply policy expressions may nest: an any_of / all_of / negate chain at most this
// many levels below the top. Deeper text is a syntax error (the protobuf parser stops
// at this depth instead of recursing into a stack overflow) and a deeper proto built in
// code is InvalidArgument from BuildPolicy naming the path where it went too deep.
inline constexpr int kMaxPolicyDepth = 64;

// The protobuf text parser's recursion limit that allows kMaxPolicyDepth levels of
// expressions plus a `param { }` in the innermost; a message that embeds a
// WrapPolicyConfig `k` levels down uses kPolicyParseRecursionLimit + k.
inline constexpr int kPolicyParseRecursionLimit = kMaxPolicyDepth + 1;

// " (policy expressions may nest at most 64 levels of any_of / all_of / negate)": what
// parsers of messages embedding a WrapPolicyConfig append to a recursion-limit error.
std::string PolicyDepthHint();

// What a config selects: the policy and the module paths to ignore.
struct ConfiguredPolicy {
  WrapPolicyPtr policy;
  std::vector<std::string> ignored_paths;
};

// Parses text format. InvalidArgument "WrapPolicyConfig: line L, column C: <what>" for
// the first syntax error (unknown fields, and nesting deeper than kMaxPolicyDepth,
// included); no semantic checks. Never crashes, whatever the bytes.
absl::StatusOr<WrapPolicyConfig> ParseWrapPolicyConfig(absl::string_view text);

// ParseWrapPolicyConfig on a file's contents; the message starts with the file name.
// NotFound when the file does not exist; InvalidArgument naming the file when it is a
// directory, unreadable, or not text (core/text_file.h).
absl::StatusOr<WrapPolicyConfig> ReadWrapPolicyConfigFile(const std::string& path);

// Checks `config` and builds its policy with `registry`'s factories. InvalidArgument
// (naming the option) unless every expression sets exactly one of name / any_of /
// all_of / negate, params appear only beside a name, ignored_modules only at the top,
// and no expression is nested more than kMaxPolicyDepth levels deep; errors from the
// registry and factories carry the option's path.
absl::StatusOr<ConfiguredPolicy> BuildPolicy(
    const WrapPolicyConfig& config, const PolicyRegistry& registry = PolicyRegistry::Global());

// ParseWrapPolicyConfig then BuildPolicy.
absl::StatusOr<ConfiguredPolicy> BuildPolicyFromText(
    absl::string_view text, const PolicyRegistry& registry = PolicyRegistry::Global());

}  // namespace policy

#endif  // POLICY_CONFIG_H_
