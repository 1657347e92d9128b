#include "integration/stage_options.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "core/dtype.h"
#include "core/status_macros.h"
#include "core/text_file.h"
#include "core/timeout.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "policy/config.h"

namespace integration {
namespace {

// Keeps the first error protobuf's text parser reports (line and column 0-based there).
class FirstError : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (!has_error_) {
      has_error_ = true;
      text_ = absl::StrCat("line ", line + 1, ", column ", column + 1, ": ", message);
    }
  }
  bool has_error() const { return has_error_; }
  const std::string& text() const { return text_; }
  // True when the first error is the parser's recursion limit.
  bool too_deep() const { return text_.find("recursion limit") != std::string::npos; }

 private:
  bool has_error_ = false;
  std::string text_;
};

absl::StatusOr<core::DType> ParseFloatDType(const std::string& name, absl::string_view field) {
  if (name == "float32") return core::DType::kFloat32;
  if (name == "bfloat16") return core::DType::kBFloat16;
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": '", name, "' is not a dtype; use \"float32\" or \"bfloat16\""));
}

// The text-format StageConfig in `text`; syntax errors say "StageConfig: line L, column C".
absl::StatusOr<StageConfig> ParseStageConfig(absl::string_view text) {
  StageConfig config;
  FirstError errors;
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  // StageConfig.policy is one level down: allow the policy's full depth below it, and
  // no more (unbounded, a deeply nested config overflows the parser's stack).
  parser.SetRecursionLimit(policy::kPolicyParseRecursionLimit + 1);
  const bool ok = parser.ParseFromString(std::string(text), &config);
  if (!ok || errors.has_error()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "StageConfig: ", errors.has_error() ? errors.text() : "text format parse failed",
        errors.too_deep() ? policy::PolicyDepthHint() : ""));
  }
  return config;
}

}  // namespace

absl::StatusOr<fsdp::ShardingStrategy> ParseShardingStrategy(absl::string_view name) {
  for (fsdp::ShardingStrategy s :
       {fsdp::ShardingStrategy::kFullShard, fsdp::ShardingStrategy::kShardGradOp,
        fsdp::ShardingStrategy::kNoShard, fsdp::ShardingStrategy::kHybridShard}) {
    if (fsdp::ShardingStrategyName(s) == name) return s;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown sharding strategy '", name,
                   "'; use FULL_SHARD, SHARD_GRAD_OP, NO_SHARD or HYBRID_SHARD"));
}

