// Every built-in policy and combinator on a real nn::Gpt (vocab 64, block 32, n_embd 64,
// 2 layers, 4 heads) and on nested nn::Sequentials of nn::Linears, with tied weights,
// ignored modules, existing units, force-leaf and excluded types. Expected unit sets
// follow from the layer definitions (sizes computed here from the config, not read back
// from the plan).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nn/gpt.h"
#include "nn/linear.h"
#include "nn/sequential.h"
#include "nn/transformer.h"
#include "policy/config.h"
#include "policy/plan.h"
#include "policy/wrap_policy.h"

namespace policy {
namespace {

using Strings = std::vector<std::string>;

Strings UnitPaths(const WrapPlan& plan) {
  Strings out;
  for (const WrapUnit& unit : plan.units()) out.push_back(unit.path());
  return out;
}

const WrapUnit& Unit(const WrapPlan& plan, const std::string& path) {
  for (const WrapUnit& unit : plan.units()) {
    if (unit.path() == path) return unit;
  }
  ADD_FAILURE() << "no unit " << path;
  static const WrapUnit* const kNone = new WrapUnit();
  return *kNone;
}

Strings Params(const WrapPlan& plan, const std::string& path) {
  const WrapUnit& unit = Unit(plan, path);
  return Strings(unit.param_names().begin(), unit.param_names().end());
}

// ---- Gpt ----

constexpr int64_t kC = 64;                      // n_embd
constexpr int64_t kV = 64;                      // vocab_size
constexpr int64_t kT = 32;                      // block_size
constexpr int64_t kLn = 2 * kC;                 // LayerNorm weight + bias
constexpr int64_t kQkv = kC * 3 * kC + 3 * kC;  // Linear(C, 3C)
constexpr int64_t kAttnProj = kC * kC + kC;     // Linear(C, C)
constexpr int64_t kFc = kC * 4 * kC + 4 * kC;   // Linear(C, 4C)
constexpr int64_t kMlpProj = 4 * kC * kC + kC;  // Linear(4C, C)
constexpr int64_t kBlock = 2 * kLn + kQkv + kAttnProj + kFc + kMlpProj;
constexpr int64_t kRootRest = kV * kC + kT * kC + kLn;  // wte (tied with lm_head), wpe, ln_f

class GptPlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    nn::GptConfig config;
    config.vocab_size = kV;
    config.block_size = kT;
    config.n_embd = kC;
    config.n_layer = 2;
    config.n_head = 4;
    absl::StatusOr<std::shared_ptr<nn::Gpt>> gpt = nn::Gpt::Create(config);
    ASSERT_TRUE(gpt.ok()) << gpt.status();
    gpt_ = *gpt;
    ASSERT_EQ(gpt_->NumParameterElements(), 2 * kBlock + kRootRest);
  }

  WrapPlan MustPlan(const WrapPolicy& policy, int world_size = 4, const PlanOptions& options = {}) {
    absl::StatusOr<WrapPlan> plan = Plan(*gpt_, policy, world_size, options);
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan.ok() ? *plan : WrapPlan();
  }

  std::shared_ptr<nn::Gpt> gpt_;
};

void ExpectWteTiedIntoRoot(const WrapPlan& plan) {
  ASSERT_EQ(plan.tied_size(), 1);
  const TiedParameter& tied = plan.tied(0);
  EXPECT_EQ(Strings(tied.names().begin(), tied.names().end()),
            (Strings{"wte.weight", "lm_head.weight"}));
  EXPECT_EQ(tied.lca_path(), "");
  EXPECT_EQ(tied.unit_path(), "");
  EXPECT_EQ(tied.note(),
            "tied parameter wte.weight (also lm_head.weight) placed in unit <root> "
            "(Gpt), their lowest common ancestor unit (lowest common ancestor "
            "module: <root> (Gpt))");
  const Strings root = Params(plan, "");
  EXPECT_NE(std::find(root.begin(), root.end(), "wte.weight"), root.end());
}

TEST_F(GptPlanTest, ModuleTypesPerTransformerBlock) {
  WrapPlan plan = MustPlan(*ModuleTypes({"TransformerBlock"}));
  EXPECT_EQ(UnitPaths(plan), (Strings{"blocks.0", "blocks.1", ""}));
  EXPECT_EQ(Unit(plan, "blocks.0").numel(), kBlock);
  EXPECT_EQ(Unit(plan, "blocks.1").param_names(0), "blocks.1.ln_1.weight");
  EXPECT_EQ(Params(plan, ""), (Strings{"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"}));
  EXPECT_EQ(Unit(plan, "").numel(), kRootRest);
  ExpectWteTiedIntoRoot(plan);
}

