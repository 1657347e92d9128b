// The main job's stages (trainer/main_job.cc) on one rank: loading --resume_from or
// the --hf_dir weights, fit (and its checkpoint), validate, test, predict, the run's
// figures, and the release (safetensors and Hugging Face exports and a test of the plain
// module). Each step prints its line on rank 0 and adds its figures to the summary
// (trainer/internal/job_summary.h).
//
//   integration::internal::StageLoop loop(job, setup, runner.get(), &timed, &summary, say);
//   if (!job.resume_from.empty()) {
//     RETURN_IF_ERROR(loop.Resume());
//   } else if (!job.hf_dir.empty()) {
//     RETURN_IF_ERROR(loop.LoadHf());
//   }
//   for (integration::Stage stage : setup.stages) RETURN_IF_ERROR(loop.Run(stage));
//   RETURN_IF_ERROR(loop.AddRunFigures(meter, dist.group.get(), dist.device, timeout));
//   if (job.release) RETURN_IF_ERROR(loop.Release());
//
// Every call is a collective over the runner's group, as StageRunner's are.
#ifndef TRAINER_INTERNAL_STAGE_LOOP_H_
#define TRAINER_INTERNAL_STAGE_LOOP_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "comm/process_group.h"
#include "core/device.h"
#include "core/op_profile.h"
#include "integration/device_setup.h"
#include "integration/stage_runner.h"
#include "integration/train_module.h"
#include "nlohmann/json.hpp"
#include "trainer/internal/job_options.h"
#include "trainer/internal/job_setup.h"
#include "trainer/internal/job_summary.h"

namespace integration {
namespace internal {

// "reused the existing wrap: ...", "wrapped fresh: ..." or "not wrapped".
std::string WrapLine(const WrapReport& wrap);

class StageLoop {
 public:
  // `say` prints a line (on rank 0). None of the pointers is owned; all outlive the loop.
  StageLoop(const JobOptions& job, const JobSetup& setup, StageRunner* runner, TrainModule* trained,
            nlohmann::json* summary, std::function<void(const std::string&)> say);

  // Loads --resume_from (with the optimizer state when the stages fit); with
  // --resume_from=latest the newest complete checkpoint under the stages' checkpoint_dir,
  // saying which damaged ones it passed over. False when there was none (a fresh start).
  absl::StatusOr<bool> Resume();
  // NOTE [Hugging Face start] (job_options.h): wraps the model and loads job.hf_dir's
  // weights straight into this rank's shards; the stages reuse the wrap.
  absl::Status LoadHf();
  // One stage, as StageRunner runs it.
  absl::Status Run(Stage stage);
  // After the stages: the registry's counters, the global step, the throughput after
  // the warm-up measured by `meter` (and on CUDA its device-timed figure, "device_timed"),
  // the MFU inputs, every rank's peak device memory.
  absl::Status AddRunFigures(const ThroughputMeter& meter, comm::ProcessGroup* group,
                             core::Device device, absl::Duration timeout);
  // Releases the model, exports it as safetensors and, with an export_hf_dir, in the
  // Hugging Face layout (rank 0; every rank learns the outcome), and tests the plain module.
  absl::Status Release();

  // What the stages added up to so far.
  const RunTotals& totals() const { return totals_; }

 private:
  absl::Status Fit();
  // Prints the profiled fit step's table and adds summary.json's "op_profile".
  void AddOpProfile(const std::vector<core::OpRecord>& ops);
  absl::Status Evaluate(Stage stage);
  absl::Status Predict();

  const JobOptions& job_;
  const JobSetup& setup_;
  StageRunner& runner_;
  TrainModule& trained_;
  nlohmann::json& summary_;
  std::function<void(const std::string&)> say_;
  RunTotals totals_;
};

}  // namespace internal
}  // namespace integration

#endif  // TRAINER_INTERNAL_STAGE_LOOP_H_
