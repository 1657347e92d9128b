#include "policy/config.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "policy/testing/test_modules.h"

namespace policy {
namespace {

using testing::TestModule;

bool Has(absl::string_view haystack, const std::string& needle) {
  return haystack.find(needle) != absl::string_view::npos;
}

WrapContext Ctx(const std::string& type, int64_t unwrapped) {
  WrapContext c;
  c.type_name = type;
  c.unwrapped_subtree_numel = unwrapped;
  return c;
}

TEST(ConfigTest, BuildsCombinatorsAndIgnoredPaths) {
  absl::StatusOr<ConfiguredPolicy> c = BuildPolicyFromText(R"pb(
    # Blocks, or anything with >= 1000 unclaimed elements, but never a LayerNorm.
    all_of {
      any_of {
        name: "module_types"
        param { key: "types" value: "Block" }
      }
      any_of {
        name: "size_based"
        param { key: "min_num_params" value: "1000" }
      }
    }
    all_of {
      negate {
        name: "module_types"
        param { key: "types" value: "LayerNorm" }
      }
    }
    ignored_modules: "wpe"
    ignored_modules: "blocks.0.attn"
  )pb");
  ASSERT_TRUE(c.ok()) << c.status();
  auto m = TestModule::Make("X");
  EXPECT_TRUE(c->policy->ShouldWrap(*m, Ctx("Block", 1)));
  EXPECT_TRUE(c->policy->ShouldWrap(*m, Ctx("Linear", 1000)));
  EXPECT_FALSE(c->policy->ShouldWrap(*m, Ctx("Linear", 999)));
  EXPECT_FALSE(c->policy->ShouldWrap(*m, Ctx("LayerNorm", 5000)));
  EXPECT_EQ(c->policy->Name(),
            "and(or(module_types(Block), size_based(min_num_params=1000)), "
            "not(module_types(LayerNorm)))");
  EXPECT_EQ(c->ignored_paths, (std::vector<std::string>{"wpe", "blocks.0.attn"}));
}

TEST(ConfigTest, SyntaxErrorsGiveLineAndColumn) {
  absl::StatusOr<WrapPolicyConfig> c = ParseWrapPolicyConfig(
      "name: \"size_based\"\n"
      "param { key: \"min_num_params\" value: \"10\" }\n"
      "bogus: 3\n");
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  // Protobuf reports an unknown field at the token after its name: the ':' in column 6.
  EXPECT_TRUE(Has(c.status().message(), "WrapPolicyConfig: line 3, column 6: ")) << c.status();
  EXPECT_TRUE(Has(c.status().message(), "bogus")) << c.status();

  // `key` is a string; the integer token starts at 0-based column 13.
  c = ParseWrapPolicyConfig("param { key: 5 }\n");
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(c.status().message(), "line 1, column 14: ")) << c.status();

  // An unclosed brace is reported at the end of the input (line 2, column 1).
  c = ParseWrapPolicyConfig("negate { name: \"always\"\n");
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(c.status().message(), "line 2, column 1: ")) << c.status();
}

TEST(ConfigTest, ExactlyOneKindPerExpression) {
  absl::StatusOr<ConfiguredPolicy> c =
      BuildPolicyFromText("name: \"always\" any_of { name: \"never\" }");
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(c.status().message(),
                  "WrapPolicyConfig: set exactly one of name, any_of, all_of, negate; found "
                  "name, any_of"))
      << c.status();

  c = BuildPolicyFromText("any_of { name: \"always\" } any_of { }");
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(c.status().message(), "WrapPolicyConfig.any_of[1]: set exactly one of"))
      << c.status();
  EXPECT_TRUE(Has(c.status().message(), "found none")) << c.status();
}

