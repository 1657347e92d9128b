// TrainModule: what a user hands integration::StageRunner: the model, how to run one
// training step and one evaluation step on this rank's share of a batch, and which
// optimizer to build. The runner does everything distributed around it (wrapping,
// gradient reduction through FSDP, optimizer steps, loss averaging over ranks,
// checkpoints), so a TrainModule is written as for one process.
//
//   class MyModule : public integration::TrainModule {
//    public:
//     std::shared_ptr<core::Module> model() override { return net_; }
//     absl::StatusOr<integration::StepOutput> TrainingStep(
//         const integration::StepContext& ctx) override {
//       ASSIGN_OR_RETURN(Batch local, MyRows(ctx.step, ctx.batch_size, ctx.rank, ctx.world_size));
//       ASSIGN_OR_RETURN(core::Tensor loss,
//                        nn::functional::Mse(net_->CallOne({local.x}), local.y));
//       RETURN_IF_ERROR(core::Backward(loss));
//       return integration::StepOutput{loss.ToVector()[0], local.rows};
//     }
//     ... EvaluationStep (forward only), ConfigureOptimizer ...
//   };
#ifndef INTEGRATION_TRAIN_MODULE_H_
#define INTEGRATION_TRAIN_MODULE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/module.h"
#include "core/tensor.h"
#include "optim/optimizer.h"

namespace integration {

enum class Stage { kFit, kValidate, kTest, kPredict };

// "fit", "validate", "test", "predict".
std::string StageName(Stage stage);

// Which batch a step is about, and which share of it this rank runs.
struct StepContext {
  Stage stage = Stage::kFit;
  // Fit: the global training step, 0-based, which continues across Fit calls and
  // checkpoints (use it as the training batch's index so resumed training sees the
  // batches uninterrupted training would). Other stages: the batch's index within the
  // stage, 0 .. StageOptions::eval_batches - 1, or in Validate and Test of a module that
  // evaluates a whole set, 0 .. TrainModule::EvaluationBatches - 1.
  int64_t step = 0;
  int rank = 0;
  int world_size = 1;
  // Rows of the global batch (a multiple of world_size); this rank runs the rows
  // data::RankSampler(rank, world_size) gives it.
  int batch_size = 0;
  // Fit with StageOptions::grad_accumulation = k > 1 (NOTE [Gradient accumulation] in
  // integration/stage_options.h): TrainingStep runs k times per step, for micro-batch
  // 0 .. k-1: the rows data::RankSampler(micro_batch, micro_batches) gives of the global
  // batch, of which this rank runs its RankSampler(rank, world_size) share. 0 and 1
  // otherwise. NOTE [Deterministic training] (StageOptions::deterministic_micro_batches
  // = M): in Fit, Validate and Test a rank runs whole micro-batches of the global batch, so
  // the runner passes the global micro-batch's index in [0, M), M, and rank 0 of
  // world_size 1 (the share that is all of it).
  int micro_batch = 0;
  int micro_batches = 1;
};

// What a training or evaluation step reports.
struct StepOutput {
  // The mean loss over this rank's share of the batch.
  double loss = 0;
  // How many items (tokens, samples) that mean is over: its weight in the mean over
  // ranks, and what throughput is counted in. > 0 in training; >= 0 in evaluation, where a
  // share of padding rows only (NOTE [Whole-set evaluation]) reports 0 (and its loss is
  // then ignored).
  int64_t count = 0;
  // A training step may leave its loss on the device (NOTE [Deferred loss] in
  // nn/losses.h: nn::functional::CrossEntropyOptions::read_loss): then `loss` is ignored and the
  // runner calls this when it reports (a log step, the fit's last step), so the step itself needs
  // no host synchronisation.
  std::function<absl::StatusOr<double>()> read_loss;

  // The loss: read_loss() when the step deferred it, else `loss`.
  absl::StatusOr<double> ReadLoss() const { return read_loss ? read_loss() : loss; }
};

// The rows [begin, end) of the global batch (ctx.batch_size rows) that this step runs: the
// micro-batch's contiguous block (ctx.micro_batch of ctx.micro_batches), then this rank's
// data::RankSampler share of it. A step that makes its own batches makes exactly these rows
// (and, for NOTE [Dropout offset] in nn/functional/dropout.h, starts its dropout offsets at
// row `begin`: the same mask at every world size). InvalidArgument naming the sizes when
// the batch does not divide into micro-batches and ranks.
absl::StatusOr<std::pair<int64_t, int64_t>> StepRows(const StepContext& ctx);

// NOTE [Mean over real tokens]: a step whose rows hold different numbers of items (padded
// sequences: only the real tokens count) must not take the mean over its own items alone,
// or the ranks' averaged gradients weigh a rank with few items as much as one with many,
// and the result depends on the world size. The global batch's mean is
//   sum over all items / global = (1 / shares) sum over shares of (local mean) s,
//   s = local * shares / global,   shares = ctx.world_size * ctx.micro_batches
// (FSDP averages over the ranks and the runner over micro-batches: 1 / shares in all). A step
// multiplies its local mean loss by ShareOfMean(ctx, local, global) before core::Backward
// (F::MulScalar) and reports the unscaled local mean with count `local` (the runner's
// count-weighted average of the ranks' losses is then the global mean). In the deterministic
// mode (world_size 1, micro_batches M at every world size) s does not depend on the world
// size, so the bits do not either. InvalidArgument unless 0 <= local <= global and global > 0.
absl::StatusOr<double> ShareOfMean(const StepContext& ctx, int64_t local, int64_t global);

class TrainModule {
 public:
  virtual ~TrainModule() = default;

