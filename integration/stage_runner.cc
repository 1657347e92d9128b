#include "integration/stage_runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "checkpoint/series.h"
#include "comm/agreement.h"
#include "core/status_macros.h"
#include "fsdp/fully_shard.h"
#include "fsdp/grad_utils.h"
#include "glog/logging.h"

namespace integration {
namespace {

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int64_t CommBytes(const comm::ProcessGroup& group) {
  const comm::CollectiveStats total = group.Stats().Total();
  return total.bytes_sent + total.bytes_received;
}

std::string RankPeaks(const RankMemory& m) {
  std::vector<std::string> parts;
  for (int t = 0; t < core::kNumMemoryTags; ++t) {
    if (m.peak_by_tag[t] == 0) continue;
    parts.push_back(absl::StrCat(core::MemoryTagName(static_cast<core::MemoryTag>(t)), "=",
                                 core::FormatBytes(m.peak_by_tag[t])));
  }
  parts.push_back(absl::StrCat("total=", core::FormatBytes(m.peak_total)));
  return absl::StrJoin(parts, " ");
}

}  // namespace

std::string FormatProgress(const Progress& p) {
  std::vector<std::string> ranks;
  for (size_t r = 0; r < p.memory.size(); ++r) {
    ranks.push_back(absl::StrCat("r", r, " ", RankPeaks(p.memory[r])));
  }
  return absl::StrFormat("step %5d/%d (global %d)  loss %.4f  %s/s %8.0f  peak %s", p.step, p.steps,
                         p.global_step, p.loss, p.count_unit.empty() ? "items" : p.count_unit,
                         p.items_per_second, absl::StrJoin(ranks, " | "));
}

absl::StatusOr<std::unique_ptr<StageRunner>> StageRunner::Create(
    std::shared_ptr<comm::ProcessGroup> group, StageOptions options,
    std::shared_ptr<fsdp::WrapperRegistry> registry) {
  if (group == nullptr) {
    return absl::InvalidArgumentError("StageRunner::Create: the process group is null");
  }
  // Ranks may have read their options from different files: agree on their validity.
  RETURN_IF_ERROR(comm::AgreeOnStatus(group.get(), options.Validate(group->size()),
                                      "StageRunner::Create", options.wrap.timeout));
  if (registry == nullptr) registry = std::make_shared<fsdp::WrapperRegistry>();
  return std::unique_ptr<StageRunner>(
      new StageRunner(std::move(group), std::move(options), std::move(registry)));
}

StageRunner::StageRunner(std::shared_ptr<comm::ProcessGroup> group, StageOptions options,
                         std::shared_ptr<fsdp::WrapperRegistry> registry)
    : group_(std::move(group)), options_(std::move(options)), registry_(std::move(registry)) {}

absl::StatusOr<std::shared_ptr<core::Module>> StageRunner::ModelOf(TrainModule& module) {
  std::shared_ptr<core::Module> model = module.model();
  if (model == nullptr) {
    return absl::InvalidArgumentError("StageRunner: TrainModule::model() returned null");
  }
  return model;
}

StageRunner::ModelState& StageRunner::StateOf(const std::shared_ptr<core::Module>& model) {
  ModelState& state = states_[model.get()];
  if (state.model.lock() != model) {
    // A new model (or a destroyed one's address reused): start over.
    state = ModelState();
    state.model = model;
  }
  return state;
}

absl::StatusOr<WrapReport> StageRunner::Wrap(TrainModule& module) {
  ASSIGN_OR_RETURN(std::shared_ptr<core::Module> model, ModelOf(module));
  const fsdp::RegistryCounters before = registry_->counters();
  ASSIGN_OR_RETURN(std::shared_ptr<fsdp::FullyShardHandle> handle,
                   fsdp::FullyShard(model, group_, options_.wrap, registry_.get()));
  const fsdp::RegistryCounters after = registry_->counters();
  WrapReport report;
  report.reused = after.reuses > before.reuses;
  report.units = static_cast<int>(handle->units().size());
  report.units_created = static_cast<int>(after.units_created - before.units_created);
  report.units_reused = report.units - report.units_created;
  report.param_bytes_copied = after.param_bytes_copied - before.param_bytes_copied;
  VLOG(1) << "StageRunner: " << (report.reused ? "reused" : "wrapped") << " " << model->Describe()
          << ": " << report.units << " units (" << report.units_reused << " reused), "
          << report.param_bytes_copied << " parameter bytes copied";
  return report;
}

absl::Status StageRunner::EnsureOptimizer(TrainModule& module, ModelState& state,
                                          const std::shared_ptr<core::Module>& model) {
  if (state.optimizer != nullptr) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<optim::Optimizer>> made =
      module.ConfigureOptimizer(model->NamedParameters());
  if (!made.ok()) {
    return core::Annotate(made.status(),
                          absl::StrCat("TrainModule::ConfigureOptimizer for ", model->Describe()));
  }
  if (*made == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("TrainModule::ConfigureOptimizer for ", model->Describe(), " returned null"));
  }
  state.optimizer = *std::move(made);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<double>>> StageRunner::AllGatherDoubles(
    const std::vector<double>& mine) {
  // Each double travels as its 64 bits in two int32 elements, so the values arrive
  // exactly (the group reduces nothing).
  const int64_t n = static_cast<int64_t>(mine.size());
  ASSIGN_OR_RETURN(core::Tensor in, core::Tensor::Allocate({2 * n}, core::DType::kInt32));
  if (n > 0) std::memcpy(in.raw_data(), mine.data(), n * sizeof(double));
  ASSIGN_OR_RETURN(core::Tensor out,
                   core::Tensor::Allocate({2 * n * group_->size()}, core::DType::kInt32));
  comm::AllGatherOptions gather;
  gather.timeout = options_.wrap.timeout;
  ASSIGN_OR_RETURN(std::shared_ptr<comm::Work> work, group_->AllGather(in, out, gather));
  RETURN_IF_ERROR(work->Wait(options_.wrap.timeout));
  std::vector<std::vector<double>> all(group_->size(), std::vector<double>(n));
  for (int r = 0; r < group_->size(); ++r) {
    if (n > 0) {
      std::memcpy(all[r].data(), out.data<int32_t>() + 2 * n * r, n * sizeof(double));
    }
  }
  return all;
}

absl::StatusOr<std::vector<RankMemory>> StageRunner::GatherMemory() {
  const core::MemoryStats s = core::Allocator::Current(core::Device::Cpu())->Stats();
  std::vector<double> mine;
  for (int t = 0; t < core::kNumMemoryTags; ++t) mine.push_back(s.peak_by_tag[t]);
  for (int t = 0; t < core::kNumMemoryTags; ++t) mine.push_back(s.current_by_tag[t]);
  mine.push_back(s.peak_total);
  ASSIGN_OR_RETURN(std::vector<std::vector<double>> all, AllGatherDoubles(mine));
  std::vector<RankMemory> out(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    for (int t = 0; t < core::kNumMemoryTags; ++t) {
      out[r].peak_by_tag[t] = static_cast<int64_t>(all[r][t]);
      out[r].current_by_tag[t] = static_cast<int64_t>(all[r][core::kNumMemoryTags + t]);
    }
    out[r].peak_total = static_cast<int64_t>(all[r][2 * core::kNumMemoryTags]);
  }
  return out;
}

absl::StatusOr<StageReport> StageRunner::BeginStage(Stage stage, TrainModule& module, bool wrap) {
  StageReport report;
  report.stage = stage;
  if (wrap) {
    absl::StatusOr<WrapReport> wrapped = Wrap(module);
    if (!wrapped.ok()) return core::Annotate(wrapped.status(), StageName(stage));
    report.wrap = *wrapped;
  } else {
    report.wrap.skipped = true;
  }
  core::Allocator::Current(core::Device::Cpu())->ResetPeaks();
  stage_start_comm_bytes_ = CommBytes(*group_);
  stage_start_seconds_ = NowSeconds();
  return report;
}

absl::Status StageRunner::EndStage(const std::shared_ptr<core::Module>& model,
                                   StageReport& report) {
  if (std::shared_ptr<fsdp::FullyShardHandle> handle = registry_->FindHandle(*model)) {
    RETURN_IF_ERROR(handle->Reshard());
  }
  report.seconds = NowSeconds() - stage_start_seconds_;
  ASSIGN_OR_RETURN(report.memory, GatherMemory());
  report.comm_bytes = CommBytes(*group_) - stage_start_comm_bytes_;
  return absl::OkStatus();
}

absl::Status StageRunner::AccumulateMicroBatches(TrainModule& module, core::Module& model,
                                                 StepContext ctx, std::vector<StepOutput>* parts) {
  // NOTE [Gradient accumulation] (stage_options.h); NOTE [Deterministic training]: this
  // rank's share of the M micro-batches, summed by the units, scaled by 1 / M.
  const int deterministic = options_.deterministic_micro_batches;
  const int k = deterministic > 0 ? deterministic / group_->size() : options_.grad_accumulation;
  const bool sync_last =
      deterministic > 0 || options_.accumulation == StageOptions::Accumulation::kNoSync;
  const int rank = group_->rank();
  for (int j = 0; j < k; ++j) {
    ctx.micro_batch = j;
    ctx.micro_batches = k;
    if (deterministic > 0) {
      // A whole global micro-batch of the aligned range: rank r's j-th is r k + j of M.
      ctx.micro_batch = rank * k + j;
      ctx.micro_batches = deterministic;
      ctx.rank = 0;
      ctx.world_size = 1;
    }
    std::unique_ptr<fsdp::NoSyncScope> no_sync;
    if (sync_last && j + 1 < k) {
      ASSIGN_OR_RETURN(no_sync, fsdp::NoSync(model, registry_.get()));
    }
    absl::StatusOr<StepOutput> out = module.TrainingStep(ctx);
    if (!out.ok()) {
      return core::Annotate(out.status(), k == 1
                                              ? absl::StrCat("fit: TrainingStep at step ", ctx.step)
                                              : absl::StrCat("fit: TrainingStep at step ", ctx.step,
                                                             ", micro-batch ", j, " of ", k));
    }
    parts->push_back(*std::move(out));
  }
  if (k == 1 && deterministic == 0) return absl::OkStatus();
  const int scale = deterministic > 0 ? deterministic : k;
  return core::Annotate(
      fsdp::ScaleGrads(model, registry_.get(), 1.0 / scale),
      absl::StrCat("fit: mean of the micro-batches' gradients at step ", ctx.step));
}

namespace {

// The (loss x count, count) pairs one step adds to the fit's report, from its micro-batches'
// outputs, reading the deferred losses now (NOTE [Deferred loss] in nn/losses.h): one pair
// per micro-batch under NOTE [Deterministic training], else one for the step (its loss
// exactly as the module gave it for one micro-batch, else their count-weighted mean).
absl::Status AppendLossPairs(std::vector<StepOutput>& parts, bool per_micro_batch,
                             int64_t global_step, std::vector<double>* pairs) {
  double weighted = 0, count = 0;
  for (size_t j = 0; j < parts.size(); ++j) {
    StepOutput& part = parts[j];
    if (part.read_loss) {
      absl::StatusOr<double> loss = part.read_loss();
      if (!loss.ok()) {
        return core::Annotate(loss.status(), absl::StrCat("fit: reading the loss of global step ",
                                                          global_step + 1, ", micro-batch ", j));
      }
      part.loss = *loss;
      part.read_loss = nullptr;
    }
    const double n = static_cast<double>(part.count);
    if (per_micro_batch) {
      pairs->push_back(part.loss * n);
      pairs->push_back(n);
    }
    weighted += part.loss * n;
    count += n;
  }
  if (per_micro_batch) return absl::OkStatus();
  const double loss = parts.size() == 1 ? parts[0].loss : (count > 0 ? weighted / count : 0);
  pairs->push_back(loss * count);
  pairs->push_back(count);
  return absl::OkStatus();
}

}  // namespace

// The report of the fit's steps since the last one (NOTE [Deferred loss]: their losses read
// now; one all-gather for all of them, which also carries rank 0's checkpoint_every_minutes
// decision and every rank's NOTE [Asynchronous save] write flag), the save it lets commit, the
// losses checked finite, and the progress line.
absl::Status StageRunner::ReportFitSteps(TrainModule& module, const core::Module& model,
                                         int64_t done, int64_t num_steps, int64_t global_step,
                                         FitLoop* loop, FitResult* result) {
  std::vector<double> pending;
  for (size_t s = 0; s < loop->unreported.size(); ++s) {
    RETURN_IF_ERROR(AppendLossPairs(loop->unreported[s], options_.deterministic_micro_batches > 0,
                                    global_step - static_cast<int64_t>(loop->unreported.size() - s),
                                    &pending));
  }
  loop->unreported.clear();
  // Whether checkpoint_every_minutes have passed: rank 0's clock decides, its flag riding
  // at the end of the report's all-gather.
  const bool ask_time = loop->periodic && options_.checkpoint_every_minutes > 0;
  if (ask_time) {
    pending.push_back(NowSeconds() - loop->last_save_time >=
                      60 * options_.checkpoint_every_minutes);
  }
  // NOTE [Asynchronous save]: whether each rank's background write has ended (every rank
  // has a save in flight or none: they begin at the same steps).
  const bool ask_write = pending_save_ != nullptr;
  if (ask_write) pending.push_back(pending_save_->WriteDone());
  ASSIGN_OR_RETURN(std::vector<std::vector<double>> all, AllGatherDoubles(pending));
  bool writes_done = true;
  if (ask_write) {
    for (std::vector<double>& r : all) {
      writes_done = writes_done && r.back() != 0;
      r.pop_back();
    }
    pending.pop_back();
  }
  if (ask_time) {
    loop->time_due = all[0].back() != 0;
    for (std::vector<double>& r : all) r.pop_back();
    pending.pop_back();
  }
  if (ask_write && writes_done) RETURN_IF_ERROR(FinishPendingSave(result));
  // Pairs per step on each rank: 1, or its deterministic micro-batches.
  const size_t per_step = static_cast<size_t>(MicroBatchesPerRank());
  const int64_t first = global_step - static_cast<int64_t>(pending.size() / (2 * per_step));
  double items_since_report = 0;
  for (size_t k = 0; k < pending.size(); k += 2 * per_step) {
    double weighted = 0, count = 0;
    for (const auto& r : all) {  // rank order, then micro-batch order
      for (size_t j = 0; j < 2 * per_step; j += 2) {
        weighted += r[k + j];
        count += r[k + j + 1];
      }
    }
    const double loss = count > 0 ? weighted / count : NAN;
    if (!std::isfinite(loss)) {
      return absl::InternalError(absl::StrCat("fit: the loss of ", model.Describe(), " is ", loss,
                                              " at global step ",
                                              first + static_cast<int64_t>(k / (2 * per_step)) + 1,
                                              " (training diverged; lower the learning rate)"));
    }
    result->losses.push_back(loss);
    items_since_report += count;
  }
  loop->items_total += items_since_report;
  const size_t reported_steps = pending.size() / (2 * per_step);
  pending.clear();
  Progress p;
  p.step = done;
  p.steps = num_steps;
  p.global_step = global_step;
  p.loss = result->losses.back();
  p.losses.assign(result->losses.end() - static_cast<int64_t>(reported_steps),
                  result->losses.end());
  p.count_unit = module.CountUnit();
  p.committed_step = committed_step_;
  const double now = NowSeconds();
  p.items_per_second = items_since_report / std::max(1e-9, now - loop->last_report_time);
  ASSIGN_OR_RETURN(p.memory, GatherMemory());
  if (group_->rank() == 0) {
    if (progress_callback_) {
      progress_callback_(p);
    } else if (google::IsGoogleLoggingInitialized()) {
      LOG(INFO) << FormatProgress(p);
    } else {
      std::printf("%s\n", FormatProgress(p).c_str());
      std::fflush(stdout);
    }
  }
  loop->last_report_time = NowSeconds();
  return absl::OkStatus();
}

// NOTE [Periodic checkpoints]: Fit's one save replaces checkpoint_dir whole; refused before
// training if that would delete an earlier run's step checkpoints (rank 0 looks; all agree).
absl::Status StageRunner::CheckCheckpointDirFree() {
  absl::Status free = absl::OkStatus();
  if (group_->rank() == 0) {
    absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> steps =
        checkpoint::ListStepCheckpoints(options_.checkpoint_dir);
    free = steps.status();
    if (free.ok() && !steps->empty()) {
      free = absl::FailedPreconditionError(absl::StrCat(
          "fit: StageOptions.checkpoint_dir '", options_.checkpoint_dir, "' holds ", steps->size(),
          " step checkpoints (the newest ", steps->back().second,
          "), which the save at the end of this fit would replace; set "
          "checkpoint_every_steps or checkpoint_every_minutes to add to them, or choose "
          "another checkpoint_dir"));
    }
  }
  return comm::AgreeOnStatus(group_.get(), free, "fit: checking checkpoint_dir",
                             options_.wrap.timeout);
}

// Step `i` of the fit at `global_step`: its learning rate, the micro-batches' forward and
// backward (their outputs appended to `parts`), clipping and the optimizer step, profiled when
// it is StageOptions::profile_step.
absl::Status StageRunner::RunFitStep(TrainModule& module, core::Module& model,
                                     optim::Optimizer& optimizer, int64_t i, int64_t global_step,
                                     std::vector<StepOutput>* parts, FitResult* result) {
  // StageOptions::profile_step: this step's ops, from the TrainingStep to the optimizer.
  std::unique_ptr<core::OpProfile> profile;
  std::optional<core::ScopedOpProfile> profiling;
  if (i == options_.profile_step) {
    profile = std::make_unique<core::OpProfile>();
    profiling.emplace(profile.get());
  }
  StepContext ctx;
  ctx.stage = Stage::kFit;
  ctx.step = global_step;
  ctx.rank = group_->rank();
  ctx.world_size = group_->size();
  ctx.batch_size = options_.train_batch_size;
  if (std::optional<double> lr = module.LearningRate(ctx.step)) optimizer.set_lr(*lr);
  // set_to_none: the units restart the dropped gradients from zero in one memset per
  // run of adjacent slices (NOTE [Gradient reduction] in fsdp/unit.h), not one per grad.
  optimizer.ZeroGrad(/*set_to_none=*/true);
  RETURN_IF_ERROR(AccumulateMicroBatches(module, model, ctx, parts));
  if (options_.max_grad_norm > 0) {
    RETURN_IF_ERROR(fsdp::ClipGradNorm(model, registry_.get(), options_.max_grad_norm).status());
  }
  RETURN_IF_ERROR(core::Annotate(optimizer.Step(), absl::StrCat("fit: optimizer step ", ctx.step)));
  if (profile != nullptr) {
    profiling.reset();
    RETURN_IF_ERROR(core::Annotate(profile->ResolveDeviceTimes(),
                                   absl::StrCat("fit: op profile of step ", ctx.step)));
    result->profiled_ops = profile->records();
  }
  return absl::OkStatus();
}

absl::StatusOr<FitResult> StageRunner::Fit(TrainModule& module, int64_t steps) {
  ASSIGN_OR_RETURN(std::shared_ptr<core::Module> model, ModelOf(module));
  if ((options_.grad_accumulation > 1 || options_.deterministic_micro_batches > group_->size()) &&
      !module.SupportsMicroBatches()) {
    return absl::FailedPreconditionError(
        absl::StrCat("fit: StageOptions.grad_accumulation = ", options_.grad_accumulation,
                     ", but the module ", "training ", model->Describe(),
                     " does not run micro-batches "
                     "(TrainModule::SupportsMicroBatches)"));
  }
  FitResult result;
  ASSIGN_OR_RETURN(result.report, BeginStage(Stage::kFit, module, /*wrap=*/true));
  ModelState& state = StateOf(model);
  // NOTE [Training to a global step].
  const int64_t num_steps =
      steps > 0
          ? steps
          : (options_.max_steps > 0 ? std::max<int64_t>(0, options_.max_steps - state.global_step)
                                    : options_.fit_steps);
  RETURN_IF_ERROR(EnsureOptimizer(module, state, model));

  result.first_step = state.global_step;
  committed_step_ = -1;
  FitLoop loop;
  loop.last_report_time = NowSeconds();
  // A Fit that fails with a save in flight drops it: its write awaited, its temporary
  // directory removed, nothing committed (NOTE [Asynchronous save]).
  struct DropPendingSave {
    std::unique_ptr<checkpoint::PendingSave>* pending;
    ~DropPendingSave() { pending->reset(); }
  } drop_pending_save{&pending_save_};
  // NOTE [Periodic checkpoints].
  const bool periodic = !options_.checkpoint_dir.empty() && (options_.checkpoint_every_steps > 0 ||
                                                             options_.checkpoint_every_minutes > 0);
  loop.periodic = periodic;
  loop.last_save_time = loop.last_report_time;
  int64_t last_saved_step = -1;
  if (!options_.checkpoint_dir.empty() && !periodic) RETURN_IF_ERROR(CheckCheckpointDirFree());
  for (int64_t i = 0; i < num_steps; ++i) {
    loop.time_due = false;  // NOTE [Periodic checkpoints]: set at a report
    std::vector<StepOutput> parts;
    RETURN_IF_ERROR(
        RunFitStep(module, *model, *state.optimizer, i, state.global_step, &parts, &result));
    // Each rank's (loss x count, count) waits for the next report, where one all-gather
    // averages every step since the last one: no collective of its own per step, and a
    // loss left on the device is read only then (NOTE [Deferred loss]). NOTE [Deterministic
    // training]: one pair per micro-batch, added in micro-batch order.
    loop.unreported.push_back(std::move(parts));
    ++state.global_step;

    const int64_t done = i + 1;
    if ((options_.log_every > 0 && done % options_.log_every == 0) || done == num_steps) {
      RETURN_IF_ERROR(
          ReportFitSteps(module, *model, done, num_steps, state.global_step, &loop, &result));
    }
    if (periodic && (loop.time_due || (options_.checkpoint_every_steps > 0 &&
                                       state.global_step % options_.checkpoint_every_steps == 0))) {
      RETURN_IF_ERROR(SaveStepCheckpoint(module, state.global_step, &result));
      last_saved_step = state.global_step;
      loop.last_save_time = NowSeconds();
    }
  }
  const double final_save_start = NowSeconds();
  if (periodic && num_steps > 0 && last_saved_step != state.global_step) {
    RETURN_IF_ERROR(SaveStepCheckpoint(module, state.global_step, &result));
  }
  RETURN_IF_ERROR(FinishPendingSave(&result));
  result.global_step = state.global_step;
  const size_t tail = std::min<size_t>(10, result.losses.size());
  double sum = 0;
  for (size_t i = result.losses.size() - tail; i < result.losses.size(); ++i) {
    sum += result.losses[i];
  }
  result.final_loss = tail > 0 ? sum / tail : 0;
  RETURN_IF_ERROR(EndStage(model, result.report));
  result.items_per_second = loop.items_total / std::max(1e-9, result.report.seconds);

  if (!options_.checkpoint_dir.empty() && !periodic) {
    RETURN_IF_ERROR(SaveCheckpoint(module, options_.checkpoint_dir));
    result.checkpoint_dir = options_.checkpoint_dir;
    result.checkpoints.push_back(options_.checkpoint_dir);
  }
  result.final_save_seconds = NowSeconds() - final_save_start;
  if (options_.release_after_fit) {
    RETURN_IF_ERROR(Release(module));
    result.released = true;
  }
  return result;
}

int StageRunner::MicroBatchesPerRank() const {
  const int m = options_.deterministic_micro_batches;
  return m > 0 ? m / group_->size() : 1;
}

absl::Status StageRunner::AgreeEvaluationBatches(const std::string& name, int64_t batches) {
  ASSIGN_OR_RETURN(std::vector<std::vector<double>> counts,
                   AllGatherDoubles({static_cast<double>(batches)}));
  for (size_t r = 1; r < counts.size(); ++r) {
    if (counts[r][0] != counts[0][0]) {
      return absl::FailedPreconditionError(absl::StrCat(
          name, ": rank ", r, " would run ", counts[r][0], " batches and rank 0 ", counts[0][0],
          " (TrainModule::EvaluationBatches differs between the ranks: their held-out data "
          "differ)"));
    }
  }
  if (batches < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": TrainModule::EvaluationBatches returned ", batches, " (must be >= 0)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<double>> StageRunner::RunEvaluationSteps(Stage stage,
                                                                    TrainModule& module,
                                                                    int64_t batches) {
  const std::string name = StageName(stage);
  const int m = options_.deterministic_micro_batches;
  const int rank = group_->rank();
  const int k = MicroBatchesPerRank();
  std::vector<double> pairs;
  double weighted = 0, count = 0;
  for (int64_t b = 0; b < batches; ++b) {
    for (int j = 0; j < k; ++j) {
      StepContext ctx;
      ctx.stage = stage;
      ctx.step = b;
      ctx.rank = rank;
      ctx.world_size = group_->size();
      ctx.batch_size = options_.eval_batch_size;
      if (m > 0) {  // a whole global micro-batch: rank r's j-th is r k + j of M
        ctx.micro_batch = rank * k + j;
        ctx.micro_batches = m;
        ctx.rank = 0;
        ctx.world_size = 1;
      }
      const std::string what = m > 0 ? absl::StrCat(name, ": EvaluationStep of batch ", b,
                                                    ", micro-batch ", ctx.micro_batch, " of ", m)
                                     : absl::StrCat(name, ": EvaluationStep of batch ", b);
      // Forward only: checkpointed modules run plain (NOTE [Activation checkpointing]).
      core::NoGradScope no_grad;
      absl::StatusOr<StepOutput> out = module.EvaluationStep(ctx);
      if (!out.ok()) return core::Annotate(out.status(), what);
      if (out->count < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": StepOutput::count = ", out->count, " (must be >= 0)"));
      }
      // A share of padding only counts nothing, whatever its loss.
      const double n = static_cast<double>(out->count);
      const double loss_sum = out->count > 0 ? out->loss * n : 0;
      if (m > 0) {
        pairs.push_back(loss_sum);
        pairs.push_back(n);
      } else {
        weighted += loss_sum;
        count += n;
      }
    }
  }
  if (m == 0) pairs = {weighted, count};
  return pairs;
}

