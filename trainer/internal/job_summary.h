// The main job's summary (trainer/main_job.cc): one JSON object of the run's figures,
// which rank 0 writes to <output_dir>/summary.json with SVG charts beside it, and which
// whoever prints it (rank 0, or the parent that launched the ranks) shows as a table
// followed by one JSON line.
//
//   nlohmann::json summary = integration::internal::NewSummary(facts);
//   ...  // the stages add their figures
//   RETURN_IF_ERROR(integration::internal::WriteSummary(dir, totals, floor, &summary));
//   integration::internal::PrintSummary(summary);
#ifndef TRAINER_INTERNAL_JOB_SUMMARY_H_
#define TRAINER_INTERNAL_JOB_SUMMARY_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/module.h"
#include "fsdp/registry.h"
#include "fsdp/unit.h"
#include "integration/device_setup.h"
#include "integration/memory_estimate.h"
#include "integration/stage_runner.h"
#include "nlohmann/json.hpp"

namespace integration {
namespace internal {

// The summary's file name in the output directory.
inline constexpr char kSummaryFile[] = "summary.json";

// What the stages of one run add up to (on every rank; rank 0's go into the summary).
struct RunTotals {
  // Peaks over all stages, rank by rank.
  std::vector<RankMemory> memory;
  // (global step, loss) of every fit step, and the losses alone.
  std::vector<std::pair<double, double>> loss_points;
  std::vector<double> fit_losses;
  // Parameter bytes the stages that reused a wrap copied (0 when the registry works).
  int64_t bytes_copied_on_rewrap = 0;
  // The last fit's items per second, all ranks.
  double tokens_per_second = 0;

  // Folds a stage's per-rank peaks into `memory`.
  void AddMemory(const std::vector<RankMemory>& stage);
};

// What the summary says about the job before any stage ran.
struct JobFacts {
  int world_size = 0;
  int intra_op_threads = 0;
  std::string gemm_library;
  std::string backend;
  bool cuda = false;
  int64_t language_vocab_size = 0;
  std::string strategy;
  std::string stages;
  std::string model;   // --model: "gpt" or "llama"
  std::string hf_dir;  // the Hugging Face directory the model came from; "" for none
  int64_t model_parameters = 0;
  double entropy_floor = 0;
  // The per-rank memory estimate (NOTE [Memory estimate] in integration/memory_estimate.h),
  // compared with the fit's measured peak in the summary.
  MemoryEstimate memory_estimate;
};

// A rank's peak bytes by tag name, and "total".
nlohmann::json MemoryJson(const RankMemory& m);

// The summary of a job that has not run a stage yet: the facts, and null or 0 for every
// figure a stage fills in.
nlohmann::json NewSummary(const JobFacts& facts);

// NOTE [Comm overlap] in fsdp/unit.h: a rank's all-gathers and reduce-scatters during a
// fit, as the summary's "comm_overlap".
nlohmann::json CommOverlapJson(const fsdp::CommTiming& timing);

// The summary's "fsdp_units": label, numel and padded numel of each unit of `model`.
nlohmann::json UnitsJson(core::Module& model, fsdp::WrapperRegistry& registry);

// What the model FLOPs per token of a GPT (or a Llama: the same dense-transformer count)
// depend on (integration::GptFlopsPerToken).
struct MfuModel {
  int64_t parameters = 0;  // unsharded
  int64_t n_layer = 0;
  int64_t seq_len = 0;
  int64_t n_embd = 0;
};

// The model-FLOPs utilisation inputs and result (NOTE in integration/device_setup.h) of a
// GPT or Llama training run at `tokens_per_second_after_warmup` on `world_size` devices: sets the
// summary's "mfu" (null unless the device's peak and the throughput are known) and
// "mfu_inputs"; returns the model FLOPs per token.
double AddMfu(const MfuModel& model, core::Device device, int world_size,
              std::optional<double> tokens_per_second_after_warmup, nlohmann::json* summary);

// The summary's "device_timed": the fit's steps after the warm-up timed on rank 0's device
// (integration::ThroughputMeter::DeviceTimed): {"basis": "CUDA events on the compute
// stream", "steps", "step_ms_median", "step_ms_mean", "tokens_per_second"}.
nlohmann::json DeviceTimedJson(const DeviceStepTimes& t);

// A "device_timed" object as text, for the throughput line and the summary table:
// "301234 tokens/s by CUDA events, median step 54.32 ms over 26 steps".
std::string DeviceTimedText(const nlohmann::json& device_timed);

// Rank 0's last step: fills in the figures from `totals` and the test loss over
// `entropy_floor`, writes the loss and memory charts and then the summary (with the
// per-step losses) into `output_dir`.
absl::Status WriteSummary(const std::string& output_dir, const RunTotals& totals,
                          double entropy_floor, nlohmann::json* summary);

// The summary table, then the summary without the per-step losses as one JSON line, on
// stdout.
void PrintSummary(const nlohmann::json& summary);

// The summary table alone, as PrintSummary prints it.
std::string SummaryTable(const nlohmann::json& summary);

}  // namespace internal
}  // namespace integration

#endif  // TRAINER_INTERNAL_JOB_SUMMARY_H_
