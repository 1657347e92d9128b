// StageOptions: what integration::StageRunner's stages do (wrapping, steps, batch sizes,
// logging, checkpointing), as a struct or parsed from a text-format StageConfig
// (integration/stage.proto).
//
//   ASSIGN_OR_RETURN(integration::StageOptions options, integration::ParseStageOptions(R"pb(
//     policy { name: "module_types" param { key: "types" value: "TransformerBlock" } }
//     strategy: "SHARD_GRAD_OP"
//     fit_steps: 200
//   )pb"));
//   RETURN_IF_ERROR(options.Validate(group->size()));
#ifndef INTEGRATION_STAGE_OPTIONS_H_
#define INTEGRATION_STAGE_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "fsdp/options.h"
#include "integration/stage.pb.h"

namespace integration {

struct StageOptions {
  // How every stage wraps the model (policy, strategy, mixed precision, prefetch,
  // collective timeout). All stages use these same options, so a stage after another
  // gets the registry's existing units back.
  fsdp::FullyShardOptions wrap;
  // Optimizer steps of one Fit (> 0).
  int64_t fit_steps = 100;
  // NOTE [Training to a global step]: when > 0, Fit trains from the model's global step up to
  // this one (Lightning's max_steps) instead of fit_steps steps: a run resumed from a
  // checkpoint at step s takes max_steps - s steps, so a run restarted after a failure ends at
  // the same step, with the same bits, as the run that never failed; none when the model is
  // there already. A step count passed to Fit itself wins over both.
  int64_t max_steps = 0;
  // Rows of every global batch (> 0, multiples of the world size): each rank runs its
  // data::RankSampler share.
  int train_batch_size = 16;
  int eval_batch_size = 16;
  // Batches of one Validate, Test or Predict (> 0); Validate and Test of a module that
  // evaluates its whole held-out set run as many as that takes instead
  // (TrainModule::EvaluationBatches).
  int eval_batches = 8;
  // A progress line on rank 0 every this many fit steps, and after the last (>= 0; 0:
  // only after the last). Step losses are averaged over ranks at these reports (one
  // all-gather for all steps since the previous one), so a loss that is not finite is
  // reported, naming its step, at the next report.
  int64_t log_every = 25;
  // When non-empty, Fit ends by saving a checkpoint (model and optimizer) here, or, with
  // periodic checkpoints, saves its step checkpoints under it.
  std::string checkpoint_dir;
  // NOTE [Periodic checkpoints]: with checkpoint_dir set and checkpoint_every_steps = k > 0
  // and/or checkpoint_every_minutes = t > 0, Fit saves checkpoints during the fit, each to
  // <checkpoint_dir>/step-<global step> (checkpoint/series.h): after every global step that
  // is a multiple of k; after a step with a progress report (log_every) when t minutes have
  // passed since the fit began or its last save (rank 0's clock, agreed in the report's
  // all-gather, so every rank saves at the same step); and after its last step unless that
  // one was just saved. After each save, with keep_checkpoints = K > 0, rank 0 deletes all but
  // the newest K step checkpoints: older ones only once a newer one is committed (0 keeps
  // every one). checkpoint::FindLatestCheckpoint(checkpoint_dir) finds where to resume.
  // Without k or t, Fit saves once, at its end, to checkpoint_dir itself.
  int64_t checkpoint_every_steps = 0;
  double checkpoint_every_minutes = 0;
  int keep_checkpoints = 0;
  // NOTE [Asynchronous save] (checkpoint/sharded.h): periodic checkpoints are snapshotted at
  // their step and written on a background thread while training goes on. A save is
  // committed (and older ones pruned) at the first progress report after every rank's write
  // has ended, when the next save is due (at most one in flight: it waits for the previous),
  // or when Fit ends; a write that failed in the background fails Fit there, on every rank,
  // naming the rank, with the previous checkpoint intact.
  bool async_checkpoints = false;
  // Test hook: when set, called with the global step of every periodic checkpoint Fit
  // begins; a non-OK result is this rank's write error for that save
  // (checkpoint::SaveOptions::simulate_write_error: a disk that fills during the save).
  std::function<absl::Status(int64_t step)> testonly_write_error;
  // Fit ends by releasing the model: a plain module with its trained full weights.
  bool release_after_fit = false;
  // When > 0, the global gradient norm is clipped to this before each step.
  double max_grad_norm = 0;
  // When in [0, steps of a Fit), Fit records that step of the Fit (0-based: the
  // TrainingStep, the gradient clipping and the optimizer step) into
  // FitResult::profiled_ops (core/op_profile.h: each op's category, FLOPs, bytes and, on
  // CUDA, device time). -1: no profile (>= -1).
  int64_t profile_step = -1;
  // NOTE [Gradient accumulation]: each optimizer step runs the module's TrainingStep on
  // grad_accumulation micro-batches (>= 1; StepContext::micro_batch), each
  // train_batch_size / grad_accumulation rows of the global batch (a multiple of the world
  // size), and steps on the mean of their gradients: the step one batch of
  // train_batch_size rows gives, up to rounding. The module must support it
  // (TrainModule::SupportsMicroBatches). With kReduceEach every micro-batch's gradient is
  // reduce-scattered into the shards as it is made, so a rank holds gradient shards
  // only; with kNoSync (fsdp::NoSync, PyTorch's no_sync) each unit keeps its full local
  // gradient until the last micro-batch, which reduces the sum once: fewer collectives, a
  // full gradient per unit in memory.
  int grad_accumulation = 1;
  enum class Accumulation { kReduceEach, kNoSync };
  Accumulation accumulation = Accumulation::kReduceEach;
  // NOTE [Deterministic training]: when > 0 (a power of two M, with wrap.deterministic
  // set too), every global batch is cut into M micro-batches of train_batch_size / M
  // rows at every world size; rank r of N (N a power of two dividing M) runs micro-batches
  // [r M / N, (r + 1) M / N), the first ones under no_sync, each unit sums them and the
  // ranks in one binary tree (fsdp NOTE [Deterministic reduction]), and Fit scales the sum
  // by 1 / M and adds the step's M micro-batch losses in micro-batch order. So N ranks
  // give, bit for bit, the losses and parameters of one rank (same intra-op thread
  // count), and a run resumed at another world size those of the uninterrupted one.
  // Replaces grad_accumulation (which must stay 1); max_grad_norm must be 0 (the global
  // norm's sum would follow the sharding). Validate and Test run each batch as its M
  // micro-batches the same way (eval_batch_size must be a multiple of M) and add their
  // losses in micro-batch order, so their loss is the same bits at every world size too.
  int deterministic_micro_batches = 0;

