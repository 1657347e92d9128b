// An example of a custom wrap rule written the way a policy author would: its own target,
// registered by name ("path_glob") so that a WrapPolicyConfig can select it.
//
// It wraps modules whose dotted path matches one of a list of glob patterns, optionally
// only every k-th of them (by the number at the end of the path):
//
//   # Every second TransformerBlock of a Gpt: blocks.0, blocks.2, ...
//   name: "path_glob"
//   param { key: "pattern" value: "blocks.*" }
//   param { key: "every" value: "2" }
//
// Link //policy/examples:path_glob_policy (alwayslink) and the name is registered; the
// functions below are for direct use and tests.
#ifndef POLICY_EXAMPLES_PATH_GLOB_POLICY_H_
#define POLICY_EXAMPLES_PATH_GLOB_POLICY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "policy/wrap_policy.h"

namespace policy {
namespace examples {

// True when `path` matches `pattern`, where "*" matches any run of characters other than
// '.', "**" any run at all (dots included), "?" one character other than '.', and every
// other character itself. "blocks.*" matches "blocks.3" but not "blocks.3.mlp";
// "**.mlp" matches "blocks.3.mlp".
bool PathGlobMatch(absl::string_view pattern, absl::string_view path);

struct PathGlobOptions {
  // A module matches if its path matches any of these; at least one is required.
  std::vector<std::string> patterns;
  // With every = k > 1, a matching module is wrapped only if its path ends in a
  // non-negative integer i (a Sequential child) with i % k == 0. Must be >= 1.
  int64_t every = 1;
};

// The rule; Validate() is InvalidArgument for no patterns or every < 1.
WrapPolicyPtr PathGlob(PathGlobOptions options);

}  // namespace examples
}  // namespace policy

#endif  // POLICY_EXAMPLES_PATH_GLOB_POLICY_H_