TEST(ConfigTest, MisplacedFieldsNameTheOption) {
  absl::StatusOr<ConfiguredPolicy> c =
      BuildPolicyFromText("negate { name: \"always\" ignored_modules: \"wte\" }");
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(c.status().message(),
                  "WrapPolicyConfig.negate.ignored_modules: only allowed "
                  "at the top level"))
      << c.status();

  c = BuildPolicyFromText("any_of { name: \"always\" } param { key: \"k\" value: \"v\" }");
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(c.status().message(),
                  "WrapPolicyConfig.param: parameters belong beside a "
                  "policy name"))
      << c.status();

  c = BuildPolicyFromText("name: \"size_based\" param { key: \"min_num_params\" }");
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(c.status().message(), "parameter 'min_num_params' has no value")) << c.status();

  c = BuildPolicyFromText("name: \"always\" ignored_modules: \"\"");
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(c.status().message(), "WrapPolicyConfig.ignored_modules[0]")) << c.status();
}

TEST(ConfigTest, BadParametersNameTheirPathInTheConfig) {
  absl::StatusOr<ConfiguredPolicy> c = BuildPolicyFromText(R"pb(
    any_of { name: "always" }
    any_of {
      name: "size_based"
      param { key: "min_params" value: "10" }
    }
  )pb");
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(c.status().message(),
                  "WrapPolicyConfig.any_of[1] (size_based): unknown "
                  "parameter 'min_params'"))
      << c.status();

  c = BuildPolicyFromText(
      "all_of { negate { name: \"size_based\" param { key: \"min_num_params\" value: \"ten\" } } "
      "}");
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(c.status().message(),
                  "WrapPolicyConfig.all_of[0].negate (size_based): "
                  "parameter 'min_num_params' must be an integer, got "
                  "'ten'"))
      << c.status();
}

TEST(ConfigTest, UnknownPolicyIsNotFoundListingKnownNames) {
  absl::StatusOr<ConfiguredPolicy> c = BuildPolicyFromText("negate { name: \"sizebased\" }");
  ASSERT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Has(c.status().message(),
                  "WrapPolicyConfig.negate.name: unknown wrap policy "
                  "'sizebased'; known policies: "))
      << c.status();
  EXPECT_TRUE(Has(c.status().message(), "size_based")) << c.status();
}

TEST(ConfigTest, DuplicateRegistrationSurfacesThroughTheConfig) {
  PolicyRegistry registry;
  RegisterBuiltinPolicies(&registry);
  registry.Register(
      "always", [](const PolicyParams&) -> absl::StatusOr<WrapPolicyPtr> { return Never(); },
      "mine.cc:1");
  absl::StatusOr<ConfiguredPolicy> c = BuildPolicyFromText("name: \"always\"", registry);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Has(c.status().message(), "'always' is registered 2 times")) << c.status();
  EXPECT_TRUE(BuildPolicyFromText("name: \"never\"", registry).ok());
}

TEST(ConfigTest, FilesPrefixErrorsWithTheirName) {
  const std::string path = std::string(getenv("TEST_TMPDIR")) + "/policy.txt";
  {
    std::ofstream out(path);
    out << "name: \"always\"\n\nname2: 1\n";
  }
  absl::StatusOr<WrapPolicyConfig> c = ReadWrapPolicyConfigFile(path);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(c.status().message(), path + ": WrapPolicyConfig: line 3, column 6"))
      << c.status();

  EXPECT_EQ(ReadWrapPolicyConfigFile(path + ".missing").status().code(),
            absl::StatusCode::kNotFound);
  {
    std::ofstream out(path);
    out << "name: \"module_types\" param { key: \"types\" value: \"A\" value: \"B\" }\n";
  }
  c = ReadWrapPolicyConfigFile(path);
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<ConfiguredPolicy> built = BuildPolicy(*c);
  ASSERT_TRUE(built.ok()) << built.status();
  EXPECT_EQ(built->policy->Name(), "module_types(A, B)");
}