  // The model every stage wraps: the same object on every call.
  virtual std::shared_ptr<core::Module> model() = 0;

  // Forward and backward of this rank's share of training batch ctx.step. Gradients
  // accumulate into the parameters; the runner zeroes them before, FSDP reduces them
  // during backward, and the runner steps the optimizer after. The loss must be the mean
  // over this rank's rows, so that FSDP's averaged reduction gives the gradient of the
  // global batch's mean.
  virtual absl::StatusOr<StepOutput> TrainingStep(const StepContext& ctx) = 0;

  // Whether TrainingStep runs only micro-batch ctx.micro_batch of ctx.micro_batches (as
  // StepContext says), which StageOptions::grad_accumulation > 1 needs. False unless a
  // module says so: Fit refuses to accumulate over a module that would run its whole
  // batch every time.
  virtual bool SupportsMicroBatches() const { return false; }

  // Forward only (no backward, no gradients) of batch ctx.step of ctx.stage
  // (kValidate or kTest: use different held-out data for the two).
  virtual absl::StatusOr<StepOutput> EvaluationStep(const StepContext& ctx) = 0;

  // NOTE [Whole-set evaluation]: how many batches of `batch_size` rows Validate and Test
  // run (kValidate or kTest) so that every item of the held-out set is evaluated exactly
  // once: batch b holds items [b batch_size, (b + 1) batch_size), the last batch padded
  // with rows that count 0 (their loss left out of the mean). Every rank runs every batch,
  // also where its rows are all padding (reporting count 0, loss 0), so the collectives of
  // the forward stay matched; the runner all-gathers the counts first and fails every rank
  // when they differ. StageOptions::eval_batches does not limit it. The loss is then the
  // mean over all the set's items: in the deterministic mode (NOTE [Deterministic
  // training]) the same bits at every world size. nullopt (the default): the stage runs
  // StageOptions::eval_batches batches, as for a module without a finite held-out set.
  virtual std::optional<int64_t> EvaluationBatches(Stage stage, int batch_size) const {
    (void)stage;
    (void)batch_size;
    return std::nullopt;
  }

  // Forward only: this rank's predictions for batch ctx.step of kPredict. The default
  // returns Unimplemented.
  virtual absl::StatusOr<core::Tensor> PredictStep(const StepContext& ctx);

  // The optimizer Fit steps, over `params` (model()->NamedParameters() after wrapping,
  // so each parameter's data is this rank's shard). Called once per model: later Fits
  // and checkpoint loads keep using (and restoring) the same optimizer.
  virtual absl::StatusOr<std::unique_ptr<optim::Optimizer>> ConfigureOptimizer(
      std::vector<core::NamedParameter> params) = 0;

  // What StepOutput::count counts, plural, for progress lines ("samples/s",
  // "tokens/s"). The default is "samples".
  virtual std::string CountUnit() const { return "samples"; }

  // The learning rate of global step `step`, set on the optimizer before that step;
  // nullopt (the default) leaves the optimizer's rate alone.
  virtual std::optional<double> LearningRate(int64_t step) {
    (void)step;
    return std::nullopt;
  }

  // NOTE [Data identity]: what the training data stream is, as "key" -> "value" text. The
  // runner stores it in every checkpoint (StageRunner::SaveCheckpoint), and a resume
  // (StageRunner::LoadCheckpoint with the optimizer) refuses a module whose identity
  // differs, naming each differing key, unless asked to load anyway. It must hold
  // everything whose change would make the resumed run read other training batches than
  // the uninterrupted one at the same step: the source (file paths, their sizes and a
  // content fingerprint; or a generator's options), the sampling seed and order, the
  // sequence length. The position is in DataPosition (below); what only evaluation reads
  // is in neither. Keys start with "data."
  // ("data.kind", "data.files", "data.sizes", "data.fingerprint", "data.seed",
  // "data.language_seed", "data.order", "data.vocab", ...). Values are compared as
  // text: write numbers exactly (every digit of a double). The default, empty, describes
  // nothing, and a resume then compares nothing.
  virtual std::map<std::string, std::string> DataIdentity() const { return {}; }

  // NOTE [Data position]: where in its data the training stands after `global_step` steps
  // of `batch_size` rows, as "key" -> "value" text: for data read in epochs "data.epoch"
  // (the epoch of the next sample) and "data.window" (how many of that epoch's samples
  // were read), a function of the step, the batch size and the data. The runner stores it
  // in every checkpoint (TrainingCheckpointOptions::data_position, with
  // StageOptions::train_batch_size), and a resume compares the checkpoint's with this
  // module's at the checkpoint's step under NOTE [Data identity]'s rule (refused naming
  // each differing key unless asked to load anyway): a resume with another batch size
  // would read other samples than the saved run. The default, empty, describes nothing
  // (the step alone is the position, as for data sampled by step); then nothing is
  // compared.
  virtual std::map<std::string, std::string> DataPosition(int64_t global_step,
                                                          int batch_size) const {
    (void)global_step;
    (void)batch_size;
    return {};
  }
};

}  // namespace integration

#endif  // INTEGRATION_TRAIN_MODULE_H_
