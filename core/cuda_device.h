// Which CUDA devices this process can use.
//
//   absl::StatusOr<int> n = core::CudaDeviceCount();
//   if (!n.ok() || *n == 0) GTEST_SKIP() << n.status();
//
// Builds without --config=cuda answer Unavailable; so does a machine whose driver
// cannot run the toolkit's runtime (no GPU).
#ifndef CORE_CUDA_DEVICE_H_
#define CORE_CUDA_DEVICE_H_

#include <string>

#include "absl/status/statusor.h"

namespace core {

// True when the build was made with --config=cuda.
bool BuiltWithCuda();

// Number of usable CUDA devices; Unavailable with the reason when there are none.
absl::StatusOr<int> CudaDeviceCount();

// "NVIDIA H200, 139.8 GiB, sm_90" for device `index`.
absl::StatusOr<std::string> CudaDeviceName(int index);

}  // namespace core

#endif  // CORE_CUDA_DEVICE_H_
