// Where the main job computes: choosing the device and the collective backend from the
// --device / --backend flags, moving a CPU-built model onto the device, the device's
// memory figures, and the throughput figures of a run (tokens/s after a warm-up, model
// FLOPs per token, MFU).
//
//   ASSIGN_OR_RETURN(integration::DeviceChoice choice,
//                    integration::ChooseDeviceAndBackend("cuda", "auto", local_rank,
//                                                        integration::DeviceAvailability::Probe()));
//   // choice.device == cuda:<local_rank>, choice.backend == comm::Backend::kNccl
//   RETURN_IF_ERROR(integration::MoveModuleToDevice(*model, choice.device));
//
// The rules (--device, --backend):
//   cpu,  gloo|auto   -> cpu over gloo
//   cpu,  shm         -> cpu over shared memory (all ranks on one host; InitFromEnv checks)
//   cpu,  nccl        -> FailedPrecondition (NCCL reduces GPU buffers)
//   cuda, nccl|auto   -> cuda:LOCAL_RANK over nccl
//   cuda, gloo|shm    -> FailedPrecondition (gloo and shm reduce host buffers)
// checked in this order for cuda (whatever the backend):
//   cuda in a build without CUDA -> FailedPrecondition naming --config=cuda;
//   cuda with no usable GPU      -> Unavailable with the runtime's reason;
// then the backend (gloo and shm refused), then:
//   LOCAL_RANK >= visible GPUs   -> FailedPrecondition (one GPU per local rank).
#ifndef INTEGRATION_DEVICE_SETUP_H_
#define INTEGRATION_DEVICE_SETUP_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "comm/init_from_env.h"
#include "core/device.h"
#include "core/module.h"

namespace integration {

// What this process can use (injected in tests).
struct DeviceAvailability {
  bool built_with_cuda = false;
  // Usable CUDA devices, or the reason there are none.
  absl::StatusOr<int> gpus = absl::UnavailableError("not probed");
  // core::BuiltWithCuda() and core::CudaDeviceCount() now.
  static DeviceAvailability Probe();
};

struct DeviceChoice {
  core::Device device = core::Device::Cpu();
  comm::Backend backend = comm::Backend::kGloo;
};

// Applies the rules in the header comment to the flag values. InvalidArgument for an
// unknown device or backend name.
absl::StatusOr<DeviceChoice> ChooseDeviceAndBackend(absl::string_view device_flag,
                                                    absl::string_view backend_flag, int local_rank,
                                                    const DeviceAvailability& available);

// Moves every parameter of `module` (data and, when defined, grad) to `device`,
// keeping the Parameter objects (their identity is what optimizers and the FSDP
// registry hold): nn::ToDevice, all or nothing; a deferred parameter stays deferred, to
// be materialized there. A no-op for parameters already there. The error names the
// parameter.
absl::Status MoveModuleToDevice(core::Module& module, core::Device device);

// `t` on `device` (a copy, or `t` itself when it is already there).
absl::StatusOr<core::Tensor> OnDevice(const core::Tensor& t, core::Device device);

// Bytes free on a CUDA device now (cudaMemGetInfo) and its total; Unavailable in a
// build without CUDA.
struct DeviceMemoryInfo {
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
};
absl::StatusOr<DeviceMemoryInfo> ReadDeviceMemoryInfo(core::Device device);

// Model FLOPs per token of a GPT training step (forward + backward), as llm.c and the
// PaLM paper count them: 6 N + 12 L T C, N the parameters, L layers, T the sequence
// length, C the width (the second term is the attention's QK^T and AV products).
double GptFlopsPerToken(int64_t num_params, int64_t n_layer, int64_t seq_len, int64_t n_embd);

// The dense bf16 peak FLOP/s of a device from its name (core::CudaDeviceName), e.g.
// 989e12 for an H200 or H100 SXM; nullopt when unknown.
std::optional<double> PeakBf16FlopsFromName(absl::string_view device_name);

// The timed steps of a ThroughputMeter as the device saw them (CUDA events on the compute
// stream, one per step start).
struct DeviceStepTimes {
  int64_t steps = 0;
  double step_ms_median = 0;  // the middle step (the mean of the two middle ones for an
                              // even count)
  double step_ms_mean = 0;
  double tokens_per_second = 0;  // tokens_per_step x 1000 / step_ms_mean
};

// The figures of `step_ms` (each timed step's milliseconds); nullopt when there is none or
// their sum is not positive.
std::optional<DeviceStepTimes> SummarizeDeviceSteps(std::vector<double> step_ms,
                                                    int64_t tokens_per_step);

// Tokens per second of training after a warm-up. Call StepStarted() at the start of
// every training step (n steps in all). The figure covers steps warmup_steps() + 1 to
// n - 1, timed from the start of one to the start of the next (so each includes its
// optimizer step, and whatever follows the last step, e.g. a checkpoint, is left out);
// warmup_steps() is `warmup_steps` when given (the main job's
// --throughput_warmup_steps), else min(5, n / 10).
// On a CUDA `device` the same steps are also timed on the device: from the start of step
// warmup_steps() + 1 on, each StepStarted records a CUDA event on the compute stream, after
// all the work queued so far (the previous step's last work), so each step's device time
// runs from its first queued work to the next step's start, as its host time does.
class ThroughputMeter {
 public:
  explicit ThroughputMeter(int64_t total_steps, std::optional<int64_t> warmup_steps = std::nullopt,
                           core::Device device = core::Device::Cpu());
  ~ThroughputMeter();
  ThroughputMeter(const ThroughputMeter&) = delete;
  ThroughputMeter& operator=(const ThroughputMeter&) = delete;

  void StepStarted(absl::Time now);
  int64_t warmup_steps() const { return warmup_; }
  // Steps measured; 0 when there were too few.
  int64_t measured_steps() const;
  // tokens_per_step x measured_steps() / their seconds; nullopt when none were measured.
  std::optional<double> TokensPerSecond(int64_t tokens_per_step) const;
  // The measured steps' device times (SummarizeDeviceSteps); waits for the events. nullopt
  // on the CPU or when no step was measured; the first CUDA error of recording or reading
  // an event, naming the step.
  absl::StatusOr<std::optional<DeviceStepTimes>> DeviceTimed(int64_t tokens_per_step) const;

 private:
  int64_t warmup_ = 0;
  core::Device device_;
  std::vector<absl::Time> starts_;
  std::vector<void*> events_;  // core/timing_event.h, one per start after the warm-up
  absl::Status event_error_;   // the first failure to record one
};

}  // namespace integration

#endif  // INTEGRATION_DEVICE_SETUP_H_
