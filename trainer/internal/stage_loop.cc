#include "trainer/internal/stage_loop.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/hf_model.h"
#include "checkpoint/safetensors.h"
#include "comm/agreement.h"
#include "core/allocator.h"
#include "core/cuda_device.h"
#include "core/format_bytes.h"
#include "core/roofline.h"
#include "core/status_macros.h"
#include "fsdp/runtime.h"
#include "fsdp/unit.h"
#include "integration/op_profile_report.h"

namespace integration {
namespace internal {
namespace {

// Every rank's peak bytes on its CUDA device (core's CUDA allocator counters), in rank
// order; an empty list on the CPU.
absl::StatusOr<std::vector<int64_t>> GatherDevicePeaks(comm::ProcessGroup* group,
                                                       core::Device device,
                                                       absl::Duration timeout) {
  std::vector<int64_t> peaks;
  if (!device.is_cuda()) return peaks;
  const int64_t mine = core::Allocator::Current(device)->Stats().peak_total;
  ASSIGN_OR_RETURN(std::vector<std::string> all,
                   comm::AllGatherBytes(group, absl::StrCat(mine), timeout));
  for (const std::string& text : all) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(text, &v)) {
      return absl::InternalError(absl::StrCat("peak device memory: a rank sent '", text, "'"));
    }
    peaks.push_back(v);
  }
  return peaks;
}

}  // namespace

std::string WrapLine(const WrapReport& w) {
  if (w.skipped) return "not wrapped";
  if (w.reused) {
    return absl::StrFormat(
        "reused the existing wrap: units reused %d of %d, parameter bytes "
        "copied on re-wrap %d",
        w.units_reused, w.units, w.param_bytes_copied);
  }
  return absl::StrFormat(
      "wrapped fresh: %d units (%d kept from earlier wraps), %s of "
      "parameters copied into shards",
      w.units, w.units_reused, core::FormatBytes(w.param_bytes_copied));
}

StageLoop::StageLoop(const JobOptions& job, const JobSetup& setup, StageRunner* runner,
                     TrainModule* trained, nlohmann::json* summary,
                     std::function<void(const std::string&)> say)
    : job_(job),
      setup_(setup),
      runner_(*runner),
      trained_(*trained),
      summary_(*summary),
      say_(std::move(say)) {}

absl::StatusOr<bool> StageLoop::Resume() {
  const bool fits =
      std::find(setup_.stages.begin(), setup_.stages.end(), Stage::kFit) != setup_.stages.end();
  LoadCheckpointOptions load;
  load.optimizer = fits;
  load.allow_data_change = job_.resume_allow_data_change;
  std::string dir = job_.resume_from;
  LoadedCheckpoint loaded;
  if (job_.resume_from == kResumeLatest) {
    const std::string root = runner_.options().checkpoint_dir;
    ASSIGN_OR_RETURN(ResumeResult latest, runner_.ResumeLatest(trained_, root, load));
    for (const std::string& why : latest.skipped) {
      say_(absl::StrCat("resume: passed over damaged checkpoint ", why));
    }
    if (!latest.resumed) {
      say_(absl::StrCat("resume: no complete checkpoint under ", root, ": starting fresh"));
      summary_["resumed_from"] = nullptr;
      return false;
    }
    dir = latest.dir;
    loaded = latest.loaded;
  } else {
    ASSIGN_OR_RETURN(loaded, runner_.LoadCheckpoint(trained_, dir, load));
  }
  // NOTE [Data position]: where in the epochs of the token files the saved run stood.
  std::string position;
  const auto epoch = loaded.data_position.find("data.epoch");
  const auto window = loaded.data_position.find("data.window");
  if (epoch != loaded.data_position.end() && window != loaded.data_position.end()) {
    position = absl::StrCat(", data epoch ", epoch->second, " window ", window->second);
  }
  say_(absl::StrFormat("loaded checkpoint %s (saved at step %d by %d ranks%s%s); this rank read %s",
                       dir, loaded.step, loaded.saved_world_size,
                       fits ? ", with optimizer state" : "", position,
                       core::FormatBytes(loaded.bytes_read)));
  // NOTE [Data identity]: what --resume_allow_data_change let through, or why nothing
  // was compared.
  nlohmann::json changes = nlohmann::json::array();
  for (const DataIdentityChange& c : loaded.data_identity_changes) {
    say_(absl::StrCat("resuming on other data (--resume_allow_data_change): ", c.ToString()));
    changes.push_back(c.ToString());
  }
  if (!loaded.data_identity_note.empty()) say_(absl::StrCat("note: ", loaded.data_identity_note));
  summary_["resumed_from"] = dir;
  summary_["resumed_step"] = loaded.step;
  summary_["resumed_data_position"] = loaded.data_position;
  summary_["resumed_data_changes"] = changes;
  return true;
}