TEST_F(GptPlanTest, TiedEmbeddingCannotLeaveTheRoot) {
  // Asking for every Embedding: wpe becomes a unit, but wte's weight is also lm_head's,
  // so wte has nothing of its own to claim and the weight stays in the root.
  WrapPlan plan = MustPlan(*ModuleTypes({"Embedding", "Linear"}));
  const Strings paths = UnitPaths(plan);
  EXPECT_EQ(std::count(paths.begin(), paths.end(), "wte"), 0);
  EXPECT_EQ(std::count(paths.begin(), paths.end(), "lm_head"), 0);
  EXPECT_EQ(paths.front(), "wpe");
  EXPECT_EQ(
      Params(plan, ""),
      (Strings{"wte.weight", "blocks.0.ln_1.weight", "blocks.0.ln_1.bias", "blocks.0.ln_2.weight",
               "blocks.0.ln_2.bias", "blocks.1.ln_1.weight", "blocks.1.ln_1.bias",
               "blocks.1.ln_2.weight", "blocks.1.ln_2.bias", "ln_f.weight", "ln_f.bias"}));
  ExpectWteTiedIntoRoot(plan);
}

TEST_F(GptPlanTest, AlwaysWrapsEveryModuleThatHasSomethingToClaim) {
  WrapPlan plan = MustPlan(*Always());
  Strings expected = {"wpe"};
  for (const char* b : {"blocks.0", "blocks.1"}) {
    for (const char* leaf : {".ln_1", ".attn.qkv", ".attn.proj", ".ln_2", ".mlp.fc", ".mlp.proj"}) {
      expected.push_back(std::string(b) + leaf);
    }
  }
  expected.push_back("ln_f");
  expected.push_back("");
  EXPECT_EQ(UnitPaths(plan), expected);
  EXPECT_EQ(Params(plan, ""), (Strings{"wte.weight"}));
  ExpectWteTiedIntoRoot(plan);
}

TEST_F(GptPlanTest, NeverGivesOneRootUnit) {
  WrapPlan plan = MustPlan(*Never());
  EXPECT_EQ(UnitPaths(plan), (Strings{""}));
  EXPECT_EQ(Unit(plan, "").numel(), 2 * kBlock + kRootRest);
  Strings names;
  for (const auto& [name, p] : gpt_->NamedParameters()) names.push_back(name);
  EXPECT_EQ(Params(plan, ""), names);
  EXPECT_EQ(Unit(plan, "").reason(), "root");
}

TEST_F(GptPlanTest, SizeBasedBottomUp) {
  // Threshold between one MLP and one block's remainder: the MLPs (fc + proj) wrap; then
  // each block has only ln_1 + attn + ln_2 left, below the threshold, but the two
  // remainders together reach it at "blocks".
  const int64_t mlp = kFc + kMlpProj;
  const int64_t remainder = 2 * kLn + kQkv + kAttnProj;
  static_assert(kFc < 20000 && kMlpProj < 20000 && kQkv + kAttnProj < 20000, "sizes");
  ASSERT_GE(mlp, 20000);
  ASSERT_LT(remainder, 20000);
  ASSERT_GE(2 * remainder, 20000);
  SizeBasedOptions o;
  o.min_num_params = 20000;
  WrapPlan plan = MustPlan(*SizeBased(o));
  EXPECT_EQ(UnitPaths(plan), (Strings{"blocks.0.mlp", "blocks.1.mlp", "blocks", ""}));
  EXPECT_EQ(Unit(plan, "blocks").numel(), 2 * remainder);
  EXPECT_EQ(Unit(plan, "blocks.0.mlp").reason(),
            "size_based: " + std::to_string(mlp) + " unwrapped >= min_num_params 20000");
  ExpectWteTiedIntoRoot(plan);
}

TEST_F(GptPlanTest, SizeBasedForceLeafKeepsBlocksWhole) {
  SizeBasedOptions o;
  o.min_num_params = 20000;
  o.force_leaf_types = {"TransformerBlock"};
  WrapPlan plan = MustPlan(*SizeBased(o));
  EXPECT_EQ(UnitPaths(plan), (Strings{"blocks.0", "blocks.1", ""}));
  EXPECT_EQ(Unit(plan, "blocks.1").numel(), kBlock);
}

