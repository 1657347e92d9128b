// StageRunner: the train / validate / test / predict stages of a TrainModule over one
// process group, all wrapping through one fsdp::WrapperRegistry. A stage after another
// gets the existing FSDP units back (no re-flatten, no parameter byte copied); a stage
// run alone (another process, or after Release) wraps fresh with the same options and
// computes the same results.
//
//   ASSIGN_OR_RETURN(comm::Distributed dist, comm::InitFromEnv({}));
//   integration::StageOptions options;
//   options.wrap.policy = policy::ModuleTypes({"TransformerBlock"});
//   options.checkpoint_dir = "/ckpt/run";
//   ASSIGN_OR_RETURN(auto runner, integration::StageRunner::Create(dist.group, options));
//   ASSIGN_OR_RETURN(integration::FitResult fit, runner->Fit(module));    // wraps, trains, saves
//   ASSIGN_OR_RETURN(integration::EvalResult test, runner->Test(module)); // reuses the units
//   // test.report.wrap.units_reused == units, test.report.wrap.param_bytes_copied == 0
//   RETURN_IF_ERROR(runner->Release(module));  // module is the plain trained model
//
//   // Another process, any world size:
//   ASSIGN_OR_RETURN(auto loaded, runner->LoadCheckpoint(module, "/ckpt/run",
//   /*optimizer=*/false)); ASSIGN_OR_RETURN(integration::EvalResult again, runner->Test(module));
//   // same loss
//
// Separate stage objects (Lightning's Trainer(...).fit(m), then another
// Trainer(...).test(m)) share one registry: create each over the same
// std::shared_ptr<fsdp::WrapperRegistry> and the same group object, and the second
// reuses the first one's units (0 parameter bytes copied):
//
//   auto registry = std::make_shared<fsdp::WrapperRegistry>();
//   ASSIGN_OR_RETURN(auto fitter, integration::StageRunner::Create(dist.group, fit_options,
//   registry)); ASSIGN_OR_RETURN(auto tester, integration::StageRunner::Create(dist.group,
//   test_options, registry)); RETURN_IF_ERROR(fitter->Fit(module).status());
//   ASSIGN_OR_RETURN(integration::EvalResult test, tester->Test(module));
//   // test.report.wrap.reused, units_reused == units, param_bytes_copied == 0
//
// The wrap options (StageOptions::wrap) of runners sharing a registry must ask for the
// same wrap; a runner whose options differ gets FailedPrecondition naming the first
// differing option (NOTE [Registry reuse] in fsdp/registry.h). Each runner keeps its own
// optimizer and global step per model.
//
// The runner keeps, per model, the optimizer (made by TrainModule::ConfigureOptimizer at
// the first Fit or optimizer load) and the global step, so a later Fit continues
// training with its optimizer state. Evaluation stages run forwards only: they allocate
// no gradients and no optimizer state. Units the user wrapped by hand through the
// runner's registry() before the first stage are kept as they are.
//
// Every call is a collective over the group: call it on every rank in the same order.
// Losses are averaged over ranks weighted by StepOutput::count (NOTE [Whole-set
// evaluation] in train_module.h for Validate and Test of a whole held-out set). Memory
// figures are of each rank's current CPU allocator (core::Allocator::Current), whose peaks
// every stage resets when it starts. Not thread-safe: a runner (and its registry, shared or not)
// belongs to one rank and is used by that rank's thread.
#ifndef INTEGRATION_STAGE_RUNNER_H_
#define INTEGRATION_STAGE_RUNNER_H_

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/process_group.h"
#include "core/allocator.h"
#include "core/module.h"
#include "core/op_profile.h"
#include "core/tensor.h"
#include "fsdp/registry.h"
#include "integration/checkpointing/training_checkpoint.h"
#include "integration/stage_options.h"
#include "integration/train_module.h"
#include "optim/optimizer.h"

