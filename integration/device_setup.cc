#include "integration/device_setup.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/cuda_device.h"
#include "core/status_macros.h"
#include "core/timing_event.h"
#include "nn/to_device.h"

#ifdef FSDP_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace integration {

DeviceAvailability DeviceAvailability::Probe() {
  DeviceAvailability a;
  a.built_with_cuda = core::BuiltWithCuda();
  a.gpus = core::CudaDeviceCount();
  return a;
}

absl::StatusOr<DeviceChoice> ChooseDeviceAndBackend(absl::string_view device_flag,
                                                    absl::string_view backend_flag, int local_rank,
                                                    const DeviceAvailability& available) {
  absl::StatusOr<comm::Backend> backend = comm::ParseBackend(backend_flag);
  if (!backend.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--backend: ", backend.status().message()));
  }
  DeviceChoice choice;
  if (device_flag == "cpu") {
    if (*backend == comm::Backend::kNccl) {
      return absl::FailedPreconditionError(
          "--device=cpu --backend=nccl: NCCL reduces GPU buffers and the model computes on the "
          "CPU; use --backend=gloo (or auto), or --device=cuda");
    }
    choice.backend = *backend == comm::Backend::kShm ? comm::Backend::kShm : comm::Backend::kGloo;
    return choice;
  }
  if (device_flag != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device=", device_flag,
        ": expected cpu or cuda (each rank uses cuda:LOCAL_RANK, one GPU per local rank)"));
  }
  if (!available.built_with_cuda) {
    return absl::FailedPreconditionError(
        "--device=cuda: this binary was built without CUDA; build it with "
        "`bazel build --config=cuda //trainer:main_job` (or use --device=cpu)");
  }
  if (!available.gpus.ok()) {
    return absl::UnavailableError(
        absl::StrCat("--device=cuda: no usable GPU: ", available.gpus.status().message()));
  }
  if (*available.gpus <= 0) {
    return absl::UnavailableError("--device=cuda: no usable GPU: the CUDA runtime sees 0 devices");
  }
  if (*backend == comm::Backend::kGloo) {
    return absl::FailedPreconditionError(
        "--device=cuda --backend=gloo: gloo reduces host buffers and the model's tensors are "
        "on the GPU; use --backend=nccl (or auto)");
  }
  if (*backend == comm::Backend::kShm) {
    return absl::FailedPreconditionError(
        "--device=cuda --backend=shm: shm reduces host buffers through shared memory and the "
        "model's tensors are on the GPU; use --backend=nccl (or auto)");
  }
  if (local_rank < 0 || local_rank >= *available.gpus) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--device=cuda: LOCAL_RANK ", local_rank, " needs GPU ", local_rank, " but ",
        *available.gpus, " GPU(s) are visible; start at most one rank per GPU on each host"));
  }
  choice.device = core::Device::Cuda(local_rank);
  choice.backend = comm::Backend::kNccl;
  return choice;
}

absl::StatusOr<core::Tensor> OnDevice(const core::Tensor& t, core::Device device) {
  if (!t.defined() || t.device() == device) return t;
  return t.To(device, t.storage()->tag());
}

absl::Status MoveModuleToDevice(core::Module& module, core::Device device) {
  return nn::ToDevice(module, device);
}

absl::StatusOr<DeviceMemoryInfo> ReadDeviceMemoryInfo(core::Device device) {
  if (!device.is_cuda()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReadDeviceMemoryInfo: ", device.ToString(), " is not a CUDA device"));
  }
#ifdef FSDP_WITH_CUDA
  cudaError_t err = cudaSetDevice(device.index);
  size_t free_bytes = 0, total_bytes = 0;
  if (err == cudaSuccess) err = cudaMemGetInfo(&free_bytes, &total_bytes);
  if (err != cudaSuccess) {
    return absl::UnavailableError(
        absl::StrCat("cudaMemGetInfo on ", device.ToString(), ": ", cudaGetErrorString(err)));
  }
  DeviceMemoryInfo info;
  info.free_bytes = static_cast<int64_t>(free_bytes);
  info.total_bytes = static_cast<int64_t>(total_bytes);
  return info;
#else
  return absl::UnavailableError(absl::StrCat("ReadDeviceMemoryInfo(", device.ToString(),
                                             "): built without CUDA (--config=cuda)"));
#endif
}

