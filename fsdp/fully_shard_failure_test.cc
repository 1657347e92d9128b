// FullyShard's failures (NOTE [Wrap rollback] in fully_shard.cc): a failure at any step
// of any new unit, on one rank only, leaves every rank's module exactly as before (the
// same Parameter objects over their original storage, values and gradients, no hooks,
// no registry entries or claims) and a fresh wrap then trains like the unwrapped
// reference; a check that fails on one rank only gives every rank the same error naming
// that rank, within seconds.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/gloo_process_group.h"
#include "comm/hash_store.h"
#include "comm/testing/thread_ranks.h"
#include "core/status_macros.h"
#include "fsdp/fully_shard.h"
#include "fsdp/internal/wrap_fault.h"
#include "fsdp/registry.h"
#include "fsdp/testing/gpt_training.h"
#include "fsdp/testing/wrap_fault.h"
#include "gtest/gtest.h"

namespace fsdp {
namespace {

using internal::WrapStep;

constexpr int kWorld = 2;

// The state of one parameter before a wrap.
struct ParamState {
  std::string name;
  core::ParameterPtr param;
  core::Tensor data;  // the tensor object itself: its storage must come back
  std::vector<float> values;
  core::Tensor grad;
  std::vector<float> grad_values;
  bool requires_grad = true;
};

// Everything a failed wrap must leave as it was.
struct Snapshot {
  std::vector<ParamState> params;
  std::vector<std::shared_ptr<core::Module>> modules;
  std::vector<int> hooks;                    // per module
  std::vector<std::shared_ptr<Unit>> units;  // per module: registry.FindUnit
  std::vector<bool> claimed;                 // per module: held by `registry`
  int num_units = 0;
  RegistryCounters counters;
};

Snapshot Take(core::Module& model, WrapperRegistry& registry) {
  Snapshot s;
  for (const auto& [name, p] : model.NamedParameters()) {
    ParamState st;
    st.name = name;
    st.param = p;
    st.data = p->data;
    st.values = p->data.ToVector();
    st.grad = p->grad;
    if (p->grad.defined()) st.grad_values = p->grad.ToVector();
    st.requires_grad = p->requires_grad;
    s.params.push_back(std::move(st));
  }
  WrapperRegistry probe;  // sees `registry`'s claims as another registry's
  for (const auto& [path, m] : model.NamedModules()) {
    s.modules.push_back(m);
    s.hooks.push_back(m->NumHooks());
    s.units.push_back(registry.FindUnit(*m));
    s.claimed.push_back(probe.HeldByAnotherRegistry(*m));
  }
  s.num_units = registry.NumUnits();
  s.counters = registry.counters();
  return s;
}

// Expects `model` and `registry` to be as `before` recorded them.
void ExpectUnchanged(const Snapshot& before, core::Module& model, WrapperRegistry& registry,
                     const std::string& where) {
  SCOPED_TRACE(where);
  const std::vector<core::NamedParameter> params = model.NamedParameters();
  ASSERT_EQ(params.size(), before.params.size());
  ASSERT_FALSE(params.empty());
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamState& b = before.params[i];
    const core::Parameter& p = *params[i].second;
    EXPECT_EQ(params[i].first, b.name);
    EXPECT_EQ(params[i].second, b.param) << b.name << ": another Parameter object";
    EXPECT_TRUE(p.data.SharesStorage(b.data)) << b.name << ": not its original storage";
    EXPECT_EQ(p.data.shape(), b.data.shape()) << b.name;
    EXPECT_EQ(p.data.ToVector(), b.values) << b.name;
    EXPECT_EQ(p.grad.defined(), b.grad.defined()) << b.name;
    if (b.grad.defined() && p.grad.defined()) {
      EXPECT_TRUE(p.grad.SharesStorage(b.grad)) << b.name << ": not its original gradient";
      EXPECT_EQ(p.grad.ToVector(), b.grad_values) << b.name;
    }
    EXPECT_EQ(p.requires_grad, b.requires_grad) << b.name;
  }
  const std::vector<core::NamedModule> modules = model.NamedModules();
  ASSERT_EQ(modules.size(), before.modules.size());
  WrapperRegistry probe;
  for (size_t i = 0; i < modules.size(); ++i) {
    const core::Module& m = *modules[i].second;
    EXPECT_EQ(modules[i].second, before.modules[i]);
    EXPECT_EQ(m.NumHooks(), before.hooks[i]) << modules[i].first << ": hooks left behind";
    EXPECT_EQ(registry.FindUnit(m), before.units[i]) << modules[i].first;
    EXPECT_EQ(probe.HeldByAnotherRegistry(m), before.claimed[i]) << modules[i].first;
  }
  EXPECT_EQ(registry.FindHandle(model), nullptr);
  EXPECT_EQ(registry.NumUnits(), before.num_units);
  const RegistryCounters c = registry.counters();
  EXPECT_EQ(c.wraps, before.counters.wraps);
  EXPECT_EQ(c.reuses, before.counters.reuses);
  EXPECT_EQ(c.units_created, before.counters.units_created);
  EXPECT_EQ(c.param_bytes_copied, before.counters.param_bytes_copied);
  EXPECT_TRUE(registry.runtime().idle());
}

// Gives every parameter a distinct gradient, so the rollback must restore those too.
absl::Status GiveGradients(core::Module& model) {
  float v = 0.25f;
  for (const auto& [name, p] : model.NamedParameters()) {
    RETURN_IF_ERROR(p->EnsureGrad());
    p->grad.Fill(v);
    v += 0.125f;
  }
  return absl::OkStatus();
}

testing::GptTrainingSetup ShortSetup() {
  testing::GptTrainingSetup setup = testing::TinySetup();
  setup.steps = 3;
  return setup;
}

struct RollbackCase {
  // blocks.0 hand-wrapped first: it stays an existing unit, so the new units are
  // blocks.1 and the root; otherwise blocks.0, blocks.1 and the root.
  bool existing_unit;
  int unit_index;
  WrapStep step;
};

std::string CaseName(const ::testing::TestParamInfo<RollbackCase>& info) {
  std::string step = internal::WrapStepName(info.param.step);
  for (char& c : step) {
    if (c == ' ') c = '_';
  }
  return absl::StrCat(info.param.existing_unit ? "Existing" : "Fresh", "_Unit",
                      info.param.unit_index, "_", step);
}

std::vector<RollbackCase> AllCases() {
  std::vector<RollbackCase> out;
  for (bool existing : {false, true}) {
    const int new_units = existing ? 2 : 3;
    for (int k = 0; k < new_units; ++k) {
      for (WrapStep step : internal::kAllWrapSteps) out.push_back({existing, k, step});
    }
  }
  return out;
}

class WrapRollbackTest : public ::testing::TestWithParam<RollbackCase> {};

TEST_P(WrapRollbackTest, AFaultOnRankOneRollsBackEveryRankAndAFreshWrapTrains) {
  const RollbackCase c = GetParam();
  const testing::GptTrainingSetup setup = ShortSetup();
  absl::StatusOr<testing::TrainingRun> reference = testing::TrainUnwrapped(setup);
  ASSERT_TRUE(reference.ok()) << reference.status();
  const FullyShardOptions options = testing::PerBlockOptions(ShardingStrategy::kFullShard);
  absl::Status s =
      comm::testing::RunThreadRanks(kWorld, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(std::shared_ptr<nn::Gpt> gpt, testing::MakeGpt(setup));
        RETURN_IF_ERROR(GiveGradients(*gpt));
        WrapperRegistry registry;
        std::shared_ptr<FullyShardHandle> hand;
        if (c.existing_unit) {
          ASSIGN_OR_RETURN(hand,
                           FullyShard(gpt->blocks()->modules()[0], ctx.group, options, &registry));
        }
        const Snapshot before = Take(*gpt, registry);
        EXPECT_EQ(before.num_units, c.existing_unit ? 1 : 0);
        {
          std::optional<testing::ScopedWrapFault> fault;
          if (ctx.rank == 1) fault.emplace(c.unit_index, c.step);
          absl::Status failed = FullyShard(gpt, ctx.group, options, &registry).status();
          if (fault.has_value()) {
            EXPECT_EQ(fault->hits(), 1) << "the fault never fired";
          }
          EXPECT_EQ(failed.code(), absl::StatusCode::kInternal) << failed;
          EXPECT_TRUE(
              absl::StrContains(failed.message(), "rank 1: FullyShard(<root> (Gpt)): unit "))
              << "rank " << ctx.rank << ": " << failed;
          EXPECT_TRUE(absl::StrContains(
              failed.message(),
              absl::StrCat("(", internal::WrapStepName(c.step), "): injected wrap fault")))
              << failed;
        }
        ExpectUnchanged(before, *gpt, registry, absl::StrCat("rank ", ctx.rank));
        if (hand != nullptr) {
          EXPECT_EQ(hand->root_unit(), registry.FindUnit(*gpt->blocks()->modules()[0]));
          EXPECT_EQ(hand->root_unit()->state(), UnitState::kSharded);
        }

        // The rolled-back module wraps afresh (keeping the hand-wrapped unit) and trains
        // like the unwrapped reference.
        ASSIGN_OR_RETURN(testing::TrainingRun run,
                         testing::TrainFullyShardedModel(ctx, setup, options, gpt, &registry));
        EXPECT_EQ(registry.counters().wraps, before.counters.wraps + 1);
        EXPECT_EQ(registry.counters().units_created,
                  before.counters.units_created + (c.existing_unit ? 2 : 3));
        return testing::CompareRuns(*reference, run, 1e-5, 1e-6);  // NOTE [Parity tolerance]
      });
  EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(EveryUnitAndStep, WrapRollbackTest, ::testing::ValuesIn(AllCases()),
                         CaseName);

// Every rank returns `code` with a message naming rank 1 and containing `needle`, well
// before the collectives' 30 s timeout.
void ExpectAllFailNamingRankOne(const std::vector<absl::Status>& errors, absl::Duration took,
                                absl::StatusCode code, const std::string& needle) {
  EXPECT_LT(took, absl::Seconds(10));
  ASSERT_EQ(errors.size(), static_cast<size_t>(kWorld));
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(errors[r].code(), code) << "rank " << r << ": " << errors[r];
    EXPECT_TRUE(absl::StrContains(errors[r].message(), "rank 1: "))
        << "rank " << r << ": " << errors[r];
    EXPECT_TRUE(absl::StrContains(errors[r].message(), needle))
        << "rank " << r << ": " << errors[r];
  }
}