TEST_F(GptPlanTest, SizeBasedExcludedTypeGoesToItsParent) {
  SizeBasedOptions o;
  o.min_num_params = 20000;
  o.excluded_types = {"Mlp"};
  WrapPlan plan = MustPlan(*SizeBased(o));
  EXPECT_EQ(UnitPaths(plan), (Strings{"blocks.0", "blocks.1", ""}));
  const Strings block = Params(plan, "blocks.0");
  EXPECT_NE(std::find(block.begin(), block.end(), "blocks.0.mlp.fc.weight"), block.end());
}

TEST_F(GptPlanTest, LambdaByDepthAndPath) {
  WrapPlan plan = MustPlan(
      *Lambda([](const core::Module&, const WrapContext& c) { return c.depth == 2; }, "depth2"));
  EXPECT_EQ(UnitPaths(plan), (Strings{"blocks.0", "blocks.1", ""}));
  EXPECT_EQ(Unit(plan, "blocks.0").reason(), "depth2");
}

TEST_F(GptPlanTest, OrAndNot) {
  WrapPlan plan = MustPlan(*Or({ModuleTypes({"Mlp"}), ModuleTypes({"CausalSelfAttention"})}));
  EXPECT_EQ(UnitPaths(plan),
            (Strings{"blocks.0.attn", "blocks.0.mlp", "blocks.1.attn", "blocks.1.mlp", ""}));

  plan = MustPlan(*And(
      {ModuleTypes({"TransformerBlock"}),
       Lambda([](const core::Module&, const WrapContext& c) { return c.path == "blocks.1"; })}));
  EXPECT_EQ(UnitPaths(plan), (Strings{"blocks.1", ""}));

  // Everything except the leaf layers: attn and mlp take their Linears, each block its
  // LayerNorms; the blocks' Sequential is left with nothing.
  plan = MustPlan(*And({Always(), Not(ModuleTypes({"Linear", "LayerNorm", "Embedding"}))}));
  EXPECT_EQ(UnitPaths(plan), (Strings{"blocks.0.attn", "blocks.0.mlp", "blocks.0", "blocks.1.attn",
                                      "blocks.1.mlp", "blocks.1", ""}));
  EXPECT_EQ(Params(plan, "blocks.0"), (Strings{"blocks.0.ln_1.weight", "blocks.0.ln_1.bias",
                                               "blocks.0.ln_2.weight", "blocks.0.ln_2.bias"}));
  ExpectWteTiedIntoRoot(plan);
}

TEST_F(GptPlanTest, IgnoredModules) {
  PlanOptions options;
  options.ignored_paths = {"wpe"};
  options.ignored_modules = {gpt_->blocks()->operator[](1).get()};
  WrapPlan plan = MustPlan(*ModuleTypes({"TransformerBlock"}), 4, options);
  EXPECT_EQ(UnitPaths(plan), (Strings{"blocks.0", ""}));
  EXPECT_EQ(Params(plan, ""), (Strings{"wte.weight", "ln_f.weight", "ln_f.bias"}));
  ASSERT_EQ(plan.ignored_size(), 1 + 12);  // wpe.weight and block 1's 12 tensors
  EXPECT_EQ(plan.ignored(0).name(), "wpe.weight");
  EXPECT_EQ(plan.ignored(1).ignored_module(), "blocks.1");
  EXPECT_EQ(plan.totals().ignored_numel(), kT * kC + kBlock);
  EXPECT_EQ(plan.totals().numel(), kBlock + kV * kC + kLn);
}

TEST_F(GptPlanTest, IgnoringTheHeadIgnoresTheTiedEmbedding) {
  PlanOptions options;
  options.ignored_paths = {"lm_head"};
  WrapPlan plan = MustPlan(*ModuleTypes({"TransformerBlock"}), 4, options);
  ASSERT_EQ(plan.ignored_size(), 1);
  EXPECT_EQ(plan.ignored(0).name(), "wte.weight");
  EXPECT_EQ(plan.ignored(0).ignored_module(), "lm_head");
  EXPECT_EQ(Params(plan, ""), (Strings{"wpe.weight", "ln_f.weight", "ln_f.bias"}));
}

