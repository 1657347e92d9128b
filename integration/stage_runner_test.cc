// StageRunner over thread ranks: stages share the registry (reuse, no copies), a stage
// run alone gives the same results, evaluation allocates no gradients or optimizer state,
// hand-wrapped units are kept, continued Fit equals one longer Fit, and Release leaves
// the trained plain module with its original Parameter objects.
#include "integration/stage_runner.h"

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/testing/thread_ranks.h"
#include "core/allocator.h"
#include "core/op_profile.h"
#include "core/status_macros.h"
#include "fsdp/fsdp.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/forwarding_train_module.h"
#include "integration/gpt_module.h"
#include "integration/testing/stage_testing.h"
#include "policy/wrap_policy.h"

namespace integration {
namespace {

using ::testing::HasSubstr;
using ::testing::SizeIs;

using testing::NoFailuresYet;
using testing::RunRanks;

// Width 16, vocabulary 16: every unit holds elements on every rank at N <= 4.
GptModuleOptions TinyGpt() { return testing::TinyGpt(16, 16, 3); }
StageOptions TinyStages() { return testing::TinyStages(4, 6, 3); }

TEST(StageRunnerTest, TestAfterFitReusesTheUnitsAndATestAloneMatchesIt) {
  INTEGRATION_ASSERT_OK(RunRanks(2, [](comm::testing::RankContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(auto module, GptTrainModule::Create(TinyGpt()));
    ASSIGN_OR_RETURN(auto runner, StageRunner::Create(ctx.group, TinyStages()));
    ASSIGN_OR_RETURN(FitResult fit, runner->Fit(*module));
    // The fit wraps fresh: 2 blocks + root.
    EXPECT_FALSE(fit.report.wrap.reused);
    EXPECT_EQ(fit.report.wrap.units, 3);
    EXPECT_EQ(fit.report.wrap.units_created, 3);
    EXPECT_GT(fit.report.wrap.param_bytes_copied, 0);
    ASSIGN_OR_RETURN(EvalResult test, runner->Test(*module));
    EXPECT_TRUE(test.report.wrap.reused) << "test reuses the fit's wrap";
    EXPECT_EQ(test.report.wrap.units_reused, 3);
    EXPECT_EQ(test.report.wrap.units_created, 0);
    EXPECT_EQ(test.report.wrap.param_bytes_copied, 0);
    EXPECT_EQ(runner->registry().counters().reuses, 1);

    // The same trained weights in a fresh model, tested alone by a fresh runner: a
    // fresh wrap with the same policy, and the same loss. (Same world size and layout,
    // so the forwards do the same arithmetic: equality is exact.)
    ASSIGN_OR_RETURN(fsdp::StateDict trained,
                     fsdp::FullStateDict(*module->model(), &runner->registry()));
    ASSIGN_OR_RETURN(auto other, GptTrainModule::Create(TinyGpt()));
    ASSIGN_OR_RETURN(auto other_runner, StageRunner::Create(ctx.group, TinyStages()));
    ASSIGN_OR_RETURN(WrapReport wrapped, other_runner->Wrap(*other));
    EXPECT_FALSE(wrapped.reused);
    EXPECT_EQ(wrapped.units_created, 3);
    RETURN_IF_ERROR(fsdp::LoadFullStateDict(*other->model(), &other_runner->registry(), trained));
    ASSIGN_OR_RETURN(EvalResult alone, other_runner->Test(*other));
    EXPECT_EQ(alone.loss, test.loss) << "test alone vs after fit";
    EXPECT_EQ(test.count, 2 * 4 * 8) << "2 batches of 4 rows of 8 tokens";
    return absl::OkStatus();
  }));
}

// NOTE [bf16 logits] (nn/gpt.h): under bf16 mixed precision the model's logits are bf16;
// the loss and the predictions take them (ids in the vocabulary, the same on every rank),
// and the fit trains on them.
TEST(StageRunnerTest, Bf16MixedPrecisionStagesTakeBf16Logits) {
  INTEGRATION_ASSERT_OK(RunRanks(2, [](comm::testing::RankContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(auto module, GptTrainModule::Create(TinyGpt()));
    StageOptions options = TinyStages();
    options.wrap.mixed_precision.param_dtype = core::DType::kBFloat16;
    ASSIGN_OR_RETURN(auto runner, StageRunner::Create(ctx.group, options));
    ASSIGN_OR_RETURN(FitResult fit, runner->Fit(*module));
    EXPECT_TRUE(std::isfinite(fit.final_loss));
    ASSIGN_OR_RETURN(EvalResult test, runner->Test(*module));
    EXPECT_TRUE(std::isfinite(test.loss));
    ASSIGN_OR_RETURN(PredictResult predicted, runner->Predict(*module));
    EXPECT_EQ(predicted.outputs.size(), 2u);
    RETURN_IF_ERROR(NoFailuresYet());
    for (const core::Tensor& ids : predicted.outputs) {
      EXPECT_EQ(ids.dtype(), core::DType::kInt32);
      for (float id : ids.ToVector()) {
        EXPECT_GE(id, 0);
        EXPECT_LT(id, TinyGpt().model.vocab_size);
      }
    }
    return absl::OkStatus();
  }));
}

TEST(StageRunnerTest, EvaluationStagesAllocateNoGradientsOrOptimizerState) {
  INTEGRATION_ASSERT_OK(RunRanks(2, [](comm::testing::RankContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(auto module, GptTrainModule::Create(TinyGpt()));
    ASSIGN_OR_RETURN(auto runner, StageRunner::Create(ctx.group, TinyStages()));
    for (Stage stage : {Stage::kValidate, Stage::kTest}) {
      ASSIGN_OR_RETURN(EvalResult r,
                       stage == Stage::kTest ? runner->Test(*module) : runner->Validate(*module));
      for (const RankMemory& m : r.report.memory) {
        // The stage alone allocated no gradients or optimizer state, and its forwards
        // were measured.
        EXPECT_EQ(m.peak_by_tag[static_cast<int>(core::MemoryTag::kGrad)], 0) << StageName(stage);
        EXPECT_EQ(m.peak_by_tag[static_cast<int>(core::MemoryTag::kOptim)], 0) << StageName(stage);
        EXPECT_GT(m.peak_by_tag[static_cast<int>(core::MemoryTag::kActivation)], 0)
            << StageName(stage);
      }
    }
    EXPECT_EQ(runner->optimizer(*module), nullptr) << "no optimizer made";
    ASSIGN_OR_RETURN(PredictResult predicted, runner->Predict(*module));
    // Predict: int32 [rows, T] per batch.
    EXPECT_EQ(predicted.outputs.size(), 2u);
    RETURN_IF_ERROR(NoFailuresYet());
    EXPECT_EQ(predicted.outputs[0].shape(), core::Shape({2, 8}));
    EXPECT_EQ(predicted.outputs[0].dtype(), core::DType::kInt32);
    // After a Fit the gradients and optimizer state exist; a test adds none.
    RETURN_IF_ERROR(runner->Fit(*module, 2).status());
    ASSIGN_OR_RETURN(EvalResult after, runner->Test(*module));
    for (const RankMemory& m : after.report.memory) {
      for (core::MemoryTag tag : {core::MemoryTag::kGrad, core::MemoryTag::kOptim}) {
        const int t = static_cast<int>(tag);
        EXPECT_EQ(m.peak_by_tag[t], m.current_by_tag[t])
            << "test after fit grew " << core::MemoryTagName(tag);
        EXPECT_GT(m.current_by_tag[t], 0) << core::MemoryTagName(tag);
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
    EXPECT_EQ(fit.report.wrap.units, 3);
    EXPECT_EQ(fit.report.wrap.units_reused, 1);
    EXPECT_EQ(fit.report.wrap.units_created, 2);
    EXPECT_EQ(runner->registry().FindUnit(*block0), unit) << "the user's unit kept";
    return absl::OkStatus();
  }));
}

// Two full state dicts hold the same parameters: the same non-zero number of entries,
// the same names in the same order, equal values.
void ExpectSameParameters(const fsdp::StateDict& a, const fsdp::StateDict& b) {
  EXPECT_FALSE(a.empty());
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first) << "parameter " << i;
    const std::vector<float> va = a[i].second.ToVector();
    EXPECT_FALSE(va.empty()) << a[i].first;
    EXPECT_EQ(va, b[i].second.ToVector()) << "parameter " << a[i].first << " differs";
  }
}

TEST(StageRunnerTest, ContinuedFitEqualsOneLongerFit) {
  INTEGRATION_ASSERT_OK(RunRanks(2, [](comm::testing::RankContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(auto a, GptTrainModule::Create(TinyGpt()));
    ASSIGN_OR_RETURN(auto runner_a, StageRunner::Create(ctx.group, TinyStages()));
    ASSIGN_OR_RETURN(FitResult first, runner_a->Fit(*a, 3));
    optim::Optimizer* optimizer = runner_a->optimizer(*a);
    ASSIGN_OR_RETURN(fsdp::StateDict at_three,
                     fsdp::FullStateDict(*a->model(), &runner_a->registry()));
    ASSIGN_OR_RETURN(EvalResult between, runner_a->Validate(*a));  // a stage in between
    ASSIGN_OR_RETURN(FitResult second, runner_a->Fit(*a, 3));
    // The same optimizer continued.
    EXPECT_EQ(runner_a->optimizer(*a), optimizer);
    EXPECT_EQ(optimizer->step_count(), 6);
    EXPECT_EQ(second.first_step, 3);
    EXPECT_EQ(second.global_step, 6);

    ASSIGN_OR_RETURN(auto b, GptTrainModule::Create(TinyGpt()));
    ASSIGN_OR_RETURN(auto runner_b, StageRunner::Create(ctx.group, TinyStages()));
    ASSIGN_OR_RETURN(FitResult straight, runner_b->Fit(*b, 6));
    std::vector<double> continued = first.losses;
    continued.insert(continued.end(), second.losses.begin(), second.losses.end());
    // Same batches, same learning rates, same optimizer state, same arithmetic: exact.
    EXPECT_THAT(continued, SizeIs(6));
    EXPECT_EQ(continued, straight.losses);
    ASSIGN_OR_RETURN(fsdp::StateDict pa, fsdp::FullStateDict(*a->model(), &runner_a->registry()));
    ASSIGN_OR_RETURN(fsdp::StateDict pb, fsdp::FullStateDict(*b->model(), &runner_b->registry()));
    ExpectSameParameters(pa, pb);

    // The validation in between evaluated the weights after 3 steps: the same weights in
    // a fresh model, validated by a fresh runner (same world size and layout, so the
    // same arithmetic), give exactly its loss over the same number of tokens.
    EXPECT_TRUE(std::isfinite(between.loss)) << between.loss;
    EXPECT_GT(between.loss, 0);
    EXPECT_EQ(between.batches, 2);
    EXPECT_EQ(between.count, 2 * 4 * 8) << "2 batches of 4 rows of 8 tokens";
    ASSIGN_OR_RETURN(auto c, GptTrainModule::Create(TinyGpt()));
    ASSIGN_OR_RETURN(auto runner_c, StageRunner::Create(ctx.group, TinyStages()));
    RETURN_IF_ERROR(runner_c->Wrap(*c).status());
    RETURN_IF_ERROR(fsdp::LoadFullStateDict(*c->model(), &runner_c->registry(), at_three));
    ASSIGN_OR_RETURN(EvalResult again, runner_c->Validate(*c));
    EXPECT_EQ(again.count, between.count);
    EXPECT_EQ(again.loss, between.loss) << "validation at step 3: alone vs in between";
    return absl::OkStatus();
  }));
}

// NOTE [Gradient accumulation]: two micro-batches of 2 rows give the gradient one batch
// of 4 rows gives (to fp32 rounding: the mean of two means of equal counts is the mean),
// with the loss of the batch, in both modes; kNoSync holds every unit's full gradient at
// once, so its peak memory is the larger; a module that cannot split its batch, and a
// batch the micro-batches do not divide, are refused by name.
TEST(StageRunnerTest, GradAccumulationGivesTheWholeBatchGradientInBothModes) {
  INTEGRATION_ASSERT_OK(RunRanks(2, [](comm::testing::RankContext& ctx) -> absl::Status {
    struct Run {
      std::vector<std::vector<float>> grads;  // this rank's gradient shards
      double loss = 0;
      int64_t peak = 0;  // this rank's peak bytes, all tags
    };
    const auto run = [&](int k, StageOptions::Accumulation mode) -> absl::StatusOr<Run> {
      StageOptions options = TinyStages();
      options.grad_accumulation = k;
      options.accumulation = mode;
      ASSIGN_OR_RETURN(auto module, GptTrainModule::Create(TinyGpt()));
      ASSIGN_OR_RETURN(auto runner, StageRunner::Create(ctx.group, options));
      ASSIGN_OR_RETURN(FitResult fit, runner->Fit(*module, 1));
      Run r;
      r.loss = fit.losses.at(0);
      r.peak = fit.report.memory.at(static_cast<size_t>(ctx.rank)).peak_total;
      for (const auto& [name, p] : runner->optimizer(*module)->named_parameters()) {
        if (p->grad.defined()) r.grads.push_back(p->grad.ToVector());
      }
      return r;
    };
    ASSIGN_OR_RETURN(Run whole, run(1, StageOptions::Accumulation::kReduceEach));
    ASSIGN_OR_RETURN(Run each, run(2, StageOptions::Accumulation::kReduceEach));
    ASSIGN_OR_RETURN(Run no_sync, run(2, StageOptions::Accumulation::kNoSync));
    for (const Run* r : {&each, &no_sync}) {
      EXPECT_NEAR(r->loss, whole.loss, 1e-6 * whole.loss);
      EXPECT_EQ(r->grads.size(), whole.grads.size());
      RETURN_IF_ERROR(testing::NoFailuresYet());
      for (size_t i = 0; i < whole.grads.size(); ++i) {
        double d = 0, w = 0;
        for (size_t j = 0; j < whole.grads[i].size(); ++j) {
          d += std::pow(static_cast<double>(r->grads[i][j]) - whole.grads[i][j], 2);
          w += std::pow(static_cast<double>(whole.grads[i][j]), 2);
        }
        EXPECT_LE(std::sqrt(d), 1e-5 * std::sqrt(w) + 1e-12) << "gradient shard " << i;
      }
    }
    EXPECT_GT(no_sync.peak, each.peak);
    return absl::OkStatus();
  }));

  // A module that does not split its batch is refused before any step.
  INTEGRATION_ASSERT_OK(RunRanks(1, [](comm::testing::RankContext& ctx) -> absl::Status {
    struct Whole : ForwardingTrainModule {
      using ForwardingTrainModule::ForwardingTrainModule;
      bool SupportsMicroBatches() const override { return false; }
    };
    ASSIGN_OR_RETURN(auto module, GptTrainModule::Create(TinyGpt()));
    Whole whole(module.get());
    StageOptions options = TinyStages();
    options.grad_accumulation = 2;
    ASSIGN_OR_RETURN(auto runner, StageRunner::Create(ctx.group, options));
    const absl::Status s = runner->Fit(whole, 1).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("StageOptions.grad_accumulation = 2"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("SupportsMicroBatches"));
    return absl::OkStatus();
  }));
  StageOptions odd = TinyStages();  // 4 rows
  odd.grad_accumulation = 4;        // 1-row micro-batches over 2 ranks
  const absl::Status s = odd.Validate(2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("StageOptions.grad_accumulation = 4"));
}

// StageOptions::profile_step: that step's ops (NOTE [Op accounting] in core/op_profile.h),
// from the TrainingStep through the gradient reduction to the optimizer; nothing else.
TEST(StageRunnerTest, ProfileStepRecordsThatStepsOpsOnly) {
  INTEGRATION_ASSERT_OK(RunRanks(2, [](comm::testing::RankContext& ctx) -> absl::Status {
    StageOptions options = TinyStages();
    options.profile_step = 1;
    ASSIGN_OR_RETURN(auto module, GptTrainModule::Create(TinyGpt()));
    ASSIGN_OR_RETURN(auto runner, StageRunner::Create(ctx.group, options));
    ASSIGN_OR_RETURN(FitResult fit, runner->Fit(*module, 3));
    std::map<core::OpCategory, int> count;
    for (const core::OpRecord& r : fit.profiled_ops) ++count[r.category];
    EXPECT_GT(count[core::OpCategory::kGemmForward], 0);
    EXPECT_GT(count[core::OpCategory::kGemmWeightGrad], 0);
    EXPECT_GT(count[core::OpCategory::kAttention], 0);
    EXPECT_GT(count[core::OpCategory::kCollective], 0);  // all-gathers, reduce-scatters
    EXPECT_EQ(count[core::OpCategory::kOptimizer], 1);   // one step, one fused update
    EXPECT_EQ(count[core::OpCategory::kLoss], 1);
    // Outside a profiled step nothing is recorded, and a step past the Fit's is none.
    EXPECT_EQ(core::CurrentOpProfile(), nullptr);
    ASSIGN_OR_RETURN(FitResult later, runner->Fit(*module, 1));
    EXPECT_TRUE(later.profiled_ops.empty());
    return absl::OkStatus();
  }));
  StageOptions bad = TinyStages();
  bad.profile_step = -2;
  const absl::Status s = bad.Validate(2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("StageOptions.profile_step = -2"));
}

TEST(StageRunnerTest, ReleaseLeavesTheTrainedPlainModuleWithItsParameters) {
  INTEGRATION_ASSERT_OK(RunRanks(2, [](comm::testing::RankContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(auto module, GptTrainModule::Create(TinyGpt()));
    const std::vector<core::ParameterPtr> before = module->model()->Parameters();
    ASSIGN_OR_RETURN(auto runner, StageRunner::Create(ctx.group, TinyStages()));
    ASSIGN_OR_RETURN(FitResult fit, runner->Fit(*module));
    ASSIGN_OR_RETURN(EvalResult test, runner->Test(*module));
    RETURN_IF_ERROR(runner->Release(*module));
    EXPECT_EQ(module->model()->Parameters(), before) << "same Parameter objects";
    EXPECT_EQ(runner->registry().NumUnits(), 0) << "no units left";
    EvalOptions plain;
    plain.wrap = false;
    ASSIGN_OR_RETURN(EvalResult released, runner->Test(*module, plain));
    EXPECT_TRUE(released.report.wrap.skipped) << "not wrapped";
    // The released module computes with the same values in full-shape storage of its own.
    EXPECT_LE(std::abs(released.loss - test.loss), 1e-6 * test.loss)
        << "released " << released.loss << " vs wrapped " << test.loss;
    // A Fit after Release wraps fresh and continues from the trained weights.
    ASSIGN_OR_RETURN(FitResult more, runner->Fit(*module, 2));
    EXPECT_FALSE(more.report.wrap.reused) << "fresh wrap";
    EXPECT_EQ(more.first_step, 6);
    EXPECT_THAT(more.losses, SizeIs(2));
    EXPECT_FALSE(fit.losses.empty());
    RETURN_IF_ERROR(NoFailuresYet());
    EXPECT_LT(more.losses[0], fit.losses[0]) << "continued from trained weights";
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
    if (ctx.rank != 0) {
      EXPECT_TRUE(seen.empty()) << "only rank 0 reports";
      return absl::OkStatus();
    }
    EXPECT_EQ(seen.size(), 3u);
    EXPECT_THAT(fit.losses, SizeIs(7));
    RETURN_IF_ERROR(NoFailuresYet());
    EXPECT_EQ(seen[0].step, 3);
    EXPECT_EQ(seen[1].step, 6);
    EXPECT_EQ(seen[2].step, 7);
    EXPECT_EQ(seen[2].loss, fit.losses.back()) << "the step's loss";
    // Every rank's memory.
    EXPECT_EQ(seen[0].memory.size(), 2u);
    RETURN_IF_ERROR(NoFailuresYet());
    EXPECT_GT(seen[0].memory[1].peak_by_tag[static_cast<int>(core::MemoryTag::kParam)], 0);
    const std::string line = FormatProgress(seen[0]);
    EXPECT_THAT(line, HasSubstr("r1 "));
    EXPECT_THAT(line, HasSubstr("loss"));
    return absl::OkStatus();
  }));
}

// NOTE [Deferred loss]: a step's loss left on the device is read when the runner reports,
// not when the step runs, and the fit's losses are those of the losses read at once.
class ReadCountingModule : public ForwardingTrainModule {
 public:
  using ForwardingTrainModule::ForwardingTrainModule;
  absl::StatusOr<StepOutput> TrainingStep(const StepContext& ctx) override {
    ASSIGN_OR_RETURN(StepOutput out, ForwardingTrainModule::TrainingStep(ctx));
    if (!out.read_loss) return absl::InternalError("the GPT's TrainingStep deferred no loss");
    ++steps_;
    auto read = std::move(out.read_loss);
    out.read_loss = [this, read, step = ctx.step]() -> absl::StatusOr<double> {
      reads_.push_back({steps_, step});
      if (step == fail_at_) return absl::DataLossError("device lost the loss");
      return read();
    };
    return out;
  }
  // (steps run when the read happened, the step whose loss it read)
  std::vector<std::pair<int64_t, int64_t>> reads_;
  int64_t steps_ = 0;
  int64_t fail_at_ = -1;
};

TEST(StageRunnerTest, DeferredLossesAreReadAtReportsAndGiveTheSameLosses) {
  INTEGRATION_ASSERT_OK(RunRanks(2, [](comm::testing::RankContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(auto reference, GptTrainModule::Create(TinyGpt()));
    ASSIGN_OR_RETURN(auto plain_runner, StageRunner::Create(ctx.group, TinyStages()));
    // The same module with each loss read at once, the runner's way before deferral.
    class ReadAtOnce : public ForwardingTrainModule {
     public:
      using ForwardingTrainModule::ForwardingTrainModule;
      absl::StatusOr<StepOutput> TrainingStep(const StepContext& c) override {
        ASSIGN_OR_RETURN(StepOutput out, ForwardingTrainModule::TrainingStep(c));
        ASSIGN_OR_RETURN(out.loss, out.read_loss());
        out.read_loss = nullptr;
        return out;
      }
    } at_once(reference.get());
    ASSIGN_OR_RETURN(FitResult want, plain_runner->Fit(at_once, 7));
    RETURN_IF_ERROR(plain_runner->Release(*reference));

    ASSIGN_OR_RETURN(auto gpt, GptTrainModule::Create(TinyGpt()));
    ReadCountingModule counted(gpt.get());
    ASSIGN_OR_RETURN(auto runner, StageRunner::Create(ctx.group, TinyStages()));  // log every 3
    ASSIGN_OR_RETURN(FitResult got, runner->Fit(counted, 7));
    EXPECT_EQ(got.losses, want.losses);
    // Steps 0-2 read after step 3 ran, 3-5 after step 6, 6 after step 7.
    const std::vector<std::pair<int64_t, int64_t>> reads = {{3, 0}, {3, 1}, {3, 2}, {6, 3},
                                                            {6, 4}, {6, 5}, {7, 6}};
    EXPECT_EQ(counted.reads_, reads);
    // A failed read names the step.
    counted.fail_at_ = 8;
    const absl::Status s = runner->Fit(counted, 3).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_THAT(s.message(), HasSubstr("loss of global step 9"));
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
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(s.message(), HasSubstr("another WrapperRegistry"));
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
    // The fit runner wraps fresh.
    EXPECT_EQ(fit.report.wrap.units_created, 3);
    EXPECT_GT(fit.report.wrap.param_bytes_copied, 0);
    // Options built again (an equal policy object, not the same one): still the same wrap.
    ASSIGN_OR_RETURN(auto test_runner,
                     StageRunner::Create(ctx.group, TinyStages(), fit_runner->shared_registry()));
    EXPECT_EQ(&test_runner->registry(), registry.get()) << "one registry";
    ASSIGN_OR_RETURN(EvalResult test, test_runner->Test(*module));
    EXPECT_TRUE(test.report.wrap.reused);
    EXPECT_EQ(test.report.wrap.units, 3);
    EXPECT_EQ(test.report.wrap.units_reused, 3);
    EXPECT_EQ(test.report.wrap.units_created, 0);
    EXPECT_EQ(test.report.wrap.param_bytes_copied, 0);
    // One wrap and one reuse in the shared registry.
    EXPECT_EQ(registry->counters().wraps, 1);
    EXPECT_EQ(registry->counters().reuses, 1);
    // Either runner releases: the module is plain for both.
    RETURN_IF_ERROR(test_runner->Release(*module));
    EXPECT_EQ(registry->NumUnits(), 0) << "released";
    return absl::OkStatus();
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
    EXPECT_THAT(s.message(), HasSubstr("StageOptions.train_batch_size"));
    // A wrap that asks for other options than the user's own wrap of the root.
    ASSIGN_OR_RETURN(auto module, GptTrainModule::Create(TinyGpt()));
    ASSIGN_OR_RETURN(auto runner, StageRunner::Create(ctx.group, TinyStages()));
    fsdp::FullyShardOptions other = runner->options().wrap;
    other.strategy = fsdp::ShardingStrategy::kNoShard;
    RETURN_IF_ERROR(
        fsdp::FullyShard(module->model(), ctx.group, other, &runner->registry()).status());
    absl::Status fit = runner->Fit(*module).status();
    EXPECT_EQ(fit.code(), absl::StatusCode::kFailedPrecondition) << fit;
    EXPECT_THAT(fit.message(), HasSubstr("fit"));
    EXPECT_THAT(fit.message(), HasSubstr("strategy"));
    return absl::OkStatus();
  }));
}

}  // namespace
}  // namespace integration