  // OK when usable on `world_size` ranks; InvalidArgument naming the option
  // ("StageOptions.train_batch_size", "FullyShardOptions.hybrid_shard_size", ...).
  absl::Status Validate(int world_size) const;
};

// Options from a StageConfig: set fields replace those of `base` (by default the
// defaults above). The policy is built
// from the policy registry (policy/config.h). InvalidArgument naming the field
// ("StageConfig.strategy", ...) for a bad value, including a collective_timeout_s
// outside core::TimeoutFromSeconds's range (1 ms to 7 days; NOTE [Timeout range] in
// core/timeout.h); NotFound for an unknown policy name.
absl::StatusOr<StageOptions> StageOptionsFromProto(const StageConfig& config,
                                                   const StageOptions& base = StageOptions());

// The same from text format; syntax errors say "StageConfig: line L, column C" (nesting
// deeper than policy::kMaxPolicyDepth included). Never crashes, whatever the bytes.
absl::StatusOr<StageOptions> ParseStageOptions(absl::string_view text,
                                               const StageOptions& base = StageOptions());

// ParseStageOptions of a file's contents; errors name the file: NotFound when it does
// not exist, InvalidArgument when it is a directory, unreadable or not text
// (core/text_file.h) — never silently the defaults.
absl::StatusOr<StageOptions> ReadStageOptionsFile(const std::string& path,
                                                  const StageOptions& base = StageOptions());

// The StageConfig of a text-format file, for the fields StageOptions does not hold (the
// main job's hf_dir and export_hf_dir). The errors of ReadStageOptionsFile's reading and
// parsing, naming the file.
absl::StatusOr<StageConfig> ReadStageConfigFile(const std::string& path);

// "reduce_each" -> kReduceEach, "no_sync" -> kNoSync; InvalidArgument otherwise.
absl::StatusOr<StageOptions::Accumulation> ParseAccumulation(absl::string_view name);

// "FULL_SHARD" -> kFullShard, ... (ShardingStrategyName's inverse); InvalidArgument
// listing the names otherwise.
absl::StatusOr<fsdp::ShardingStrategy> ParseShardingStrategy(absl::string_view name);

}  // namespace integration

#endif  // INTEGRATION_STAGE_OPTIONS_H_
