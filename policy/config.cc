#include "policy/config.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"
#include "core/text_file.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"

namespace policy {
namespace {

// Keeps the first error the text-format parser reports (0-based line and column).
class FirstErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (has_error_) return;
    has_error_ = true;
    line_ = line;
    column_ = column;
    message_ = message;
  }
  void AddWarning(int, google::protobuf::io::ColumnNumber, const std::string&) override {}

  bool has_error() const { return has_error_; }
  // True when the first error is the parser's recursion limit.
  bool too_deep() const {
    return has_error_ && message_.find("recursion limit") != std::string::npos;
  }
  std::string Describe() const {
    return absl::StrCat("line ", line_ + 1, ", column ", column_ + 1, ": ", message_);
  }

 private:
  bool has_error_ = false;
  int line_ = 0;
  int column_ = 0;
  std::string message_;
};

}  // namespace

std::string PolicyDepthHint() {
  return absl::StrCat(" (policy expressions may nest at most ", kMaxPolicyDepth,
                      " levels of any_of / all_of / negate)");
}

namespace {

// Builds the expression `config` found at `where`, `depth` levels below the top. The
// recursion is bounded: deeper than kMaxPolicyDepth is an error before recursing.
absl::StatusOr<WrapPolicyPtr> BuildExpression(const WrapPolicyConfig& config,
                                              const std::string& where, int depth,
                                              const PolicyRegistry& registry) {
  const bool top_level = depth == 0;
  if (depth > kMaxPolicyDepth) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": policy expressions nest more than ",
                                                   kMaxPolicyDepth,
                                                   " levels deep (any_of / all_of / negate)"));
  }
  std::vector<std::string> set;
  if (!config.name().empty()) set.push_back("name");
  if (config.any_of_size() > 0) set.push_back("any_of");
  if (config.all_of_size() > 0) set.push_back("all_of");
  if (config.has_negate()) set.push_back("negate");
  if (set.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": set exactly one of name, any_of, all_of, negate; found ",
                     set.empty() ? "none" : absl::StrJoin(set, ", ")));
  }
  if (!top_level && config.ignored_modules_size() > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ".ignored_modules: only allowed at the top level of a WrapPolicyConfig"));
  }
  if (config.param_size() > 0 && config.name().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ".param: parameters belong beside a policy name, but this ",
                     "expression is ", set.front()));
  }

  if (!config.name().empty()) {
    PolicyParams params(absl::StrCat(where, " (", config.name(), ")"));
    for (int i = 0; i < config.param_size(); ++i) {
      const PolicyParam& param = config.param(i);
      if (param.key().empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(params.context(), ": param[", i, "] has an empty key"));
      }
      if (param.value_size() == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(params.context(), ": parameter '", param.key(), "' has no value"));
      }
      for (const std::string& value : param.value()) params.Add(param.key(), value);
    }
    absl::StatusOr<WrapPolicyPtr> made = registry.Create(config.name(), params);
    if (!made.ok() && (made.status().code() == absl::StatusCode::kNotFound ||
                       made.status().code() == absl::StatusCode::kFailedPrecondition)) {
      return core::Annotate(made.status(), absl::StrCat(where, ".name"));
    }
    return made;
  }
  if (config.has_negate()) {
    ASSIGN_OR_RETURN(WrapPolicyPtr inner,
                     BuildExpression(config.negate(), where + ".negate", depth + 1, registry));
    return Not(std::move(inner));
  }
  const bool is_or = config.any_of_size() > 0;
  const auto& children = is_or ? config.any_of() : config.all_of();
  std::vector<WrapPolicyPtr> built;
  for (int i = 0; i < children.size(); ++i) {
    ASSIGN_OR_RETURN(WrapPolicyPtr child,
                     BuildExpression(children.Get(i),
                                     absl::StrCat(where, is_or ? ".any_of[" : ".all_of[", i, "]"),
                                     depth + 1, registry));
    built.push_back(std::move(child));
  }
  return is_or ? Or(std::move(built)) : And(std::move(built));
}

}  // namespace

absl::StatusOr<WrapPolicyConfig> ParseWrapPolicyConfig(absl::string_view text) {
  WrapPolicyConfig config;
  FirstErrorCollector errors;
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  // Without a limit the parser recurses once per nested message: `negate {` ten
  // thousand times overflows the stack.
  parser.SetRecursionLimit(kPolicyParseRecursionLimit);
  const bool ok = parser.ParseFromString(std::string(text), &config);
  if (!ok || errors.has_error()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "WrapPolicyConfig: ", errors.has_error() ? errors.Describe() : "text format parse failed",
        errors.too_deep() ? PolicyDepthHint() : ""));
  }
  return config;
}

absl::StatusOr<WrapPolicyConfig> ReadWrapPolicyConfigFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string contents, core::ReadTextFile(path, "policy config"));
  absl::StatusOr<WrapPolicyConfig> config = ParseWrapPolicyConfig(contents);
  if (!config.ok()) return core::Annotate(config.status(), path);
  return config;
}

absl::StatusOr<ConfiguredPolicy> BuildPolicy(const WrapPolicyConfig& config,
                                             const PolicyRegistry& registry) {
  ConfiguredPolicy out;
  ASSIGN_OR_RETURN(out.policy, BuildExpression(config, "WrapPolicyConfig", /*depth=*/0, registry));
  for (int i = 0; i < config.ignored_modules_size(); ++i) {
    if (config.ignored_modules(i).empty()) {
      return absl::InvalidArgumentError(absl::StrCat("WrapPolicyConfig.ignored_modules[", i,
                                                     "]: empty path (the root cannot be ignored)"));
    }
    out.ignored_paths.push_back(config.ignored_modules(i));
  }
  return out;
}

absl::StatusOr<ConfiguredPolicy> BuildPolicyFromText(absl::string_view text,
                                                     const PolicyRegistry& registry) {
  ASSIGN_OR_RETURN(WrapPolicyConfig config, ParseWrapPolicyConfig(text));
  return BuildPolicy(config, registry);
}

}  // namespace policy
