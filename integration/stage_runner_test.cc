// StageRunner over thread ranks: stages share the registry (reuse, no copies), a stage
// run alone gives the same results, evaluation allocates no gradients or optimizer state,
// hand-wrapped units are kept, continued Fit equals one longer Fit, and Release leaves
// the trained plain module with its original Parameter objects.
#include "integration/stage_runner.h"

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/testing/thread_ranks.h"
#include "core/allocator.h"
#include "core/status_macros.h"
#include "fsdp/fsdp.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/gpt_module.h"
#include "integration/testing/stage_testing.h"
#include "policy/wrap_policy.h"

namespace integration {
namespace {

using ::testing::HasSubstr;

using testing::Check;
using testing::RunRanks;

// Width 16, vocabulary 16: every unit holds elements on every rank at N <= 4.
GptModuleOptions TinyGpt() { return testing::TinyGpt(16, 16, 3); }
StageOptions TinyStages() { return testing::TinyStages(4, 6, 3); }

TEST(StageRunnerTest, TestAfterFitReusesTheUnitsAndATestAloneMatchesIt) {
  INTEGRATION_ASSERT_OK(RunRanks(2, [](comm::testing::RankContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(auto module, GptTrainModule::Create(TinyGpt()));
    ASSIGN_OR_RETURN(auto runner, StageRunner::Create(ctx.group, TinyStages()));
    ASSIGN_OR_RETURN(FitResult fit, runner->Fit(*module));
    RETURN_IF_ERROR(Check(!fit.report.wrap.reused && fit.report.wrap.units == 3 &&
                              fit.report.wrap.units_created == 3 &&
                              fit.report.wrap.param_bytes_copied > 0,
                          "the fit wraps fresh: 2 blocks + root"));
    ASSIGN_OR_RETURN(EvalResult test, runner->Test(*module));
    RETURN_IF_ERROR(Check(test.report.wrap.reused, "test reuses the fit's wrap"));
    RETURN_IF_ERROR(Check(test.report.wrap.units_reused == 3 && test.report.wrap.units_created == 0,
                          absl::StrCat("units reused ", test.report.wrap.units_reused)));
    RETURN_IF_ERROR(Check(test.report.wrap.param_bytes_copied == 0, "no bytes copied"));
    RETURN_IF_ERROR(Check(runner->registry().counters().reuses == 1, "one reuse counted"));

    // The same trained weights in a fresh model, tested alone by a fresh runner: a
    // fresh wrap with the same policy, and the same loss. (Same world size and layout,
    // so the forwards do the same arithmetic: equality is exact.)
    ASSIGN_OR_RETURN(fsdp::StateDict trained, fsdp::FullStateDict(*module->model(), &runner->registry()));
    ASSIGN_OR_RETURN(auto other, GptTrainModule::Create(TinyGpt()));
    ASSIGN_OR_RETURN(auto other_runner, StageRunner::Create(ctx.group, TinyStages()));
    ASSIGN_OR_RETURN(WrapReport wrapped, other_runner->Wrap(*other));
    RETURN_IF_ERROR(Check(!wrapped.reused && wrapped.units_created == 3, "fresh wrap"));
    RETURN_IF_ERROR(fsdp::LoadFullStateDict(*other->model(), &other_runner->registry(), trained));
    ASSIGN_OR_RETURN(EvalResult alone, other_runner->Test(*other));
    RETURN_IF_ERROR(Check(alone.loss == test.loss,
                          absl::StrCat("test alone ", alone.loss, " vs after fit ", test.loss)));
    RETURN_IF_ERROR(Check(test.count == 2 * 4 * 8, "2 batches of 4 rows of 8 tokens"));
    return absl::OkStatus();
  }));
}

TEST(StageRunnerTest, EvaluationStagesAllocateNoGradientsOrOptimizerState) {
  INTEGRATION_ASSERT_OK(RunRanks(2, [](comm::testing::RankContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(auto module, GptTrainModule::Create(TinyGpt()));
    ASSIGN_OR_RETURN(auto runner, StageRunner::Create(ctx.group, TinyStages()));
    for (Stage stage : {Stage::kValidate, Stage::kTest}) {
      ASSIGN_OR_RETURN(EvalResult r, stage == Stage::kTest ? runner->Test(*module)
                                                           : runner->Validate(*module));
      for (const RankMemory& m : r.report.memory) {
        RETURN_IF_ERROR(Check(m.peak_by_tag[static_cast<int>(core::MemoryTag::kGrad)] == 0 &&
                                  m.peak_by_tag[static_cast<int>(core::MemoryTag::kOptim)] == 0,
                              absl::StrCat(StageName(stage), " alone allocated gradients or optimizer state")));
        RETURN_IF_ERROR(Check(m.peak_by_tag[static_cast<int>(core::MemoryTag::kActivation)] > 0,
                              "the forwards were measured"));
      }
    }
    RETURN_IF_ERROR(Check(runner->optimizer(*module) == nullptr, "no optimizer made"));
    ASSIGN_OR_RETURN(PredictResult predicted, runner->Predict(*module));
    RETURN_IF_ERROR(Check(predicted.outputs.size() == 2 &&
                              predicted.outputs[0].shape() == core::Shape({2, 8}) &&
                              predicted.outputs[0].dtype() == core::DType::kInt32,
                          "predict: int32 [rows, T] per batch"));
    // After a Fit the gradients and optimizer state exist; a test adds none.
    RETURN_IF_ERROR(runner->Fit(*module, 2).status());
    ASSIGN_OR_RETURN(EvalResult after, runner->Test(*module));
    for (const RankMemory& m : after.report.memory) {
      for (core::MemoryTag tag : {core::MemoryTag::kGrad, core::MemoryTag::kOptim}) {
        const int t = static_cast<int>(tag);
        RETURN_IF_ERROR(Check(m.peak_by_tag[t] == m.current_by_tag[t] && m.current_by_tag[t] > 0,
                              absl::StrCat("test after fit grew ", core::MemoryTagName(tag))));
      }
    }
    return absl::OkStatus();
  }));
}

TEST(StageRunnerTest, HandWrappedUnitsAreKept) {
  INTEGRATION_ASSERT_OK(RunRanks(2, [](comm::testing::RankContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(auto module, GptTrainModule::Create(TinyGpt()));
    ASSIGN_OR_RETURN(auto runner, StageRunner::Create(ctx.group, TinyStages()));
    const std::shared_ptr<core::Module>& block0 = (*module->gpt()->blocks())[0];
    ASSIGN_OR_RETURN(auto handle, fsdp::FullyShard(block0, ctx.group, runner->options().wrap,
                                                   &runner->registry()));
    std::shared_ptr<fsdp::Unit> unit = runner->registry().FindUnit(*block0);
    ASSIGN_OR_RETURN(FitResult fit, runner->Fit(*module, 2));
    RETURN_IF_ERROR(Check(fit.report.wrap.units == 3 && fit.report.wrap.units_reused == 1 &&
                              fit.report.wrap.units_created == 2,
                          absl::StrCat("units ", fit.report.wrap.units, " reused ",
                                       fit.report.wrap.units_reused)));
    RETURN_IF_ERROR(Check(runner->registry().FindUnit(*block0) == unit, "the user's unit kept"));
    return absl::OkStatus();
  }));
}

// Two full state dicts hold the same parameters: the same non-zero number of entries,
// the same names in the same order, equal values.
absl::Status CheckSameParameters(const fsdp::StateDict& a, const fsdp::StateDict& b) {
  RETURN_IF_ERROR(Check(!a.empty() && a.size() == b.size(),
                        absl::StrCat("state dicts of ", a.size(), " and ", b.size(),
                                     " parameters")));
  for (size_t i = 0; i < a.size(); ++i) {
    RETURN_IF_ERROR(Check(a[i].first == b[i].first,
                          absl::StrCat("parameter ", i, ": ", a[i].first, " vs ", b[i].first)));
    const std::vector<float> va = a[i].second.ToVector();
    RETURN_IF_ERROR(Check(!va.empty() && va == b[i].second.ToVector(),
                          absl::StrCat("parameter ", a[i].first, " differs")));
  }
  return absl::OkStatus();
}

TEST(StageRunnerTest, ContinuedFitEqualsOneLongerFit) {
  INTEGRATION_ASSERT_OK(RunRanks(2, [](comm::testing::RankContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(auto a, GptTrainModule::Create(TinyGpt()));
    ASSIGN_OR_RETURN(auto runner_a, StageRunner::Create(ctx.group, TinyStages()));
    ASSIGN_OR_RETURN(FitResult first, runner_a->Fit(*a, 3));
    optim::Optimizer* optimizer = runner_a->optimizer(*a);
    ASSIGN_OR_RETURN(fsdp::StateDict at_three, fsdp::FullStateDict(*a->model(), &runner_a->registry()));
    ASSIGN_OR_RETURN(EvalResult between, runner_a->Validate(*a));  // a stage in between
    ASSIGN_OR_RETURN(FitResult second, runner_a->Fit(*a, 3));
    RETURN_IF_ERROR(Check(runner_a->optimizer(*a) == optimizer && optimizer->step_count() == 6,
                          "the same optimizer continued"));
    RETURN_IF_ERROR(Check(second.first_step == 3 && second.global_step == 6, "global steps"));

    ASSIGN_OR_RETURN(auto b, GptTrainModule::Create(TinyGpt()));
    ASSIGN_OR_RETURN(auto runner_b, StageRunner::Create(ctx.group, TinyStages()));
    ASSIGN_OR_RETURN(FitResult straight, runner_b->Fit(*b, 6));
    std::vector<double> continued = first.losses;
    continued.insert(continued.end(), second.losses.begin(), second.losses.end());
    // Same batches, same learning rates, same optimizer state, same arithmetic: exact.
    RETURN_IF_ERROR(Check(continued.size() == 6 && continued == straight.losses, "losses differ"));
    ASSIGN_OR_RETURN(fsdp::StateDict pa, fsdp::FullStateDict(*a->model(), &runner_a->registry()));
    ASSIGN_OR_RETURN(fsdp::StateDict pb, fsdp::FullStateDict(*b->model(), &runner_b->registry()));
    RETURN_IF_ERROR(CheckSameParameters(pa, pb));

    // The validation in between evaluated the weights after 3 steps: the same weights in
    // a fresh model, validated by a fresh runner (same world size and layout, so the
    // same arithmetic), give exactly its loss over the same number of tokens.
    RETURN_IF_ERROR(Check(std::isfinite(between.loss) && between.loss > 0,
                          absl::StrCat("validation loss ", between.loss)));
    RETURN_IF_ERROR(Check(between.batches == 2 && between.count == 2 * 4 * 8,
                          absl::StrCat("validated ", between.batches, " batches, ",
                                       between.count, " tokens; expected 2 batches of 4 rows "
                                       "of 8 tokens")));
    ASSIGN_OR_RETURN(auto c, GptTrainModule::Create(TinyGpt()));
    ASSIGN_OR_RETURN(auto runner_c, StageRunner::Create(ctx.group, TinyStages()));
    RETURN_IF_ERROR(runner_c->Wrap(*c).status());
    RETURN_IF_ERROR(fsdp::LoadFullStateDict(*c->model(), &runner_c->registry(), at_three));
    ASSIGN_OR_RETURN(EvalResult again, runner_c->Validate(*c));
    RETURN_IF_ERROR(Check(again.count == between.count && again.loss == between.loss,
                          absl::StrCat("validation at step 3: ", between.loss, " in between vs ",
                                       again.loss, " alone")));
    return absl::OkStatus();
  }));
}

TEST(StageRunnerTest, ReleaseLeavesTheTrainedPlainModuleWithItsParameters) {
  INTEGRATION_ASSERT_OK(RunRanks(2, [](comm::testing::RankContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(auto module, GptTrainModule::Create(TinyGpt()));
    const std::vector<core::ParameterPtr> before = module->model()->Parameters();
    ASSIGN_OR_RETURN(auto runner, StageRunner::Create(ctx.group, TinyStages()));
    ASSIGN_OR_RETURN(FitResult fit, runner->Fit(*module));
    ASSIGN_OR_RETURN(EvalResult test, runner->Test(*module));
    RETURN_IF_ERROR(runner->Release(*module));
    RETURN_IF_ERROR(Check(module->model()->Parameters() == before, "same Parameter objects"));
    RETURN_IF_ERROR(Check(runner->registry().NumUnits() == 0, "no units left"));
    EvalOptions plain;
    plain.wrap = false;
    ASSIGN_OR_RETURN(EvalResult released, runner->Test(*module, plain));
    RETURN_IF_ERROR(Check(released.report.wrap.skipped, "not wrapped"));
    // The released module computes with the same values in full-shape storage of its own.
    RETURN_IF_ERROR(Check(std::abs(released.loss - test.loss) <= 1e-6 * test.loss,
                          absl::StrCat("released ", released.loss, " vs wrapped ", test.loss)));
    // A Fit after Release wraps fresh and continues from the trained weights.
    ASSIGN_OR_RETURN(FitResult more, runner->Fit(*module, 2));
    RETURN_IF_ERROR(Check(!more.report.wrap.reused && more.first_step == 6, "fresh wrap, step 6"));
    RETURN_IF_ERROR(Check(more.losses.size() == 2 && !fit.losses.empty() &&
                              more.losses[0] < fit.losses[0],
                          "continued from trained weights"));
    return absl::OkStatus();
  }));
}

TEST(StageRunnerTest, ProgressReportsEveryKStepsOnRankZeroWithEveryRanksMemory) {
  INTEGRATION_ASSERT_OK(RunRanks(2, [](comm::testing::RankContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(auto module, GptTrainModule::Create(TinyGpt()));
    ASSIGN_OR_RETURN(auto runner, StageRunner::Create(ctx.group, TinyStages()));
    std::vector<Progress> seen;
    runner->set_progress_callback([&](const Progress& p) { seen.push_back(p); });
    ASSIGN_OR_RETURN(FitResult fit, runner->Fit(*module, 7));
    if (ctx.rank != 0) return Check(seen.empty(), "only rank 0 reports");
    RETURN_IF_ERROR(Check(seen.size() == 3 && seen[0].step == 3 && seen[1].step == 6 &&
                              seen[2].step == 7,
                          absl::StrCat("reports: ", seen.size())));
    RETURN_IF_ERROR(Check(fit.losses.size() == 7 && seen[2].loss == fit.losses.back(),
                          "the step's loss"));
    RETURN_IF_ERROR(Check(seen[0].memory.size() == 2 &&
                              seen[0].memory[1].peak_by_tag[static_cast<int>(core::MemoryTag::kParam)] > 0,
                          "every rank's memory"));
    const std::string line = FormatProgress(seen[0]);
    RETURN_IF_ERROR(Check(line.find("r1 ") != std::string::npos &&
                              line.find("loss") != std::string::npos,
                          line));
    return absl::OkStatus();
  }));
}

TEST(StageRunnerTest, ASecondRunnerWithItsOwnRegistryIsRefusedUntilTheFirstReleases) {
  INTEGRATION_ASSERT_OK(RunRanks(2, [](comm::testing::RankContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(auto module, GptTrainModule::Create(TinyGpt()));
    ASSIGN_OR_RETURN(auto fit_runner, StageRunner::Create(ctx.group, TinyStages()));
    ASSIGN_OR_RETURN(auto test_runner, StageRunner::Create(ctx.group, TinyStages()));
    RETURN_IF_ERROR(fit_runner->Fit(*module, 2).status());
    absl::Status s = test_runner->Test(*module).status();
    RETURN_IF_ERROR(Check(s.code() == absl::StatusCode::kFailedPrecondition &&
                              s.message().find("another WrapperRegistry") != absl::string_view::npos,
                          s.ToString()));
    RETURN_IF_ERROR(fit_runner->Release(*module));
    return test_runner->Test(*module).status();
  }));
}

// Lightning's Trainer(...).fit(m) then another Trainer(...).test(m): two runners
// created over one shared registry (and the same group) reuse the units.
TEST(StageRunnerTest, TwoRunnersOverOneSharedRegistryReuseTheUnitsWithoutCopies) {
  INTEGRATION_ASSERT_OK(RunRanks(2, [](comm::testing::RankContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(auto module, GptTrainModule::Create(TinyGpt()));
    auto registry = std::make_shared<fsdp::WrapperRegistry>();
    ASSIGN_OR_RETURN(auto fit_runner, StageRunner::Create(ctx.group, TinyStages(), registry));
    ASSIGN_OR_RETURN(FitResult fit, fit_runner->Fit(*module, 2));
    RETURN_IF_ERROR(Check(fit.report.wrap.units_created == 3 &&
                              fit.report.wrap.param_bytes_copied > 0,
                          "the fit runner wraps fresh"));
    // Options built again (an equal policy object, not the same one): still the same wrap.
    ASSIGN_OR_RETURN(auto test_runner,
                     StageRunner::Create(ctx.group, TinyStages(), fit_runner->shared_registry()));
    RETURN_IF_ERROR(Check(&test_runner->registry() == registry.get(), "one registry"));
    ASSIGN_OR_RETURN(EvalResult test, test_runner->Test(*module));
    RETURN_IF_ERROR(Check(test.report.wrap.reused && test.report.wrap.units == 3 &&
                              test.report.wrap.units_reused == 3 &&
                              test.report.wrap.units_created == 0,
                          absl::StrCat("units reused ", test.report.wrap.units_reused, " of ",
                                       test.report.wrap.units)));
    RETURN_IF_ERROR(Check(test.report.wrap.param_bytes_copied == 0,
                          absl::StrCat("bytes copied ", test.report.wrap.param_bytes_copied)));
    RETURN_IF_ERROR(Check(registry->counters().wraps == 1 && registry->counters().reuses == 1,
                          "one wrap and one reuse in the shared registry"));
    // Either runner releases: the module is plain for both.
    RETURN_IF_ERROR(test_runner->Release(*module));
    return Check(registry->NumUnits() == 0, "released");
  }));
}

TEST(StageRunnerTest, ProgressLinesNameWhatTheModuleCounts) {
  Progress p;
  p.step = 1;
  p.steps = 2;
  p.items_per_second = 10;
  EXPECT_THAT(FormatProgress(p), HasSubstr("samples/s"));  // the default: no tokens
  p.count_unit = "tokens";
  EXPECT_THAT(FormatProgress(p), HasSubstr("tokens/s"));
  auto module = GptTrainModule::Create(TinyGpt());
  ASSERT_TRUE(module.ok()) << module.status();
  EXPECT_EQ((*module)->CountUnit(), "tokens");
}

TEST(StageRunnerTest, ErrorsNameTheStepOrOption) {
  EXPECT_EQ(StageRunner::Create(nullptr, TinyStages()).status().code(),
            absl::StatusCode::kInvalidArgument);
  INTEGRATION_ASSERT_OK(RunRanks(2, [](comm::testing::RankContext& ctx) -> absl::Status {
    StageOptions odd = TinyStages();
    odd.train_batch_size = 3;
    absl::Status s = StageRunner::Create(ctx.group, odd).status();
    RETURN_IF_ERROR(Check(s.message().find("StageOptions.train_batch_size") != absl::string_view::npos,
                          s.ToString()));
    // A wrap that asks for other options than the user's own wrap of the root.
    ASSIGN_OR_RETURN(auto module, GptTrainModule::Create(TinyGpt()));
    ASSIGN_OR_RETURN(auto runner, StageRunner::Create(ctx.group, TinyStages()));
    fsdp::FullyShardOptions other = runner->options().wrap;
    other.strategy = fsdp::ShardingStrategy::kNoShard;
    RETURN_IF_ERROR(
        fsdp::FullyShard(module->model(), ctx.group, other, &runner->registry()).status());
    absl::Status fit = runner->Fit(*module).status();
    RETURN_IF_ERROR(Check(fit.code() == absl::StatusCode::kFailedPrecondition &&
                              fit.message().find("fit") != absl::string_view::npos &&
                              fit.message().find("strategy") != absl::string_view::npos,
                          fit.ToString()));
    return absl::OkStatus();
  }));
}

}  // namespace
}  // namespace integration
