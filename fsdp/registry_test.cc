// WrapperRegistry: one test per row of DESIGN.md's table of repeated wraps, with the
// error messages checked, plus the weak references and the counters.
#include "fsdp/registry.h"

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "comm/testing/thread_ranks.h"
#include "core/status_macros.h"
#include "fsdp/fully_shard.h"
#include "fsdp/testing/gpt_training.h"
#include "gtest/gtest.h"
#include "nn/nn.h"
#include "policy/wrap_policy.h"

namespace fsdp {
namespace {

FullyShardOptions PerBlock() { return testing::PerBlockOptions(ShardingStrategy::kFullShard); }

comm::testing::ThreadRanksOptions ShortRun() {
  comm::testing::ThreadRanksOptions o;
  o.timeout = absl::Seconds(40);
  return o;
}

// Row 1: a unit root again, same options and group: the existing handle, no
// allocation, zero parameter bytes copied, counted as a reuse.
TEST(RegistryTableTest, RewrapSameOptionsAndGroupReturnsTheExistingHandle) {
  absl::Status s = comm::testing::RunThreadRanks(
      2,
      [](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(testing::TinySetup()));
        WrapperRegistry registry;
        ASSIGN_OR_RETURN(auto first, FullyShard(gpt, ctx.group, PerBlock(), &registry));
        const RegistryCounters c = registry.counters();
        EXPECT_EQ(c.wraps, 1);
        EXPECT_EQ(c.units_created, 3);
        EXPECT_GT(c.param_bytes_copied, 0);
        ctx.allocator->ResetPeaks();
        const core::MemoryStats mem = ctx.allocator->Stats();
        ASSIGN_OR_RETURN(auto again, FullyShard(gpt, ctx.group, PerBlock(), &registry));
        const core::MemoryStats after = ctx.allocator->Stats();
        EXPECT_EQ(again, first);
        EXPECT_EQ(registry.counters().reuses, c.reuses + 1);
        EXPECT_EQ(registry.counters().wraps, c.wraps);
        EXPECT_EQ(registry.counters().units_created, c.units_created);
        EXPECT_EQ(registry.counters().param_bytes_copied, c.param_bytes_copied);
        EXPECT_EQ(after.peak_total, mem.current_total);  // nothing allocated, even briefly
        EXPECT_EQ(after.num_allocations, mem.num_allocations);
        // A unit root that another wrap created: its existing unit, in a handle of its own.
        std::shared_ptr<core::Module> block0 = gpt->blocks()->modules()[0];
        ASSIGN_OR_RETURN(auto block_handle, FullyShard(block0, ctx.group, PerBlock(), &registry));
        EXPECT_EQ(block_handle->root_unit(), registry.FindUnit(*block0));
        EXPECT_EQ(block_handle->root_unit(), first->units()[0]);
        ASSIGN_OR_RETURN(auto block_again, FullyShard(block0, ctx.group, PerBlock(), &registry));
        EXPECT_EQ(block_again, block_handle);
        EXPECT_EQ(registry.counters().reuses, c.reuses + 3);
        EXPECT_EQ(registry.counters().param_bytes_copied, c.param_bytes_copied);
        EXPECT_EQ(registry.NumUnits(), 3);
        return absl::OkStatus();
      },
      ShortRun());
  EXPECT_TRUE(s.ok()) << s;
}

// Row 2: a unit root again with different options: FailedPrecondition naming the
// module path and the differing option (the group counts as an option).
TEST(RegistryTableTest, RewrapWithDifferentOptionsNamesModuleAndOption) {
  absl::Status s = comm::testing::RunThreadRanks(
      2,
      [](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(testing::TinySetup()));
        WrapperRegistry registry;
        ASSIGN_OR_RETURN(auto first, FullyShard(gpt, ctx.group, PerBlock(), &registry));
        FullyShardOptions other = PerBlock();
        other.strategy = ShardingStrategy::kShardGradOp;
        absl::Status st = FullyShard(gpt, ctx.group, other, &registry).status();
        EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
        EXPECT_TRUE(absl::StrContains(st.message(), "FullyShard(<root> (Gpt))")) << st;
        EXPECT_TRUE(absl::StrContains(st.message(), "strategy: FULL_SHARD vs SHARD_GRAD_OP")) << st;

        other = PerBlock();
        other.limit_all_gathers = 1;
        st = FullyShard(gpt->blocks()->modules()[1], ctx.group, other, &registry).status();
        EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
        EXPECT_TRUE(absl::StrContains(st.message(), "FullyShard(blocks.1 (TransformerBlock))"))
            << st;
        EXPECT_TRUE(absl::StrContains(st.message(), "limit_all_gathers: 2 vs 1")) << st;

        other = PerBlock();
        other.policy = policy::Always();
        st = FullyShard(gpt, ctx.group, other, &registry).status();
        EXPECT_TRUE(absl::StrContains(st.message(), "policy: module_types(")) << st;

        // Another group object (a subgroup of the same ranks).
        ASSIGN_OR_RETURN(auto copy, ctx.group->NewSubgroup({0, 1}, {}));
        st = FullyShard(gpt, copy, PerBlock(), &registry).status();
        EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
        EXPECT_TRUE(absl::StrContains(st.message(), "option group")) << st;
        EXPECT_EQ(registry.counters().reuses, 0);
        EXPECT_EQ(registry.counters().wraps, 1);
        return absl::OkStatus();
      },
      ShortRun());
  EXPECT_TRUE(s.ok()) << s;
}