TEST_F(GptPlanTest, ExistingBlockUnitIsKept) {
  const auto& block0 = gpt_->blocks()->operator[](0);
  PlanOptions options;
  options.existing_units = {{block0.get(), block0->Parameters()}};
  Strings offered;
  WrapPlan plan = MustPlan(*Lambda([&offered](const core::Module&, const WrapContext& c) {
    offered.push_back(c.path);
    return c.type_name == "TransformerBlock";
  }),
                           4, options);
  EXPECT_EQ(UnitPaths(plan), (Strings{"blocks.0", "blocks.1", ""}));
  EXPECT_TRUE(Unit(plan, "blocks.0").existing());
  EXPECT_EQ(Unit(plan, "blocks.0").reason(), "existing unit");
  EXPECT_FALSE(Unit(plan, "blocks.1").existing());
  for (const std::string& path : offered) EXPECT_NE(path.rfind("blocks.0", 0), 0u) << path;
  // Same units as planning from scratch, so an existing unit does not change the
  // fingerprint other than through its flag.
  WrapPlan fresh = MustPlan(*ModuleTypes({"TransformerBlock"}));
  EXPECT_EQ(FirstDifference(fresh, plan),
            "unit 0 (blocks.0 (TransformerBlock)): existing false vs true");
}

TEST_F(GptPlanTest, FromATextConfigWithIgnoredModules) {
  absl::StatusOr<ConfiguredPolicy> configured = BuildPolicyFromText(R"pb(
    any_of {
      name: "module_types"
      param { key: "types" value: "TransformerBlock" }
    }
    any_of {
      name: "size_based"
      param { key: "min_num_params" value: "1000000" }
    }
    ignored_modules: "wpe"
  )pb");
  ASSERT_TRUE(configured.ok()) << configured.status();
  PlanOptions options;
  options.ignored_paths = configured->ignored_paths;
  WrapPlan plan = MustPlan(*configured->policy, 8, options);
  EXPECT_EQ(UnitPaths(plan), (Strings{"blocks.0", "blocks.1", ""}));
  ASSERT_EQ(plan.ignored_size(), 1);
  EXPECT_EQ(plan.ignored(0).name(), "wpe.weight");
}

TEST_F(GptPlanTest, SameConfigGivesSameFingerprintAcrossModelInstances) {
  nn::GptConfig config = gpt_->config();
  config.seed = 99;  // different weights, same structure
  std::shared_ptr<nn::Gpt> other = nn::Gpt::Create(config).value();
  WrapPlan a = MustPlan(*ModuleTypes({"TransformerBlock"}), 8);
  absl::StatusOr<WrapPlan> b = Plan(*other, *ModuleTypes({"TransformerBlock"}), 8);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(Fingerprint(a), Fingerprint(*b));
  EXPECT_NE(Fingerprint(a), Fingerprint(MustPlan(*ModuleTypes({"TransformerBlock"}), 4)));
  EXPECT_NE(Fingerprint(a), Fingerprint(MustPlan(*ModuleTypes({"Mlp"}), 8)));
}

// ---- Nested Sequentials of Linears ----

constexpr int64_t LinearNumel(int64_t in, int64_t out) { return in * out + out; }

// net = Seq( "0": Seq(Linear(4, 8), Linear(8, 8)),
//            "1": Seq("0": Seq(Linear(8, 8)), "1": Linear(8, 2)) )
std::shared_ptr<nn::Sequential> NestedNet() {
  using nn::Linear;
  using nn::Sequential;
  return Sequential::Make(
      {Sequential::Make({std::make_shared<Linear>(4, 8), std::make_shared<Linear>(8, 8)}),
       Sequential::Make(
           {Sequential::Make({std::make_shared<Linear>(8, 8)}), std::make_shared<Linear>(8, 2)})});
}

