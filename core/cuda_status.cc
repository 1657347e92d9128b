#include "core/cuda_status.h"

#include "absl/strings/str_cat.h"

namespace core {
namespace cuda {

absl::Status SetDevice(Device device) {
  if (device.is_cpu()) return absl::OkStatus();
#ifdef FSDP_WITH_CUDA
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current == device.index) {
    return absl::OkStatus();
  }
  return StatusFromCuda(cudaSetDevice(device.index),
                        absl::StrCat("cudaSetDevice(", device.index, ") for ", device.ToString()));
#else
  return absl::UnavailableError(absl::StrCat("cannot use ", device.ToString(),
                                             ": this build has no CUDA support; build with "
                                             "--config=cuda"));
#endif
}

absl::Status Synchronize(Device device) {
  if (device.is_cpu()) return absl::OkStatus();
#ifdef FSDP_WITH_CUDA
  if (absl::Status s = SetDevice(device); !s.ok()) return s;
  return StatusFromCuda(cudaDeviceSynchronize(),
                        absl::StrCat("synchronizing ", device.ToString(),
                                     " (an earlier asynchronous kernel or copy failed)"));
#else
  return absl::UnavailableError(absl::StrCat("cannot synchronize ", device.ToString(),
                                             ": this build has no CUDA support; build with "
                                             "--config=cuda"));
#endif
}

}  // namespace cuda
}  // namespace core