// Row 2, policies: a re-wrap compares what the policy decides (WrapPolicy::Identity),
// not its name. A different lambda under the same name (the default "lambda") is
// refused naming the policy, never answered with the old handle; the very same policy
// object, or an equal built-in made again, is a reuse with nothing copied.
TEST(RegistryTableTest, RewrapWithAnotherPolicyOfTheSameNameIsRefusedNamingIt) {
  absl::Status s = comm::testing::RunThreadRanks(
      2,
      [](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(testing::TinySetup()));
        WrapperRegistry registry;
        FullyShardOptions blocks = PerBlock();
        blocks.policy = policy::Lambda([](const core::Module&, const policy::WrapContext& c) {
          return c.type_name == "TransformerBlock";
        });
        ASSIGN_OR_RETURN(auto first, FullyShard(gpt, ctx.group, blocks, &registry));
        EXPECT_EQ(first->units().size(), 3u);
        const RegistryCounters c = registry.counters();

        // Same name, another decision: wrap nothing below the root.
        FullyShardOptions nothing = PerBlock();
        nothing.policy =
            policy::Lambda([](const core::Module&, const policy::WrapContext&) { return false; });
        EXPECT_EQ(nothing.policy->Name(), blocks.policy->Name());
        absl::Status st = FullyShard(gpt, ctx.group, nothing, &registry).status();
        EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
        EXPECT_TRUE(absl::StrContains(st.message(), "FullyShard(<root> (Gpt))")) << st;
        EXPECT_TRUE(absl::StrContains(st.message(), "another policy named 'lambda'")) << st;

        // Same name AND the same predicate, made again: still another policy (a predicate
        // cannot be compared), so never silently the old handle either.
        FullyShardOptions same_predicate = PerBlock();
        same_predicate.policy =
            policy::Lambda([](const core::Module&, const policy::WrapContext& c) {
              return c.type_name == "TransformerBlock";
            });
        st = FullyShard(gpt, ctx.group, same_predicate, &registry).status();
        EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
        EXPECT_EQ(registry.counters().reuses, c.reuses);

        // The very same policy object: the existing handle, nothing copied.
        ASSIGN_OR_RETURN(auto again, FullyShard(gpt, ctx.group, blocks, &registry));
        EXPECT_EQ(again, first);
        EXPECT_EQ(registry.counters().reuses, c.reuses + 1);
        EXPECT_EQ(registry.counters().param_bytes_copied, c.param_bytes_copied);

        // After Release, the new lambda gets its own plan: one unit, the root.
        RETURN_IF_ERROR(Release(*gpt, &registry));
        ASSIGN_OR_RETURN(auto fresh, FullyShard(gpt, ctx.group, nothing, &registry));
        EXPECT_EQ(fresh->units().size(), 1u);
        return absl::OkStatus();
      },
      ShortRun());
  EXPECT_TRUE(s.ok()) << s;
}