// A plan error on rank 1 only (an ignored path its model lacks).
TEST(FullyShardAgreementTest, APlanErrorOnOneRankFailsEveryRankNamingIt) {
  std::vector<absl::Status> errors(kWorld);
  const absl::Time start = absl::Now();
  absl::Status s =
      comm::testing::RunThreadRanks(kWorld, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(ShortSetup()));
        FullyShardOptions options = testing::PerBlockOptions(ShardingStrategy::kFullShard);
        if (ctx.rank == 1) options.ignored_paths = {"no_such_module"};
        WrapperRegistry registry;
        const Snapshot before = Take(*gpt, registry);
        errors[ctx.rank] = FullyShard(gpt, ctx.group, options, &registry).status();
        ExpectUnchanged(before, *gpt, registry, absl::StrCat("rank ", ctx.rank));
        // The group is still in step: a collective after the failure works.
        core::Tensor t = core::Tensor::Zeros({1});
        ASSIGN_OR_RETURN(auto work, ctx.group->AllReduce(t, {}));
        return work->Wait(absl::Seconds(10));
      });
  ASSERT_TRUE(s.ok()) << s;
  ExpectAllFailNamingRankOne(errors, absl::Now() - start, absl::StatusCode::kInvalidArgument,
                             "FullyShard(<root> (Gpt)): PlanOptions.ignored_paths: no module "
                             "at path 'no_such_module'");
}

