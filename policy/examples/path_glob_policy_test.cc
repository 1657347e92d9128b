#include "policy/examples/path_glob_policy.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nn/gpt.h"
#include "policy/config.h"
#include "policy/plan.h"
#include "policy/registry.h"

namespace policy {
namespace examples {
namespace {

using Strings = std::vector<std::string>;

Strings UnitPaths(const WrapPlan& plan) {
  Strings out;
  for (const WrapUnit& unit : plan.units()) out.push_back(unit.path());
  return out;
}

std::shared_ptr<nn::Gpt> SmallGpt(int64_t n_layer) {
  nn::GptConfig config;  // vocab 64, block 32, n_embd 64, 4 heads
  config.n_layer = n_layer;
  absl::StatusOr<std::shared_ptr<nn::Gpt>> gpt = nn::Gpt::Create(config);
  EXPECT_TRUE(gpt.ok()) << gpt.status();
  return *gpt;
}

TEST(PathGlobMatchTest, StarStaysInAComponentDoubleStarDoesNot) {
  EXPECT_TRUE(PathGlobMatch("blocks.*", "blocks.3"));
  EXPECT_TRUE(PathGlobMatch("blocks.*", "blocks.12"));
  EXPECT_FALSE(PathGlobMatch("blocks.*", "blocks.3.mlp"));
  EXPECT_FALSE(PathGlobMatch("blocks.*", "blocks"));
  EXPECT_TRUE(PathGlobMatch("blocks.*.mlp", "blocks.3.mlp"));
  EXPECT_TRUE(PathGlobMatch("**.mlp", "blocks.3.mlp"));
  EXPECT_FALSE(PathGlobMatch("**.mlp", "blocks.3.mlp.fc"));
  EXPECT_TRUE(PathGlobMatch("**", ""));
  EXPECT_TRUE(PathGlobMatch("blocks.?", "blocks.7"));
  EXPECT_FALSE(PathGlobMatch("blocks.?", "blocks.17"));
  EXPECT_FALSE(PathGlobMatch("blocks?3", "blocks.3"));
  EXPECT_TRUE(PathGlobMatch("wte", "wte"));
  EXPECT_FALSE(PathGlobMatch("wte", "wpe"));
}

// The definition by cases, recursively: the reference for small inputs.
bool ReferenceMatch(absl::string_view pattern, absl::string_view path) {
  if (pattern.empty()) return path.empty();
  if (pattern.substr(0, 2) == "**") {
    for (size_t skip = 0; skip <= path.size(); ++skip) {
      if (ReferenceMatch(pattern.substr(2), path.substr(skip))) return true;
    }
    return false;
  }
  if (pattern.front() == '*') {
    for (size_t skip = 0; skip <= path.size(); ++skip) {
      if (ReferenceMatch(pattern.substr(1), path.substr(skip))) return true;
      if (skip < path.size() && path[skip] == '.') break;
    }
    return false;
  }
  if (path.empty()) return false;
  if (pattern.front() == '?' ? path.front() == '.' : pattern.front() != path.front()) return false;
  return ReferenceMatch(pattern.substr(1), path.substr(1));
}

TEST(PathGlobMatchTest, AgreesWithTheDefinitionOnEveryShortPatternAndPath) {
  // Every pattern of up to 4 symbols over {*, ?, ., a} against every path of up to 4
  // characters over {., a, b}.
  const std::string pattern_alphabet = "*?.a";
  const std::string path_alphabet = ".ab";
  auto all = [](const std::string& alphabet, int max_len) {
    std::vector<std::string> out = {""};
    for (size_t begin = 0, len = 1; len <= static_cast<size_t>(max_len); ++len) {
      const size_t end = out.size();
      for (size_t i = begin; i < end; ++i) {
        for (char c : alphabet) out.push_back(out[i] + c);
      }
      begin = end;
    }
    return out;
  };
  int compared = 0;
  for (const std::string& pattern : all(pattern_alphabet, 4)) {
    for (const std::string& path : all(path_alphabet, 4)) {
      ASSERT_EQ(PathGlobMatch(pattern, path), ReferenceMatch(pattern, path))
          << "pattern '" << pattern << "' path '" << path << "'";
      ++compared;
    }
  }
  EXPECT_EQ(compared, 341 * 121);
}

TEST(PathGlobMatchTest, HugeAndStarHeavyPatternsNeitherOverflowNorExplode) {
  // A million-character pattern (the recursive matcher recursed once per character)
  // and fifty "**" before a mismatch (exponential for the recursive matcher).
  EXPECT_FALSE(PathGlobMatch(std::string(1 << 20, '?'), "blocks.0"));
  EXPECT_TRUE(PathGlobMatch("blocks.0" + std::string(1 << 20, '*'), "blocks.0"));
  std::string stars;
  for (int i = 0; i < 50; ++i) stars += "**a";
  EXPECT_FALSE(PathGlobMatch(stars + "z", std::string(200, 'a')));
}

TEST(PathGlobPolicyTest, RegisteredByLinkingAlone) {
  EXPECT_TRUE(PolicyRegistry::Global().Contains("path_glob"));
  EXPECT_TRUE(PolicyRegistry::Global().CheckRegistrations().ok());
}

TEST(PathGlobPolicyTest, EverySecondBlockFromATextConfig) {
  absl::StatusOr<ConfiguredPolicy> configured = BuildPolicyFromText(R"pb(
    name: "path_glob"
    param { key: "pattern" value: "blocks.*" }
    param { key: "every" value: "2" }
  )pb");
  ASSERT_TRUE(configured.ok()) << configured.status();
  std::shared_ptr<nn::Gpt> gpt = SmallGpt(5);
  absl::StatusOr<WrapPlan> plan = Plan(*gpt, *configured->policy, 4);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(UnitPaths(*plan), (Strings{"blocks.0", "blocks.2", "blocks.4", ""}));
  EXPECT_EQ(plan->units(1).reason(), "path_glob: blocks.2 matches blocks.*, index divisible by 2");
  EXPECT_EQ(plan->policy(), "path_glob(blocks.*; every 2)");
}

TEST(PathGlobPolicyTest, CombinesWithBuiltinsInAConfig) {
  // Every MLP, plus the attention of block 1 only.
  absl::StatusOr<ConfiguredPolicy> configured = BuildPolicyFromText(R"pb(
    any_of {
      name: "path_glob"
      param { key: "pattern" value: "**.mlp" }
    }
    any_of {
      name: "path_glob"
      param { key: "pattern" value: "blocks.1.attn" }
    }
  )pb");
  ASSERT_TRUE(configured.ok()) << configured.status();
  std::shared_ptr<nn::Gpt> gpt = SmallGpt(2);
  absl::StatusOr<WrapPlan> plan = Plan(*gpt, *configured->policy, 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(UnitPaths(*plan), (Strings{"blocks.0.mlp", "blocks.1.attn", "blocks.1.mlp", ""}));
}

TEST(PathGlobPolicyTest, BadParametersNameTheOption) {
  absl::StatusOr<ConfiguredPolicy> c = BuildPolicyFromText(R"pb(
    name: "path_glob"
    param { key: "pattern" value: "blocks.*" }
    param { key: "every" value: "0" }
  )pb");
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find(
                "WrapPolicyConfig (path_glob): path_glob: parameter 'every' must be >= 1, got 0"),
            std::string::npos)
      << c.status();

  c = BuildPolicyFromText("name: \"path_glob\"");
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("parameter 'pattern' needs at least one glob"),
            std::string::npos)
      << c.status();

  c = BuildPolicyFromText("name: \"path_glob\" param { key: \"patern\" value: \"x\" }");
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("unknown parameter 'patern'; accepted: pattern, every"),
            std::string::npos)
      << c.status();
}

}  // namespace
}  // namespace examples
}  // namespace policy