// Row 3: a module whose descendants are units: those units are kept as children and the
// policy is asked only about unmanaged subtrees.
TEST(RegistryTableTest, WrapAroundExistingUnitsKeepsThemAndHidesThemFromThePolicy) {
  absl::Status s = comm::testing::RunThreadRanks(
      2,
      [](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(testing::TinySetup()));
        WrapperRegistry registry;
        std::shared_ptr<core::Module> block1 = gpt->blocks()->modules()[1];
        ASSIGN_OR_RETURN(auto inner, FullyShard(block1, ctx.group, PerBlock(), &registry));
        std::shared_ptr<Unit> block1_unit = inner->root_unit();
        const int64_t inner_copied = block1_unit->flat().bytes_copied();
        auto asked = std::make_shared<std::vector<std::string>>();
        FullyShardOptions options = PerBlock();
        options.policy = policy::Lambda(
            [asked](const core::Module& m, const policy::WrapContext& c) {
              asked->push_back(c.path);
              return m.TypeName() == "TransformerBlock";
            },
            "blocks_recording");
        ASSIGN_OR_RETURN(auto outer, FullyShard(gpt, ctx.group, options, &registry));
        // Kept: the same unit object, its flat parameter untouched.
        EXPECT_EQ(registry.FindUnit(*block1), block1_unit);
        EXPECT_EQ(block1_unit->flat().bytes_copied(), inner_copied);
        std::vector<std::string> labels;
        for (const auto& u : outer->units()) labels.push_back(u->label());
        EXPECT_EQ(labels,
                  (std::vector<std::string>{"blocks.0 (TransformerBlock)",
                                            "blocks.1 (TransformerBlock)", "<root> (Gpt)"}));
        EXPECT_EQ(outer->units()[1], block1_unit);
        for (const std::string& path : *asked) {
          EXPECT_FALSE(absl::StartsWith(path, "blocks.1")) << "policy asked about " << path;
        }
        EXPECT_NE(std::find(asked->begin(), asked->end(), "blocks.0"), asked->end());
        EXPECT_EQ(registry.counters().units_created, 3);
        // And it trains: one step gives every parameter a gradient slice.
        ASSIGN_OR_RETURN(data::MarkovLanguage language,
                         testing::MakeLanguage(testing::TinySetup()));
        ASSIGN_OR_RETURN(data::TokenBatch batch, language.Batch(0, 2, 8));
        RETURN_IF_ERROR(testing::ForwardBackward(*gpt, batch).status());
        for (const auto& [name, p] : gpt->NamedParameters()) {
          EXPECT_TRUE(p->grad.defined() && p->grad.numel() == p->data.numel()) << name;
        }
        return absl::OkStatus();
      },
      ShortRun());
  EXPECT_TRUE(s.ok()) << s;
}

// Row 4: a module already inside another unit: FailedPrecondition naming the owner.
TEST(RegistryTableTest, WrapInsideAnotherUnitNamesTheOwningUnit) {
  absl::Status s = comm::testing::RunThreadRanks(
      2,
      [](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(testing::TinySetup()));
        WrapperRegistry registry;
        ASSIGN_OR_RETURN(auto handle, FullyShard(gpt, ctx.group, PerBlock(), &registry));
        auto block0 = std::static_pointer_cast<nn::TransformerBlock>(gpt->blocks()->modules()[0]);
        const RegistryCounters before = registry.counters();
        absl::Status st = FullyShard(gpt->ln_f(), ctx.group, PerBlock(), &registry).status();
        EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
        EXPECT_TRUE(absl::StrContains(st.message(), "FullyShard(ln_f (LayerNorm))")) << st;
        EXPECT_TRUE(absl::StrContains(st.message(), "already inside unit <root> (Gpt)")) << st;
        // The nearest owner: blocks.0.mlp is inside both blocks.0 and the root.
        std::shared_ptr<core::Module> mlp;
        for (auto& [path, m] : block0->NamedModules()) {
          if (path == "mlp") mlp = m;
        }
        st = FullyShard(mlp, ctx.group, PerBlock(), &registry).status();
        EXPECT_TRUE(
            absl::StrContains(st.message(), "already inside unit blocks.0 (TransformerBlock)"))
            << st;
        // The blocks container holds only units, yet it is inside the root unit.
        st = FullyShard(gpt->blocks(), ctx.group, PerBlock(), &registry).status();
        EXPECT_TRUE(absl::StrContains(st.message(), "already inside unit <root> (Gpt)")) << st;
        EXPECT_EQ(registry.counters().wraps, before.wraps);
        EXPECT_EQ(registry.NumUnits(), 3);
        return absl::OkStatus();
      },
      ShortRun());
  EXPECT_TRUE(s.ok()) << s;
}

