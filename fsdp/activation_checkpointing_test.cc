// Activation checkpointing under FSDP (NOTE [Activation checkpointing] in core/module.h,
// NOTE [Recompute] in runtime.h): training with checkpointed blocks gives, bit for bit,
// the losses and parameters of the same training without, at N = 1, 2, 4 under every
// strategy; the recompute costs no all-gather and leaves the recorded order alone;
// user hooks fire once per pass; evaluation never recomputes; the registry treats a
// changed checkpoint choice like a changed policy; Release turns checkpointing off.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "comm/testing/thread_ranks.h"
#include "core/allocator.h"
#include "core/status_macros.h"
#include "fsdp/fully_shard.h"
#include "fsdp/testing/gpt_training.h"
#include "gtest/gtest.h"
#include "nn/transformer.h"

namespace fsdp {
namespace {

struct Case {
  ShardingStrategy strategy;
  int world_size;
  int hybrid_shard_size;
  // Which modules are units and which are checkpointed.
  std::vector<std::string> unit_types;
  policy::WrapPolicyPtr checkpoint;
  std::string label;
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  return absl::StrCat(testing::StrategyCaseName({info.param.strategy, info.param.world_size,
                                                 info.param.hybrid_shard_size}),
                      "_", info.param.label);
}

class CheckpointParityTest : public ::testing::TestWithParam<Case> {};

// 0 differing bits: CompareRuns with both tolerances 0 accepts only equal values.
TEST_P(CheckpointParityTest, LossesAndParametersAreBitwiseThoseWithoutCheckpointing) {
  const Case c = GetParam();
  testing::GptTrainingSetup setup = testing::TinySetup();
  setup.gpt.n_layer = 3;
  setup.steps = 8;
  FullyShardOptions plain = testing::PerBlockOptions(c.strategy, c.hybrid_shard_size);
  plain.policy = policy::ModuleTypes(c.unit_types);
  FullyShardOptions checkpointed = plain;
  checkpointed.checkpoint_policy = c.checkpoint;
  absl::Status s = comm::testing::RunThreadRanks(
      c.world_size, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(testing::TrainingRun want,
                         testing::TrainFullyShardedRank(ctx, setup, plain));
        ASSIGN_OR_RETURN(testing::TrainingRun got,
                         testing::TrainFullyShardedRank(ctx, setup, checkpointed));
        if (want.losses.back() > want.losses.front() - 0.05) {
          return absl::InternalError("the run does not train, so matching it proves little");
        }
        return testing::CompareRuns(want, got, /*rtol=*/0, /*atol=*/0);
      });
  EXPECT_TRUE(s.ok()) << s;
}

std::vector<Case> Cases() {
  const std::vector<std::pair<ShardingStrategy, int>> strategies = {
      {ShardingStrategy::kFullShard, 0},
      {ShardingStrategy::kShardGradOp, 0},
      {ShardingStrategy::kNoShard, 0},
      {ShardingStrategy::kHybridShard, -1}};
  std::vector<Case> cases;
  for (const auto& [strategy, hybrid] : strategies) {
    for (int n : {1, 2, 4}) {
      const int h = hybrid < 0 ? std::max(1, n / 2) : 0;
      // Every block, each a unit: the recompute uses the block's backward all-gather.
      cases.push_back({strategy,
                       n,
                       h,
                       {"TransformerBlock"},
                       policy::ModuleTypes({"TransformerBlock"}),
                       "EveryBlock"});
    }
    // Every second block, and blocks holding a nested unit (each Mlp): the nested unit is
    // gathered in the recompute for its backward.
    cases.push_back({strategy,
                     2,
                     hybrid < 0 ? 1 : 0,
                     {"TransformerBlock"},
                     policy::EveryKth({"TransformerBlock"}, 2),
                     "EverySecondBlock"});
    cases.push_back({strategy,
                     2,
                     hybrid < 0 ? 1 : 0,
                     {"TransformerBlock", "Mlp"},
                     policy::ModuleTypes({"TransformerBlock"}),
                     "NestedUnit"});
    // A checkpointed module that is not a unit (inside a block's unit).
    cases.push_back({strategy,
                     2,
                     hybrid < 0 ? 1 : 0,
                     {"TransformerBlock"},
                     policy::ModuleTypes({"Mlp"}),
                     "InsideAUnit"});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllStrategies, CheckpointParityTest, ::testing::ValuesIn(Cases()),
                         CaseName);

// What one training step does on rank 0 of 2, with and without checkpointing.
struct StepRecord {
  std::vector<std::string> events;
  int block0_attn_forward_hooks = 0;  // a user's forward pre-hook on blocks.0.attn
  int64_t activation_peak = 0;        // bytes, tag activation, during the step
};

absl::StatusOr<StepRecord> RecordStep(const FullyShardOptions& options) {
  testing::GptTrainingSetup setup = testing::TinySetup();
  setup.gpt.n_layer = 4;
  StepRecord out;
  absl::Status s =
      comm::testing::RunThreadRanks(2, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(setup));
        ASSIGN_OR_RETURN(data::MarkovLanguage language, testing::MakeLanguage(setup));
        WrapperRegistry registry;
        ASSIGN_OR_RETURN(auto handle, FullyShard(gpt, ctx.group, options, &registry));
        int hooks = 0;
        core::HookHandle hook =
            std::static_pointer_cast<nn::TransformerBlock>((*gpt->blocks())[0])
                ->attn()
                ->RegisterForwardPreHook([&hooks](core::Module&, core::Tensors&) {
                  ++hooks;
                  return absl::OkStatus();
                });
        ASSIGN_OR_RETURN(data::TokenBatch batch, language.Batch(0, 4, setup.seq_len));
        // A first step settles the recorded order; the second is the one compared.
        RETURN_IF_ERROR(testing::ForwardBackward(*gpt, batch).status());
        hooks = 0;
        core::Allocator& cpu = *ctx.allocator;
        const int64_t before = cpu.Stats().current(core::MemoryTag::kActivation);
        cpu.ResetPeaks();
        registry.RecordEvents(true);
        RETURN_IF_ERROR(testing::ForwardBackward(*gpt, batch).status());
        registry.RecordEvents(false);
        if (ctx.rank == 0) {
          out.events = registry.events();
          out.block0_attn_forward_hooks = hooks;
          out.activation_peak = cpu.Stats().peak(core::MemoryTag::kActivation) - before;
        }
        return absl::OkStatus();
      });
  if (!s.ok()) return s;
  return out;
}