namespace {

// The (loss x count, count) totals of every rank's pairs (`all`, in rank order), added in a
// fixed order: the ranks' sums in rank order, or with m > 0 micro-batches a batch (NOTE
// [Deterministic training]) the micro-batches' pairs in (batch, micro-batch) order, k of each
// batch's on each rank, which is the same order at every world size.
std::pair<double, double> AddEvaluationPairs(const std::vector<std::vector<double>>& all,
                                             int64_t batches, int m, int k) {
  double total_weighted = 0, total_count = 0;
  if (m > 0) {
    for (int64_t b = 0; b < batches; ++b) {
      for (int g = 0; g < m; ++g) {
        const std::vector<double>& r = all[static_cast<size_t>(g / k)];
        const size_t at = static_cast<size_t>(2 * (b * k + g % k));
        total_weighted += r[at];
        total_count += r[at + 1];
      }
    }
  } else {
    for (const auto& r : all) {
      total_weighted += r[0];
      total_count += r[1];
    }
  }
  return {total_weighted, total_count};
}

}  // namespace

absl::StatusOr<EvalResult> StageRunner::Evaluate(Stage stage, TrainModule& module,
                                                 const EvalOptions& eval_options) {
  ASSIGN_OR_RETURN(std::shared_ptr<core::Module> model, ModelOf(module));
  const std::string name = StageName(stage);
  // NOTE [Deterministic training]: each batch in M micro-batches, as in Fit.
  const int m = options_.deterministic_micro_batches;
  if (m > group_->size() && !module.SupportsMicroBatches()) {
    return absl::FailedPreconditionError(absl::StrCat(
        name, ": StageOptions.deterministic_micro_batches = ", m, ", but the module evaluating ",
        model->Describe(), " does not run micro-batches (TrainModule::SupportsMicroBatches)"));
  }
  EvalResult result;
  ASSIGN_OR_RETURN(result.report, BeginStage(stage, module, eval_options.wrap));
  // NOTE [Whole-set evaluation]: the module's batch count, or eval_batches. Every rank must
  // run as many batches as every other, or some would wait for the others' collectives.
  const std::optional<int64_t> whole = module.EvaluationBatches(stage, options_.eval_batch_size);
  const int64_t batches = whole.has_value() ? *whole : options_.eval_batches;
  RETURN_IF_ERROR(AgreeEvaluationBatches(name, batches));
  ASSIGN_OR_RETURN(std::vector<double> pairs, RunEvaluationSteps(stage, module, batches));
  // Each rank's values travel exactly and are added in a fixed order, so the result does
  // not depend on the reduction order of the backend.
  ASSIGN_OR_RETURN(std::vector<std::vector<double>> all, AllGatherDoubles(pairs));
  const int k = MicroBatchesPerRank();
  const auto [total_weighted, total_count] = AddEvaluationPairs(all, batches, m, k);
  result.loss = total_count > 0 ? total_weighted / total_count : NAN;
  result.count = static_cast<int64_t>(total_count);
  result.batches = batches;
  result.whole_set = whole.has_value();
  RETURN_IF_ERROR(EndStage(model, result.report));
  return result;
}

