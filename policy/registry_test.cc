#include "policy/registry.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "policy/testing/test_modules.h"

namespace policy {
namespace {

using testing::TestModule;

bool Has(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

WrapContext Ctx(const std::string& type, int64_t unwrapped) {
  WrapContext c;
  c.type_name = type;
  c.unwrapped_subtree_numel = unwrapped;
  return c;
}

absl::StatusOr<WrapPolicyPtr> MakeAlwaysForTest(const PolicyParams& params) {
  absl::Status s = params.CheckKeys({});
  if (!s.ok()) return s;
  return Always();
}

TEST(PolicyRegistryTest, GlobalHasTheBuiltins) {
  std::vector<std::string> names = PolicyRegistry::Global().Names();
  for (const char* name : {"always", "every_kth", "module_types", "never", "size_based"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
  }
  EXPECT_TRUE(PolicyRegistry::Global().CheckRegistrations().ok());
}

TEST(PolicyRegistryTest, BuiltinsTakeTheirParameters) {
  auto m = TestModule::Make("X");
  PolicyParams size;
  size.Add("min_num_params", "100");
  size.Add("excluded_types", "Embedding, LayerNorm");
  absl::StatusOr<WrapPolicyPtr> p = PolicyRegistry::Global().Create("size_based", size);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE((*p)->ShouldWrap(*m, Ctx("Linear", 100)));
  EXPECT_FALSE((*p)->ShouldWrap(*m, Ctx("Linear", 99)));
  EXPECT_FALSE((*p)->ShouldWrap(*m, Ctx("LayerNorm", 1000)));
  EXPECT_EQ((*p)->Name(), "size_based(min_num_params=100, excluded_types=[Embedding, LayerNorm])");

  PolicyParams types;
  types.Add("types", "TransformerBlock");
  types.Add("types", "Mlp");
  p = PolicyRegistry::Global().Create("module_types", types);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE((*p)->ShouldWrap(*m, Ctx("Mlp", 1)));
  EXPECT_FALSE((*p)->ShouldWrap(*m, Ctx("Linear", 1)));

  p = PolicyRegistry::Global().Create("never", {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE((*p)->ShouldWrap(*m, Ctx("X", 1)));

  PolicyParams every;
  every.Add("types", "TransformerBlock");
  every.Add("k", "3");
  p = PolicyRegistry::Global().Create("every_kth", every);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)->Name(), "every_kth(TransformerBlock; k=3)");
  PolicyParams bad_k;
  bad_k.Add("types", "TransformerBlock");
  bad_k.Add("k", "0");
  p = PolicyRegistry::Global().Create("every_kth", bad_k);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(std::string(p.status().message()), "parameter 'k' must be >= 1, got 0"))
      << p.status();
}

TEST(PolicyRegistryTest, UnknownNameIsNotFoundListingKnownNames) {
  PolicyRegistry registry;
  RegisterBuiltinPolicies(&registry);
  absl::StatusOr<WrapPolicyPtr> p = registry.Create("sized_based", {});
  ASSERT_EQ(p.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(
      Has(std::string(p.status().message()),
          "unknown wrap policy 'sized_based'; known policies: always, every_kth, module_types, "
          "never, size_based"))
      << p.status();
}

TEST(PolicyRegistryTest, DuplicateIsRecordedNotFatal) {
  PolicyRegistry registry;
  EXPECT_TRUE(registry.Register("mine", MakeAlwaysForTest, "a.cc:1"));
  EXPECT_TRUE(registry.Register("other", MakeAlwaysForTest, "c.cc:3"));
  EXPECT_FALSE(registry.Register("mine", MakeAlwaysForTest, "b.cc:2"));
  EXPECT_TRUE(registry.Contains("mine"));

  absl::StatusOr<WrapPolicyPtr> p = registry.Create("mine", {});
  ASSERT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Has(std::string(p.status().message()),
                  "wrap policy 'mine' is registered 2 times (a.cc:1, b.cc:2)"))
      << p.status();
  // A later lookup fails the same way; other names are unaffected.
  EXPECT_EQ(registry.Create("mine", {}).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(registry.Create("other", {}).ok());

  absl::Status check = registry.CheckRegistrations();
  EXPECT_EQ(check.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Has(std::string(check.message()), "'mine'")) << check;
  EXPECT_FALSE(Has(std::string(check.message()), "'other'")) << check;
}

TEST(PolicyRegistryTest, EmptyNameAndEmptyFactoryAreRecorded) {
  PolicyRegistry registry;
  EXPECT_FALSE(registry.Register("", MakeAlwaysForTest, "x.cc:9"));
  EXPECT_FALSE(registry.Register("nofactory", nullptr, "y.cc:10"));
  EXPECT_FALSE(registry.Contains("nofactory"));
  absl::Status check = registry.CheckRegistrations();
  EXPECT_EQ(check.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Has(std::string(check.message()), "empty name (x.cc:9)")) << check;
  EXPECT_TRUE(Has(std::string(check.message()), "'nofactory' with an empty factory (y.cc:10)"))
      << check;
}

TEST(PolicyRegistryTest, FactoryErrorsNameThePolicyAndKey) {
  PolicyParams params;
  params.Add("min_params", "10");
  absl::StatusOr<WrapPolicyPtr> p = PolicyRegistry::Global().Create("size_based", params);
  ASSERT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(std::string(p.status().message()),
                  "size_based: unknown parameter 'min_params'; accepted: min_num_params, "
                  "excluded_types, force_leaf_types"))
      << p.status();

  PolicyParams bad_number;
  bad_number.Add("min_num_params", "1e5");
  p = PolicyRegistry::Global().Create("size_based", bad_number);
  ASSERT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(std::string(p.status().message()),
                  "size_based: parameter 'min_num_params' must be an integer, got '1e5'"))
      << p.status();

  PolicyParams negative;
  negative.Add("min_num_params", "-3");
  EXPECT_EQ(PolicyRegistry::Global().Create("size_based", negative).status().code(),
            absl::StatusCode::kInvalidArgument);

  PolicyParams none;
  p = PolicyRegistry::Global().Create("module_types", none);
  ASSERT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(std::string(p.status().message()), "module_types: parameter 'types'"))
      << p.status();
}

TEST(PolicyParamsTest, GettersConvertAndComplain) {
  PolicyParams params("ctx");
  params.Add("n", "42");
  params.Add("twice", "1");
  params.Add("twice", "2");
  params.Add("list", " A,B ,, C");
  params.Add("list", "D");
  EXPECT_EQ(params.GetInt64("n", 0).value(), 42);
  EXPECT_EQ(params.GetInt64("absent", 7).value(), 7);
  absl::StatusOr<int64_t> twice = params.GetInt64("twice", 0);
  ASSERT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      Has(std::string(twice.status().message()), "ctx: parameter 'twice' takes one value, got 2"));
  EXPECT_EQ(params.GetList("list"), (std::vector<std::string>{"A", "B", "C", "D"}));
  EXPECT_TRUE(params.GetList("absent").empty());
  EXPECT_EQ(params.Keys(), (std::vector<std::string>{"list", "n", "twice"}));
  EXPECT_TRUE(params.CheckKeys({"n", "twice", "list"}).ok());
  EXPECT_EQ(params.CheckKeys({"n"}).code(), absl::StatusCode::kInvalidArgument);
}

TEST(PolicyRegistryTest, NullFromAFactoryIsAnError) {
  PolicyRegistry registry;
  registry.Register(
      "null", [](const PolicyParams&) -> absl::StatusOr<WrapPolicyPtr> { return WrapPolicyPtr(); });
  EXPECT_EQ(registry.Create("null", {}).status().code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace policy