std::map<std::string, int> Count(const std::vector<std::string>& events, const std::string& kind) {
  std::map<std::string, int> n;
  for (const std::string& e : events) {
    if (absl::StartsWith(e, kind + " ")) ++n[e.substr(kind.size() + 1)];
  }
  return n;
}

std::vector<std::string> Only(const std::vector<std::string>& events, const std::string& kind) {
  std::vector<std::string> out;
  for (const std::string& e : events) {
    if (absl::StartsWith(e, kind + " ")) out.push_back(e);
  }
  return out;
}

TEST(CheckpointRuntimeTest, RecomputeMakesNoAllGatherAndKeepsTheOrders) {
  for (const auto& [label, unit_types] :
       std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"blocks", {"TransformerBlock"}},
           {"blocks and their Mlps", {"TransformerBlock", "Mlp"}}}) {
    SCOPED_TRACE(label);
    FullyShardOptions plain = testing::PerBlockOptions(ShardingStrategy::kFullShard);
    plain.policy = policy::ModuleTypes(unit_types);
    FullyShardOptions checkpointed = plain;
    checkpointed.checkpoint_policy = policy::ModuleTypes({"TransformerBlock"});
    absl::StatusOr<StepRecord> want = RecordStep(plain);
    absl::StatusOr<StepRecord> got = RecordStep(checkpointed);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(got.ok()) << got.status();
    // The same all-gathers, unit by unit, and the same forward and backward orders.
    EXPECT_EQ(Count(got->events, "allgather_issued"), Count(want->events, "allgather_issued"));
    EXPECT_FALSE(Count(want->events, "allgather_issued").empty());
    EXPECT_EQ(Only(got->events, "forward_compute_begin"),
              Only(want->events, "forward_compute_begin"));
    EXPECT_EQ(Only(got->events, "backward_compute_begin"),
              Only(want->events, "backward_compute_begin"));
    EXPECT_EQ(Count(got->events, "reshard"), Count(want->events, "reshard"));
    // A nested unit (each Mlp) is gathered once in its block's recompute; blocks recompute
    // through their own backward hooks and record no recompute event.
    const std::map<std::string, int> recomputes = Count(got->events, "recompute_begin");
    if (unit_types.size() == 2) {
      EXPECT_EQ(recomputes.size(), 4u);
      for (const auto& [unit, n] : recomputes) {
        EXPECT_TRUE(absl::StrContains(unit, "(Mlp)")) << unit;
        EXPECT_EQ(n, 1) << unit;
      }
    } else {
      EXPECT_TRUE(recomputes.empty());
    }
    EXPECT_TRUE(Count(want->events, "recompute_begin").empty());
    // A user's hook inside a checkpointed block fires once per forward pass.
    EXPECT_EQ(want->block0_attn_forward_hooks, 1);
    EXPECT_EQ(got->block0_attn_forward_hooks, 1);
    // And the point of it all: fewer activation bytes at the peak.
    EXPECT_LT(got->activation_peak, want->activation_peak);
  }
}

