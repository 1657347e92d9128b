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
                                                    absl::string_view backend_flag,
                                                    int local_rank,
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

// Tokens per second of training after a warm-up. Call StepStarted() at the start of
// every training step (n steps in all). The figure covers steps warmup_steps() + 1 to
// n - 1, timed from the start of one to the start of the next (so each includes its
// optimizer step, and whatever follows the last step, e.g. a checkpoint, is left out);
// warmup_steps() = min(5, n / 10).
class ThroughputMeter {
 public:
  explicit ThroughputMeter(int64_t total_steps);
  void StepStarted(absl::Time now);
  int64_t warmup_steps() const { return warmup_; }
  // Steps measured; 0 when there were too few.
  int64_t measured_steps() const;
  // tokens_per_step x measured_steps() / their seconds; nullopt when none were measured.
  std::optional<double> TokensPerSecond(int64_t tokens_per_step) const;

 private:
  int64_t warmup_ = 0;
  std::vector<absl::Time> starts_;
};

}  // namespace integration

#endif  // INTEGRATION_DEVICE_SETUP_H_
