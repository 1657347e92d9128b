#include "integration/stage_options.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policy/config.h"

namespace integration {
namespace {

using ::testing::HasSubstr;

TEST(StageOptionsTest, EmptyConfigKeepsTheStructDefaults) {
  absl::StatusOr<StageOptions> parsed = ParseStageOptions("");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const StageOptions defaults;
  EXPECT_EQ(parsed->fit_steps, defaults.fit_steps);
  EXPECT_EQ(parsed->train_batch_size, defaults.train_batch_size);
  EXPECT_EQ(parsed->eval_batch_size, defaults.eval_batch_size);
  EXPECT_EQ(parsed->eval_batches, defaults.eval_batches);
  EXPECT_EQ(parsed->log_every, defaults.log_every);
  EXPECT_EQ(parsed->checkpoint_dir, defaults.checkpoint_dir);
  EXPECT_EQ(parsed->release_after_fit, defaults.release_after_fit);
  EXPECT_EQ(fsdp::FirstDifferingOption(parsed->wrap, defaults.wrap), "");
}

TEST(StageOptionsTest, EveryFieldIsRead) {
  absl::StatusOr<StageOptions> parsed = ParseStageOptions(R"pb(
    policy {
      name: "module_types"
      param { key: "types" value: "TransformerBlock" }
      ignored_modules: "wpe"
    }
    strategy: "HYBRID_SHARD"
    hybrid_shard_size: 2
    mixed_precision { param_dtype: "bfloat16" reduce_dtype: "bfloat16" }
    fit_steps: 7
    train_batch_size: 8
    eval_batch_size: 4
    eval_batches: 3
    log_every: 0
    checkpoint_dir: "/tmp/x"
    checkpoint_every_steps: 50
    checkpoint_every_minutes: 2.5
    keep_checkpoints: 3
    async_checkpoints: true
    release_after_fit: true
    collective_timeout_s: 12.5
    max_grad_norm: 1.5
    profile_step: 5
    grad_accumulation: 2
    accumulation: "no_sync"
    checkpoint_policy {
      name: "every_kth"
      param { key: "types" value: "TransformerBlock" }
      param { key: "k" value: "2" }
    }
    cpu_offload: true
  )pb");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_NE(parsed->wrap.checkpoint_policy, nullptr);
  EXPECT_EQ(parsed->wrap.checkpoint_policy->Name(), "every_kth(TransformerBlock; k=2)");
  EXPECT_EQ(parsed->wrap.strategy, fsdp::ShardingStrategy::kHybridShard);
  EXPECT_EQ(parsed->wrap.hybrid_shard_size, 2);
  EXPECT_TRUE(parsed->wrap.cpu_offload);
  EXPECT_EQ(parsed->wrap.mixed_precision.param_dtype, core::DType::kBFloat16);
  EXPECT_EQ(parsed->wrap.mixed_precision.reduce_dtype, core::DType::kBFloat16);
  ASSERT_NE(parsed->wrap.policy, nullptr);
  EXPECT_THAT(parsed->wrap.policy->Name(), HasSubstr("TransformerBlock"));
  EXPECT_EQ(parsed->wrap.ignored_paths, std::vector<std::string>{"wpe"});
  EXPECT_EQ(parsed->fit_steps, 7);
  EXPECT_EQ(parsed->train_batch_size, 8);
  EXPECT_EQ(parsed->eval_batch_size, 4);
  EXPECT_EQ(parsed->eval_batches, 3);
  EXPECT_EQ(parsed->log_every, 0);
  EXPECT_EQ(parsed->checkpoint_dir, "/tmp/x");
  EXPECT_EQ(parsed->checkpoint_every_steps, 50);
  EXPECT_EQ(parsed->checkpoint_every_minutes, 2.5);
  EXPECT_EQ(parsed->keep_checkpoints, 3);
  EXPECT_TRUE(parsed->async_checkpoints);
  EXPECT_TRUE(parsed->release_after_fit);
  EXPECT_EQ(parsed->wrap.timeout, absl::Milliseconds(12500));
  EXPECT_EQ(parsed->max_grad_norm, 1.5);
  EXPECT_EQ(parsed->profile_step, 5);
  EXPECT_EQ(parsed->grad_accumulation, 2);
  EXPECT_EQ(parsed->accumulation, StageOptions::Accumulation::kNoSync);
  EXPECT_TRUE(parsed->Validate(4).ok());
}

TEST(StageOptionsTest, UnsetFieldsKeepTheGivenBase) {
  StageOptions base;
  base.fit_steps = 11;
  base.checkpoint_dir = "/base";
  absl::StatusOr<StageOptions> parsed = ParseStageOptions("checkpoint_dir: \"/x\"", base);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->fit_steps, 11);
  EXPECT_EQ(parsed->checkpoint_dir, "/x");
}

TEST(StageOptionsTest, SyntaxErrorsGiveLineAndColumn) {
  absl::StatusOr<StageOptions> parsed = ParseStageOptions("fit_steps: 3\nfit_stepz: 4\n");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(parsed.status().message(), HasSubstr("StageConfig: line 2"));
  EXPECT_THAT(parsed.status().message(), HasSubstr("fit_stepz"));
}

TEST(StageOptionsTest, BadValuesNameTheField) {
  struct Case {
    const char* text;
    absl::StatusCode code;
    const char* field;
  };
  const Case cases[] = {
      {"strategy: \"ZERO3\"", absl::StatusCode::kInvalidArgument, "StageConfig.strategy"},
      {"mixed_precision { param_dtype: \"fp16\" }", absl::StatusCode::kInvalidArgument,
       "StageConfig.mixed_precision.param_dtype"},
      {"collective_timeout_s: -1", absl::StatusCode::kInvalidArgument,
       "StageConfig.collective_timeout_s"},
      {"policy { name: \"no_such_policy\" }", absl::StatusCode::kNotFound, "StageConfig.policy"},
      {"accumulation: \"sometimes\"", absl::StatusCode::kInvalidArgument,
       "StageConfig.accumulation"},
      {"checkpoint_policy { name: \"every_kth\" param { key: \"types\" value: \"B\" } "
       "param { key: \"k\" value: \"0\" } }",
       absl::StatusCode::kInvalidArgument, "StageConfig.checkpoint_policy"},
      {"checkpoint_policy { name: \"never\" ignored_modules: \"wpe\" }",
       absl::StatusCode::kInvalidArgument, "StageConfig.checkpoint_policy: ignored_modules"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<StageOptions> parsed = ParseStageOptions(c.text);
    ASSERT_FALSE(parsed.ok()) << c.text;
    EXPECT_EQ(parsed.status().code(), c.code) << parsed.status();
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.field)) << parsed.status();
  }
}