TEST(CheckpointRuntimeTest, EvaluationNeverRecomputes) {
  testing::GptTrainingSetup setup = testing::TinySetup();
  absl::Status s =
      comm::testing::RunThreadRanks(2, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(setup));
        ASSIGN_OR_RETURN(data::MarkovLanguage language, testing::MakeLanguage(setup));
        FullyShardOptions options = testing::PerBlockOptions(ShardingStrategy::kFullShard);
        options.checkpoint_policy = policy::ModuleTypes({"TransformerBlock"});
        WrapperRegistry registry;
        ASSIGN_OR_RETURN(auto handle, FullyShard(gpt, ctx.group, options, &registry));
        ASSIGN_OR_RETURN(data::TokenBatch batch, language.Batch(0, 4, setup.seq_len));
        {
          core::NoGradScope no_grad;
          RETURN_IF_ERROR(gpt->Forward(batch.inputs).status());
        }
        for (const auto& block : gpt->blocks()->modules()) {
          if (!block->checkpoint_activations() || block->awaiting_recompute()) {
            return absl::InternalError(absl::StrCat(block->Describe(),
                                                    ": checkpointed but kept an input to recompute "
                                                    "from in an evaluation forward"));
          }
        }
        // A training forward does keep it.
        RETURN_IF_ERROR(gpt->Forward(batch.inputs).status());
        if (!(*gpt->blocks())[0]->awaiting_recompute()) {
          return absl::InternalError("a training forward did not checkpoint blocks.0");
        }
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(CheckpointRegistryTest, ChangedChoiceIsFailedPreconditionAndReleaseTurnsItOff) {
  testing::GptTrainingSetup setup = testing::TinySetup();
  setup.gpt.n_layer = 3;
  absl::Status s =
      comm::testing::RunThreadRanks(2, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(setup));
        FullyShardOptions options = testing::PerBlockOptions(ShardingStrategy::kFullShard);
        options.checkpoint_policy = policy::EveryKth({"TransformerBlock"}, 2);
        WrapperRegistry registry;
        ASSIGN_OR_RETURN(auto handle, FullyShard(gpt, ctx.group, options, &registry));
        const std::vector<bool> want = {true, false, true};
        for (size_t i = 0; i < want.size(); ++i) {
          if ((*gpt->blocks())[i]->checkpoint_activations() != want[i]) {
            return absl::InternalError(absl::StrCat(
                "blocks.", i, " checkpointed: ", (*gpt->blocks())[i]->checkpoint_activations()));
          }
        }
        if (gpt->checkpoint_activations()) return absl::InternalError("the root is checkpointed");
        // The same choice made again (an equal policy built anew): the same handle.
        FullyShardOptions same = options;
        same.checkpoint_policy = policy::EveryKth({"TransformerBlock"}, 2);
        ASSIGN_OR_RETURN(auto again, FullyShard(gpt, ctx.group, same, &registry));
        if (again != handle) return absl::InternalError("an equal re-wrap made a new handle");
        // Another choice, or none: FailedPrecondition naming the option.
        for (const policy::WrapPolicyPtr& other :
             {policy::WrapPolicyPtr(policy::ModuleTypes({"TransformerBlock"})),
              policy::WrapPolicyPtr()}) {
          FullyShardOptions changed = options;
          changed.checkpoint_policy = other;
          absl::StatusOr<std::shared_ptr<FullyShardHandle>> r =
              FullyShard(gpt, ctx.group, changed, &registry);
          if (r.status().code() != absl::StatusCode::kFailedPrecondition ||
              !absl::StrContains(r.status().message(),
                                 "checkpoint_policy: every_kth(TransformerBlock; k=2) vs")) {
            return absl::InternalError(
                absl::StrCat("changed checkpoint choice gave: ", r.status().ToString()));
          }
        }
        RETURN_IF_ERROR(Release(*gpt, &registry));
        for (const auto& [path, m] : gpt->NamedModules()) {
          if (m->checkpoint_activations()) {
            return absl::InternalError(
                absl::StrCat(m->Describe(), " still checkpointed after Release"));
          }
        }
        // Wrapping again after Release applies the new choice.
        FullyShardOptions every = options;
        every.checkpoint_policy = policy::ModuleTypes({"TransformerBlock"});
        ASSIGN_OR_RETURN(auto fresh, FullyShard(gpt, ctx.group, every, &registry));
        if (!(*gpt->blocks())[1]->checkpoint_activations()) {
          return absl::InternalError("the fresh wrap did not checkpoint blocks.1");
        }
        return Release(*gpt, &registry);
      });
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace fsdp
