#include "policy/examples/path_glob_policy.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"
#include "policy/registry.h"

namespace policy {
namespace examples {

bool PathGlobMatch(absl::string_view pattern, absl::string_view path) {
  // Patterns come from config files: match with a table over (pattern token, path
  // position) in O(|pattern| * |path|) time and no recursion, so that a long pattern or
  // one full of "**" cannot exhaust the stack or take exponential time.
  enum class Kind { kAny, kStar, kOne, kChar };
  struct Token {
    Kind kind;
    char c;
  };
  std::vector<Token> tokens;
  for (size_t i = 0; i < pattern.size();) {
    if (pattern.substr(i, 2) == "**") {
      tokens.push_back({Kind::kAny, 0});
      i += 2;
    } else {
      const char c = pattern[i++];
      tokens.push_back({c == '*' ? Kind::kStar : c == '?' ? Kind::kOne : Kind::kChar, c});
    }
  }
  const size_t n = path.size();
  // next[j]: tokens after the current one match path[j:]; row for "no tokens left" first.
  std::vector<char> next(n + 1, 0), current(n + 1, 0);
  next[n] = 1;
  for (size_t t = tokens.size(); t-- > 0;) {
    const Token& token = tokens[t];
    for (size_t j = n + 1; j-- > 0;) {
      const bool more = j < n;
      switch (token.kind) {
        case Kind::kAny:
          current[j] = next[j] || (more && current[j + 1]);
          break;
        case Kind::kStar:
          current[j] = next[j] || (more && path[j] != '.' && current[j + 1]);
          break;
        case Kind::kOne:
          current[j] = more && path[j] != '.' && next[j + 1];
          break;
        case Kind::kChar:
          current[j] = more && path[j] == token.c && next[j + 1];
          break;
      }
    }
    std::swap(next, current);
  }
  return next[0] != 0;
}

namespace {

class PathGlobPolicy : public WrapPolicy {
 public:
  explicit PathGlobPolicy(PathGlobOptions options) : options_(std::move(options)) {}

  bool ShouldWrap(const core::Module& /*module*/, const WrapContext& context) const override {
    bool matched = false;
    for (const std::string& pattern : options_.patterns) {
      matched = matched || PathGlobMatch(pattern, context.path);
    }
    if (!matched) return false;
    if (options_.every == 1) return true;
    const size_t dot = context.path.rfind('.');
    const std::string last = dot == std::string::npos ? context.path : context.path.substr(dot + 1);
    int64_t index = 0;
    return absl::SimpleAtoi(last, &index) && index >= 0 && index % options_.every == 0;
  }

  std::string Name() const override {
    return absl::StrCat("path_glob(", absl::StrJoin(options_.patterns, ", "),
                        options_.every > 1 ? absl::StrCat("; every ", options_.every) : "", ")");
  }

  // Name() carries every option ShouldWrap reads.
  std::string Identity() const override { return Name(); }

  std::string Explain(const core::Module& /*module*/, const WrapContext& context) const override {
    return absl::StrCat(
        "path_glob: ", context.path, " matches ", absl::StrJoin(options_.patterns, " or "),
        options_.every > 1 ? absl::StrCat(", index divisible by ", options_.every) : "");
  }

  absl::Status Validate() const override {
    if (options_.patterns.empty()) {
      return absl::InvalidArgumentError("path_glob: parameter 'pattern' needs at least one glob");
    }
    if (options_.every < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("path_glob: parameter 'every' must be >= 1, got ", options_.every));
    }
    return absl::OkStatus();
  }

 private:
  PathGlobOptions options_;
};

absl::StatusOr<WrapPolicyPtr> MakePathGlob(const PolicyParams& params) {
  RETURN_IF_ERROR(params.CheckKeys({"pattern", "every"}));
  PathGlobOptions options;
  options.patterns = params.GetList("pattern");
  ASSIGN_OR_RETURN(options.every, params.GetInt64("every", 1));
  WrapPolicyPtr policy = PathGlob(std::move(options));
  absl::Status valid = policy->Validate();
  if (!valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(params.context(), ": ", valid.message()));
  }
  return policy;
}

// Linking this library in is all it takes to make "path_glob" available by name.
POLICY_REGISTER_WRAP_POLICY("path_glob", MakePathGlob);

}  // namespace

WrapPolicyPtr PathGlob(PathGlobOptions options) {
  return std::make_shared<PathGlobPolicy>(std::move(options));
}

}  // namespace examples
}  // namespace policy