TEST(NestedSequentialPlanTest, ModuleTypesSequentialWrapsEachNestedLevel) {
  auto net = NestedNet();
  absl::StatusOr<WrapPlan> plan = Plan(*net, *ModuleTypes({"Sequential"}), 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(UnitPaths(*plan), (Strings{"0", "1.0", "1", ""}));
  EXPECT_EQ(Params(*plan, "0"), (Strings{"0.0.weight", "0.0.bias", "0.1.weight", "0.1.bias"}));
  EXPECT_EQ(Params(*plan, "1"), (Strings{"1.1.weight", "1.1.bias"}));
  EXPECT_TRUE(Params(*plan, "").empty());
}

TEST(NestedSequentialPlanTest, SizeBasedAndAlways) {
  auto net = NestedNet();
  SizeBasedOptions o;
  o.min_num_params = 100;
  ASSERT_GE(LinearNumel(4, 8) + LinearNumel(8, 8), 100);
  ASSERT_LT(LinearNumel(8, 8) + LinearNumel(8, 2), 100);
  absl::StatusOr<WrapPlan> plan = Plan(*net, *SizeBased(o), 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(UnitPaths(*plan), (Strings{"0", ""}));
  EXPECT_EQ(Unit(*plan, "").numel(), LinearNumel(8, 8) + LinearNumel(8, 2));

  plan = Plan(*net, *Always(), 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(UnitPaths(*plan), (Strings{"0.0", "0.1", "1.0.0", "1.1", ""}));
}

TEST(NestedSequentialPlanTest, ForceLeafAtTheRootTypeKeepsOneUnit) {
  // The root is a Sequential too, so nothing below it may wrap.
  auto net = NestedNet();
  SizeBasedOptions o;
  o.min_num_params = 1;
  o.force_leaf_types = {"Sequential"};
  absl::StatusOr<WrapPlan> plan = Plan(*net, *SizeBased(o), 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(UnitPaths(*plan), (Strings{""}));
}

TEST(NestedSequentialPlanTest, OrAndNotOnLinears) {
  auto net = NestedNet();
  // Linears with more than 64 elements that are not in the second branch.
  WrapPolicyPtr p =
      And({ModuleTypes({"Linear"}), Lambda([](const core::Module&, const WrapContext& c) {
             return c.unwrapped_subtree_numel > 64;
           }),
           Not(Lambda([](const core::Module&, const WrapContext& c) {
             return c.path.rfind("1.", 0) == 0;
           }))});
  absl::StatusOr<WrapPlan> plan = Plan(*net, *Or({p, ModuleTypes({"NoSuchType"})}), 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(UnitPaths(*plan), (Strings{"0.1", ""}));  // 0.0 has 40, 0.1 has 72
}

TEST(NestedSequentialPlanTest, TiedLinearsAcrossBranchesGoToTheirCommonAncestor) {
  auto a = std::make_shared<nn::Linear>(8, 8);
  auto b = nn::Linear::Tied(a->weight(), /*bias=*/true);
  auto inner = nn::Sequential::Make({nn::Sequential::Make({a}), nn::Sequential::Make({b})});
  auto net = nn::Sequential::Make({inner, std::make_shared<nn::Linear>(8, 4)});
  absl::StatusOr<WrapPlan> plan = Plan(*net, *ModuleTypes({"Linear", "Sequential"}), 4);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // a and b keep only their biases; the shared weight belongs to "0" (their lowest common
  // ancestor), which is a unit here.
  EXPECT_EQ(UnitPaths(*plan), (Strings{"0.0.0", "0.1.0", "0", "1", ""}));
  EXPECT_EQ(Params(*plan, "0.0.0"), (Strings{"0.0.0.bias"}));
  EXPECT_EQ(Params(*plan, "0.1.0"), (Strings{"0.1.0.bias"}));
  EXPECT_EQ(Params(*plan, "0"), (Strings{"0.0.0.weight"}));
  ASSERT_EQ(plan->tied_size(), 1);
  EXPECT_EQ(plan->tied(0).lca_path(), "0");
  EXPECT_EQ(plan->tied(0).unit_path(), "0");
  EXPECT_EQ(plan->tied(0).note(),
            "tied parameter 0.0.0.weight (also 0.1.0.weight) placed in "
            "unit 0 (Sequential), their lowest common ancestor unit "
            "(lowest common ancestor module: 0 (Sequential))");

  // Without a unit at "0", the nearest unit above the common ancestor is the root.
  plan = Plan(*net, *ModuleTypes({"Linear"}), 4);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(UnitPaths(*plan), (Strings{"0.0.0", "0.1.0", "1", ""}));
  EXPECT_EQ(Params(*plan, ""), (Strings{"0.0.0.weight"}));
  EXPECT_EQ(plan->tied(0).unit_path(), "");
}

TEST(NestedSequentialPlanTest, IgnoredAndExistingInNestedSequentials) {
  auto net = NestedNet();
  PlanOptions options;
  options.ignored_paths = {"1.0"};
  const auto& first = (*net)[0];
  options.existing_units = {{first.get(), first->Parameters()}};
  absl::StatusOr<WrapPlan> plan = Plan(*net, *Always(), 2, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(UnitPaths(*plan), (Strings{"0", "1.1", ""}));
  EXPECT_TRUE(Unit(*plan, "0").existing());
  ASSERT_EQ(plan->ignored_size(), 2);
  EXPECT_EQ(plan->ignored(0).name(), "1.0.0.weight");
  EXPECT_EQ(plan->ignored(1).name(), "1.0.0.bias");
}

}  // namespace
}  // namespace policy