// Row 5: after Release, a fresh wrap.
TEST(RegistryTableTest, WrapAfterReleaseIsFresh) {
  absl::Status s = comm::testing::RunThreadRanks(
      2,
      [](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(testing::TinySetup()));
        WrapperRegistry registry;
        ASSIGN_OR_RETURN(auto first, FullyShard(gpt, ctx.group, PerBlock(), &registry));
        const std::vector<std::shared_ptr<Unit>> old_units = first->units();
        RETURN_IF_ERROR(Release(*gpt, &registry));
        EXPECT_EQ(registry.FindHandle(*gpt), nullptr);
        // Released, it can be wrapped with other options too.
        FullyShardOptions other = testing::PerBlockOptions(ShardingStrategy::kNoShard);
        ASSIGN_OR_RETURN(auto second, FullyShard(gpt, ctx.group, other, &registry));
        EXPECT_NE(second, first);
        EXPECT_EQ(registry.counters().wraps, 2);
        EXPECT_EQ(registry.counters().reuses, 0);
        EXPECT_EQ(registry.counters().units_created, 6);
        EXPECT_EQ(second->units().size(), 3u);
        for (const auto& u : second->units()) {
          for (const auto& old : old_units) EXPECT_NE(u, old);
          EXPECT_EQ(u->options().strategy, ShardingStrategy::kNoShard);
        }
        for (const auto& [name, p] : gpt->NamedParameters()) EXPECT_EQ(p->data.dim(), 1) << name;
        return absl::OkStatus();
      },
      ShortRun());
  EXPECT_TRUE(s.ok()) << s;
}

// Row 7: a module already wrapped through another registry (a stage that made a registry
// of its own): refused naming the unit root, nothing sharded; after a Release there, or
// once that registry is gone, the wrap goes through.
TEST(RegistryTableTest, WrapThroughAnotherRegistryIsRefusedNamingTheUnit) {
  absl::Status s = comm::testing::RunThreadRanks(
      2,
      [](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(testing::TinySetup()));
        auto fit_registry = std::make_unique<WrapperRegistry>();
        RETURN_IF_ERROR(FullyShard(gpt, ctx.group, PerBlock(), fit_registry.get()).status());
        WrapperRegistry test_registry;
        absl::Status again = FullyShard(gpt, ctx.group, PerBlock(), &test_registry).status();
        EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
        EXPECT_TRUE(absl::StrContains(again.message(), "another WrapperRegistry")) << again;
        EXPECT_TRUE(absl::StrContains(again.message(), "<root>")) << again;
        // A subtree holding one of its units is refused too, naming that unit's root.
        const std::shared_ptr<core::Module>& block = (*gpt->blocks())[1];
        absl::Status inner = FullyShard(block, ctx.group, PerBlock(), &test_registry).status();
        EXPECT_TRUE(absl::StrContains(inner.message(), "blocks.1")) << inner;
        EXPECT_EQ(test_registry.NumUnits(), 0);
        EXPECT_EQ(test_registry.counters().param_bytes_copied, 0);
        // Released there, it wraps here.
        RETURN_IF_ERROR(Release(*gpt, fit_registry.get()));
        RETURN_IF_ERROR(FullyShard(gpt, ctx.group, PerBlock(), &test_registry).status());
        EXPECT_EQ(test_registry.NumUnits(), 3);
        // And a destroyed registry holds nothing.
        RETURN_IF_ERROR(Release(*gpt, &test_registry));
        ASSIGN_OR_RETURN(auto other, testing::MakeGpt(testing::TinySetup()));
        RETURN_IF_ERROR(FullyShard(other, ctx.group, PerBlock(), fit_registry.get()).status());
        EXPECT_FALSE(test_registry.HeldByAnotherRegistry(*gpt));
        EXPECT_TRUE(test_registry.HeldByAnotherRegistry(*other));
        RETURN_IF_ERROR(Release(*other, fit_registry.get()));
        fit_registry.reset();
        EXPECT_FALSE(test_registry.HeldByAnotherRegistry(*other));
        return absl::OkStatus();
      },
      ShortRun());
  EXPECT_TRUE(s.ok()) << s;
}