double GptFlopsPerToken(int64_t num_params, int64_t n_layer, int64_t seq_len, int64_t n_embd) {
  return 6.0 * static_cast<double>(num_params) + 12.0 * static_cast<double>(n_layer) *
                                                     static_cast<double>(seq_len) *
                                                     static_cast<double>(n_embd);
}

std::optional<double> PeakBf16FlopsFromName(absl::string_view device_name) {
  const std::string name = absl::AsciiStrToLower(device_name);
  // Dense (no sparsity) bf16 tensor-core peaks from the vendors' data sheets.
  if (absl::StrContains(name, "h200")) return 989e12;
  if (absl::StrContains(name, "h100")) {
    return absl::StrContains(name, "pcie") ? 756e12 : 989e12;
  }
  if (absl::StrContains(name, "a100")) return 312e12;
  if (absl::StrContains(name, "l40s")) return 362e12;
  if (absl::StrContains(name, "a10g")) return 70e12;
  return std::nullopt;
}

std::optional<DeviceStepTimes> SummarizeDeviceSteps(std::vector<double> step_ms,
                                                    int64_t tokens_per_step) {
  if (step_ms.empty()) return std::nullopt;
  double total = 0;
  for (double ms : step_ms) total += ms;
  if (!(total > 0)) return std::nullopt;
  DeviceStepTimes t;
  t.steps = static_cast<int64_t>(step_ms.size());
  std::sort(step_ms.begin(), step_ms.end());
  const size_t mid = step_ms.size() / 2;
  t.step_ms_median = step_ms.size() % 2 == 1 ? step_ms[mid] : (step_ms[mid - 1] + step_ms[mid]) / 2;
  t.step_ms_mean = total / static_cast<double>(t.steps);
  t.tokens_per_second = static_cast<double>(tokens_per_step) * 1000.0 / t.step_ms_mean;
  return t;
}

ThroughputMeter::ThroughputMeter(int64_t total_steps, std::optional<int64_t> warmup_steps,
                                 core::Device device)
    : warmup_(warmup_steps.has_value()
                  ? std::max<int64_t>(0, *warmup_steps)
                  : std::min<int64_t>(5, std::max<int64_t>(0, total_steps) / 10)),
      device_(device) {}

ThroughputMeter::~ThroughputMeter() {
  for (void* event : events_) core::DestroyTimingEvent(event);
}

void ThroughputMeter::StepStarted(absl::Time now) {
  starts_.push_back(now);
  const int64_t step = static_cast<int64_t>(starts_.size());  // 1-based
  if (!device_.is_cuda() || step <= warmup_ || !event_error_.ok()) return;
  absl::StatusOr<void*> event = core::RecordTimingEvent(
      device_, absl::StrCat("throughput: the device timing event at the start of step ", step));
  if (event.ok()) {
    events_.push_back(*event);
  } else {
    event_error_ = event.status();
  }
}

int64_t ThroughputMeter::measured_steps() const {
  // Starts of steps warmup_+1 .. n: intervals between consecutive ones.
  const int64_t starts_after_warmup = static_cast<int64_t>(starts_.size()) - warmup_;
  return std::max<int64_t>(0, starts_after_warmup - 1);
}

std::optional<double> ThroughputMeter::TokensPerSecond(int64_t tokens_per_step) const {
  const int64_t n = measured_steps();
  if (n <= 0) return std::nullopt;
  const double seconds = absl::ToDoubleSeconds(starts_.back() - starts_[warmup_]);
  if (seconds <= 0) return std::nullopt;
  return static_cast<double>(tokens_per_step) * static_cast<double>(n) / seconds;
}

absl::StatusOr<std::optional<DeviceStepTimes>> ThroughputMeter::DeviceTimed(
    int64_t tokens_per_step) const {
  RETURN_IF_ERROR(event_error_);
  if (!device_.is_cuda() || events_.size() < 2) return std::nullopt;
  std::vector<double> step_ms;
  for (size_t i = 0; i + 1 < events_.size(); ++i) {
    const int64_t step = warmup_ + 1 + static_cast<int64_t>(i);
    ASSIGN_OR_RETURN(
        const double ms,
        core::TimingEventMs(events_[i], events_[i + 1],
                            absl::StrCat("throughput: the device time of step ", step)));
    step_ms.push_back(ms);
  }
  return SummarizeDeviceSteps(std::move(step_ms), tokens_per_step);
}

}  // namespace integration
