// bf16 <-> fp32 conversion on a stream of the NCCL backend, which reduces bf16 in fp32 and
// rounds back once: core's device converter (core/cuda/kernels.h, round to nearest even,
// NaN kept, as core::BFloat16 does) enqueued on `stream` (a cudaStream_t). Built only
// under --config=cuda. Both return the cudaError_t of the launch as an int (0 is success).
#ifndef COMM_CUDA_CONVERT_H_
#define COMM_CUDA_CONVERT_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/cuda/kernels.h"

namespace comm {
namespace cuda {

inline int Bf16ToFloat(const void* in, float* out, int64_t n, void* stream) {
  return static_cast<int>(core::cuda::ConvertBf16ToFloatOn(
      static_cast<cudaStream_t>(stream), static_cast<const uint16_t*>(in), out, n));
}

inline int FloatToBf16(const float* in, void* out, int64_t n, void* stream) {
  return static_cast<int>(core::cuda::ConvertFloatToBf16On(static_cast<cudaStream_t>(stream), in,
                                                           static_cast<uint16_t*>(out), n));
}

}  // namespace cuda
}  // namespace comm

#endif  // COMM_CUDA_CONVERT_H_
