// The stage API over a model of the user's own, written as graph modules (forward only,
// fsdp/testing/graph_lm.h): the TrainModule's training step is Call, F::CrossEntropy and
// core::Backward; the runner wraps, trains, tests, re-wraps and releases it as it does the
// hand-written GPT, and the model keeps its identity and its Parameter objects throughout.
#include <memory>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/status_macros.h"
#include "data/sampler.h"
#include "fsdp/testing/gpt_training.h"
#include "fsdp/testing/graph_lm.h"
#include "gtest/gtest.h"
#include "integration/stage_runner.h"
#include "integration/testing/stage_testing.h"
#include "integration/train_module.h"
#include "nn/functional/loss.h"
#include "optim/adamw.h"
#include "policy/wrap_policy.h"

namespace integration {
namespace {

namespace F = ::nn::functional;

constexpr int kSeqLen = 8;

// Training batches are the language's batches 0, 1, ...; evaluation batches are held out
// (validate from index 1'000'000, test from 2'000'000).
class GraphLmModule : public TrainModule {
 public:
  GraphLmModule(data::MarkovLanguage language)
      : model_(std::make_shared<fsdp::testing::GraphLm>(fsdp::testing::GraphLmConfig{})),
        language_(std::move(language)) {}

  std::shared_ptr<core::Module> model() override { return model_; }

  absl::StatusOr<StepOutput> TrainingStep(const StepContext& ctx) override {
    ASSIGN_OR_RETURN(data::TokenBatch local, LocalBatch(ctx, ctx.step));
    absl::StatusOr<core::Tensor> loss =
        F::CrossEntropy(model_->CallOne({local.inputs}), local.targets);
    RETURN_IF_ERROR(loss.status());
    RETURN_IF_ERROR(core::Backward(*loss));
    return StepOutput{loss->ToVector()[0], local.targets.numel()};
  }

  absl::StatusOr<StepOutput> EvaluationStep(const StepContext& ctx) override {
    const int64_t base = ctx.stage == Stage::kTest ? 2'000'000 : 1'000'000;
    ASSIGN_OR_RETURN(data::TokenBatch local, LocalBatch(ctx, base + ctx.step));
    absl::StatusOr<core::Tensor> loss =
        F::CrossEntropy(model_->CallOne({local.inputs}), local.targets);
    RETURN_IF_ERROR(loss.status());
    if (core::RequiresGrad(*loss)) {
      return absl::InternalError("an evaluation step recorded a graph");
    }
    return StepOutput{loss->ToVector()[0], local.targets.numel()};
  }

  absl::StatusOr<std::unique_ptr<optim::Optimizer>> ConfigureOptimizer(
      std::vector<core::NamedParameter> params) override {
    optim::AdamWOptions options;
    options.lr = 1e-2f;
    ASSIGN_OR_RETURN(std::unique_ptr<optim::AdamW> adamw,
                     optim::AdamW::Create(std::move(params), options));
    return std::unique_ptr<optim::Optimizer>(std::move(adamw));
  }

  std::string CountUnit() const override { return "tokens"; }

 private:
  absl::StatusOr<data::TokenBatch> LocalBatch(const StepContext& ctx, int64_t index) const {
    ASSIGN_OR_RETURN(data::TokenBatch global, language_.Batch(index, ctx.batch_size, kSeqLen));
    ASSIGN_OR_RETURN(data::RankSampler sampler,
                     data::RankSampler::Create(ctx.rank, ctx.world_size));
    return sampler.Local(global);
  }

  std::shared_ptr<fsdp::testing::GraphLm> model_;
  data::MarkovLanguage language_;
};

absl::StatusOr<std::unique_ptr<GraphLmModule>> MakeModule() {
  ASSIGN_OR_RETURN(data::MarkovLanguage language,
                   fsdp::testing::MakeLanguage(fsdp::testing::TinySetup()));
  return std::make_unique<GraphLmModule>(std::move(language));
}

StageOptions GraphStages() {
  StageOptions o = testing::TinyStages(/*rows=*/4, /*fit_steps=*/20);
  o.wrap.policy = policy::ModuleTypes({"GraphBlock"});
  return o;
}

TEST(GraphStageTest, FitTestRewrapAndReleaseAModelOfGraphModules) {
  INTEGRATION_ASSERT_OK(testing::RunRanks(2, [](comm::testing::RankContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(std::unique_ptr<GraphLmModule> module, MakeModule());
    const std::shared_ptr<core::Module> model = module->model();
    std::vector<core::ParameterPtr> before = model->Parameters();
    ASSIGN_OR_RETURN(auto runner, StageRunner::Create(ctx.group, GraphStages()));
    ASSIGN_OR_RETURN(FitResult fit, runner->Fit(*module));
    EXPECT_EQ(fit.report.wrap.units, 3);  // two blocks and the root
    EXPECT_EQ(fit.losses.size(), 20u);
    RETURN_IF_ERROR(testing::NoFailuresYet());
    EXPECT_LT(fit.losses.back(), fit.losses.front() - 0.3) << "the graph model learns";
    ASSIGN_OR_RETURN(EvalResult test, runner->Test(*module));
    EXPECT_TRUE(test.report.wrap.reused);
    EXPECT_EQ(test.report.wrap.param_bytes_copied, 0);
    // A second Fit re-wraps by reuse and continues.
    ASSIGN_OR_RETURN(FitResult more, runner->Fit(*module, 2));
    EXPECT_TRUE(more.report.wrap.reused);
    EXPECT_EQ(more.first_step, 20);
    ASSIGN_OR_RETURN(EvalResult test_after, runner->Test(*module));
    RETURN_IF_ERROR(runner->Release(*module));
    // The plain trained module: the same object and Parameter objects, full weights, and a
    // fresh runner's wrap of it tests to the same loss.
    EXPECT_EQ(module->model(), model);
    EXPECT_EQ(model->Parameters(), before);
    const fsdp::testing::GraphLm shapes(fsdp::testing::GraphLmConfig{});
    const std::vector<core::ParameterPtr> full = shapes.Parameters();
    for (size_t i = 0; i < before.size(); ++i) {
      EXPECT_EQ(before[i]->data.shape(), full[i]->data.shape()) << "parameter " << i;
    }
    ASSIGN_OR_RETURN(auto fresh_runner, StageRunner::Create(ctx.group, GraphStages()));
    ASSIGN_OR_RETURN(EvalResult alone, fresh_runner->Test(*module));
    EXPECT_FALSE(alone.report.wrap.reused);
    EXPECT_EQ(alone.loss, test_after.loss);
    return fresh_runner->Release(*module);
  }));
}

}  // namespace
}  // namespace integration
