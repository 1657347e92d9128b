// The main job's flags as JobOptions: the defaults, the parent's checks with the
// messages it prints, the stages, and the StageOptions the flags make.
#include "trainer/internal/job_options.h"

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/hf_gpt2.h"
#include "checkpoint/hf_llama.h"
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
ABSL_DECLARE_FLAG(std::string, hf_dir);
ABSL_DECLARE_FLAG(std::string, export_hf_dir);
ABSL_DECLARE_FLAG(std::string, resume_from);
ABSL_DECLARE_FLAG(bool, resume_allow_data_change);
ABSL_DECLARE_FLAG(int, min_world_size);

namespace integration {
namespace internal {
namespace {

using ::testing::ElementsAre;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
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
  EXPECT_EQ(job.hf_dir, "");
  EXPECT_EQ(job.export_hf_dir, "");
  EXPECT_THAT(job.model_flags_set, IsEmpty());
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

// --throughput_warmup_steps leaves at least one step timed (each is timed up to the next
// step's start), and a rank under another launcher refuses it too (StageOptionsFor).
TEST(JobOptionsTest, ThroughputWarmupStepsLeavesATimedStepOrIsRefusedNamingTheFlag) {
  JobOptions job = JobOptionsFromFlags();
  job.steps = 40;
  for (const int64_t ok : {0, 5, 38}) {
    job.throughput_warmup_steps = ok;
    EXPECT_TRUE(CheckBeforeLaunch(job).ok()) << ok << ": " << CheckBeforeLaunch(job);
  }
  for (const int64_t bad : {-1, 39, 40}) {
    job.throughput_warmup_steps = bad;
    const absl::Status s = CheckBeforeLaunch(job);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(s.message()),
                StartsWith(absl::StrCat("--throughput_warmup_steps=", bad,
                                        " must be in [0, --steps - 2 = 38]")));
    EXPECT_EQ(StageOptionsFor(job, absl::Seconds(60)).status().message(), s.message());
  }
  job.throughput_warmup_steps = std::nullopt;  // the default, min(5, steps / 10)
  EXPECT_TRUE(CheckBeforeLaunch(job).ok()) << CheckBeforeLaunch(job);
}

TEST(JobOptionsTest, TheParentRefusesNamingTheFlag) {
  JobOptions job = JobOptionsFromFlags();
  job.world_size = 0;
  EXPECT_EQ(CheckBeforeLaunch(job).message(), "--world_size=0 must be >= 1");
  job = JobOptionsFromFlags();
  job.stages = "fit,bogus";
  EXPECT_THAT(Message(CheckBeforeLaunch(job)), StartsWith("INVALID_ARGUMENT: --stages:"));
  job = JobOptionsFromFlags();
  job.max_restarts = -1;
  EXPECT_EQ(CheckBeforeLaunch(job).message(), "--max_restarts=-1 must be >= 0");
  job = JobOptionsFromFlags();
  job.max_steps = -2;
  EXPECT_THAT(Message(CheckBeforeLaunch(job)), StartsWith("--max_steps=-2 must be >= 0"));
  // NOTE [Training to a global step]: restarts that resume need a step to train to.
  job = JobOptionsFromFlags();
  job.stages = "fit,test";
  job.max_restarts = 2;
  job.resume_from = kResumeLatest;
  EXPECT_THAT(Message(CheckBeforeLaunch(job)),
              StartsWith("--max_restarts=2 with --resume_from=latest needs --max_steps"));
  job.max_steps = 100;
  EXPECT_TRUE(CheckBeforeLaunch(job).ok()) << CheckBeforeLaunch(job);
  job = JobOptionsFromFlags();
  job.world_size = 2;
  job.min_world_size = -1;
  EXPECT_EQ(CheckBeforeLaunch(job).message(),
            "--min_world_size=-1 must be in [0, --world_size=2] (0: never fewer ranks than "
            "--world_size)");
  job.min_world_size = 3;
  EXPECT_THAT(Message(CheckBeforeLaunch(job)), StartsWith("--min_world_size=3 must be in [0, "));
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

// NOTE [Restarts] in comm/launcher.h: --min_world_size is read, 0 (never fewer) by
// default, and accepted anywhere in [0, --world_size], with or without --max_restarts.
TEST(JobOptionsTest, MinWorldSizeIsReadAndAcceptedUpToTheWorldSize) {
  absl::FlagSaver restore;
  EXPECT_EQ(JobOptionsFromFlags().min_world_size, 0);
  absl::SetFlag(&FLAGS_min_world_size, 1);
  JobOptions job = JobOptionsFromFlags();
  EXPECT_EQ(job.min_world_size, 1);
  // Without --max_restarts it has no effect, and is not refused.
  EXPECT_TRUE(CheckBeforeLaunch(job).ok()) << CheckBeforeLaunch(job);
  job.max_restarts = 2;
  for (int min_world_size : {0, 1, 2}) {
    job.min_world_size = min_world_size;
    EXPECT_TRUE(CheckBeforeLaunch(job).ok()) << min_world_size << ": " << CheckBeforeLaunch(job);
  }
  job.min_world_size = 3;
  EXPECT_EQ(CheckBeforeLaunch(job).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(CheckBeforeLaunch(job)), HasSubstr("--min_world_size=3"));
}

// NOTE [Data identity]: --resume_allow_data_change is read, off by default, and means
// something only with --resume_from.
TEST(JobOptionsTest, ResumeAllowDataChangeIsReadAndNeedsResumeFrom) {
  absl::FlagSaver restore;
  EXPECT_FALSE(JobOptionsFromFlags().resume_allow_data_change);
  absl::SetFlag(&FLAGS_resume_allow_data_change, true);
  JobOptions job = JobOptionsFromFlags();
  EXPECT_TRUE(job.resume_allow_data_change);
  const absl::Status refused = CheckBeforeLaunch(job);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(refused), StartsWith("--resume_allow_data_change needs --resume_from"));
  absl::SetFlag(&FLAGS_resume_from, "/ckpt/run");
  job = JobOptionsFromFlags();
  EXPECT_EQ(job.resume_from, "/ckpt/run");
  EXPECT_TRUE(job.resume_allow_data_change);
  EXPECT_TRUE(CheckBeforeLaunch(job).ok()) << CheckBeforeLaunch(job);
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
  EXPECT_EQ(DefaultIntermediateSize(64), 176);  // 170.7 -> 176
  EXPECT_EQ(DefaultIntermediateSize(48), 128);  // exactly 128
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
      {[](JobOptions& j) { j.train.seq_len = 33; },
       "--seq_len = 33: must be in [1, --block_size = 32]"},
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

// NOTE [Hugging Face start]: the committed transformers checkpoints.
const char kHfGpt2[] = "checkpoint/testdata/hf_gpt2";
const char kHfLlama[] = "checkpoint/testdata/hf_llama";

// A text-format StageConfig file holding `text`.
std::string StageConfigFile(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(JobOptionsTest, HfFlagsAndTheModelFlagsSetAreRead) {
  absl::FlagSaver restore;
  absl::SetFlag(&FLAGS_hf_dir, "/models/gpt2");
  absl::SetFlag(&FLAGS_export_hf_dir, "/out/tuned");
  absl::SetFlag(&FLAGS_n_embd, 96);
  absl::SetFlag(&FLAGS_n_kv_head, 2);
  absl::SetFlag(&FLAGS_n_head, 4);  // the default: not "set"
  const JobOptions job = JobOptionsFromFlags();
  EXPECT_EQ(job.hf_dir, "/models/gpt2");
  EXPECT_EQ(job.export_hf_dir, "/out/tuned");
  EXPECT_EQ(job.hf_dir_name, "--hf_dir");
  EXPECT_EQ(job.export_hf_dir_name, "--export_hf_dir");
  EXPECT_THAT(job.model_flags_set, ElementsAre("n_embd", "n_kv_head"));
}

// config.json's model_type and sizes replace --model and the size flags at their defaults;
// the seed stays the flag's and the model is built deferred.
TEST(JobOptionsTest, HfDirSetsTheModelFromConfigJson) {
  JobOptions job = JobOptionsFromFlags();
  job.hf_dir = kHfGpt2;
  absl::StatusOr<JobOptions> gpt = ResolveHfDirs(job);
  ASSERT_TRUE(gpt.ok()) << gpt.status();
  const nn::GptConfig want = checkpoint::ReadHfGpt2Config(kHfGpt2).value();
  EXPECT_EQ(gpt->model_kind, "gpt");
  EXPECT_EQ(gpt->gpt.vocab_size, want.vocab_size);
  EXPECT_EQ(gpt->gpt.vocab_size, 64);
  EXPECT_EQ(gpt->gpt.n_embd, 32);
  EXPECT_EQ(gpt->gpt.n_head, 4);
  EXPECT_EQ(gpt->gpt.block_size, 32);
  EXPECT_EQ(gpt->gpt.seed, job.gpt.seed);
  EXPECT_TRUE(gpt->train.deferred_init);
  EXPECT_FALSE(job.train.deferred_init);
  EXPECT_TRUE(CheckBeforeLaunch(job).ok()) << CheckBeforeLaunch(job);

  job.hf_dir = kHfLlama;
  absl::StatusOr<JobOptions> llama = ResolveHfDirs(job);
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_EQ(llama->model_kind, "llama");
  EXPECT_EQ(llama->llama.vocab_size, 96);
  EXPECT_EQ(llama->llama.hidden_size, 32);
  EXPECT_EQ(llama->llama.num_key_value_heads, 2);
  EXPECT_EQ(llama->llama.intermediate_size, 64);
  EXPECT_EQ(llama->llama.rope_theta, 500000.0);
  EXPECT_EQ(llama->llama.rms_norm_eps, 1e-5f);
  EXPECT_TRUE(llama->train.deferred_init);
  // The stages wrap the Llama's blocks.
  absl::StatusOr<StageOptions> options = StageOptionsFor(*llama, absl::Seconds(7));
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_THAT(options->wrap.policy->Name(), HasSubstr("LlamaDecoderLayer"));
  EXPECT_TRUE(CheckBeforeLaunch(job).ok()) << CheckBeforeLaunch(job);
  // Without an hf_dir, nothing changes.
  job = JobOptionsFromFlags();
  absl::StatusOr<JobOptions> plain = ResolveHfDirs(job);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->model_kind, "gpt");
  EXPECT_EQ(plain->gpt.n_embd, job.gpt.n_embd);
  EXPECT_FALSE(plain->train.deferred_init);
}

// A model flag set to another value than its default must agree with config.json: one that
// does not is refused naming the flag, the file and the field; one that agrees is fine.
TEST(JobOptionsTest, ASetModelFlagThatDisagreesWithConfigJsonIsRefusedNamingBoth) {
  struct Case {
    const char* dir;
    const char* flag;
    void (*set)(JobOptions&);
    const char* message;  // "" : accepted
  };
  const Case cases[] = {
      {kHfGpt2, "n_embd", [](JobOptions& j) { j.gpt.n_embd = 48; },
       "--n_embd=48 disagrees with checkpoint/testdata/hf_gpt2/config.json: n_embd is 32"},
      {kHfGpt2, "n_embd", [](JobOptions& j) { j.gpt.n_embd = 32; }, ""},
      {kHfGpt2, "block_size", [](JobOptions& j) { j.gpt.block_size = 64; },
       "--block_size=64 disagrees with checkpoint/testdata/hf_gpt2/config.json: n_positions is "
       "32"},
      {kHfGpt2, "model", [](JobOptions& j) { j.model_kind = "llama"; },
       "--model=llama disagrees with checkpoint/testdata/hf_gpt2/config.json: model_type is "
       "gpt2"},
      // The Llama's own flags mean nothing to a GPT-2, as with --model=gpt.
      {kHfGpt2, "rope_theta", [](JobOptions& j) { j.llama.rope_theta = 1.0; }, ""},
      {kHfLlama, "model", [](JobOptions& j) { j.model_kind = "gpt"; },
       "--model=gpt disagrees with checkpoint/testdata/hf_llama/config.json: model_type is "
       "llama"},
      {kHfLlama, "model", [](JobOptions& j) { j.model_kind = "llama"; }, ""},
      {kHfLlama, "n_kv_head", [](JobOptions& j) { j.llama.num_key_value_heads = 4; },
       "--n_kv_head=4 disagrees with checkpoint/testdata/hf_llama/config.json: "
       "num_key_value_heads is 2"},
      {kHfLlama, "rope_theta", [](JobOptions& j) { j.llama.rope_theta = 10000; },
       "--rope_theta=10000 disagrees with checkpoint/testdata/hf_llama/config.json: rope_theta "
       "is 500000"},
      {kHfLlama, "tie_word_embeddings", [](JobOptions& j) { j.llama.tie_word_embeddings = true; },
       "--tie_word_embeddings=true disagrees with checkpoint/testdata/hf_llama/config.json: "
       "tie_word_embeddings is false"},
      {kHfLlama, "rms_norm_eps", [](JobOptions& j) { j.llama.rms_norm_eps = 1e-5f; }, ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.dir) + " --" + c.flag);
    JobOptions job = JobOptionsFromFlags();
    job.hf_dir = c.dir;
    job.model_flags_set = {c.flag};
    c.set(job);
    const absl::Status s = ResolveHfDirs(job).status();
    if (*c.message == '\0') {
      EXPECT_TRUE(s.ok()) << s;
      continue;
    }
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Message(s), StartsWith(c.message));
    EXPECT_THAT(Message(s), HasSubstr("(--hf_dir: "));
    // The parent refuses it before starting any rank.
    EXPECT_THAT(Message(CheckBeforeLaunch(job)), HasSubstr(c.message));
  }
  // The same value, unset (at its default), is config.json's.
  JobOptions job = JobOptionsFromFlags();
  job.hf_dir = kHfGpt2;
  job.gpt.n_embd = 48;
  EXPECT_EQ(ResolveHfDirs(job).value().gpt.n_embd, 32);
}

TEST(JobOptionsTest, HfDirErrorsNameTheFlag) {
  JobOptions job = JobOptionsFromFlags();
  job.hf_dir = ::testing::TempDir() + "/no_such_model";
  absl::Status s = ResolveHfDirs(job).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(s), StartsWith("--hf_dir: "));
  EXPECT_THAT(Message(s), HasSubstr("no_such_model/config.json"));
  // --seq_len within config.json's context.
  job = JobOptionsFromFlags();
  job.hf_dir = kHfLlama;
  job.train.seq_len = 33;
  absl::StatusOr<JobOptions> resolved = ResolveHfDirs(job);
  ASSERT_TRUE(resolved.ok());
  EXPECT_EQ(Message(CheckModelFlags(*resolved)),
            "--seq_len = 33: must be in [1, 32], checkpoint/testdata/hf_llama/config.json's "
            "max_position_embeddings (--hf_dir)");
  // The export needs the release, and may not overwrite the starting checkpoint.
  job = JobOptionsFromFlags();
  job.export_hf_dir = "/out/tuned";
  job.release = false;
  EXPECT_EQ(Message(ResolveHfDirs(job).status()),
            "--export_hf_dir=/out/tuned needs --release: the export is of the released model");
  EXPECT_THAT(Message(CheckBeforeLaunch(job)), HasSubstr("needs --release"));
  job.release = true;
  EXPECT_TRUE(ResolveHfDirs(job).ok());
  job.hf_dir = kHfGpt2;
  job.export_hf_dir = std::string(kHfGpt2) + "/";
  s = ResolveHfDirs(job).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("is --hf_dir: the export would overwrite"));
}