// An option error on rank 1 only.
TEST(FullyShardAgreementTest, AnOptionErrorOnOneRankFailsEveryRankNamingIt) {
  std::vector<absl::Status> errors(kWorld);
  const absl::Time start = absl::Now();
  absl::Status s =
      comm::testing::RunThreadRanks(kWorld, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(ShortSetup()));
        FullyShardOptions options = testing::PerBlockOptions(ShardingStrategy::kFullShard);
        if (ctx.rank == 1) options.limit_all_gathers = -1;
        WrapperRegistry registry;
        errors[ctx.rank] = FullyShard(gpt, ctx.group, options, &registry).status();
        EXPECT_EQ(registry.NumUnits(), 0);
        return absl::OkStatus();
      });
  ASSERT_TRUE(s.ok()) << s;
  ExpectAllFailNamingRankOne(errors, absl::Now() - start, absl::StatusCode::kInvalidArgument,
                             "FullyShardOptions.limit_all_gathers is -1");
}

// A registry conflict on rank 1 only: there, blocks.1 is already a unit root of another
// registry (wrapped over a one-rank group of its own, which needs no peer).
TEST(FullyShardAgreementTest, ARegistryConflictOnOneRankFailsEveryRankNamingIt) {
  std::vector<absl::Status> errors(kWorld);
  const absl::Time start = absl::Now();
  absl::Status s =
      comm::testing::RunThreadRanks(kWorld, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(ShortSetup()));
        const FullyShardOptions options = testing::PerBlockOptions(ShardingStrategy::kFullShard);
        WrapperRegistry other;
        if (ctx.rank == 1) {
          comm::GlooOptions solo_options;
          solo_options.name = "solo";
          ASSIGN_OR_RETURN(std::shared_ptr<comm::GlooProcessGroup> solo,
                           comm::GlooProcessGroup::Create(std::make_shared<comm::HashStore>(), 0, 1,
                                                          solo_options));
          RETURN_IF_ERROR(FullyShard(gpt->blocks()->modules()[1], solo, options, &other).status());
        }
        WrapperRegistry registry;
        const Snapshot before = Take(*gpt, registry);
        errors[ctx.rank] = FullyShard(gpt, ctx.group, options, &registry).status();
        ExpectUnchanged(before, *gpt, registry, absl::StrCat("rank ", ctx.rank));
        return absl::OkStatus();
      });
  ASSERT_TRUE(s.ok()) << s;
  ExpectAllFailNamingRankOne(errors, absl::Now() - start, absl::StatusCode::kFailedPrecondition,
                             "blocks.1 (TransformerBlock) is already a unit root of another "
                             "WrapperRegistry");
}

}  // namespace
}  // namespace fsdp