absl::StatusOr<EvalResult> StageRunner::Validate(TrainModule& module, const EvalOptions& options) {
  return Evaluate(Stage::kValidate, module, options);
}

absl::StatusOr<EvalResult> StageRunner::Test(TrainModule& module, const EvalOptions& options) {
  return Evaluate(Stage::kTest, module, options);
}

absl::StatusOr<PredictResult> StageRunner::Predict(TrainModule& module,
                                                   const EvalOptions& eval_options) {
  ASSIGN_OR_RETURN(std::shared_ptr<core::Module> model, ModelOf(module));
  PredictResult result;
  ASSIGN_OR_RETURN(result.report, BeginStage(Stage::kPredict, module, eval_options.wrap));
  for (int b = 0; b < options_.eval_batches; ++b) {
    StepContext ctx;
    ctx.stage = Stage::kPredict;
    ctx.step = b;
    ctx.rank = group_->rank();
    ctx.world_size = group_->size();
    ctx.batch_size = options_.eval_batch_size;
    core::NoGradScope no_grad;  // forward only, as in Evaluate
    absl::StatusOr<core::Tensor> out = module.PredictStep(ctx);
    if (!out.ok()) {
      return core::Annotate(out.status(), absl::StrCat("predict: PredictStep of batch ", b));
    }
    result.outputs.push_back(*std::move(out));
  }
  RETURN_IF_ERROR(EndStage(model, result.report));
  return result;
}

