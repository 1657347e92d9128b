// The planner on small hand-made module trees (policy/testing/test_modules.h), where
// every parameter size is chosen by the test: application order, the context each module
// is offered with, tying and shared modules, ignored modules, existing units, memory
// figures and fingerprints.
#include "policy/plan.h"

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "policy/testing/test_modules.h"

namespace policy {
namespace {

using testing::FindUnit;
using testing::MakeLeaf;
using testing::TestModule;
using testing::UnitParams;
using testing::UnitPaths;
using Strings = std::vector<std::string>;

bool Has(absl::string_view haystack, const std::string& needle) {
  return haystack.find(needle) != absl::string_view::npos;
}

// net (Net, own "scale" 1)
//   a (Block): w0 10
//   b (Block): w0 3
//     c (Leaf): w0 5
//   head (Leaf): w0 2
struct SmallNet {
  std::shared_ptr<TestModule> net = TestModule::Make("Net");
  std::shared_ptr<TestModule> a, b, c, head;
  SmallNet() {
    net->AddParam("scale", 1);
    a = net->AddChild("a", MakeLeaf("Block", {10}));
    b = net->AddChild("b", MakeLeaf("Block", {3}));
    c = b->AddChild("c", MakeLeaf("Leaf", {5}));
    head = net->AddChild("head", MakeLeaf("Leaf", {2}));
  }
};

// Records the context of every module a policy is offered, and wraps per `decide`.
struct Recorder {
  std::map<std::string, WrapContext> seen;
  std::vector<std::string> order;
  WrapPolicyPtr Policy(std::function<bool(const WrapContext&)> decide) {
    return Lambda(
        [this, decide](const core::Module&, const WrapContext& c) {
          seen[c.path] = c;
          order.push_back(c.path);
          return decide(c);
        },
        "recorder");
  }
};

TEST(PlanTest, UnitsInPostOrderWithParametersInNamedParametersOrder) {
  SmallNet m;
  absl::StatusOr<WrapPlan> plan = Plan(*m.net, *ModuleTypes({"Block"}), 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(UnitPaths(*plan), (Strings{"a", "b", ""}));
  EXPECT_EQ(UnitParams(*plan, "a"), (Strings{"a.w0"}));
  EXPECT_EQ(UnitParams(*plan, "b"), (Strings{"b.w0", "b.c.w0"}));
  EXPECT_EQ(UnitParams(*plan, ""), (Strings{"scale", "head.w0"}));
  EXPECT_EQ(plan->units(0).reason(), "module_types: type Block");
  EXPECT_EQ(plan->units(2).reason(), "root");
  EXPECT_EQ(plan->units(1).type_name(), "Block");
  EXPECT_EQ(plan->units(1).depth(), 1);
  EXPECT_EQ(plan->policy(), "module_types(Block)");
  EXPECT_TRUE(plan->tied().empty());
  EXPECT_TRUE(plan->ignored().empty());
}

TEST(PlanTest, PolicySeesPostOrderContextsWithUnclaimedNumel) {
  SmallNet m;
  Recorder r;
  // Wrap c only: b then sees only its own 3 elements as unwrapped.
  absl::StatusOr<WrapPlan> plan =
      Plan(*m.net, *r.Policy([](const WrapContext& c) { return c.path == "b.c"; }), 1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // Children before parents, in registration order; the root is never offered.
  EXPECT_EQ(r.order, (Strings{"a", "b.c", "b", "head"}));
  const WrapContext& b = r.seen.at("b");
  EXPECT_EQ(b.type_name, "Block");
  EXPECT_EQ(b.depth, 1);
  EXPECT_EQ(b.own_numel, 3);
  EXPECT_EQ(b.unwrapped_subtree_numel, 3);
  EXPECT_EQ(b.ancestor_types, (Strings{"Net"}));
  const WrapContext& c = r.seen.at("b.c");
  EXPECT_EQ(c.depth, 2);
  EXPECT_EQ(c.unwrapped_subtree_numel, 5);
  EXPECT_EQ(c.ancestor_types, (Strings{"Net", "Block"}));
  EXPECT_EQ(UnitPaths(*plan), (Strings{"b.c", ""}));
  EXPECT_EQ(UnitParams(*plan, ""), (Strings{"scale", "a.w0", "b.w0", "head.w0"}));
  EXPECT_EQ(plan->units(0).reason(), "recorder");
}

TEST(PlanTest, AlwaysWrapsEveryModuleWithParametersAndNeverOnlyTheRoot) {
  SmallNet m;
  m.net->AddChild("act", TestModule::Make("ReLU"));  // no parameters: never a unit
  absl::StatusOr<WrapPlan> always = Plan(*m.net, *Always(), 4);
  ASSERT_TRUE(always.ok()) << always.status();
  EXPECT_EQ(UnitPaths(*always), (Strings{"a", "b.c", "b", "head", ""}));
  EXPECT_EQ(UnitParams(*always, ""), (Strings{"scale"}));

  absl::StatusOr<WrapPlan> never = Plan(*m.net, *Never(), 4);
  ASSERT_TRUE(never.ok()) << never.status();
  EXPECT_EQ(UnitPaths(*never), (Strings{""}));
  EXPECT_EQ(UnitParams(*never, ""), (Strings{"scale", "a.w0", "b.w0", "b.c.w0", "head.w0"}));
}

TEST(PlanTest, RootTakesWhatIsLeftEvenWhenEmpty) {
  auto net = TestModule::Make("Net");
  net->AddChild("only", MakeLeaf("Block", {4}));
  absl::StatusOr<WrapPlan> plan = Plan(*net, *Always(), 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(UnitPaths(*plan), (Strings{"only", ""}));
  EXPECT_EQ(FindUnit(*plan, "")->numel(), 0);
  EXPECT_EQ(FindUnit(*plan, "")->padded_numel(), 0);
}

TEST(PlanTest, SizeBasedCountsOnlyUnclaimedElements) {
  // seq (Seq): three groups (Group) of two leaves (Leaf) of 10 elements each.
  auto seq = TestModule::Make("Seq");
  for (int g = 0; g < 3; ++g) {
    auto group = seq->AddChild(std::to_string(g), TestModule::Make("Group"));
    group->AddChild("x", MakeLeaf("Leaf", {10}));
    group->AddChild("y", MakeLeaf("Leaf", {10}));
  }
  SizeBasedOptions o;
  o.min_num_params = 15;  // a leaf (10) is too small, a group (20) is big enough
  absl::StatusOr<WrapPlan> plan = Plan(*seq, *SizeBased(o), 1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(UnitPaths(*plan), (Strings{"0", "1", "2", ""}));
  EXPECT_EQ(plan->units(0).reason(), "size_based: 20 unwrapped >= min_num_params 15");

  o.min_num_params = 10;  // now the leaves wrap and the groups have nothing left
  plan = Plan(*seq, *SizeBased(o), 1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(UnitPaths(*plan), (Strings{"0.x", "0.y", "1.x", "1.y", "2.x", "2.y", ""}));
}

TEST(PlanTest, ForceLeafAndExcludedTypes) {
  SmallNet m;
  SizeBasedOptions o;
  o.min_num_params = 1;
  o.force_leaf_types = {"Block"};  // c (inside b) must not wrap
  o.excluded_types = {"Net"};
  absl::StatusOr<WrapPlan> plan = Plan(*m.net, *SizeBased(o), 1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(UnitPaths(*plan), (Strings{"a", "b", "head", ""}));
  EXPECT_EQ(UnitParams(*plan, "b"), (Strings{"b.w0", "b.c.w0"}));

  o.force_leaf_types = {};
  o.excluded_types = {"Block"};  // blocks never wrap; c and head do
  plan = Plan(*m.net, *SizeBased(o), 1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(UnitPaths(*plan), (Strings{"b.c", "head", ""}));
  EXPECT_EQ(UnitParams(*plan, ""), (Strings{"scale", "a.w0", "b.w0"}));
}

TEST(PlanTest, CombinatorsOnATree) {
  SmallNet m;
  SizeBasedOptions o;
  o.min_num_params = 4;
  // Leaves of >= 4 elements, or Blocks not at depth 1. Both Blocks are at depth 1, so
  // only the Not keeps them out; of the leaves only c (5) is big enough, head (2) is not.
  WrapPolicyPtr p = Or(
      {And({ModuleTypes({"Leaf"}), SizeBased(o)}),
       And({ModuleTypes({"Block"}),
            Not(Lambda([](const core::Module&, const WrapContext& c) { return c.depth == 1; }))})});
  absl::StatusOr<WrapPlan> plan = Plan(*m.net, *p, 1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(UnitPaths(*plan), (Strings{"b.c", ""}));
  EXPECT_EQ(plan->units(0).reason(),
            "and(module_types: type Leaf; size_based: 5 unwrapped >= "
            "min_num_params 4)");
}

TEST(PlanTest, TiedParameterLandsInLowestCommonAncestorUnit) {
  // net { enc (Block) { emb (Leaf): weight 6 }, dec (Block) { out (Leaf): weight = emb's } }
  auto net = TestModule::Make("Net");
  auto enc = net->AddChild("enc", TestModule::Make("Block"));
  auto emb = enc->AddChild("emb", TestModule::Make("Leaf"));
  core::ParameterPtr w = emb->AddParam("weight", 6);
  emb->AddParam("bias", 2);
  auto dec = net->AddChild("dec", TestModule::Make("Block"));
  dec->AddChild("out", TestModule::Make("Leaf"))->AddParam("weight", w);
  dec->AddParam("gain", 1);
  Recorder r;
  absl::StatusOr<WrapPlan> plan =
      Plan(*net, *r.Policy([](const WrapContext& c) { return c.type_name == "Block"; }), 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // enc cannot claim the tied weight (its uses meet at the root) and dec.out has nothing.
  EXPECT_EQ(r.seen.at("enc").unwrapped_subtree_numel, 2);
  EXPECT_EQ(r.seen.at("enc.emb").own_numel, 8);
  EXPECT_EQ(r.seen.count("dec.out"), 0u);
  EXPECT_EQ(UnitPaths(*plan), (Strings{"enc", "dec", ""}));
  EXPECT_EQ(UnitParams(*plan, "enc"), (Strings{"enc.emb.bias"}));
  EXPECT_EQ(UnitParams(*plan, "dec"), (Strings{"dec.gain"}));
  EXPECT_EQ(UnitParams(*plan, ""), (Strings{"enc.emb.weight"}));
  ASSERT_EQ(plan->tied_size(), 1);
  const TiedParameter& tied = plan->tied(0);
  EXPECT_EQ(Strings(tied.names().begin(), tied.names().end()),
            (Strings{"enc.emb.weight", "dec.out.weight"}));
  EXPECT_EQ(tied.lca_path(), "");
  EXPECT_EQ(tied.unit_path(), "");
  EXPECT_EQ(tied.note(),
            "tied parameter enc.emb.weight (also dec.out.weight) placed in unit "
            "<root> (Net), their lowest common ancestor unit (lowest common "
            "ancestor module: <root> (Net))");
}

TEST(PlanTest, TiedInsideOneSubtreeStaysInThatSubtreesUnit) {
  // net { blk (Block) { x (Leaf): w 4, y (Leaf): w = x's }, other (Leaf): 3 }
  auto net = TestModule::Make("Net");
  auto blk = net->AddChild("blk", TestModule::Make("Block"));
  auto x = blk->AddChild("x", TestModule::Make("Leaf"));
  core::ParameterPtr w = x->AddParam("w", 4);
  blk->AddChild("y", TestModule::Make("Leaf"))->AddParam("w", w);
  net->AddChild("other", MakeLeaf("Leaf", {3}));
  // Always: x and y are offered nothing (the weight's home is blk), blk claims it.
  absl::StatusOr<WrapPlan> plan = Plan(*net, *Always(), 1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(UnitPaths(*plan), (Strings{"blk", "other", ""}));
  EXPECT_EQ(UnitParams(*plan, "blk"), (Strings{"blk.x.w"}));
  ASSERT_EQ(plan->tied_size(), 1);
  EXPECT_EQ(plan->tied(0).lca_path(), "blk");
  EXPECT_EQ(plan->tied(0).unit_path(), "blk");

  // With only "other" wrapped, the lowest common ancestor unit of blk's weight is the root.
  plan = Plan(*net, *ModuleTypes({"Leaf"}), 1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(UnitPaths(*plan), (Strings{"other", ""}));
  EXPECT_EQ(plan->tied(0).unit_path(), "");
}

TEST(PlanTest, SharedModuleCountsAsUsedAtBothParents) {
  // net { p1 (Block) { s (Leaf): 5 }, p2 (Block) { s (same module) , own 1 } }
  auto net = TestModule::Make("Net");
  auto shared = MakeLeaf("Leaf", {5});
  net->AddChild("p1", TestModule::Make("Block"))->AddChild("s", shared);
  auto p2 = net->AddChild("p2", TestModule::Make("Block"));
  p2->AddChild("s", shared);
  p2->AddParam("own", 1);
  absl::StatusOr<WrapPlan> plan = Plan(*net, *Always(), 1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(UnitPaths(*plan), (Strings{"p2", ""}));
  EXPECT_EQ(UnitParams(*plan, ""), (Strings{"p1.s.w0"}));
  ASSERT_EQ(plan->tied_size(), 1);
  EXPECT_EQ(Strings(plan->tied(0).names().begin(), plan->tied(0).names().end()),
            (Strings{"p1.s.w0", "p2.s.w0"}));
}

TEST(PlanTest, ParameterRegisteredTwiceOnOneModule) {
  auto net = TestModule::Make("Net");
  auto leaf = net->AddChild("leaf", TestModule::Make("Leaf"));
  core::ParameterPtr w = leaf->AddParam("a", 7);
  leaf->AddParam("b", w);
  Recorder r;
  absl::StatusOr<WrapPlan> plan = Plan(*net, *r.Policy([](const WrapContext&) { return true; }), 1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(r.seen.at("leaf").own_numel, 7);  // counted once
  EXPECT_EQ(r.seen.at("leaf").unwrapped_subtree_numel, 7);
  EXPECT_EQ(UnitParams(*plan, "leaf"), (Strings{"leaf.a"}));
  EXPECT_EQ(FindUnit(*plan, "leaf")->numel(), 7);
  ASSERT_EQ(plan->tied_size(), 1);
  EXPECT_EQ(plan->tied(0).unit_path(), "leaf");
}

TEST(PlanTest, IgnoredModulesAreUnmanagedAndNeverOffered) {
  SmallNet m;
  Recorder r;
  PlanOptions options;
  options.ignored_paths = {"b"};
  options.ignored_modules = {m.head.get()};
  absl::StatusOr<WrapPlan> plan =
      Plan(*m.net, *r.Policy([](const WrapContext&) { return true; }), 2, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(r.order, (Strings{"a"}));
  EXPECT_EQ(UnitPaths(*plan), (Strings{"a", ""}));
  EXPECT_EQ(UnitParams(*plan, ""), (Strings{"scale"}));
  ASSERT_EQ(plan->ignored_size(), 3);
  EXPECT_EQ(plan->ignored(0).name(), "b.w0");
  EXPECT_EQ(plan->ignored(0).ignored_module(), "b");
  EXPECT_EQ(plan->ignored(1).name(), "b.c.w0");
  EXPECT_EQ(plan->ignored(1).ignored_module(), "b");
  EXPECT_EQ(plan->ignored(2).name(), "head.w0");
  EXPECT_EQ(plan->ignored(2).ignored_module(), "head");
  EXPECT_EQ(plan->totals().ignored_numel(), 3 + 5 + 2);
  EXPECT_EQ(plan->totals().numel(), 1 + 10);
}

TEST(PlanTest, ParameterTiedIntoAnIgnoredModuleIsIgnored) {
  auto net = TestModule::Make("Net");
  core::ParameterPtr w = net->AddChild("emb", TestModule::Make("Leaf"))->AddParam("w", 4);
  net->AddChild("head", TestModule::Make("Leaf"))->AddParam("w", w);
  PlanOptions options;
  options.ignored_paths = {"head"};
  absl::StatusOr<WrapPlan> plan = Plan(*net, *Always(), 1, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(UnitPaths(*plan), (Strings{""}));
  EXPECT_TRUE(UnitParams(*plan, "").empty());
  ASSERT_EQ(plan->ignored_size(), 1);
  EXPECT_EQ(plan->ignored(0).name(), "emb.w");
  EXPECT_EQ(plan->ignored(0).ignored_module(), "head");
  ASSERT_EQ(plan->tied_size(), 1);
  EXPECT_TRUE(Has(plan->tied(0).note(), "is ignored, with head (Leaf)")) << plan->tied(0).note();
}

TEST(PlanTest, BadIgnoredModulesAreInvalidArgument) {
  SmallNet m;
  PlanOptions options;
  options.ignored_paths = {"b.zz"};
  absl::Status s = Plan(*m.net, *Always(), 1, options).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      Has(s.message(), "PlanOptions.ignored_paths: no module at path 'b.zz' in <root> (Net)"))
      << s;
  options.ignored_paths = {""};
  s = Plan(*m.net, *Always(), 1, options).status();
  EXPECT_TRUE(Has(s.message(), "cannot be ignored")) << s;
  options.ignored_paths = {};
  auto stranger = MakeLeaf("Leaf", {1});
  options.ignored_modules = {stranger.get()};
  s = Plan(*m.net, *Always(), 1, options).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(s.message(), "PlanOptions.ignored_modules: <root> (Leaf) is not in the tree"))
      << s;
}

TEST(PlanTest, ExistingUnitsAreKeptAndTheirSubtreesNotOffered) {
  SmallNet m;
  Recorder r;
  PlanOptions options;
  // The user wrapped b first (it holds b.w0 and b.c.w0).
  options.existing_units = {
      {m.b.get(), {m.b->OwnParameters()[0].second, m.c->OwnParameters()[0].second}}};
  absl::StatusOr<WrapPlan> plan =
      Plan(*m.net, *r.Policy([](const WrapContext&) { return true; }), 2, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(r.order, (Strings{"a", "head"}));
  EXPECT_EQ(UnitPaths(*plan), (Strings{"a", "b", "head", ""}));
  const WrapUnit* b = FindUnit(*plan, "b");
  EXPECT_TRUE(b->existing());
  EXPECT_EQ(b->reason(), "existing unit");
  EXPECT_EQ(UnitParams(*plan, "b"), (Strings{"b.w0", "b.c.w0"}));
  EXPECT_FALSE(FindUnit(*plan, "a")->existing());
}

TEST(PlanTest, CheckpointPolicyIsAskedInPreOrderOutsideIgnoredAndExistingUnits) {
  SmallNet m;
  Recorder wrap, checkpoint;
  PlanOptions options;
  options.ignored_modules = {m.head.get()};
  WrapPolicyPtr picks =
      checkpoint.Policy([](const WrapContext& c) { return c.type_name == "Block"; });
  options.checkpoint_policy = picks.get();
  absl::StatusOr<WrapPlan> plan =
      Plan(*m.net, *wrap.Policy([](const WrapContext&) { return false; }), 2, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // Pre-order, without the root and the ignored head; the subtree's managed elements.
  EXPECT_EQ(checkpoint.order, (Strings{"a", "b", "b.c"}));
  EXPECT_EQ(checkpoint.seen["b"].unwrapped_subtree_numel, 3 + 5);
  EXPECT_EQ(plan->checkpoint_policy(), "recorder");
  ASSERT_EQ(plan->checkpointed_size(), 2);
  EXPECT_EQ(plan->checkpointed(0).path(), "a");
  EXPECT_EQ(plan->checkpointed(0).type_name(), "Block");
  EXPECT_EQ(plan->checkpointed(0).reason(), "recorder");
  EXPECT_EQ(plan->checkpointed(1).path(), "b");
  // Checkpointing changes no collective: the fingerprint ignores it.
  PlanOptions no_checkpoint = options;
  no_checkpoint.checkpoint_policy = nullptr;
  absl::StatusOr<WrapPlan> without =
      Plan(*m.net, *wrap.Policy([](const WrapContext&) { return false; }), 2, no_checkpoint);
  ASSERT_TRUE(without.ok());
  EXPECT_EQ(without->checkpointed_size(), 0);
  EXPECT_EQ(without->checkpoint_policy(), "");
  EXPECT_EQ(Fingerprint(*plan), Fingerprint(*without));

  // An existing unit and what it holds are not asked.
  Recorder again;
  WrapPolicyPtr all = again.Policy([](const WrapContext&) { return true; });
  PlanOptions existing;
  existing.existing_units = {
      {m.b.get(), {m.b->OwnParameters()[0].second, m.c->OwnParameters()[0].second}}};
  existing.checkpoint_policy = all.get();
  plan = Plan(*m.net, *Never(), 2, existing);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(again.order, (Strings{"a", "head"}));

  // An invalid checkpoint policy is InvalidArgument naming the option.
  WrapPolicyPtr bad = EveryKth({"Block"}, 0);
  PlanOptions invalid;
  invalid.checkpoint_policy = bad.get();
  plan = Plan(*m.net, *Never(), 2, invalid);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(plan.status().message(), "PlanOptions.checkpoint_policy (every_kth(Block; k=0))"))
      << plan.status();
}

TEST(PlanTest, ExistingUnitKeepsExactlyWhatItHolds) {
  SmallNet m;
  PlanOptions options;
  // c is an existing unit holding its weight; b (not inside c) is still offered, and
  // declined by Never, so b's own weight goes to the root.
  options.existing_units = {{m.c.get(), {m.c->OwnParameters()[0].second}}};
  absl::StatusOr<WrapPlan> plan = Plan(*m.net, *Never(), 1, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(UnitPaths(*plan), (Strings{"b.c", ""}));
  EXPECT_EQ(UnitParams(*plan, ""), (Strings{"scale", "a.w0", "b.w0", "head.w0"}));

  // An existing unit that holds only part of its subtree: the rest goes to the nearest
  // new unit above (here the root).
  options.existing_units = {{m.b.get(), {m.b->OwnParameters()[0].second}}};
  plan = Plan(*m.net, *Always(), 1, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(UnitPaths(*plan), (Strings{"a", "b", "head", ""}));
  EXPECT_EQ(UnitParams(*plan, "b"), (Strings{"b.w0"}));
  EXPECT_EQ(UnitParams(*plan, ""), (Strings{"scale", "b.c.w0"}));
}

TEST(PlanTest, BadExistingUnitsAreInvalidArgument) {
  SmallNet m;
  auto stranger = MakeLeaf("Leaf", {1});
  PlanOptions options;
  options.existing_units = {{stranger.get(), {}}};
  absl::Status s = Plan(*m.net, *Always(), 1, options).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(s.message(), "PlanOptions.existing_units[0]: <root> (Leaf) is not in the tree"))
      << s;

  options.existing_units = {{m.a.get(), {m.head->OwnParameters()[0].second}}};
  s = Plan(*m.net, *Always(), 1, options).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(s.message(), "(head.w0) is not used inside that module")) << s;

  options.existing_units = {{m.b.get(), {m.c->OwnParameters()[0].second}},
                            {m.c.get(), {m.c->OwnParameters()[0].second}}};
  s = Plan(*m.net, *Always(), 1, options).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(s.message(), "(b.c.w0) is also held by existing unit b (Block)")) << s;

  options.existing_units = {{m.c.get(), {}}};
  options.ignored_paths = {"b"};
  s = Plan(*m.net, *Always(), 1, options).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(s.message(), "b.c (Leaf) is ignored (b (Block))")) << s;

  // The root as an existing unit that does not hold everything: nowhere to put the rest.
  options = {};
  options.existing_units = {{m.net.get(), {m.net->OwnParameters()[0].second}}};
  s = Plan(*m.net, *Never(), 1, options).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(s.message(), "is an existing unit but does not hold a.w0")) << s;
}

TEST(PlanTest, BadWorldSizeOrPolicyIsInvalidArgument) {
  SmallNet m;
  absl::Status s = Plan(*m.net, *Always(), 0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(s.message(), "world_size")) << s;
  s = Plan(*m.net, *Or({Always(), nullptr}), 2).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(s.message(), "or: policy 1 of 2 is null")) << s;
}

TEST(PlanTest, MemoryFiguresFollowThePaddedShard) {
  SmallNet m;
  const int n = 4;
  absl::StatusOr<WrapPlan> plan = Plan(*m.net, *ModuleTypes({"Block"}), n);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // a: 10 -> 12; b: 3 + 5 = 8 -> 8; root: 1 + 2 = 3 -> 4 (multiples of 4 at or above).
  const std::map<std::string, std::pair<int64_t, int64_t>> expected = {
      {"a", {10, 12}}, {"b", {8, 8}}, {"", {3, 4}}};
  int64_t padded_sum = 0;
  for (const WrapUnit& u : plan->units()) {
    const auto& [numel, padded] = expected.at(u.path());
    EXPECT_EQ(u.numel(), numel) << u.path();
    EXPECT_EQ(u.padded_numel(), padded) << u.path();
    EXPECT_EQ(u.shard_numel(), padded / n) << u.path();
    EXPECT_EQ(u.fp32().params_bytes(), 4 * padded / n);
    EXPECT_EQ(u.fp32().grads_bytes(), 4 * padded / n);
    EXPECT_EQ(u.fp32().optim_bytes(), 8 * padded / n);
    EXPECT_EQ(u.fp32().total_bytes(), 16 * padded / n);
    EXPECT_EQ(u.fp32().gathered_params_bytes(), 4 * padded);
    EXPECT_EQ(u.bf16_mixed().params_bytes(), 2 * padded / n);
    EXPECT_EQ(u.bf16_mixed().grads_bytes(), 2 * padded / n);
    EXPECT_EQ(u.bf16_mixed().optim_bytes(), 12 * padded / n);
    EXPECT_EQ(u.bf16_mixed().total_bytes(), 16 * padded / n);
    EXPECT_EQ(u.bf16_mixed().gathered_params_bytes(), 2 * padded);
    padded_sum += padded;
  }
  const PlanTotals& t = plan->totals();
  EXPECT_EQ(t.numel(), 21);
  EXPECT_EQ(t.padded_numel(), padded_sum);
  EXPECT_EQ(t.per_rank_fp32_bytes(), 16 * padded_sum / n);
  EXPECT_EQ(t.per_rank_bf16_mixed_bytes(), (2 + 2 + 12) * padded_sum / n);
  EXPECT_EQ(t.unsharded_fp32_bytes(), 16 * 21);
  EXPECT_EQ(t.max_gathered_fp32_bytes(), 4 * 12);
  EXPECT_EQ(t.max_gathered_bf16_bytes(), 2 * 12);
}

// The encoding of NOTE [Plan fingerprint encoding], written out again from the note.
class ReferenceFnv {
 public:
  void Byte(unsigned char b) {
    h_ ^= b;
    h_ *= 0x100000001b3ull;
  }
  void U64(uint64_t v) {
    for (int i = 0; i < 8; ++i) Byte(static_cast<unsigned char>((v >> (8 * i)) & 0xff));
  }
  void Str(const std::string& s) {
    U64(s.size());
    for (char c : s) Byte(static_cast<unsigned char>(c));
  }
  uint64_t h_ = 0xcbf29ce484222325ull;
};

uint64_t ReferenceFingerprint(const WrapPlan& plan) {
  ReferenceFnv p;
  p.Str("policy.WrapPlan.v1");
  p.U64(static_cast<uint64_t>(plan.world_size()));
  p.U64(plan.units_size());
  for (const WrapUnit& unit : plan.units()) {
    ReferenceFnv u;
    u.Str("policy.WrapUnit.v1");
    u.Str(unit.path());
    u.Str(unit.type_name());
    u.U64(unit.param_names_size());
    for (const std::string& name : unit.param_names()) u.Str(name);
    u.U64(static_cast<uint64_t>(unit.numel()));
    u.U64(static_cast<uint64_t>(unit.padded_numel()));
    u.U64(unit.existing() ? 1 : 0);
    p.U64(u.h_);
  }
  p.U64(plan.ignored_size());
  for (const IgnoredParameter& ignored : plan.ignored()) {
    p.Str(ignored.name());
    p.U64(static_cast<uint64_t>(ignored.numel()));
  }
  return p.h_;
}

TEST(FingerprintTest, FollowsTheDocumentedEncodingAndIsReproducible) {
  SmallNet m1, m2;
  PlanOptions options;
  options.ignored_paths = {"head"};
  WrapPlan p1 = Plan(*m1.net, *ModuleTypes({"Block"}), 4, options).value();
  WrapPlan p2 = Plan(*m2.net, *ModuleTypes({"Block"}), 4, options).value();
  EXPECT_EQ(Fingerprint(p1), ReferenceFingerprint(p1));
  EXPECT_EQ(Fingerprint(p1), Fingerprint(p2));  // separately built, equal models
  EXPECT_EQ(FirstDifference(p1, p2), "");
  EXPECT_EQ(FirstDifferingUnit(p1, UnitFingerprints(p2)), "");
  // Reasons and memory figures are not part of it.
  p2.mutable_units(0)->set_reason("something else");
  p2.mutable_units(0)->mutable_fp32()->set_total_bytes(1);
  EXPECT_EQ(Fingerprint(p1), Fingerprint(p2));
}

TEST(FingerprintTest, ChangesWithPathParamsNumelAndWorldSize) {
  SmallNet m;
  const WrapPlan base = Plan(*m.net, *ModuleTypes({"Block"}), 4).value();
  const uint64_t fp = Fingerprint(base);

  WrapPlan world = Plan(*m.net, *ModuleTypes({"Block"}), 8).value();
  EXPECT_NE(Fingerprint(world), fp);
  EXPECT_EQ(FirstDifference(base, world), "world_size 4 vs 8");

  WrapPlan path = base;
  path.mutable_units(1)->set_path("bb");
  EXPECT_NE(Fingerprint(path), fp);
  EXPECT_EQ(FirstDifference(base, path), "unit 1: path b (Block) vs bb (Block)");
  EXPECT_EQ(FirstDifferingUnit(base, UnitFingerprints(path)), "unit 1 (b (Block)) differs");

  WrapPlan params = base;
  params.mutable_units(1)->set_param_names(1, "b.c.w1");
  EXPECT_NE(Fingerprint(params), fp);
  EXPECT_EQ(FirstDifference(base, params), "unit 1 (b (Block)): parameter 1 b.c.w0 vs b.c.w1");

  WrapPlan numel = base;
  numel.mutable_units(0)->set_numel(11);
  EXPECT_NE(Fingerprint(numel), fp);
  EXPECT_EQ(FirstDifference(base, numel), "unit 0 (a (Block)): numel 10 vs 11");

  // A different policy choosing a different unit set.
  WrapPlan other = Plan(*m.net, *Never(), 4).value();
  EXPECT_NE(Fingerprint(other), fp);
  EXPECT_EQ(FirstDifference(base, other), "unit 0: path a (Block) vs <root> (Net)");
  EXPECT_EQ(FirstDifferingUnit(base, UnitFingerprints(other)), "unit 0 (a (Block)) differs");

  WrapPlan fewer = base;
  fewer.mutable_units()->RemoveLast();
  EXPECT_NE(Fingerprint(fewer), fp);
  EXPECT_EQ(FirstDifference(base, fewer), "unit 2: only in the first plan (<root> (Net))");
  EXPECT_EQ(FirstDifferingUnit(base, UnitFingerprints(fewer)),
            "unit count 3 vs 2; the first 2 units agree");
}

}  // namespace
}  // namespace policy
