// The main job's flags as JobOptions: the defaults, the parent's checks with the
// messages it prints, the stages, and the StageOptions the flags make.
#include "integration/internal/job_options.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace integration {
namespace internal {
namespace {

using ::testing::ElementsAre;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// gmock 1.12's string matchers take std::string.
std::string Message(const absl::Status& status) { return std::string(status.message()); }

TEST(JobOptionsTest, TheDefaultsAreTheDemos) {
  const JobOptions job = JobOptionsFromFlags();
  EXPECT_EQ(job.world_size, 2);
  EXPECT_EQ(job.stages, "fit,test");
  EXPECT_EQ(job.steps, 300);
  EXPECT_THAT(job.output_dir, EndsWith("out/main_job"));
  EXPECT_EQ(job.checkpoint_dir, job.output_dir + "/checkpoint");
  EXPECT_EQ(job.safetensors_path, job.output_dir + "/model.safetensors");
  EXPECT_EQ(job.model.model.vocab_size, 64);
  EXPECT_EQ(job.model.seq_len, 32);
  EXPECT_EQ(job.model.language.seed, job.model.model.seed + 1);
  EXPECT_TRUE(job.model.device.is_cpu());
  EXPECT_TRUE(CheckBeforeLaunch(job).ok()) << CheckBeforeLaunch(job);
}

TEST(JobOptionsTest, ParsesTheStagesInOrder) {
  absl::StatusOr<std::vector<Stage>> stages = ParseStages("test,fit,,predict");
  ASSERT_TRUE(stages.ok()) << stages.status();
  EXPECT_THAT(*stages, ElementsAre(Stage::kTest, Stage::kFit, Stage::kPredict));
  absl::Status bad = ParseStages("fit,train").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("--stages: unknown stage 'train'"));
}

TEST(JobOptionsTest, TheParentRefusesNamingTheFlag) {
  JobOptions job = JobOptionsFromFlags();
  job.world_size = 0;
  EXPECT_EQ(CheckBeforeLaunch(job).message(), "--world_size=0 must be >= 1");
  job = JobOptionsFromFlags();
  job.stages = "fit,bogus";
  EXPECT_THAT(Message(CheckBeforeLaunch(job)), StartsWith("INVALID_ARGUMENT: --stages:"));
  job = JobOptionsFromFlags();
  job.strategy = "HALF_SHARD";
  EXPECT_THAT(Message(CheckBeforeLaunch(job)), StartsWith("--strategy: INVALID_ARGUMENT:"));
  job = JobOptionsFromFlags();
  job.intra_op_threads = -1;
  EXPECT_EQ(CheckBeforeLaunch(job).message(), "--intra_op_threads=-1 must be >= 1, or 0 for auto");
  job = JobOptionsFromFlags();
  job.timeout_s = 0;
  EXPECT_THAT(Message(CheckBeforeLaunch(job)), HasSubstr("--timeout_s"));
  job = JobOptionsFromFlags();
  job.cpu_offload = true;  // on the default --device=cpu
  EXPECT_EQ(CheckBeforeLaunch(job).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(CheckBeforeLaunch(job)), StartsWith("--cpu_offload needs --device=cuda"));
}

TEST(JobOptionsTest, IntraOpThreadsAreTheFlagWhenSet) {
  JobOptions job = JobOptionsFromFlags();
  job.intra_op_threads = 3;
  EXPECT_EQ(IntraOpThreads(job, 2).value_or(-1), 3);
  job.intra_op_threads = 0;
  EXPECT_GE(IntraOpThreads(job, 2).value_or(-1), 1);
  job.intra_op_threads = -2;
  EXPECT_THAT(IntraOpThreads(job, 2).status().message(), HasSubstr("--intra_op_threads=-2"));
}

TEST(JobOptionsTest, StageOptionsComeFromTheFlags) {
  JobOptions job = JobOptionsFromFlags();
  job.strategy = "SHARD_GRAD_OP";
  job.batch_size = 8;
  job.param_dtype = "bfloat16";
  job.cpu_offload = true;
  absl::StatusOr<StageOptions> options = StageOptionsFor(job, absl::Seconds(7));
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->wrap.strategy, fsdp::ShardingStrategy::kShardGradOp);
  EXPECT_EQ(options->wrap.mixed_precision.param_dtype, core::DType::kBFloat16);
  EXPECT_EQ(options->wrap.timeout, absl::Seconds(7));
  EXPECT_TRUE(options->wrap.cpu_offload);
  EXPECT_NE(options->wrap.policy, nullptr);
  EXPECT_EQ(options->train_batch_size, 8);
  EXPECT_EQ(options->fit_steps, 300);
  EXPECT_EQ(options->checkpoint_dir, job.checkpoint_dir);
  job.strategy = "HALF_SHARD";
  EXPECT_THAT(Message(StageOptionsFor(job, absl::Seconds(7)).status()), StartsWith("--strategy: "));
  job = JobOptionsFromFlags();
  job.stage_config = "/nonexistent/stage.textproto";
  EXPECT_EQ(StageOptionsFor(job, absl::Seconds(7)).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace internal
}  // namespace integration