// Row 6: ranks disagree on the plan: FailedPrecondition on every rank before any
// sharding, naming the first differing unit; never a hang.
TEST(RegistryTableTest, RanksThatDisagreeOnThePlanAllFailBeforeSharding) {
  constexpr int kWorld = 3;
  std::vector<absl::Status> errors(kWorld);
  const absl::Time start = absl::Now();
  absl::Status s = comm::testing::RunThreadRanks(
      kWorld,
      [&](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(testing::TinySetup()));
        FullyShardOptions options = PerBlock();
        if (ctx.rank == 2) {  // this rank wraps blocks.1's MLP instead of blocks.1
          options.policy = policy::Lambda(
              [](const core::Module&, const policy::WrapContext& c) {
                return c.path == "blocks.0" || c.path == "blocks.1.mlp";
              },
              "rank2_differs");
        }
        std::vector<core::Shape> shapes;
        for (const auto& [name, p] : gpt->NamedParameters()) shapes.push_back(p->data.shape());
        WrapperRegistry registry;
        errors[ctx.rank] = FullyShard(gpt, ctx.group, options, &registry).status();
        EXPECT_EQ(registry.NumUnits(), 0);
        std::vector<core::Shape> after;
        for (const auto& [name, p] : gpt->NamedParameters()) after.push_back(p->data.shape());
        EXPECT_EQ(after, shapes) << "a parameter was sharded";
        // The group still works: nothing was left half-issued.
        core::Tensor t = core::Tensor::Zeros({1});
        ASSIGN_OR_RETURN(auto work, ctx.group->AllReduce(t, {}));
        return work->Wait(absl::Seconds(10));
      },
      ShortRun());
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  for (int r = 0; r < kWorld; ++r) {
    const absl::Status& e = errors[r];
    EXPECT_EQ(e.code(), absl::StatusCode::kFailedPrecondition) << "rank " << r << ": " << e;
    EXPECT_TRUE(absl::StrContains(e.message(), "ranks disagree on the wrap plan (rank 2 vs rank 0"))
        << e;
    EXPECT_TRUE(absl::StrContains(e.message(), "Nothing was sharded")) << e;
    // The first differing unit is unit 1: blocks.1 on ranks 0 and 1, blocks.1.mlp on 2.
    const std::string unit = r == 2 ? "unit 1 (blocks.1.mlp (Mlp)) differs"
                                    : "unit 1 (blocks.1 (TransformerBlock)) differs";
    EXPECT_TRUE(absl::StrContains(e.message(), unit)) << "rank " << r << ": " << e;
  }
}

// Weak references: a destroyed module leaves no entry.
TEST(RegistryTest, DestroyedModulesLeaveNoEntries) {
  absl::Status s = comm::testing::RunThreadRanks(
      2,
      [](comm::testing::RankContext& ctx) -> absl::Status {
        WrapperRegistry registry;
        std::weak_ptr<FullyShardHandle> weak_handle;
        {
          ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(testing::TinySetup()));
          ASSIGN_OR_RETURN(auto handle, FullyShard(gpt, ctx.group, PerBlock(), &registry));
          weak_handle = handle;
          EXPECT_EQ(registry.NumUnits(), 3);
        }
        EXPECT_EQ(registry.NumUnits(), 0);
        EXPECT_TRUE(weak_handle.expired());
        return absl::OkStatus();
      },
      ShortRun());
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace fsdp