// `depth` nested negates around `inner`, in text format.
std::string NestedNegates(int depth, const std::string& inner) {
  std::string text;
  for (int i = 0; i < depth; ++i) text += "negate { ";
  text += inner;
  for (int i = 0; i < depth; ++i) text += " }";
  return text;
}

TEST(ConfigTest, DeeplyNestedTextIsASyntaxErrorNotAStackOverflow) {
  // Without the parser's recursion limit this overflows the stack (SIGSEGV).
  const std::string text = NestedNegates(10000, "name: \"always\"");
  absl::StatusOr<WrapPolicyConfig> c = ParseWrapPolicyConfig(text);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  EXPECT_TRUE(Has(c.status().message(), "WrapPolicyConfig: line 1, column ")) << c.status();
  EXPECT_TRUE(Has(c.status().message(), "nest at most 64 levels")) << c.status();
  // Unbalanced (never closed) nesting too.
  EXPECT_EQ(ParseWrapPolicyConfig(std::string(100000, '{')).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::string open;
  for (int i = 0; i < 100000; ++i) open += "all_of {";
  EXPECT_EQ(ParseWrapPolicyConfig(open).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ConfigTest, NestingUpToTheLimitParsesAndBuilds) {
  // kMaxPolicyDepth negates with a parameterised policy innermost: the deepest allowed.
  const std::string inner = "name: \"module_types\" param { key: \"types\" value: \"A\" }";
  absl::StatusOr<ConfiguredPolicy> c = BuildPolicyFromText(NestedNegates(kMaxPolicyDepth, inner));
  ASSERT_TRUE(c.ok()) << c.status();
  // An even number of negations: wraps exactly what module_types(A) wraps.
  auto m = TestModule::Make("X");
  EXPECT_TRUE(c->policy->ShouldWrap(*m, Ctx("A", 1)));
  EXPECT_FALSE(c->policy->ShouldWrap(*m, Ctx("B", 1)));
  // One more level is refused.
  absl::StatusOr<WrapPolicyConfig> deeper =
      ParseWrapPolicyConfig(NestedNegates(kMaxPolicyDepth + 1, inner));
  EXPECT_EQ(deeper.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ConfigTest, BuildPolicyCapsTheDepthOfProtosBuiltInCode) {
  // A proto built in code never went through the parser's limit.
  WrapPolicyConfig config;
  WrapPolicyConfig* at = &config;
  for (int i = 0; i < 1000; ++i) at = at->add_any_of()->mutable_negate();
  at->set_name("always");
  absl::StatusOr<ConfiguredPolicy> c = BuildPolicy(config);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  EXPECT_TRUE(Has(c.status().message(), "WrapPolicyConfig.any_of[0].negate.any_of[0].negate"))
      << c.status();
  EXPECT_TRUE(Has(c.status().message(), ": policy expressions nest more than 64 levels deep"))
      << c.status();
  // The error is reported where the limit is crossed: 65 levels down, not 2000.
  const std::string message(c.status().message());
  const size_t levels = std::count(message.begin(), message.end(), '.');
  EXPECT_EQ(levels, static_cast<size_t>(kMaxPolicyDepth + 1)) << message;
}

TEST(ConfigTest, DirectoriesAndBinaryFilesAreInvalidArgumentNamingThePath) {
  const std::string dir = std::string(getenv("TEST_TMPDIR"));
  absl::StatusOr<WrapPolicyConfig> c = ReadWrapPolicyConfigFile(dir);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  EXPECT_TRUE(Has(c.status().message(), "policy config file '" + dir + "' is a directory"))
      << c.status();

  const std::string binary = dir + "/policy.bin";
  {
    std::ofstream out(binary, std::ios::binary);
    out << std::string("\x0a\x06always\x00\xff", 10);
  }
  c = ReadWrapPolicyConfigFile(binary);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  EXPECT_TRUE(Has(c.status().message(), binary)) << c.status();
  EXPECT_TRUE(Has(c.status().message(), "not a text file")) << c.status();
}

}  // namespace
}  // namespace policy