namespace integration {

// One rank's allocator figures.
struct RankMemory {
  std::array<int64_t, core::kNumMemoryTags> peak_by_tag{};
  std::array<int64_t, core::kNumMemoryTags> current_by_tag{};
  int64_t peak_total = 0;
};

// What a stage's wrap did.
struct WrapReport {
  // The registry answered with the existing wrap of the model (a reuse).
  bool reused = false;
  // Units the wrap manages, and how many of them existed before this stage (reused: all
  // of them; a fresh wrap: those the user wrapped by hand) or were created by it.
  int units = 0;
  int units_reused = 0;
  int units_created = 0;
  // Parameter bytes this stage's wrap copied (0 for a reuse).
  int64_t param_bytes_copied = 0;
  // Wrapping was skipped (EvalOptions::wrap false).
  bool skipped = false;
};

struct StageReport {
  Stage stage = Stage::kFit;
  WrapReport wrap;
  double seconds = 0;
  // Per rank (index = rank): peaks during the stage, current at its end.
  std::vector<RankMemory> memory;
  // Bytes this rank's group moved during the stage (sent + received, all collectives).
  int64_t comm_bytes = 0;
};

struct FitResult {
  StageReport report;
  // The global mean loss of every step this Fit took, in order.
  std::vector<double> losses;
  // Global step before the first and after the last step of this Fit.
  int64_t first_step = 0;
  int64_t global_step = 0;
  // Mean of the last min(10, steps) entries of `losses`.
  double final_loss = 0;
  // Sum over ranks of StepOutput::count per second of the stage.
  double items_per_second = 0;
  // Where the checkpoint went ("" when StageOptions::checkpoint_dir is empty): the last one
  // this Fit saved.
  std::string checkpoint_dir;
  // NOTE [Periodic checkpoints]: every checkpoint this Fit saved, in order (the step
  // directories; only checkpoint_dir itself without periodic checkpoints).
  std::vector<std::string> checkpoints;
  // Seconds after the last step spent saving (the last periodic checkpoint, or the one save
  // at the end) and committing a save in flight.
  double final_save_seconds = 0;
  bool released = false;
  // The ops of step StageOptions::profile_step of this Fit, with their CUDA device times
  // resolved; empty when no step was profiled.
  std::vector<core::OpRecord> profiled_ops;
};

struct EvalResult {
  StageReport report;
  // Global mean loss over the stage's batches, weighted by StepOutput::count: with
  // whole_set, the exact mean over the held-out set's items (NOTE [Whole-set evaluation]
  // in integration/train_module.h).
  double loss = 0;
  // The items it is over (the sum of every step's StepOutput::count).
  int64_t count = 0;
  // Batches run: TrainModule::EvaluationBatches when the module gives it (whole_set), else
  // StageOptions::eval_batches.
  int64_t batches = 0;
  bool whole_set = false;
};

struct PredictResult {
  StageReport report;
  // This rank's PredictStep outputs, batch by batch.
  std::vector<core::Tensor> outputs;
};

// A progress report of Fit, every StageOptions::log_every steps and after the last.
struct Progress {
  int64_t step = 0;         // steps taken in this Fit (1-based)
  int64_t steps = 0;        // steps this Fit takes
  int64_t global_step = 0;  // global steps taken, over all Fits
  double loss = 0;          // this step's global mean loss
  // The global mean loss of every step since the previous report, in order: global steps
  // global_step - losses.size() + 1 .. global_step (the last is `loss`).
  std::vector<double> losses;
  // The global step of the newest periodic checkpoint this Fit has committed (NOTE [Periodic
  // checkpoints]), -1 for none yet.
  int64_t committed_step = -1;
  double items_per_second = 0;  // since the previous report, all ranks together
  // What the items are (TrainModule::CountUnit(): "samples", "tokens", ...).
  std::string count_unit = "samples";
  std::vector<RankMemory> memory;  // per rank, peaks since the stage began
};

// "step   25/300 (global 25)  loss 2.3141  tokens/s 41234  peak r0 param=... | r1 ...",
// with progress.count_unit before "/s" ("samples/s" for a model without tokens).
std::string FormatProgress(const Progress& progress);

// What ResumeLatest did.
struct ResumeResult {
  // False when `root` held no complete checkpoint (nothing was loaded).
  bool resumed = false;
  std::string dir;  // the checkpoint loaded
  // Newer step checkpoints passed over, "<dir>: <why>" (checkpoint::LatestCheckpoint).
  std::vector<std::string> skipped;
  LoadedCheckpoint loaded;
};

struct EvalOptions {
  // Wrap the model through the registry first (the default). False evaluates the model
  // as it is, e.g. a released plain module (every rank still runs its share of each
  // batch and the losses are averaged over the group).
  bool wrap = true;
};

// How StageRunner::LoadCheckpoint loads.
struct LoadCheckpointOptions {
  // Also the optimizer state: a resume, which compares the data too (below). False loads
  // the model only (evaluation, the start of a fine-tuning) and compares no data.
  bool optimizer = false;
  // NOTE [Data identity] (integration/train_module.h): a resume whose module's
  // DataIdentity() differs from the checkpoint's, or whose DataPosition() at the
  // checkpoint's step and StageOptions::train_batch_size differs from the checkpoint's
  // (NOTE [Data position]), is FailedPrecondition naming each differing key with both
  // values. True loads anyway and lists the differences in
  // LoadedCheckpoint::data_identity_changes.
  bool allow_data_change = false;
};

class StageRunner {
 public:
  // InvalidArgument for a null group or options invalid on its size (naming the option).
  // Collective over `group` (every rank calls it): a rank whose options are invalid
  // fails every rank, with its error prefixed "rank <r>: ". Every stage wraps through
  // `registry`: pass the same one (and the same group object) to runners that must
  // reuse each other's units; null (the default) gives the runner a registry of its own.
  static absl::StatusOr<std::unique_ptr<StageRunner>> Create(
      std::shared_ptr<comm::ProcessGroup> group, StageOptions options,
      std::shared_ptr<fsdp::WrapperRegistry> registry = nullptr);