TEST(StageOptionsTest, ValidateNamesTheOption) {
  StageOptions options;
  options.train_batch_size = 6;
  absl::Status s = options.Validate(4);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("StageOptions.train_batch_size = 6"));
  EXPECT_THAT(s.message(), HasSubstr("world size 4"));

  options = StageOptions();
  options.fit_steps = 0;
  EXPECT_THAT(options.Validate(1).message(), HasSubstr("StageOptions.fit_steps"));
  options = StageOptions();
  options.eval_batches = 0;
  EXPECT_THAT(options.Validate(1).message(), HasSubstr("StageOptions.eval_batches"));
  options = StageOptions();
  options.wrap.strategy = fsdp::ShardingStrategy::kHybridShard;
  options.wrap.hybrid_shard_size = 3;
  EXPECT_THAT(options.Validate(4).message(), HasSubstr("hybrid_shard_size"));
}

// NOTE [Deterministic training]: the micro-batch count and the wrap option together, a
// power of two that the world size divides and that divides the batch; no
// grad_accumulation or gradient clipping beside it.
TEST(StageOptionsTest, DeterministicMicroBatchesAreCheckedNamingTheOption) {
  absl::StatusOr<StageOptions> parsed = ParseStageOptions("deterministic_micro_batches: 8");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->deterministic_micro_batches, 8);
  EXPECT_TRUE(parsed->wrap.deterministic);
  EXPECT_TRUE(parsed->Validate(4).ok());
  EXPECT_THAT(parsed->Validate(16).message(), HasSubstr("must be a power of two that"));
  StageOptions options = *parsed;
  options.deterministic_micro_batches = 6;
  EXPECT_THAT(options.Validate(2).message(), HasSubstr("deterministic_micro_batches = 6"));
  options = *parsed;
  options.wrap.deterministic = false;
  EXPECT_THAT(options.Validate(2).message(), HasSubstr("set both"));
  options = *parsed;
  options.grad_accumulation = 2;
  EXPECT_THAT(options.Validate(2).message(), HasSubstr("StageOptions.grad_accumulation = 2"));
  options = *parsed;
  options.max_grad_norm = 1;
  EXPECT_THAT(options.Validate(2).message(), HasSubstr("StageOptions.max_grad_norm"));
}

TEST(StageOptionsTest, ReadsAFileAndNamesItInErrors) {
  const std::string path = ::testing::TempDir() + "/stage_config.txtpb";
  {
    std::ofstream out(path);
    out << "fit_steps: 42\nlog_every: \"x\"\n";
  }
  absl::StatusOr<StageOptions> bad = ReadStageOptionsFile(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr(path));
  {
    std::ofstream out(path);
    out << "fit_steps: 42\n";
  }
  absl::StatusOr<StageOptions> good = ReadStageOptionsFile(path);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->fit_steps, 42);
  EXPECT_EQ(ReadStageOptionsFile(path + ".missing").status().code(), absl::StatusCode::kNotFound);
}

