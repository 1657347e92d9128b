#include "trainer/internal/job_summary.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "core/allocator.h"
#include "core/cuda_device.h"
#include "core/format_bytes.h"
#include "core/status_macros.h"
#include "integration/device_setup.h"
#include "trainer/charts/svg_chart.h"

namespace integration {
namespace internal {

nlohmann::json MemoryJson(const RankMemory& m) {
  nlohmann::json j;
  for (int t = 0; t < core::kNumMemoryTags; ++t) {
    j[core::MemoryTagName(static_cast<core::MemoryTag>(t))] = m.peak_by_tag[t];
  }
  j["total"] = m.peak_total;
  return j;
}

namespace {

// The summary without the per-step losses (those stay in summary.json).
nlohmann::json LastLine(nlohmann::json summary) {
  summary.erase("fit_losses");
  return summary;
}

absl::Status WriteCharts(const std::string& dir,
                         const std::vector<std::pair<double, double>>& losses, double floor,
                         const std::vector<RankMemory>& memory, nlohmann::json* summary) {
  const nlohmann::json& test = (*summary)["test_loss"];
  using charts::BarGroup;
  using charts::Series;
  if (!losses.empty()) {
    charts::LineChartOptions options;
    options.title = "Training loss (global batch mean)";
    options.x_label = "global step";
    options.y_label = "cross-entropy (nats/token)";
    if (std::isfinite(floor)) {
      options.lines.push_back({absl::StrFormat("entropy floor %.3f", floor), floor});
    }
    if (test.is_number()) {
      options.lines.push_back(
          {absl::StrFormat("test loss %.3f", test.get<double>()), test.get<double>()});
    }
    ASSIGN_OR_RETURN(std::string svg, charts::LineChart({Series{"train loss", losses}}, options));
    const std::string path = dir + "/loss.svg";
    RETURN_IF_ERROR(charts::WriteTextFile(path, svg));
    (*summary)["loss_chart"] = path;
  }
  std::vector<BarGroup> groups;
  for (size_t r = 0; r < memory.size(); ++r) {
    BarGroup g;
    g.label = absl::StrCat("rank ", r);
    for (int t = 0; t < core::kNumMemoryTags; ++t) {
      g.bars.push_back({core::MemoryTagName(static_cast<core::MemoryTag>(t)),
                        static_cast<double>(memory[r].peak_by_tag[t])});
    }
    groups.push_back(std::move(g));
  }
  charts::BarChartOptions options;
  options.title = "Peak memory per rank by tag (whole run)";
  options.y_label = "bytes";
  options.bytes = true;
  ASSIGN_OR_RETURN(std::string svg, charts::GroupedBarChart(groups, options));
  const std::string path = dir + "/memory.svg";
  RETURN_IF_ERROR(charts::WriteTextFile(path, svg));
  (*summary)["memory_chart"] = path;
  return absl::OkStatus();
}

}  // namespace

void RunTotals::AddMemory(const std::vector<RankMemory>& stage) {
  if (memory.size() < stage.size()) memory.resize(stage.size());
  for (size_t r = 0; r < stage.size(); ++r) {
    for (int t = 0; t < core::kNumMemoryTags; ++t) {
      memory[r].peak_by_tag[t] = std::max(memory[r].peak_by_tag[t], stage[r].peak_by_tag[t]);
    }
    memory[r].peak_total = std::max(memory[r].peak_total, stage[r].peak_total);
  }
}

nlohmann::json NewSummary(const JobFacts& facts) {
  nlohmann::json summary;
  summary["world_size"] = facts.world_size;
  summary["intra_op_threads"] = facts.intra_op_threads;
  summary["gemm_library"] = facts.gemm_library;
  summary["backend"] = facts.backend;
  summary["device"] = facts.cuda ? "cuda" : "cpu";
  // Unknown (null) when the job reads token files.
  summary["language_vocab_size"] =
      facts.language_vocab_size > 0 ? nlohmann::json(facts.language_vocab_size) : nlohmann::json();
  summary["strategy"] = facts.strategy;
  summary["stages"] = facts.stages;
  summary["model"] = facts.model;
  // NOTE [Hugging Face start] in job_options.h; null when none. "export_hf_dir" is
  // filled in by the release.
  summary["hf_dir"] = facts.hf_dir.empty() ? nlohmann::json() : nlohmann::json(facts.hf_dir);
  summary["model_parameters"] = facts.model_parameters;
  const MemoryEstimate& e = facts.memory_estimate;
  summary["memory_estimate"] = {
      {"per_rank_bytes", e.per_rank_bytes},
      {"model_state_bytes", e.model_state_bytes},
      {"gathered_bytes", e.gathered_bytes},
      // Unknown (null) where the GPT's formula does not apply (NOTE [Memory estimate]).
      {"activation_bytes",
       e.activations_estimated ? nlohmann::json(e.activation_bytes) : nlohmann::json()},
      {"activations_estimated", e.activations_estimated},
      {"comm_bytes", e.comm_bytes},
      {"init_bytes", e.init_bytes},
      {"describe", e.Describe()}};
  if (!e.activations_estimated) summary["memory_estimate"]["note"] = kActivationsNotEstimated;
  summary["fit_peak_bytes_per_rank"] = nullptr;
  summary["memory_estimate_over_fit_peak"] = nullptr;
  summary["entropy_floor"] =
      std::isfinite(facts.entropy_floor) ? nlohmann::json(facts.entropy_floor) : nlohmann::json();
  for (const char* figure : {"final_train_loss", "fit_seconds", "fit_final_save_seconds",
                             "test_loss", "validate_loss", "released_test_loss", "checkpoint_dir",
                             "safetensors_path", "export_hf_dir", "resumed_from"}) {
    summary[figure] = nullptr;
  }
  summary["checkpoints_saved"] = 0;
  summary["units_reused"] = 0;
  summary["param_bytes_copied_on_rewrap"] = 0;
  return summary;
}

nlohmann::json CommOverlapJson(const fsdp::CommTiming& c) {
  nlohmann::json overlap;
  overlap["all_gathers"] = c.all_gathers;
  overlap["all_gather_seconds"] = absl::ToDoubleSeconds(c.all_gather_run);
  overlap["all_gather_wait_seconds"] = absl::ToDoubleSeconds(c.all_gather_wait);
  overlap["all_gather_hidden"] = fsdp::CommTiming::Hidden(c.all_gather_run, c.all_gather_wait);
  overlap["reductions"] = c.reductions;
  overlap["reduce_seconds"] = absl::ToDoubleSeconds(c.reduce_run);
  overlap["reduce_wait_seconds"] = absl::ToDoubleSeconds(c.reduce_wait);
  overlap["reduce_hidden"] = fsdp::CommTiming::Hidden(c.reduce_run, c.reduce_wait);
  overlap["what"] =
      "rank 0's all-gathers and reduce-scatters during the fit: seconds they ran, "
      "seconds the rank waited for them (gloo, shm: the host blocked; NCCL: the compute "
      "stream stood, from CUDA events), and hidden = 1 - wait / run, the part that "
      "overlapped compute";
  return overlap;
}

nlohmann::json UnitsJson(core::Module& model, fsdp::WrapperRegistry& registry) {
  nlohmann::json units = nlohmann::json::array();
  for (const std::shared_ptr<fsdp::Unit>& u : registry.UnitsIn(model)) {
    units.push_back({{"label", u->label()},
                     {"numel", u->flat().numel()},
                     {"padded_numel", u->flat().padded_numel()}});
  }
  return units;
}

double AddMfu(const MfuModel& model, core::Device device, int world_size,
              std::optional<double> steady, nlohmann::json* summary) {
  nlohmann::json mfu;
  const double flops_per_token =
      GptFlopsPerToken(model.parameters, model.n_layer, model.seq_len, model.n_embd);
  (*summary)["mfu"] = nullptr;
  mfu["formula"] = "(6 N + 12 L T C) x tokens_per_second_after_warmup / (world_size x peak_flops)";
  mfu["N"] = model.parameters;
  mfu["L"] = model.n_layer;
  mfu["T"] = model.seq_len;
  mfu["C"] = model.n_embd;
  mfu["flops_per_token"] = flops_per_token;
  mfu["peak_flops_per_device"] = nullptr;
  if (device.is_cuda()) {
    absl::StatusOr<std::string> name = core::CudaDeviceName(device.index);
    mfu["device_name"] = name.ok() ? *name : std::string(name.status().message());
    const std::optional<double> peak = name.ok() ? PeakBf16FlopsFromName(*name) : std::nullopt;
    if (peak.has_value()) {
      mfu["peak_flops_per_device"] = *peak;
      if (steady.has_value()) {
        (*summary)["mfu"] = flops_per_token * *steady / (static_cast<double>(world_size) * *peak);
      }
    }
  }
  (*summary)["mfu_inputs"] = mfu;
  return flops_per_token;
}

nlohmann::json DeviceTimedJson(const DeviceStepTimes& t) {
  return {{"basis", "CUDA events on the compute stream"},
          {"steps", t.steps},
          {"step_ms_median", t.step_ms_median},
          {"step_ms_mean", t.step_ms_mean},
          {"tokens_per_second", t.tokens_per_second}};
}

std::string DeviceTimedText(const nlohmann::json& device_timed) {
  return absl::StrFormat("%.0f tokens/s by CUDA events, median step %.2f ms over %d steps",
                         device_timed["tokens_per_second"].get<double>(),
                         device_timed["step_ms_median"].get<double>(),
                         device_timed["steps"].get<int64_t>());
}

absl::Status WriteSummary(const std::string& output_dir, const RunTotals& totals,
                          double entropy_floor, nlohmann::json* summary) {
  nlohmann::json& s = *summary;
  // The floor is NaN (unknown) on token files: no ratio then.
  if (!s["test_loss"].is_null() && std::isfinite(entropy_floor)) {
    s["test_loss_over_floor"] = s["test_loss"].get<double>() / entropy_floor;
  }
  nlohmann::json peaks = nlohmann::json::array();
  for (const RankMemory& m : totals.memory) peaks.push_back(MemoryJson(m));
  s["peak_bytes_per_rank"] = peaks;
  RETURN_IF_ERROR(
      WriteCharts(output_dir, totals.loss_points, entropy_floor, totals.memory, summary));
  s["fit_losses"] = totals.fit_losses;
  return charts::WriteTextFile(absl::StrCat(output_dir, "/", kSummaryFile), s.dump(2) + "\n");
}

void PrintSummary(const nlohmann::json& summary) {
  std::printf("%s", SummaryTable(summary).c_str());
  std::cout << LastLine(summary).dump() << std::endl;
}

// The summary table, from the summary JSON (so the launching parent prints the same one).
std::string SummaryTable(const nlohmann::json& s) {
  std::ostringstream out;
  auto row = [&](const std::string& name, const std::string& value) {
    out << absl::StrFormat("  %-34s %s\n", name, value);
  };
  auto number = [&](const char* key, const char* format) -> std::string {
    if (!s.contains(key) || s[key].is_null()) return "-";
    return absl::StrFormat(format, s[key].get<double>());
  };
  out << "\nsummary\n";
  row("world size / backend / strategy",
      absl::StrCat(s["world_size"].get<int>(), " / ", s["backend"].get<std::string>(), " / ",
                   s["strategy"].get<std::string>()));
  if (s.contains("intra_op_threads")) {
    row("intra-op threads per rank / GEMM", absl::StrCat(s["intra_op_threads"].get<int>(), " / ",
                                                         s["gemm_library"].get<std::string>()));
  }
  if (s.contains("model")) row("model", s["model"].get<std::string>());
  row("model parameters", absl::StrCat(s["model_parameters"].get<int64_t>()));
  row("stages", s["stages"].get<std::string>());
  row("global steps", absl::StrCat(s["global_step"].get<int64_t>()));
  // NOTE [Run log] (run_log.h): what failures cost a restarted run.
  if (s.contains("restarts") && s["restarts"].get<int>() > 0) {
    row("restarts / steps recomputed / lost",
        absl::StrFormat("%d / %d / %.1f s", s["restarts"].get<int>(),
                        s["steps_recomputed"].get<int64_t>(), s["seconds_lost"].get<double>()));
  }
  row("final train loss", number("final_train_loss", "%.4f"));
  row("test loss (wrapped)", number("test_loss", "%.4f"));
  row("test loss (released plain module)", number("released_test_loss", "%.4f"));
  row("entropy floor", number("entropy_floor", "%.4f"));
  row("test loss over floor", number("test_loss_over_floor", "%.4f"));
  row("units reused by the test stage", absl::StrCat(s["units_reused"].get<int>()));
  row("param bytes copied on re-wrap",
      absl::StrCat(s["param_bytes_copied_on_rewrap"].get<int64_t>()));
  row("fresh wraps (registry)", absl::StrCat(s["fresh_wraps"].get<int64_t>()));
  row("tokens/s (fit, all ranks)", number("tokens_per_second", "%.0f"));
  if (s.contains("tokens_per_second_after_warmup")) {
    row(absl::StrCat(
            "tokens/s after ",
            s.contains("warmup_steps_excluded") ? s["warmup_steps_excluded"].get<int64_t>() : 0,
            " warm-up steps"),
        number("tokens_per_second_after_warmup", "%.0f"));
  }
  if (s.contains("device_timed")) {
    row("tokens/s after warm-up, device-timed", DeviceTimedText(s["device_timed"]));
  }
  if (s.contains("device")) row("device", s["device"].get<std::string>());
  if (s.contains("mfu") && !s["mfu"].is_null()) {
    row("MFU (bf16 dense peak)", absl::StrFormat("%.1f%%", 100 * s["mfu"].get<double>()));
  }
  if (s.contains("peak_device_memory_bytes") && s["peak_device_memory_bytes"].is_array()) {
    const auto& dev = s["peak_device_memory_bytes"];
    for (size_t r = 0; r < dev.size(); ++r) {
      row(absl::StrCat("peak device memory rank ", r), core::FormatBytes(dev[r].get<int64_t>()));
    }
  }
  const auto& peaks = s["peak_bytes_per_rank"];
  for (size_t r = 0; r < peaks.size(); ++r) {
    std::string line;
    for (auto it = peaks[r].begin(); it != peaks[r].end(); ++it) {
      if (it.key() == "total") continue;
      if (it.value().get<int64_t>() == 0) continue;
      absl::StrAppend(&line, it.key(), "=", core::FormatBytes(it.value().get<int64_t>()), " ");
    }
    absl::StrAppend(&line, "total=", core::FormatBytes(peaks[r]["total"].get<int64_t>()));
    row(absl::StrCat("peak memory rank ", r), line);
  }
  row("checkpoint", s["checkpoint_dir"].is_null() ? "-" : s["checkpoint_dir"].get<std::string>());
  row("safetensors",
      s["safetensors_path"].is_null() ? "-" : s["safetensors_path"].get<std::string>());
  if (s.contains("hf_dir") && !s["hf_dir"].is_null()) {
    row("started from (Hugging Face)", s["hf_dir"].get<std::string>());
  }
  if (s.contains("export_hf_dir") && !s["export_hf_dir"].is_null()) {
    row("exported (Hugging Face)", s["export_hf_dir"].get<std::string>());
  }
  for (const char* chart : {"loss_chart", "memory_chart"}) {
    if (s.contains(chart) && !s[chart].is_null()) row(chart, s[chart].get<std::string>());
  }
  return out.str();
}

}  // namespace internal
}  // namespace integration
