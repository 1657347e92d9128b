#include "core/cuda_device.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

#ifdef FSDP_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace core {

bool BuiltWithCuda() {
#ifdef FSDP_WITH_CUDA
  return true;
#else
  return false;
#endif
}

absl::StatusOr<int> CudaDeviceCount() {
#ifdef FSDP_WITH_CUDA
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat("no usable CUDA device: ", cudaGetErrorString(err)));
  }
  if (n == 0) return absl::UnavailableError("no CUDA device present");
  return n;
#else
  return absl::UnavailableError("built without CUDA; build with --config=cuda");
#endif
}

absl::StatusOr<std::string> CudaDeviceName(int index) {
#ifdef FSDP_WITH_CUDA
  cudaDeviceProp prop;
  cudaError_t err = cudaGetDeviceProperties(&prop, index);
  if (err != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat("cuda:", index, ": ", cudaGetErrorString(err)));
  }
  return absl::StrFormat("%s, %.1f GiB, sm_%d%d", prop.name,
                         static_cast<double>(prop.totalGlobalMem) / (1 << 30), prop.major,
                         prop.minor);
#else
  (void)index;
  return absl::UnavailableError("built without CUDA; build with --config=cuda");
#endif
}

}  // namespace core