  // Wraps, then trains StageOptions::fit_steps steps (or `steps` when > 0; or up to global
  // step StageOptions::max_steps, NOTE [Training to a global step]) from the model's global
  // step, reporting progress and saving periodic checkpoints (NOTE [Periodic
  // checkpoints] in stage_options.h), then, without periodic ones, saves a checkpoint to
  // StageOptions::checkpoint_dir if set, and releases the model if release_after_fit.
  // Internal naming the step when the loss is not finite; FailedPrecondition when
  // StageOptions::grad_accumulation > 1 and the module does not support micro-batches;
  // other errors as the TrainModule, FSDP or the optimizer return them.
  absl::StatusOr<FitResult> Fit(TrainModule& module, int64_t steps = 0);

  // Forward-only stages over batches of eval_batch_size rows: TrainModule::
  // EvaluationBatches of them where the module gives it (the whole held-out set, NOTE
  // [Whole-set evaluation] in integration/train_module.h), else StageOptions::eval_batches;
  // predict always eval_batches. Under NOTE [Deterministic training] each Validate and Test
  // batch runs as its M micro-batches (rank r of N the micro-batches [r M / N, (r + 1) M /
  // N), with StepContext world_size 1) and the loss adds their (loss x count, count) in
  // micro-batch order: the same bits at every world size. FailedPrecondition when the
  // ranks' batch counts differ, or under deterministic_micro_batches > the world size for a
  // module that does not run micro-batches; InvalidArgument for a StepOutput::count < 0.
  absl::StatusOr<EvalResult> Validate(TrainModule& module, const EvalOptions& options = {});
  absl::StatusOr<EvalResult> Test(TrainModule& module, const EvalOptions& options = {});
  absl::StatusOr<PredictResult> Predict(TrainModule& module, const EvalOptions& options = {});

  // Wraps the model (as a stage would) and returns what the wrap did.
  absl::StatusOr<WrapReport> Wrap(TrainModule& module);

  // Saves the model and, if Fit made one, its optimizer state, tagged with the global
  // step, the module's DataIdentity() and its DataPosition() at that step with
  // StageOptions::train_batch_size (integration/checkpointing/training_checkpoint.h).
  // The model must be wrapped or plain; a collective.
  absl::Status SaveCheckpoint(
      TrainModule& module, const std::string& dir,
      checkpoint::SimulatedCrash simulate_crash = checkpoint::SimulatedCrash::kNone);