TrainingCheckpointOptions StageRunner::CheckpointOptions(const TrainModule& module,
                                                         const ModelState& state) const {
  TrainingCheckpointOptions options;
  options.step = state.global_step;
  options.data_identity = module.DataIdentity();  // NOTE [Data identity]
  // NOTE [Data position]
  options.data_position = module.DataPosition(state.global_step, options_.train_batch_size);
  options.timeout = options_.wrap.timeout;
  return options;
}

absl::Status StageRunner::SaveCheckpoint(TrainModule& module, const std::string& dir,
                                         checkpoint::SimulatedCrash simulate_crash) {
  ASSIGN_OR_RETURN(std::shared_ptr<core::Module> model, ModelOf(module));
  ModelState& state = StateOf(model);
  TrainingCheckpointOptions options = CheckpointOptions(module, state);
  options.simulate_crash = simulate_crash;
  return core::Annotate(SaveTrainingCheckpoint(dir, *model, registry_.get(), state.optimizer.get(),
                                               group_.get(), options),
                        absl::StrCat("saving checkpoint '", dir, "'"));
}

absl::Status StageRunner::SaveStepCheckpoint(TrainModule& module, int64_t step, FitResult* result) {
  const std::string dir = checkpoint::StepDirectory(options_.checkpoint_dir, step);
  // NOTE [Asynchronous save]: at most one in flight; the previous one commits first.
  RETURN_IF_ERROR(FinishPendingSave(result));
  ASSIGN_OR_RETURN(std::shared_ptr<core::Module> model, ModelOf(module));
  ModelState& state = StateOf(model);
  TrainingCheckpointOptions save = CheckpointOptions(module, state);
  if (options_.testonly_write_error)
    save.simulate_write_error = options_.testonly_write_error(step);
  if (!options_.async_checkpoints) {
    RETURN_IF_ERROR(
        core::Annotate(SaveTrainingCheckpoint(dir, *model, registry_.get(), state.optimizer.get(),
                                              group_.get(), save),
                       absl::StrCat("saving checkpoint '", dir, "'")));
    return Committed(dir, step, result);
  }
  // This one's snapshot, then back to work.
  absl::StatusOr<std::unique_ptr<checkpoint::PendingSave>> pending = BeginTrainingCheckpoint(
      dir, *model, registry_.get(), state.optimizer.get(), group_.get(), save,
      /*background=*/true);
  RETURN_IF_ERROR(core::Annotate(pending.status(), absl::StrCat("saving checkpoint '", dir, "'")));
  pending_save_ = *std::move(pending);
  pending_step_ = step;
  return absl::OkStatus();
}

