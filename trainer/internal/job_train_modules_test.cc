// The main job's wrappers forward what they do not change: a GPT wrapped in either (or
// both, as the main job nests them) still counts tokens, so its progress lines say
// tokens/s; the fault injector fails only its rank's chosen step.
#include "trainer/internal/job_train_modules.h"

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
  for (const char* spec : {"error@1", "boom@0:1", "kill@0:0", "exit@x:1", "kill@0:g0",
                           "error@0:2:-1", "error@0:2,kill@1", "error@0:2:1:1"}) {
    absl::Status s = FaultInjector::Parse(spec, 0, nullptr).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << spec;
    EXPECT_THAT(s.message(), HasSubstr("--testonly_fault=")) << spec;
  }
}

// The chaos test's schedule: faults at global steps, at chosen restarts, several per spec.
TEST(JobTrainModulesTest, FaultsAtGlobalStepsFireAtTheirRestartOnly) {
  std::unique_ptr<GptTrainModule> gpt = TinyModule();
  ASSERT_NE(gpt, nullptr);
  const std::string spec = "error@0:g3:1,error@1:g2,diskfull@0:4:1,diskfull@0:6";
  absl::StatusOr<std::unique_ptr<FaultInjector>> first =
      FaultInjector::Parse(spec, 0, gpt.get(), 0);
  absl::StatusOr<std::unique_ptr<FaultInjector>> restart =
      FaultInjector::Parse(spec, 0, gpt.get(), 1);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(restart.ok()) << restart.status();
  StepContext ctx;
  ctx.batch_size = 2;
  ctx.micro_batches = 2;
  // Rank 0's first start has no step fault; its restart fails global step 3 (ctx.step 2) at
  // its first micro-batch, however many TrainingStep calls came before.
  for (int64_t step = 0; step < 4; ++step) {
    ctx.step = step;
    for (int j = 0; j < 2; ++j) {
      ctx.micro_batch = j;
      EXPECT_TRUE((*first)->TrainingStep(ctx).ok()) << step;
      const absl::Status s = (*restart)->TrainingStep(ctx).status();
      EXPECT_EQ(s.ok(), !(step == 2 && j == 0)) << step << " " << j << " " << s;
    }
  }
  // The disk fills for the checkpoint of step 6 at the first start, of step 4 at the restart.
  std::function<absl::Status(int64_t)> first_hook = (*first)->WriteErrorHook();
  std::function<absl::Status(int64_t)> restart_hook = (*restart)->WriteErrorHook();
  ASSERT_TRUE(first_hook != nullptr);
  ASSERT_TRUE(restart_hook != nullptr);
  EXPECT_TRUE(first_hook(4).ok());
  EXPECT_THAT(first_hook(6).message(), HasSubstr("No space left on device"));
  EXPECT_EQ(first_hook(6).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(restart_hook(4).ok());
  EXPECT_TRUE(restart_hook(6).ok());
  absl::StatusOr<std::unique_ptr<FaultInjector>> rank1 = FaultInjector::Parse(spec, 1, gpt.get());
  ASSERT_TRUE(rank1.ok());
  EXPECT_TRUE((*rank1)->WriteErrorHook() == nullptr);
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