  // Wraps the model, then loads `dir` (saved at any world size) into it and sets the
  // model's global step to the checkpoint's; with options.optimizer, also the optimizer
  // state (making the optimizer first if needed), so a following Fit continues the saved
  // run. A resume (options.optimizer) first compares the module's DataIdentity() with the
  // checkpoint's (NOTE [Data identity]): FailedPrecondition naming each differing key and
  // both values ("data.seed: the checkpoint's 2 vs this module's 3"), then its
  // DataPosition() at the checkpoint's step with the checkpoint's (NOTE [Data position]:
  // "data.window: the checkpoint's 64 vs this module's 128" after a change of
  // train_batch_size), before anything is wrapped or loaded, unless
  // options.allow_data_change; a side without an identity or position is not compared
  // (LoadedCheckpoint::data_identity_note says so). Collective: a rank that
  // cannot load (a damaged or missing file, other data) fails every rank with its error
  // ("rank <r>: ..."), before any rank goes on to another collective.
  absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(TrainModule& module, const std::string& dir,
                                                  const LoadCheckpointOptions& options);
  // The same with LoadCheckpointOptions{optimizer}.
  absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(TrainModule& module, const std::string& dir,
                                                  bool optimizer);

  // NOTE [Periodic checkpoints]: LoadCheckpoint of the newest complete checkpoint under
  // `root` (checkpoint::FindLatestCheckpoint, run by rank 0, whose choice every rank loads),
  // passing over newer ones that are torn or damaged. When there is none, nothing is loaded
  // and ResumeResult::resumed is false: the run starts fresh. Collective.
  absl::StatusOr<ResumeResult> ResumeLatest(TrainModule& module, const std::string& root,
                                            const LoadCheckpointOptions& options);

  // fsdp::Release of the model: a plain module with its trained full weights. The
  // optimizer and global step are kept for a later Fit (which wraps again the same way).
  absl::Status Release(TrainModule& module);

  // The global step of the module's model (0 before any Fit or load).
  int64_t GlobalStep(TrainModule& module);
  // The optimizer Fit uses for the module's model, or null before the first.
  optim::Optimizer* optimizer(TrainModule& module);

  // Called on rank 0 with every progress report; by default FormatProgress as a
  // LOG(INFO) once the program has initialised glog, else as a line on stdout (the
  // library never logs before the caller has set up logging). Every rank takes part in
  // gathering the figures either way.
  void set_progress_callback(std::function<void(const Progress&)> callback) {
    progress_callback_ = std::move(callback);
  }

  fsdp::WrapperRegistry& registry() { return *registry_; }
  // The registry, to create another runner over it.
  const std::shared_ptr<fsdp::WrapperRegistry>& shared_registry() const { return registry_; }
  const std::shared_ptr<comm::ProcessGroup>& group() const { return group_; }
  const StageOptions& options() const { return options_; }

 private:
  struct ModelState {
    std::weak_ptr<core::Module> model;
    std::unique_ptr<optim::Optimizer> optimizer;
    int64_t global_step = 0;
  };

  StageRunner(std::shared_ptr<comm::ProcessGroup> group, StageOptions options,
              std::shared_ptr<fsdp::WrapperRegistry> registry);