absl::Status StageRunner::FinishPendingSave(FitResult* result) {
  if (pending_save_ == nullptr) return absl::OkStatus();
  std::unique_ptr<checkpoint::PendingSave> pending = std::move(pending_save_);
  const std::string dir = pending->dir();
  RETURN_IF_ERROR(core::Annotate(pending->Finish(), absl::StrCat("saving checkpoint '", dir, "'")));
  return Committed(dir, pending_step_, result);
}

absl::Status StageRunner::Committed(const std::string& dir, int64_t step, FitResult* result) {
  committed_step_ = step;
  result->checkpoint_dir = dir;
  result->checkpoints.push_back(dir);
  if (options_.keep_checkpoints <= 0) return absl::OkStatus();
  // Rank 0 deletes the older ones now that this one is committed; every rank learns how it
  // went before its next collective.
  absl::Status pruned = absl::OkStatus();
  if (group_->rank() == 0) {
    pruned = checkpoint::PruneStepCheckpoints(options_.checkpoint_dir, options_.keep_checkpoints)
                 .status();
  }
  const std::string what = absl::StrCat("fit: keeping the newest ", options_.keep_checkpoints,
                                        " checkpoints under '", options_.checkpoint_dir, "'");
  return comm::AgreeOnStatus(group_.get(), core::Annotate(pruned, what), what,
                             options_.wrap.timeout);
}