absl::Status StageOptions::Validate(int world_size) const {
  if (world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("world size ", world_size, " must be >= 1"));
  }
  RETURN_IF_ERROR(wrap.Validate(world_size));
  if (fit_steps <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("StageOptions.fit_steps = ", fit_steps, ": must be > 0"));
  }
  if (max_steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("StageOptions.max_steps = ", max_steps, ": must be >= 0 (0: fit_steps)"));
  }
  const std::pair<const char*, int> batches[] = {{"train_batch_size", train_batch_size},
                                                 {"eval_batch_size", eval_batch_size}};
  for (const auto& [name, value] : batches) {
    if (value <= 0 || value % world_size != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "StageOptions.", name, " = ", value, ": must be a positive multiple of the world size ",
          world_size, " (every rank runs an equal share of each global batch)"));
    }
  }
  if (checkpoint_every_steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "StageOptions.checkpoint_every_steps = ", checkpoint_every_steps, ": must be >= 0"));
  }
  if (!(checkpoint_every_minutes >= 0) || !std::isfinite(checkpoint_every_minutes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("StageOptions.checkpoint_every_minutes = ", checkpoint_every_minutes,
                     ": must be finite and >= 0"));
  }
  if (keep_checkpoints < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("StageOptions.keep_checkpoints = ", keep_checkpoints, ": must be >= 0"));
  }
  if ((checkpoint_every_steps > 0 || checkpoint_every_minutes > 0 || keep_checkpoints > 0) &&
      checkpoint_dir.empty()) {
    return absl::InvalidArgumentError(
        "StageOptions.checkpoint_every_steps, checkpoint_every_minutes and keep_checkpoints "
        "need StageOptions.checkpoint_dir (where the step checkpoints go)");
  }
  if (eval_batches <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("StageOptions.eval_batches = ", eval_batches, ": must be > 0"));
  }
  if (log_every < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("StageOptions.log_every = ", log_every, ": must be >= 0"));
  }
  if (profile_step < -1) {
    return absl::InvalidArgumentError(absl::StrCat("StageOptions.profile_step = ", profile_step,
                                                   ": must be >= -1 (-1: no profile)"));
  }
  if (!(max_grad_norm >= 0) || !std::isfinite(max_grad_norm)) {
    return absl::InvalidArgumentError(
        absl::StrCat("StageOptions.max_grad_norm = ", max_grad_norm, ": must be finite and >= 0"));
  }
  if (grad_accumulation < 1 ||
      train_batch_size % (static_cast<int64_t>(grad_accumulation) * world_size) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "StageOptions.grad_accumulation = ", grad_accumulation, ": must be >= 1 and divide ",
        "StageOptions.train_batch_size = ", train_batch_size, " into micro-batches that are ",
        "multiples of the world size ", world_size));
  }
  // NOTE [Deterministic training].
  const int m = deterministic_micro_batches;
  if (wrap.deterministic != (m > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "StageOptions.deterministic_micro_batches = ", m, " with FullyShardOptions.deterministic ",
        wrap.deterministic ? "true" : "false", ": set both (a count > 0 and true) or neither"));
  }
  if (m > 0) {
    if ((m & (m - 1)) != 0 || m % world_size != 0 || train_batch_size % m != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "StageOptions.deterministic_micro_batches = ", m, ": must be a power of two that ",
          "the world size ", world_size, " divides and that divides StageOptions.",
          "train_batch_size = ", train_batch_size));
    }
    if (eval_batch_size % m != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("StageOptions.eval_batch_size = ", eval_batch_size,
                       ": with deterministic_micro_", "batches = ", m, " it must be a multiple of ",
                       m, " (validate and test run each ", "batch as its micro-batches too)"));
    }
    if (grad_accumulation != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "StageOptions.grad_accumulation = ", grad_accumulation, " with deterministic_micro_",
          "batches = ", m, ": the deterministic micro-batches replace it (leave it 1)"));
    }
    if (max_grad_norm > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "StageOptions.max_grad_norm = ", max_grad_norm, " with deterministic_micro_batches: ",
          "the global norm's sum would follow the sharding, which differs by world size"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StageOptions::Accumulation> ParseAccumulation(absl::string_view name) {
  if (name == "reduce_each") return StageOptions::Accumulation::kReduceEach;
  if (name == "no_sync") return StageOptions::Accumulation::kNoSync;
  return absl::InvalidArgumentError(
      absl::StrCat("accumulation \"", name, "\": use reduce_each or no_sync"));
}

absl::StatusOr<StageOptions> StageOptionsFromProto(const StageConfig& config,
                                                   const StageOptions& base) {
  StageOptions options = base;
  if (config.has_policy()) {
    absl::StatusOr<policy::ConfiguredPolicy> built = policy::BuildPolicy(config.policy());
    if (!built.ok()) return core::Annotate(built.status(), "StageConfig.policy");
    options.wrap.policy = built->policy;
    options.wrap.ignored_paths = built->ignored_paths;
  }
  if (config.has_checkpoint_policy()) {
    if (config.checkpoint_policy().ignored_modules_size() > 0) {
      return absl::InvalidArgumentError(
          "StageConfig.checkpoint_policy: ignored_modules belongs in StageConfig.policy (a "
          "checkpoint policy only picks modules to recompute)");
    }
    absl::StatusOr<policy::ConfiguredPolicy> built =
        policy::BuildPolicy(config.checkpoint_policy());
    if (!built.ok()) return core::Annotate(built.status(), "StageConfig.checkpoint_policy");
    options.wrap.checkpoint_policy = built->policy;
  }
  if (config.has_strategy()) {
    absl::StatusOr<fsdp::ShardingStrategy> s = ParseShardingStrategy(config.strategy());
    if (!s.ok()) return core::Annotate(s.status(), "StageConfig.strategy");
    options.wrap.strategy = *s;
  }
  if (config.has_hybrid_shard_size()) options.wrap.hybrid_shard_size = config.hybrid_shard_size();
  if (config.has_cpu_offload()) options.wrap.cpu_offload = config.cpu_offload();
  if (config.mixed_precision().has_param_dtype()) {
    ASSIGN_OR_RETURN(options.wrap.mixed_precision.param_dtype,
                     ParseFloatDType(config.mixed_precision().param_dtype(),
                                     "StageConfig.mixed_precision.param_dtype"));
  }
  if (config.mixed_precision().has_reduce_dtype()) {
    ASSIGN_OR_RETURN(options.wrap.mixed_precision.reduce_dtype,
                     ParseFloatDType(config.mixed_precision().reduce_dtype(),
                                     "StageConfig.mixed_precision.reduce_dtype"));
  }
  if (config.has_fit_steps()) options.fit_steps = config.fit_steps();
  if (config.has_max_steps()) options.max_steps = config.max_steps();
  if (config.has_train_batch_size()) options.train_batch_size = config.train_batch_size();
  if (config.has_eval_batch_size()) options.eval_batch_size = config.eval_batch_size();
  if (config.has_eval_batches()) options.eval_batches = config.eval_batches();
  if (config.has_log_every()) options.log_every = config.log_every();
  if (config.has_checkpoint_dir()) options.checkpoint_dir = config.checkpoint_dir();
  if (config.has_checkpoint_every_steps()) {
    options.checkpoint_every_steps = config.checkpoint_every_steps();
  }
  if (config.has_checkpoint_every_minutes()) {
    options.checkpoint_every_minutes = config.checkpoint_every_minutes();
  }
  if (config.has_keep_checkpoints()) options.keep_checkpoints = config.keep_checkpoints();
  if (config.has_async_checkpoints()) options.async_checkpoints = config.async_checkpoints();
  if (config.has_release_after_fit()) options.release_after_fit = config.release_after_fit();
  if (config.has_max_grad_norm()) options.max_grad_norm = config.max_grad_norm();
  if (config.has_profile_step()) options.profile_step = config.profile_step();
  if (config.has_grad_accumulation()) options.grad_accumulation = config.grad_accumulation();
  if (config.has_deterministic_micro_batches()) {
    options.deterministic_micro_batches = config.deterministic_micro_batches();
    options.wrap.deterministic = options.deterministic_micro_batches > 0;
  }
  if (config.has_accumulation()) {
    absl::StatusOr<StageOptions::Accumulation> a = ParseAccumulation(config.accumulation());
    if (!a.ok())
      return absl::InvalidArgumentError(absl::StrCat("StageConfig.", a.status().message()));
    options.accumulation = *a;
  }
  if (config.has_collective_timeout_s()) {
    ASSIGN_OR_RETURN(options.wrap.timeout,
                     core::TimeoutFromSeconds(config.collective_timeout_s(),
                                              "StageConfig.collective_timeout_s"));
  }
  return options;
}

absl::StatusOr<StageOptions> ParseStageOptions(absl::string_view text, const StageOptions& base) {
  ASSIGN_OR_RETURN(const StageConfig config, ParseStageConfig(text));
  return StageOptionsFromProto(config, base);
}

absl::StatusOr<StageConfig> ReadStageConfigFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string contents, core::ReadTextFile(path, "stage config"));
  absl::StatusOr<StageConfig> config = ParseStageConfig(contents);
  if (!config.ok()) return core::Annotate(config.status(), path);
  return config;
}

absl::StatusOr<StageOptions> ReadStageOptionsFile(const std::string& path,
                                                  const StageOptions& base) {
  ASSIGN_OR_RETURN(const StageConfig config, ReadStageConfigFile(path));
  absl::StatusOr<StageOptions> options = StageOptionsFromProto(config, base);
  if (!options.ok()) return core::Annotate(options.status(), path);
  return options;
}

}  // namespace integration
