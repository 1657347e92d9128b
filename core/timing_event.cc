#include "core/timing_event.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

#ifdef FSDP_WITH_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda_status.h"
#include "core/status_macros.h"
#endif

namespace core {

absl::StatusOr<void*> RecordTimingEvent(Device device, absl::string_view what) {
  if (!device.is_cuda()) return nullptr;
#ifdef FSDP_WITH_CUDA
  RETURN_IF_ERROR(cuda::StatusFromCuda(cudaSetDevice(device.index), what));
  cudaEvent_t event = nullptr;
  RETURN_IF_ERROR(cuda::StatusFromCuda(cudaEventCreate(&event), what));
  if (absl::Status s = cuda::StatusFromCuda(cudaEventRecord(event, cuda::ComputeStream()), what);
      !s.ok()) {
    cudaEventDestroy(event);
    return s;
  }
  return static_cast<void*>(event);
#else
  return absl::UnavailableError(absl::StrCat(what, ": a timing event on ", device.ToString(),
                                             " needs a --config=cuda build"));
#endif
}

void DestroyTimingEvent(void* event) {
#ifdef FSDP_WITH_CUDA
  if (event != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event));
#else
  (void)event;
#endif
}

absl::StatusOr<double> TimingEventMs(void* start, void* end, absl::string_view what) {
  if (start == nullptr || end == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": no timing event to read"));
  }
#ifdef FSDP_WITH_CUDA
  RETURN_IF_ERROR(cuda::StatusFromCuda(cudaEventSynchronize(static_cast<cudaEvent_t>(end)), what));
  float ms = 0;
  RETURN_IF_ERROR(cuda::StatusFromCuda(
      cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)),
      what));
  return static_cast<double>(ms);
#else
  return absl::UnavailableError(absl::StrCat(what, ": timing events need a --config=cuda build"));
#endif
}

}  // namespace core