absl::StatusOr<LoadedCheckpoint> StageRunner::LoadCheckpoint(TrainModule& module,
                                                             const std::string& dir,
                                                             bool optimizer) {
  LoadCheckpointOptions options;
  options.optimizer = optimizer;
  return LoadCheckpoint(module, dir, options);
}

absl::StatusOr<LoadedCheckpoint> StageRunner::LoadCheckpoint(
    TrainModule& module, const std::string& dir, const LoadCheckpointOptions& load_options) {
  const bool optimizer = load_options.optimizer;
  ASSIGN_OR_RETURN(std::shared_ptr<core::Module> model, ModelOf(module));
  // NOTE [Data identity]: a resume must read the checkpoint's data. Each rank compares its
  // own module (its files may differ from another rank's) and all agree before the wrap.
  // A checkpoint that cannot be read is left to the load below, which reports it.
  // NOTE [Data position]: then where in the data the saved run stood, under the same rule.
  DataIdentityComparison data;
  if (optimizer) {
    absl::Status checked = absl::OkStatus();
    absl::StatusOr<LoadedCheckpoint> info = ReadTrainingCheckpointInfo(dir);
    if (info.ok()) {
      data = CompareDataIdentity(info->data_identity, module.DataIdentity());
      DataIdentityComparison position = CompareDataPosition(
          info->data_position, module.DataPosition(info->step, options_.train_batch_size));
      for (DataIdentityChange& c : position.changes) data.changes.push_back(std::move(c));
      if (!position.note.empty()) {
        data.note =
            data.note.empty() ? position.note : absl::StrCat(data.note, "; ", position.note);
      }
    }
    if (!data.changes.empty() && !load_options.allow_data_change) {
      std::vector<std::string> changes;
      for (const DataIdentityChange& c : data.changes) changes.push_back(c.ToString());
      checked = absl::FailedPreconditionError(absl::StrCat(
          "the module's data differ from the checkpoint's, so a resume would not read the "
          "batches of the saved run: ",
          absl::StrJoin(changes, "; "),
          " (LoadCheckpointOptions::allow_data_change, or the main job's "
          "--resume_allow_data_change, loads anyway)"));
    }
    RETURN_IF_ERROR(comm::AgreeOnStatus(
        group_.get(), core::Annotate(checked, absl::StrCat("loading checkpoint '", dir, "'")),
        absl::StrCat("comparing the data of checkpoint '", dir, "'"), options_.wrap.timeout));
  }
  RETURN_IF_ERROR(Wrap(module).status());
  ModelState& state = StateOf(model);
  if (optimizer) RETURN_IF_ERROR(EnsureOptimizer(module, state, model));
  absl::StatusOr<LoadedCheckpoint> loaded = LoadTrainingCheckpoint(
      dir, *model, registry_.get(), optimizer ? state.optimizer.get() : nullptr);
  // A damaged file fails only the ranks that read it: every rank learns the outcome
  // before the next collective, and all return the failing rank's error.
  RETURN_IF_ERROR(comm::AgreeOnStatus(
      group_.get(), core::Annotate(loaded.status(), absl::StrCat("loading checkpoint '", dir, "'")),
      absl::StrCat("loading checkpoint '", dir, "'"), options_.wrap.timeout));
  state.global_step = loaded->step;
  loaded->data_identity_changes = std::move(data.changes);
  loaded->data_identity_note = std::move(data.note);
  return loaded;
}