absl::Status StageLoop::LoadHf() {
  ASSIGN_OR_RETURN(const WrapReport wrap, runner_.Wrap(trained_));
  RETURN_IF_ERROR(checkpoint::LoadHfModel(job_.hf_dir, *trained_.model(), &runner_.registry()));
  say_(absl::StrCat("loaded Hugging Face checkpoint ", job_.hf_dir, " into each rank's shards; ",
                    WrapLine(wrap)));
  return absl::OkStatus();
}

absl::Status StageLoop::Run(Stage stage) {
  switch (stage) {
    case Stage::kFit:
      return Fit();
    case Stage::kValidate:
    case Stage::kTest:
      return Evaluate(stage);
    case Stage::kPredict:
      return Predict();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--stages: unknown stage ", static_cast<int>(stage)));
}

absl::Status StageLoop::Fit() {
  const StageOptions& options = runner_.options();
  const int64_t from = runner_.GlobalStep(trained_);
  // NOTE [Training to a global step]: --max_steps counts from step 0, --steps from here.
  const int64_t steps =
      options.max_steps > 0 ? std::max<int64_t>(0, options.max_steps - from) : options.fit_steps;
  say_(absl::StrFormat("fit: %d steps of %d x %d tokens from global step %d%s", steps,
                       options.train_batch_size, setup_.module->train_options().seq_len, from,
                       options.max_steps > 0
                           ? absl::StrCat(" to global step ", options.max_steps, " (--max_steps)")
                           : ""));
  fsdp::Runtime& runtime = runner_.registry().runtime();
  runtime.ResetCommTiming();
  ASSIGN_OR_RETURN(FitResult fit, runner_.Fit(trained_));
  say_(absl::StrCat("fit: ", WrapLine(fit.report.wrap)));

  // NOTE [Comm overlap] in fsdp/unit.h: this rank's collectives during the fit.
  const fsdp::CommTiming c = runtime.comm_timing();
  summary_["comm_overlap"] = CommOverlapJson(c);
  // The units' sizes, for memory bounds computed from them (bench/cpu).
  const std::shared_ptr<core::Module> model = trained_.model();
  summary_["fsdp_units"] =
      model != nullptr ? UnitsJson(*model, runner_.registry()) : nlohmann::json::array();
  summary_["limit_all_gathers"] = options.wrap.limit_all_gathers;
  if (c.all_gathers + c.reductions > 0) {
    say_(absl::StrFormat(
        "fit: comm overlap: %d all-gathers ran %.3f s, waited %.3f s (%.0f%% hidden); "
        "%d reduce-scatters ran %.3f s, waited %.3f s (%.0f%% hidden)",
        c.all_gathers, absl::ToDoubleSeconds(c.all_gather_run),
        absl::ToDoubleSeconds(c.all_gather_wait),
        100 * fsdp::CommTiming::Hidden(c.all_gather_run, c.all_gather_wait), c.reductions,
        absl::ToDoubleSeconds(c.reduce_run), absl::ToDoubleSeconds(c.reduce_wait),
        100 * fsdp::CommTiming::Hidden(c.reduce_run, c.reduce_wait)));
  }

  if (!fit.profiled_ops.empty()) AddOpProfile(fit.profiled_ops);
  if (fit.report.wrap.reused) totals_.bytes_copied_on_rewrap += fit.report.wrap.param_bytes_copied;
  for (size_t i = 0; i < fit.losses.size(); ++i) {
    totals_.loss_points.push_back({static_cast<double>(fit.first_step + i + 1), fit.losses[i]});
    totals_.fit_losses.push_back(fit.losses[i]);
  }
  summary_["final_train_loss"] = fit.final_loss;
  summary_["fit_seconds"] = fit.report.seconds;
  summary_["fit_final_save_seconds"] = fit.final_save_seconds;
  totals_.tokens_per_second = fit.items_per_second;
  totals_.AddMemory(fit.report.memory);
  // The fit's own peaks (the wrap included) beside the estimate they were checked against.
  nlohmann::json fit_peaks = nlohmann::json::array();
  int64_t highest = 0;
  for (const RankMemory& m : fit.report.memory) {
    fit_peaks.push_back(MemoryJson(m));
    highest = std::max(highest, m.peak_total);
  }
  summary_["fit_peak_bytes_per_rank"] = fit_peaks;
  const int64_t estimated = summary_["memory_estimate"]["per_rank_bytes"].get<int64_t>();
  // Without its activations the estimate is a lower bound: no ratio then.
  if (highest > 0 && setup_.estimate.activations_estimated) {
    summary_["memory_estimate_over_fit_peak"] = static_cast<double>(estimated) / highest;
  }
  if (!fit.checkpoint_dir.empty()) {
    say_(absl::StrCat("fit: saved ",
                      fit.checkpoints.size() > 1
                          ? absl::StrCat(fit.checkpoints.size(), " checkpoints, the last ")
                          : "checkpoint ",
                      fit.checkpoint_dir, " (model and optimizer, step ", fit.global_step, ")"));
    summary_["checkpoint_dir"] = fit.checkpoint_dir;
    summary_["checkpoints_saved"] = fit.checkpoints.size();
  }
  return absl::OkStatus();
}

void StageLoop::AddOpProfile(const std::vector<core::OpRecord>& ops) {
  // This rank's share of the step: its rows of the global batch.
  const StageOptions& options = runner_.options();
  const int world = runner_.group()->size();
  const DecoderSpec& model = setup_.module->spec();
  const int64_t seq_len = setup_.module->train_options().seq_len;
  const double tokens = static_cast<double>(options.train_batch_size) / world * seq_len;
  // 6 N + 12 L T C: the dense-transformer count, for the GPT and the Llama alike.
  const double flops_per_token = GptFlopsPerToken(summary_["model_parameters"].get<int64_t>(),
                                                  model.num_layers, seq_len, model.hidden_size);
  // The estimate on the rates of the device the step ran on (NOTE [Rate sets] in
  // core/roofline.h).
  const core::Device device = setup_.module->train_options().device;
  std::string device_name = device.ToString();
  if (device.is_cuda()) {
    absl::StatusOr<std::string> name = core::CudaDeviceName(device.index);
    if (name.ok()) device_name = *name;
  }
  std::string rates_note;
  const core::DeviceRates rates = ReportRates(device_name, &rates_note);
  const OpProfileReport report = ReportOpProfile(ops, rates, flops_per_token * tokens, tokens);
  say_(absl::StrFormat("op profile of fit step %d (this rank's ops; NOTE [Op accounting]):",
                       options.profile_step + 1));
  if (!rates_note.empty()) say_(absl::StrCat("  ", rates_note));
  for (const std::string& line : report.lines) say_(absl::StrCat("  ", line));
  summary_["op_profile"] = report.json;
  summary_["op_profile"]["rates_note"] =
      rates_note.empty() ? nlohmann::json(nullptr) : nlohmann::json(rates_note);
}

absl::Status StageLoop::Evaluate(Stage stage) {
  ASSIGN_OR_RETURN(EvalResult eval,
                   stage == Stage::kTest ? runner_.Test(trained_) : runner_.Validate(trained_));
  // NOTE [Whole-set evaluation]: token files' validate and test cover the evaluation file.
  say_(absl::StrFormat(
      "%s: loss %.4f over %d tokens%s; %s", StageName(stage), eval.loss, eval.count,
      eval.whole_set ? absl::StrFormat(" (the whole evaluation set: %d batches)", eval.batches)
                     : "",
      WrapLine(eval.report.wrap)));
  if (eval.report.wrap.reused)
    totals_.bytes_copied_on_rewrap += eval.report.wrap.param_bytes_copied;
  summary_[StageName(stage) + "_loss"] = eval.loss;
  if (stage == Stage::kTest) {
    summary_["units_reused"] = eval.report.wrap.units_reused;
    summary_["test_wrap_reused"] = eval.report.wrap.reused;
  }
  totals_.AddMemory(eval.report.memory);
  return absl::OkStatus();
}

absl::Status StageLoop::Predict() {
  ASSIGN_OR_RETURN(PredictResult predicted, runner_.Predict(trained_));
  std::string first;
  if (!predicted.outputs.empty()) {
    const core::Tensor& ids = predicted.outputs[0];
    for (int64_t t = 0; t < std::min<int64_t>(ids.size(-1), 16); ++t) {
      absl::StrAppend(&first, t > 0 ? " " : "", ids.data<int32_t>()[t]);
    }
  }
  say_(absl::StrCat("predict: ", predicted.outputs.size(), " batches; rank 0's first row: ", first,
                    " ...; ", WrapLine(predicted.report.wrap)));
  if (predicted.report.wrap.reused) {
    totals_.bytes_copied_on_rewrap += predicted.report.wrap.param_bytes_copied;
  }
  totals_.AddMemory(predicted.report.memory);
  return absl::OkStatus();
}

absl::Status StageLoop::AddRunFigures(const ThroughputMeter& meter, comm::ProcessGroup* group,
                                      core::Device device, absl::Duration timeout) {
  summary_["param_bytes_copied_on_rewrap"] = totals_.bytes_copied_on_rewrap;
  summary_["fresh_wraps"] = runner_.registry().counters().wraps;
  summary_["global_step"] = runner_.GlobalStep(trained_);
  summary_["tokens_per_second"] = totals_.tokens_per_second;
  // Throughput after the warm-up and MFU (NOTE in integration/device_setup.h).
  const DecoderSpec& model = setup_.module->spec();
  const int64_t seq_len = setup_.module->train_options().seq_len;
  const int64_t tokens_per_step =
      static_cast<int64_t>(runner_.options().train_batch_size) * seq_len;
  const std::optional<double> steady = meter.TokensPerSecond(tokens_per_step);
  summary_["warmup_steps_excluded"] = meter.warmup_steps();
  summary_["tokens_per_second_after_warmup"] =
      steady.has_value() ? nlohmann::json(*steady) : nlohmann::json();
  // The same steps on a CUDA device, timed by CUDA events (absent on the CPU).
  ASSIGN_OR_RETURN(const std::optional<DeviceStepTimes> device_timed,
                   meter.DeviceTimed(tokens_per_step));
  if (device_timed.has_value()) summary_["device_timed"] = DeviceTimedJson(*device_timed);
  summary_["peak_device_memory_bytes"] = nullptr;
  // The unsharded count (while wrapped, parameters are local slices).
  MfuModel mfu_model;
  mfu_model.parameters = summary_["model_parameters"].get<int64_t>();
  mfu_model.n_layer = model.num_layers;
  mfu_model.seq_len = seq_len;
  mfu_model.n_embd = model.hidden_size;
  const double flops_per_token = AddMfu(mfu_model, device, group->size(), steady, &summary_);
  if (device.is_cuda()) {
    say_(absl::StrFormat(
        "throughput: %s tokens/s after %d warm-up steps%s; model FLOPs per token "
        "6 N + 12 L T C = 6 x %d + 12 x %d x %d x %d = %.4g; MFU %s",
        steady.has_value() ? absl::StrFormat("%.0f", *steady) : "-", meter.warmup_steps(),
        device_timed.has_value()
            ? absl::StrCat(" (", DeviceTimedText(DeviceTimedJson(*device_timed)), ")")
            : "",
        mfu_model.parameters, mfu_model.n_layer, mfu_model.seq_len, mfu_model.n_embd,
        flops_per_token,
        summary_["mfu"].is_null()
            ? "- (unknown device peak or no steady-state steps)"
            : absl::StrFormat("%.1f%%", 100 * summary_["mfu"].get<double>())));
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> device_peaks, GatherDevicePeaks(group, device, timeout));
  if (!device_peaks.empty()) summary_["peak_device_memory_bytes"] = device_peaks;
  return absl::OkStatus();
}

absl::Status StageLoop::Release() {
  RETURN_IF_ERROR(runner_.Release(trained_));
  absl::Status exported = absl::OkStatus();
  if (runner_.group()->rank() == 0) {
    exported = checkpoint::ExportSafetensors(
        job_.safetensors_path, *setup_.module->model(),
        {{"format", "pt"}, {"global_step", absl::StrCat(runner_.GlobalStep(trained_))}},
        setup_.full_shapes);
    if (exported.ok() && !job_.export_hf_dir.empty()) {
      exported = checkpoint::ExportHfModel(*setup_.module->model(), job_.export_hf_dir);
    }
  }
  // Rank 0 alone writes: the others learn how it went before the plain test's collectives.
  RETURN_IF_ERROR(comm::AgreeOnStatus(runner_.group().get(), exported, "export the released model",
                                      runner_.options().wrap.timeout));
  summary_["safetensors_path"] = job_.safetensors_path;
  if (!job_.export_hf_dir.empty()) {
    say_(
        absl::StrCat("release: exported the Hugging Face layout (config.json, model.safetensors) "
                     "to ",
                     job_.export_hf_dir));
    summary_["export_hf_dir"] = job_.export_hf_dir;
  }
  EvalOptions plain;
  plain.wrap = false;
  ASSIGN_OR_RETURN(EvalResult released, runner_.Test(trained_, plain));
  say_(
      absl::StrFormat("released: plain module (no units, no process group needed), wrote %s; "
                      "test loss %.4f",
                      job_.safetensors_path, released.loss));
  summary_["released_test_loss"] = released.loss;
  totals_.AddMemory(released.report.memory);
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace integration
