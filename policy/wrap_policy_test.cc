// ShouldWrap of each built-in and combinator on hand-built contexts. The same policies
// applied to whole models are in plan_test.cc and plan_nn_test.cc.
#include "policy/wrap_policy.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "policy/testing/test_modules.h"

namespace policy {
namespace {

using testing::TestModule;

WrapContext Ctx(std::string type, int64_t unwrapped, std::vector<std::string> ancestors = {}) {
  WrapContext c;
  c.path = "a.b";
  c.type_name = std::move(type);
  c.depth = static_cast<int>(ancestors.size());
  c.unwrapped_subtree_numel = unwrapped;
  c.ancestor_types = std::move(ancestors);
  return c;
}

TEST(SizeBasedTest, WrapsAtAndAboveThresholdOnly) {
  auto m = TestModule::Make("Block");
  SizeBasedOptions o;
  o.min_num_params = 100;
  WrapPolicyPtr p = SizeBased(o);
  EXPECT_FALSE(p->ShouldWrap(*m, Ctx("Block", 99)));
  EXPECT_TRUE(p->ShouldWrap(*m, Ctx("Block", 100)));
  EXPECT_TRUE(p->ShouldWrap(*m, Ctx("Block", 1000)));
  EXPECT_EQ(p->Name(), "size_based(min_num_params=100)");
  EXPECT_EQ(p->Explain(*m, Ctx("Block", 1000)), "size_based: 1000 unwrapped >= min_num_params 100");
}

TEST(EveryKthTest, PicksTheTypesWhoseTrailingPathIndexIsAMultipleOfK) {
  auto m = TestModule::Make("Block");
  WrapPolicyPtr p = EveryKth({"Block"}, 2);
  ASSERT_TRUE(p->Validate().ok());
  auto at = [](std::string path, std::string type) {
    WrapContext c;
    c.path = std::move(path);
    c.type_name = std::move(type);
    return c;
  };
  EXPECT_TRUE(p->ShouldWrap(*m, at("blocks.0", "Block")));
  EXPECT_FALSE(p->ShouldWrap(*m, at("blocks.1", "Block")));
  EXPECT_TRUE(p->ShouldWrap(*m, at("blocks.10", "Block")));
  EXPECT_FALSE(p->ShouldWrap(*m, at("blocks.10", "Linear")));
  EXPECT_FALSE(p->ShouldWrap(*m, at("blocks.x", "Block")));   // no index
  EXPECT_FALSE(p->ShouldWrap(*m, at("blocks.-2", "Block")));  // not a plain index
  EXPECT_FALSE(p->ShouldWrap(*m, at("", "Block")));
  EXPECT_TRUE(p->ShouldWrap(*m, at("4", "Block")));
  EXPECT_EQ(p->Name(), "every_kth(Block; k=2)");
  EXPECT_EQ(p->Identity(), EveryKth({"Block"}, 2)->Identity());
  EXPECT_NE(p->Identity(), EveryKth({"Block"}, 3)->Identity());
  EXPECT_EQ(p->Explain(*m, at("blocks.4", "Block")), "every_kth: type Block, index 4 % 2 == 0");
  // k = 1: every block.
  EXPECT_TRUE(EveryKth({"Block"}, 1)->ShouldWrap(*m, at("blocks.7", "Block")));
  EXPECT_EQ(EveryKth({"Block"}, 0)->Validate().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EveryKth({}, 1)->Validate().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SizeBasedTest, ExcludedTypesNeverWrap) {
  auto m = TestModule::Make("Embedding");
  SizeBasedOptions o;
  o.min_num_params = 1;
  o.excluded_types = {"Embedding"};
  WrapPolicyPtr p = SizeBased(o);
  EXPECT_FALSE(p->ShouldWrap(*m, Ctx("Embedding", 1000000)));
  EXPECT_TRUE(p->ShouldWrap(*m, Ctx("Linear", 1000000)));
}

TEST(SizeBasedTest, NothingInsideAForceLeafTypeWraps) {
  auto m = TestModule::Make("Linear");
  SizeBasedOptions o;
  o.min_num_params = 1;
  o.force_leaf_types = {"Mlp"};
  WrapPolicyPtr p = SizeBased(o);
  // The force-leaf module itself may wrap; its descendants may not.
  EXPECT_TRUE(p->ShouldWrap(*m, Ctx("Mlp", 10, {"Gpt", "Sequential"})));
  EXPECT_FALSE(p->ShouldWrap(*m, Ctx("Linear", 10, {"Gpt", "Mlp"})));
  EXPECT_FALSE(p->ShouldWrap(*m, Ctx("Linear", 10, {"Mlp", "Sequential"})));
  EXPECT_TRUE(p->ShouldWrap(*m, Ctx("Linear", 10, {"Gpt", "Sequential"})));
}

TEST(SizeBasedTest, NegativeThresholdIsInvalid) {
  SizeBasedOptions o;
  o.min_num_params = -1;
  absl::Status s = SizeBased(o)->Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("min_num_params"), std::string::npos) << s;
}

TEST(ModuleTypesTest, WrapsListedTypesOnly) {
  auto m = TestModule::Make("X");
  WrapPolicyPtr p = ModuleTypes({"TransformerBlock", "Mlp"});
  EXPECT_TRUE(p->ShouldWrap(*m, Ctx("TransformerBlock", 1)));
  EXPECT_TRUE(p->ShouldWrap(*m, Ctx("Mlp", 1)));
  EXPECT_FALSE(p->ShouldWrap(*m, Ctx("Linear", 1)));
  EXPECT_EQ(p->Explain(*m, Ctx("Mlp", 1)), "module_types: type Mlp");
}

TEST(ConstantPolicyTest, AlwaysAndNever) {
  auto m = TestModule::Make("X");
  EXPECT_TRUE(Always()->ShouldWrap(*m, Ctx("X", 0)));
  EXPECT_FALSE(Never()->ShouldWrap(*m, Ctx("X", 1 << 30)));
  EXPECT_EQ(Always()->Name(), "always");
  EXPECT_EQ(Never()->Name(), "never");
}

TEST(LambdaTest, SeesModuleAndContext) {
  auto m = TestModule::Make("X");
  WrapPolicyPtr p =
      Lambda([&m](const core::Module& module,
                  const WrapContext& c) { return &module == m.get() && c.depth == 2; },
             "depth_two");
  EXPECT_TRUE(p->ShouldWrap(*m, Ctx("X", 1, {"A", "B"})));
  EXPECT_FALSE(p->ShouldWrap(*m, Ctx("X", 1, {"A"})));
  EXPECT_FALSE(p->ShouldWrap(*TestModule::Make("X"), Ctx("X", 1, {"A", "B"})));
  EXPECT_EQ(p->Name(), "depth_two");
  EXPECT_TRUE(p->Validate().ok());
  EXPECT_EQ(Lambda(nullptr)->Validate().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CombinatorTest, OrAndNotTruthTables) {
  auto m = TestModule::Make("X");
  const WrapContext c = Ctx("X", 1);
  for (bool a : {false, true}) {
    for (bool b : {false, true}) {
      WrapPolicyPtr pa = a ? Always() : Never();
      WrapPolicyPtr pb = b ? Always() : Never();
      EXPECT_EQ(Or({pa, pb})->ShouldWrap(*m, c), a || b) << a << b;
      EXPECT_EQ(And({pa, pb})->ShouldWrap(*m, c), a && b) << a << b;
    }
    EXPECT_EQ(Not(a ? Always() : Never())->ShouldWrap(*m, c), !a);
  }
  EXPECT_FALSE(Or({})->ShouldWrap(*m, c));
  EXPECT_TRUE(And({})->ShouldWrap(*m, c));
}

TEST(CombinatorTest, ComposeOnRealPredicates) {
  auto m = TestModule::Make("X");
  SizeBasedOptions big;
  big.min_num_params = 50;
  // Blocks, or anything big, but never a LayerNorm.
  WrapPolicyPtr p =
      And({Or({ModuleTypes({"Block"}), SizeBased(big)}), Not(ModuleTypes({"LayerNorm"}))});
  EXPECT_TRUE(p->ShouldWrap(*m, Ctx("Block", 1)));
  EXPECT_TRUE(p->ShouldWrap(*m, Ctx("Linear", 50)));
  EXPECT_FALSE(p->ShouldWrap(*m, Ctx("Linear", 49)));
  EXPECT_FALSE(p->ShouldWrap(*m, Ctx("LayerNorm", 500)));
  EXPECT_EQ(p->Name(),
            "and(or(module_types(Block), size_based(min_num_params=50)), "
            "not(module_types(LayerNorm)))");
}

TEST(CombinatorTest, OrExplainsWithTheFirstPolicyThatWrapped) {
  auto m = TestModule::Make("X");
  SizeBasedOptions big;
  big.min_num_params = 10;
  WrapPolicyPtr p = Or({ModuleTypes({"Block"}), SizeBased(big)});
  EXPECT_EQ(p->Explain(*m, Ctx("Linear", 20)), "size_based: 20 unwrapped >= min_num_params 10");
  EXPECT_EQ(p->Explain(*m, Ctx("Block", 20)), "module_types: type Block");
}

TEST(CombinatorTest, NullOrInvalidChildrenFailValidation) {
  absl::Status s = Or({Always(), nullptr})->Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("or: policy 1 of 2 is null"), std::string::npos) << s;
  EXPECT_EQ(Not(nullptr)->Validate().code(), absl::StatusCode::kInvalidArgument);
  SizeBasedOptions bad;
  bad.min_num_params = -5;
  s = And({Always(), Not(SizeBased(bad))})->Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("and[1]: not: size_based: min_num_params"), std::string::npos) << s;
}

TEST(IdentityTest, ComparesWhatThePolicyDecidesNotItsName) {
  // Built-ins: equal options, equal identity, however often they are made.
  EXPECT_EQ(ModuleTypes({"Block"})->Identity(), ModuleTypes({"Block"})->Identity());
  EXPECT_NE(ModuleTypes({"Block"})->Identity(), ModuleTypes({"Mlp"})->Identity());
  SizeBasedOptions small, big;
  small.min_num_params = 10;
  big.min_num_params = 1000;
  EXPECT_EQ(SizeBased(small)->Identity(), SizeBased(small)->Identity());
  EXPECT_NE(SizeBased(small)->Identity(), SizeBased(big)->Identity());
  EXPECT_EQ(Always()->Identity(), Always()->Identity());
  EXPECT_NE(Always()->Identity(), Never()->Identity());
  // Lambdas: one identity per Lambda() call, whatever the name.
  WrapPredicate yes = [](const core::Module&, const WrapContext&) { return true; };
  WrapPolicyPtr a = Lambda(yes);
  WrapPolicyPtr b = Lambda(yes);
  EXPECT_EQ(a->Name(), b->Name());
  EXPECT_NE(a->Identity(), b->Identity());
  EXPECT_EQ(a->Identity(), a->Identity());
  // Combinators compare their children's identities.
  EXPECT_EQ(Or({ModuleTypes({"Block"}), Never()})->Identity(),
            Or({ModuleTypes({"Block"}), Never()})->Identity());
  EXPECT_NE(Or({a})->Identity(), Or({b})->Identity());
  EXPECT_EQ(Or({a})->Name(), Or({b})->Name());
  EXPECT_NE(Not(a)->Identity(), Not(b)->Identity());
  EXPECT_NE(And({a, Always()})->Identity(), And({b, Always()})->Identity());
}

// A policy that does not override Identity() equals only itself: the conservative
// default for a custom policy whose name might not carry all it decides on.
class NamedOnly : public WrapPolicy {
 public:
  bool ShouldWrap(const core::Module&, const WrapContext&) const override { return true; }
  std::string Name() const override { return "named_only"; }
};

TEST(IdentityTest, TheDefaultIsTheObjectItself) {
  NamedOnly one, two;
  EXPECT_EQ(one.Identity(), one.Identity());
  EXPECT_NE(one.Identity(), two.Identity());
  EXPECT_NE(one.Identity().find("named_only"), std::string::npos) << one.Identity();
}

}  // namespace
}  // namespace policy
