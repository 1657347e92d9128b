// ForwardingTrainModule hands every TrainModule call, with its arguments, to the inner
// module and returns the inner module's answer; a wrapper that overrides one call still
// forwards the others (CountUnit, DataIdentity, DataPosition and EvaluationBatches included).
#include "integration/forwarding_train_module.h"

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/linear.h"

namespace integration {
namespace {

using ::testing::HasSubstr;

// Answers every call with a value that names the call and its argument.
class RecordingTrainModule : public TrainModule {
 public:
  std::shared_ptr<core::Module> model() override { return model_; }
  absl::StatusOr<StepOutput> TrainingStep(const StepContext& ctx) override {
    return StepOutput{1.5, ctx.step + 100};
  }
  absl::StatusOr<StepOutput> EvaluationStep(const StepContext& ctx) override {
    return StepOutput{2.5, ctx.step + 200};
  }
  absl::StatusOr<core::Tensor> PredictStep(const StepContext& ctx) override {
    return absl::NotFoundError(absl::StrCat("predict batch ", ctx.step));
  }
  absl::StatusOr<std::unique_ptr<optim::Optimizer>> ConfigureOptimizer(
      std::vector<core::NamedParameter> params) override {
    return absl::UnavailableError(absl::StrCat("optimizer over ", params.size(), " parameters"));
  }
  std::string CountUnit() const override { return "tokens"; }
  std::optional<double> LearningRate(int64_t step) override {
    return 0.5 * static_cast<double>(step);
  }
  bool SupportsMicroBatches() const override { return true; }  // not the default false
  std::map<std::string, std::string> DataIdentity() const override {
    return {{"data.kind", "recorded"}, {"data.seed", "7"}};  // not the default {}
  }
  std::map<std::string, std::string> DataPosition(int64_t global_step,
                                                  int batch_size) const override {
    return {{"data.sample", absl::StrCat(global_step * batch_size)}};  // not the default {}
  }
  std::optional<int64_t> EvaluationBatches(Stage stage, int batch_size) const override {
    return stage == Stage::kTest ? std::optional<int64_t>(1000 / batch_size) : std::nullopt;
  }

 private:
  std::shared_ptr<core::Module> model_ = std::make_shared<nn::Linear>(2, 3);
};

// Overrides nothing.
class PlainWrapper : public ForwardingTrainModule {
 public:
  using ForwardingTrainModule::ForwardingTrainModule;
};

// Overrides one call, as the main job's wrappers do.
class EvaluationCounter : public ForwardingTrainModule {
 public:
  using ForwardingTrainModule::ForwardingTrainModule;
  absl::StatusOr<StepOutput> EvaluationStep(const StepContext& ctx) override {
    ++evaluations;
    return ForwardingTrainModule::EvaluationStep(ctx);
  }
  int evaluations = 0;
};

void ExpectForwardsEverything(TrainModule& wrapper, RecordingTrainModule& inner) {
  StepContext ctx;
  ctx.step = 7;
  EXPECT_EQ(wrapper.model(), inner.model());
  absl::StatusOr<StepOutput> train = wrapper.TrainingStep(ctx);
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_EQ(train->loss, 1.5);
  EXPECT_EQ(train->count, 107);
  absl::StatusOr<StepOutput> eval = wrapper.EvaluationStep(ctx);
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_EQ(eval->loss, 2.5);
  EXPECT_EQ(eval->count, 207);
  absl::Status predict = wrapper.PredictStep(ctx).status();
  EXPECT_EQ(predict.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(predict.message(), HasSubstr("predict batch 7"));
  absl::Status optimizer = wrapper.ConfigureOptimizer(inner.model()->NamedParameters()).status();
  EXPECT_EQ(optimizer.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(optimizer.message(), HasSubstr("optimizer over 2 parameters"));
  EXPECT_EQ(wrapper.CountUnit(), "tokens");  // not TrainModule's default "samples"
  EXPECT_EQ(wrapper.LearningRate(4), std::optional<double>(2.0));
  EXPECT_TRUE(wrapper.SupportsMicroBatches());
  EXPECT_EQ(wrapper.DataIdentity(), inner.DataIdentity());
  EXPECT_EQ(wrapper.DataPosition(3, 8),
            (std::map<std::string, std::string>{{"data.sample", "24"}}));
  EXPECT_EQ(wrapper.EvaluationBatches(Stage::kTest, 8), std::optional<int64_t>(125));
  EXPECT_EQ(wrapper.EvaluationBatches(Stage::kValidate, 8), std::nullopt);
}

TEST(ForwardingTrainModuleTest, ForwardsEveryCallToTheInnerModule) {
  RecordingTrainModule inner;
  PlainWrapper wrapper(&inner);
  ExpectForwardsEverything(wrapper, inner);
}

TEST(ForwardingTrainModuleTest, AWrapperOverridingOneCallForwardsTheOthers) {
  RecordingTrainModule inner;
  EvaluationCounter counter(&inner);
  ExpectForwardsEverything(counter, inner);
  EXPECT_EQ(counter.evaluations, 1);
}

TEST(ForwardingTrainModuleTest, WrappersNest) {
  RecordingTrainModule inner;
  EvaluationCounter counter(&inner);
  PlainWrapper outer(&counter);
  ExpectForwardsEverything(outer, inner);
  EXPECT_EQ(counter.evaluations, 1);
}

}  // namespace
}  // namespace integration