absl::StatusOr<ResumeResult> StageRunner::ResumeLatest(TrainModule& module, const std::string& root,
                                                       const LoadCheckpointOptions& options) {
  // Rank 0 looks (verifying a candidate reads all of it: once, not once per rank) and sends
  // every rank its finding: "found" or "none", the directory, then what it skipped.
  std::string finding;
  if (group_->rank() == 0) {
    absl::StatusOr<checkpoint::LatestCheckpoint> latest = checkpoint::FindLatestCheckpoint(root);
    if (latest.ok()) {
      finding = absl::StrJoin({std::string("found"), latest->dir}, "\n");
      for (const std::string& why : latest->skipped) absl::StrAppend(&finding, "\n", why);
    } else if (absl::IsNotFound(latest.status())) {
      finding = absl::StrCat("none\n", latest.status().message());
    } else {
      finding = absl::StrCat("error\n", latest.status().ToString());
    }
  }
  ASSIGN_OR_RETURN(std::vector<std::string> all,
                   comm::AllGatherBytes(group_.get(), finding, options_.wrap.timeout));
  std::vector<std::string> lines = absl::StrSplit(all[0], '\n');
  ResumeResult result;
  if (lines.size() < 2 || lines[0] == "error") {
    return absl::InternalError(absl::StrCat("resuming from the newest checkpoint under '", root,
                                            "': rank 0: ", lines.size() > 1 ? lines[1] : all[0]));
  }
  if (lines[0] == "none") return result;  // a fresh start
  result.dir = lines[1];
  result.skipped.assign(lines.begin() + 2, lines.end());
  ASSIGN_OR_RETURN(result.loaded, LoadCheckpoint(module, result.dir, options));
  result.resumed = true;
  return result;
}

absl::Status StageRunner::Release(TrainModule& module) {
  ASSIGN_OR_RETURN(std::shared_ptr<core::Module> model, ModelOf(module));
  return fsdp::Release(*model, registry_.get());
}

int64_t StageRunner::GlobalStep(TrainModule& module) {
  std::shared_ptr<core::Module> model = module.model();
  return model ? StateOf(model).global_step : 0;
}

optim::Optimizer* StageRunner::optimizer(TrainModule& module) {
  std::shared_ptr<core::Module> model = module.model();
  return model ? StateOf(model).optimizer.get() : nullptr;
}

}  // namespace integration