// StageConfig.hf_dir and StageConfig.export_hf_dir replace the flags, as the file's other
// set fields do, and errors then name the field; the parent leaves the file to the ranks.
TEST(JobOptionsTest, StageConfigHfFieldsReplaceTheFlagsAndErrorsNameTheField) {
  JobOptions job = JobOptionsFromFlags();
  job.hf_dir = kHfGpt2;
  job.export_hf_dir = "/out/from_flag";
  job.stage_config = StageConfigFile(
      "hf.txtpb", absl::StrCat("hf_dir: \"", kHfLlama, "\"\nexport_hf_dir: \"/out/tuned\"\n"));
  absl::StatusOr<JobOptions> resolved = ResolveHfDirs(job);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->hf_dir, kHfLlama);
  EXPECT_EQ(resolved->hf_dir_name, "StageConfig.hf_dir");
  EXPECT_EQ(resolved->export_hf_dir, "/out/tuned");
  EXPECT_EQ(resolved->export_hf_dir_name, "StageConfig.export_hf_dir");
  EXPECT_EQ(resolved->model_kind, "llama");
  // The rest of the file still sets the stages' options.
  EXPECT_TRUE(StageOptionsFor(*resolved, absl::Seconds(7)).ok());
  // Unset fields keep the flags'.
  job.stage_config = StageConfigFile("steps.txtpb", "fit_steps: 3\n");
  resolved = ResolveHfDirs(job);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->hf_dir, kHfGpt2);
  EXPECT_EQ(resolved->hf_dir_name, "--hf_dir");
  EXPECT_EQ(resolved->export_hf_dir, "/out/from_flag");

  job.stage_config = StageConfigFile("bad_hf.txtpb", "hf_dir: \"/no/such/model\"\n");
  absl::Status s = ResolveHfDirs(job).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(s), StartsWith("StageConfig.hf_dir: "));
  EXPECT_TRUE(CheckBeforeLaunch(job).ok()) << "the ranks read --stage_config";
  job.stage_config = StageConfigFile("conflict.txtpb", absl::StrCat("hf_dir: \"", kHfGpt2, "\"\n"));
  job.model_flags_set = {"n_layer"};
  job.gpt.n_layer = 5;
  EXPECT_THAT(Message(ResolveHfDirs(job).status()),
              HasSubstr("--n_layer=5 disagrees with checkpoint/testdata/hf_gpt2/config.json: "
                        "n_layer is 2 (StageConfig.hf_dir: "));
  job = JobOptionsFromFlags();
  job.release = false;
  job.stage_config = StageConfigFile("export.txtpb", "export_hf_dir: \"/out/tuned\"\n");
  EXPECT_THAT(Message(ResolveHfDirs(job).status()),
              StartsWith("StageConfig.export_hf_dir=/out/tuned needs --release"));
}

}  // namespace
}  // namespace internal
}  // namespace integration