// The main job's fields (hf_dir, export_hf_dir) are read as a StageConfig and leave the
// StageOptions alone; a syntax error still names the file.
TEST(StageOptionsTest, ReadsTheMainJobsFieldsAsAConfig) {
  const std::string path = ::testing::TempDir() + "/stage_config_hf.txtpb";
  std::ofstream(path) << "hf_dir: \"/models/gpt2\"\nexport_hf_dir: \"/out/tuned\"\nfit_steps: 7\n";
  absl::StatusOr<StageConfig> config = ReadStageConfigFile(path);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->hf_dir(), "/models/gpt2");
  EXPECT_EQ(config->export_hf_dir(), "/out/tuned");
  EXPECT_FALSE(StageConfig().has_hf_dir());
  absl::StatusOr<StageOptions> options = ReadStageOptionsFile(path);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->fit_steps, 7);
  EXPECT_EQ(options->checkpoint_dir, "");
  std::ofstream(path) << "hf_dir: /models\n";
  const absl::Status bad = ReadStageConfigFile(path).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.message()), HasSubstr(path + ": StageConfig: line 1"));
  EXPECT_EQ(ReadStageConfigFile(path + ".missing").status().code(), absl::StatusCode::kNotFound);
}

TEST(StageOptionsTest, DeeplyNestedPolicyIsASyntaxErrorNotACrash) {
  std::string text = "fit_steps: 3\npolicy { ";
  for (int i = 0; i < 10000; ++i) text += "negate { ";
  text += "name: \"always\"";
  for (int i = 0; i < 10000; ++i) text += " }";
  text += " }\n";
  absl::StatusOr<StageOptions> parsed = ParseStageOptions(text);
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(parsed.status().message(), HasSubstr("StageConfig: line 2, column "));
  EXPECT_THAT(parsed.status().message(), HasSubstr("nest at most 64 levels"));
}

TEST(StageOptionsTest, PolicyNestedUpToTheLimitIsAccepted) {
  std::string text = "policy { ";
  for (int i = 0; i < policy::kMaxPolicyDepth; ++i) text += "negate { ";
  text += "name: \"module_types\" param { key: \"types\" value: \"TransformerBlock\" }";
  for (int i = 0; i < policy::kMaxPolicyDepth; ++i) text += " }";
  text += " }";
  absl::StatusOr<StageOptions> parsed = ParseStageOptions(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_NE(parsed->wrap.policy, nullptr);
}

TEST(StageOptionsTest, TimeoutsOutsideTheRangeAreRejectedWithTheRange) {
  // inf and 1e10 used to overflow into an immediate timeout; nan, 0 and negatives
  // have no meaning. There is no "no timeout".
  for (const char* value : {"inf", "-inf", "nan", "0", "-3", "1e10", "604801", "1e-9"}) {
    absl::StatusOr<StageOptions> parsed =
        ParseStageOptions(absl::StrCat("collective_timeout_s: ", value));
    ASSERT_FALSE(parsed.ok()) << value;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << value;
    EXPECT_THAT(parsed.status().message(), HasSubstr("StageConfig.collective_timeout_s = "));
    EXPECT_THAT(parsed.status().message(), HasSubstr("[0.001, 604800]"));
  }
  absl::StatusOr<StageOptions> week = ParseStageOptions("collective_timeout_s: 604800");
  ASSERT_TRUE(week.ok()) << week.status();
  EXPECT_EQ(week->wrap.timeout, absl::Hours(24 * 7));
}

TEST(StageOptionsTest, DirectoryOrBinaryStageConfigIsInvalidArgumentNamingThePath) {
  // A directory used to read as an empty config: every default, exit status 0.
  const std::string dir = ::testing::TempDir();
  absl::StatusOr<StageOptions> parsed = ReadStageOptionsFile(dir);
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(parsed.status().message(), HasSubstr("stage config file '" + dir + "'"));
  EXPECT_THAT(parsed.status().message(), HasSubstr("is a directory"));

  const std::string binary = dir + "/stage_config.bin";
  {
    std::ofstream out(binary, std::ios::binary);
    out << std::string("\x28\x07\x00\x01\xfe", 5);
  }
  parsed = ReadStageOptionsFile(binary);
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(parsed.status().message(), HasSubstr(binary));
  EXPECT_THAT(parsed.status().message(), HasSubstr("not a text file"));
}

}  // namespace
}  // namespace integration