  // One optimizer step's TrainingSteps over StageOptions::grad_accumulation micro-batches
  // (NOTE [Gradient accumulation]; or this rank's deterministic ones, NOTE [Deterministic
  // training]), gradients then their mean; appends each micro-batch's output (its loss,
  // or what reads it: NOTE [Deferred loss] in nn/losses.h) to `parts`.
  // Saves the checkpoint of global step `step` under checkpoint_dir, records it in `result`
  // and prunes to keep_checkpoints (NOTE [Periodic checkpoints] in stage_options.h).
  absl::Status SaveStepCheckpoint(TrainModule& module, int64_t step, FitResult* result);
  // With StageOptions::async_checkpoints: commits the save in flight (PendingSave::Finish),
  // records it and prunes; OK when there is none. Collective.
  absl::Status FinishPendingSave(FitResult* result);
  // Records the committed checkpoint `dir` in `result` and prunes to keep_checkpoints
  // (agreed across ranks).
  absl::Status Committed(const std::string& dir, int64_t step, FitResult* result);
  // What every checkpoint of the model records (its global step, the module's data identity)
  // and the collective timeout.
  TrainingCheckpointOptions CheckpointOptions(const TrainModule& module,
                                              const ModelState& state) const;
  // What Fit's loop carries from one report to the next.
  struct FitLoop {
    // Each step's micro-batch outputs since the last report, losses possibly still on the
    // device (NOTE [Deferred loss]).
    std::vector<std::vector<StepOutput>> unreported;
    double items_total = 0;       // StepOutput::count over all ranks and reported steps
    double last_report_time = 0;  // NowSeconds() of the last report (or the fit's start)
    double last_save_time = 0;    // ... of the last periodic save (or the fit's start)
    bool periodic = false;        // NOTE [Periodic checkpoints] is on
    bool time_due = false;        // checkpoint_every_minutes have passed, as of this report
  };
  // The report after `done` of `num_steps` steps at `global_step`: reads and averages the
  // losses of the steps since the last one, commits a save in flight whose writes ended on
  // every rank, sets loop->time_due, and calls the progress callback. Collective.
  absl::Status ReportFitSteps(TrainModule& module, const core::Module& model, int64_t done,
                              int64_t num_steps, int64_t global_step, FitLoop* loop,
                              FitResult* result);
  // NOTE [Periodic checkpoints]: OK unless Fit's one save at its end would replace a directory
  // of step checkpoints (FailedPrecondition naming it). Collective.
  absl::Status CheckCheckpointDirFree();
  // Fit's step `i` at `global_step`: learning rate, micro-batches, clipping, optimizer step,
  // and the op profile when i is StageOptions::profile_step.
  absl::Status RunFitStep(TrainModule& module, core::Module& model, optim::Optimizer& optimizer,
                          int64_t i, int64_t global_step, std::vector<StepOutput>* parts,
                          FitResult* result);
  absl::Status AccumulateMicroBatches(TrainModule& module, core::Module& model, StepContext ctx,
                                      std::vector<StepOutput>* parts);

  // The module's model, or InvalidArgument when it is null.
  absl::StatusOr<std::shared_ptr<core::Module>> ModelOf(TrainModule& module);
  ModelState& StateOf(const std::shared_ptr<core::Module>& model);
  absl::Status EnsureOptimizer(TrainModule& module, ModelState& state,
                               const std::shared_ptr<core::Module>& model);
  // Forward-only loop of Validate and Test.
  absl::StatusOr<EvalResult> Evaluate(Stage stage, TrainModule& module, const EvalOptions& options);
  // The micro-batches of each batch this rank runs: M / world size under NOTE
  // [Deterministic training] (M = StageOptions.deterministic_micro_batches), else 1.
  int MicroBatchesPerRank() const;
  // NOTE [Whole-set evaluation]: OK when every rank would run `batches` >= 0 batches;
  // FailedPrecondition or InvalidArgument naming stage `name` otherwise. Collective.
  absl::Status AgreeEvaluationBatches(const std::string& name, int64_t batches);
  // This rank's evaluation steps of `batches` batches: its (loss x count, count) pair per
  // micro-batch under NOTE [Deterministic training], else one pair of its sums.
  absl::StatusOr<std::vector<double>> RunEvaluationSteps(Stage stage, TrainModule& module,
                                                         int64_t batches);
  // Wrap (or not), reset peaks; the stage's report so far.
  absl::StatusOr<StageReport> BeginStage(Stage stage, TrainModule& module, bool wrap);
  // Reshards units an evaluation forward left unsharded, gathers memory, fills timings.
  absl::Status EndStage(const std::shared_ptr<core::Module>& model, StageReport& report);
  // Every rank's values, in rank order (an all-gather; exact).
  absl::StatusOr<std::vector<std::vector<double>>> AllGatherDoubles(
      const std::vector<double>& mine);
  absl::StatusOr<std::vector<RankMemory>> GatherMemory();

  std::shared_ptr<comm::ProcessGroup> group_;
  StageOptions options_;
  std::shared_ptr<fsdp::WrapperRegistry> registry_;  // never null
  std::map<const core::Module*, ModelState> states_;
  std::function<void(const Progress&)> progress_callback_;
  // NOTE [Asynchronous save]: the periodic checkpoint being written, within one Fit.
  std::unique_ptr<checkpoint::PendingSave> pending_save_;
  int64_t pending_step_ = 0;     // its global step
  int64_t committed_step_ = -1;  // of the newest checkpoint this Fit committed
  int64_t stage_start_comm_bytes_ = 0;
  double stage_start_seconds_ = 0;
};

}  // namespace integration

#endif  // INTEGRATION_STAGE_RUNNER_H_
