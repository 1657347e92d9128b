// The main job's flags as JobOptions: the defaults, the parent's checks with the
// messages it prints, the stages, and the StageOptions the flags make.
#include "integration/internal/job_options.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(int64_t, n_embd);
ABSL_DECLARE_FLAG(int64_t, n_head);
ABSL_DECLARE_FLAG(std::optional<int64_t>, n_kv_head);
ABSL_DECLARE_FLAG(std::optional<int64_t>, intermediate_size);
ABSL_DECLARE_FLAG(double, rope_theta);
ABSL_DECLARE_FLAG(double, rms_norm_eps);
ABSL_DECLARE_FLAG(bool, tie_word_embeddings);

namespace integration {
namespace internal {
namespace {

using ::testing::ElementsAre;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;
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
  EXPECT_EQ(job.model_kind, "gpt");
  EXPECT_EQ(job.gpt.vocab_size, 64);
  EXPECT_EQ(job.train.seq_len, 32);
  EXPECT_EQ(job.train.language.seed, job.gpt.seed + 1);
  EXPECT_TRUE(job.train.device.is_cpu());
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

// --forward_prefetch=auto (the default) prefetches on a CUDA device only; true and false
// say so everywhere; anything else is refused naming the flag.
TEST(JobOptionsTest, ForwardPrefetchIsOnByDefaultOnTheGpuOnly) {
  JobOptions job = JobOptionsFromFlags();
  EXPECT_EQ(job.forward_prefetch, "auto");
  EXPECT_FALSE(StageOptionsFor(job, absl::Seconds(7)).value().wrap.forward_prefetch);
  job.device = "cuda";
  EXPECT_TRUE(StageOptionsFor(job, absl::Seconds(7)).value().wrap.forward_prefetch);
  job.forward_prefetch = "false";
  EXPECT_FALSE(StageOptionsFor(job, absl::Seconds(7)).value().wrap.forward_prefetch);
  job.device = "cpu";
  job.forward_prefetch = "true";
  EXPECT_TRUE(StageOptionsFor(job, absl::Seconds(7)).value().wrap.forward_prefetch);
  job.forward_prefetch = "sometimes";
  EXPECT_THAT(Message(StageOptionsFor(job, absl::Seconds(7)).status()),
              HasSubstr("--forward_prefetch=sometimes"));
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

// --model=llama: the shared dimension flags fill LlamaConfig (width -> hidden_size, context
// -> max_position_embeddings), the Llama-only flags have their documented defaults, and
// the wrap is one unit per LlamaDecoderLayer.
TEST(JobOptionsTest, LlamaTakesTheDimensionFlagsAndItsOwnDefaults) {
  JobOptions job;
  {
    absl::FlagSaver restore;  // the flags as they were, for the other tests
    absl::SetFlag(&FLAGS_model, "llama");
    job = JobOptionsFromFlags();
  }
  EXPECT_EQ(job.model_kind, "llama");
  EXPECT_EQ(job.llama.vocab_size, 64);
  EXPECT_EQ(job.llama.hidden_size, 64);
  EXPECT_EQ(job.llama.num_hidden_layers, 2);
  EXPECT_EQ(job.llama.num_attention_heads, 4);
  EXPECT_EQ(job.llama.max_position_embeddings, 32);
  EXPECT_EQ(job.llama.num_key_value_heads, 4) << "default --n_kv_head = --n_head";
  EXPECT_EQ(job.llama.intermediate_size, 176) << "8/3 x 64 rounded up to a multiple of 8";
  EXPECT_EQ(job.llama.rope_theta, 10000.0);
  EXPECT_EQ(job.llama.rms_norm_eps, 1e-6f);
  EXPECT_FALSE(job.llama.tie_word_embeddings);
  EXPECT_EQ(job.llama.seed, job.gpt.seed);
  EXPECT_TRUE(CheckBeforeLaunch(job).ok()) << CheckBeforeLaunch(job);
  const LlamaModuleOptions module = LlamaOptionsFor(job);
  EXPECT_EQ(module.seq_len, job.train.seq_len);
  EXPECT_EQ(module.language.seed, job.train.language.seed);
  EXPECT_EQ(module.model.num_key_value_heads, 4);

  job.activation_checkpoint_every = 2;
  absl::StatusOr<StageOptions> options = StageOptionsFor(job, absl::Seconds(7));
  ASSERT_TRUE(options.ok()) << options.status();
  ASSERT_NE(options->wrap.policy, nullptr);
  EXPECT_THAT(options->wrap.policy->Name(), HasSubstr("LlamaDecoderLayer"));
  ASSERT_NE(options->wrap.checkpoint_policy, nullptr);
  EXPECT_THAT(options->wrap.checkpoint_policy->Name(), HasSubstr("LlamaDecoderLayer"));
  EXPECT_THAT(options->wrap.checkpoint_policy->Name(), HasSubstr("k=2"));
  // The GPT's stays TransformerBlock.
  job.model_kind = "gpt";
  options = StageOptionsFor(job, absl::Seconds(7));
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_THAT(options->wrap.policy->Name(), HasSubstr("TransformerBlock"));
}

TEST(JobOptionsTest, LlamaFlagsSetTheConfig) {
  absl::FlagSaver restore;  // the flags as they were, for the other tests
  absl::SetFlag(&FLAGS_model, "llama");
  absl::SetFlag(&FLAGS_n_embd, 96);
  absl::SetFlag(&FLAGS_n_head, 6);
  absl::SetFlag(&FLAGS_n_kv_head, 2);
  absl::SetFlag(&FLAGS_rope_theta, 500000.0);
  absl::SetFlag(&FLAGS_rms_norm_eps, 1e-5);
  absl::SetFlag(&FLAGS_tie_word_embeddings, true);
  const JobOptions job = JobOptionsFromFlags();
  EXPECT_EQ(job.llama.intermediate_size, 256) << "8 ceil(96 / 3)";
  absl::SetFlag(&FLAGS_intermediate_size, 200);
  const JobOptions sized = JobOptionsFromFlags();
  EXPECT_EQ(job.llama.hidden_size, 96);
  EXPECT_EQ(job.llama.num_attention_heads, 6);
  EXPECT_EQ(job.llama.num_key_value_heads, 2);
  EXPECT_EQ(job.llama.rope_theta, 500000.0);
  EXPECT_EQ(job.llama.rms_norm_eps, 1e-5f);
  EXPECT_TRUE(job.llama.tie_word_embeddings);
  EXPECT_EQ(sized.llama.intermediate_size, 200);
  EXPECT_TRUE(CheckBeforeLaunch(sized).ok()) << CheckBeforeLaunch(sized);
  // The GPT reads the same shared flags and ignores the Llama's.
  EXPECT_EQ(job.gpt.n_embd, 96);
  EXPECT_EQ(job.gpt.n_head, 6);
}

TEST(JobOptionsTest, DefaultIntermediateSizeIsEightThirdsRoundedUpToEight) {
  EXPECT_EQ(DefaultIntermediateSize(64), 176);    // 170.7 -> 176
  EXPECT_EQ(DefaultIntermediateSize(48), 128);    // exactly 128
  EXPECT_EQ(DefaultIntermediateSize(4096), 10928);
  EXPECT_EQ(DefaultIntermediateSize(1), 8);
  EXPECT_EQ(DefaultIntermediateSize(0), 0);
}

// Bad llama values are refused by the parent, naming the flag (LlamaConfig::Validate's
// field mapped to it), and an unknown --model names --model.
TEST(JobOptionsTest, BadLlamaFlagsAreRefusedNamingTheFlag) {
  JobOptions job = JobOptionsFromFlags();
  job.model_kind = "mamba";
  EXPECT_THAT(Message(CheckBeforeLaunch(job)), HasSubstr("--model=mamba: unknown model"));
  EXPECT_THAT(Message(StageOptionsFor(job, absl::Seconds(7)).status()), HasSubstr("--model=mamba"));

  struct Bad {
    void (*set)(JobOptions&);
    const char* message;
  };
  const Bad cases[] = {
      {[](JobOptions& j) { j.llama.num_key_value_heads = 3; },
       "--n_kv_head (3) must divide --n_head (4)"},
      {[](JobOptions& j) { j.llama.num_key_value_heads = 0; }, "--n_kv_head must be positive"},
      {[](JobOptions& j) { j.llama.hidden_size = 60; }, "--n_embd (60) must be --n_head (4)"},
      {[](JobOptions& j) { j.llama.intermediate_size = -8; },
       "--intermediate_size must be positive, got -8"},
      {[](JobOptions& j) { j.llama.num_hidden_layers = 0; }, "--n_layer must be positive"},
      {[](JobOptions& j) { j.llama.vocab_size = 0; }, "--vocab_size must be positive"},
      {[](JobOptions& j) { j.llama.rope_theta = 0; }, "--rope_theta must be finite and > 0"},
      {[](JobOptions& j) { j.llama.rms_norm_eps = -1; }, "--rms_norm_eps must be finite"},
      {[](JobOptions& j) { j.train.seq_len = 33; }, "--seq_len = 33: must be in [1, --block_size = 32]"},
  };
  for (const Bad& c : cases) {
    job = JobOptionsFromFlags();
    job.model_kind = "llama";
    c.set(job);
    const absl::Status s = CheckBeforeLaunch(job);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(Message(s), HasSubstr(c.message));
    EXPECT_THAT(Message(s), Not(HasSubstr("LlamaConfig"))) << Message(s);
  }
  // The GPT ignores the Llama's fields.
  job = JobOptionsFromFlags();
  job.llama.num_key_value_heads = 3;
  EXPECT_TRUE(CheckBeforeLaunch(job).ok()) << CheckBeforeLaunch(job);
}

TEST(JobOptionsTest, LlamaFieldNamesBecomeFlagNames) {
  const absl::Status mapped = WithLlamaFlagNames(absl::InvalidArgumentError(
      "LlamaModuleOptions.seq_len = 64: must be in [1, LlamaConfig.max_position_embeddings = 32]"));
  EXPECT_EQ(mapped.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mapped.message(), "--seq_len = 64: must be in [1, --block_size = 32]");
  EXPECT_TRUE(WithLlamaFlagNames(absl::OkStatus()).ok());
}

}  // namespace
}  // namespace internal
}  // namespace integration
