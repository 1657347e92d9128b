// The main job's wrappers forward what they do not change: a GPT wrapped in either (or
// both, as the main job nests them) still counts tokens, so its progress lines say
// tokens/s; the fault injector fails only its rank's chosen step.
#include "integration/internal/job_train_modules.h"

#include <memory>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/gpt_module.h"
#include "integration/testing/stage_testing.h"

namespace integration {
namespace internal {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<GptTrainModule> TinyModule() {
  absl::StatusOr<std::unique_ptr<GptTrainModule>> module =
      GptTrainModule::Create(testing::TinyGpt(16, 16, 3));
  EXPECT_TRUE(module.ok()) << module.status();
  return module.ok() ? *std::move(module) : nullptr;
}

TEST(JobTrainModulesTest, BothWrappersForwardTheCountUnitAndTheModel) {
  std::unique_ptr<GptTrainModule> gpt = TinyModule();
  ASSERT_NE(gpt, nullptr);
  absl::StatusOr<std::unique_ptr<FaultInjector>> fault =
      FaultInjector::Parse("error@1:2", /*rank=*/0, gpt.get());
  ASSERT_TRUE(fault.ok()) << fault.status();
  ThroughputMeter meter(10);
  TimedTrainModule timed(fault->get(), &meter);
  EXPECT_EQ((*fault)->CountUnit(), "tokens");
  EXPECT_EQ(timed.CountUnit(), "tokens");
  EXPECT_EQ(timed.model(), gpt->model());
  EXPECT_EQ(timed.LearningRate(0), gpt->LearningRate(0));
}

TEST(JobTrainModulesTest, TheFaultInjectorFailsItsRanksStepOnly) {
  std::unique_ptr<GptTrainModule> gpt = TinyModule();
  ASSERT_NE(gpt, nullptr);
  absl::StatusOr<std::unique_ptr<FaultInjector>> mine =
      FaultInjector::Parse("error@0:2", /*rank=*/0, gpt.get());
  absl::StatusOr<std::unique_ptr<FaultInjector>> other =
      FaultInjector::Parse("error@1:2", /*rank=*/0, gpt.get());
  ASSERT_TRUE(mine.ok()) << mine.status();
  ASSERT_TRUE(other.ok()) << other.status();
  StepContext ctx;
  ctx.batch_size = 2;
  EXPECT_TRUE((*mine)->TrainingStep(ctx).ok());
  absl::Status second = (*mine)->TrainingStep(ctx).status();
  EXPECT_EQ(second.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(second.message(), HasSubstr("--testonly_fault: injected error at step 2"));
  for (int i = 0; i < 3; ++i) EXPECT_TRUE((*other)->TrainingStep(ctx).ok());
}

TEST(JobTrainModulesTest, AMalformedFaultNamesTheFlag) {
  for (const char* spec : {"error@1", "boom@0:1", "kill@0:0", "exit@x:1"}) {
    absl::Status s = FaultInjector::Parse(spec, 0, nullptr).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << spec;
    EXPECT_THAT(s.message(), HasSubstr("--testonly_fault=")) << spec;
  }
}

TEST(JobTrainModulesTest, TheTimedModuleStartsTheMeterAtEveryStepNotEveryMicroBatch) {
  std::unique_ptr<GptTrainModule> gpt = TinyModule();
  ASSERT_NE(gpt, nullptr);
  ThroughputMeter meter(3);
  TimedTrainModule timed(gpt.get(), &meter);
  StepContext ctx;
  ctx.batch_size = 2;
  ctx.micro_batches = 2;
  for (int i = 0; i < 3; ++i) {
    ctx.step = i;
    for (int j = 0; j < 2; ++j) {  // two micro-batches of one optimizer step
      ctx.micro_batch = j;
      ASSERT_TRUE(timed.TrainingStep(ctx).ok());
    }
  }
  // Three starts time two steps (NOTE in integration/device_setup.h); none is warm-up at 3.
  EXPECT_EQ(meter.measured_steps(), 2);
}

}  // namespace
}  // namespace internal
}  // namespace integration
