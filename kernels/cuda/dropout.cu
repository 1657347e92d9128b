// CUDA launcher of dropout; see kernels/cuda/dropout.h. Grid-stride over the elements.
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda/dropout.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/dropout.h"

namespace kernels {
namespace cuda {
namespace {

namespace k = ::kernels;

__global__ void DropoutKernel(const float* x, float* y, int64_t n, uint64_t key, int64_t offset,
                              uint32_t threshold, float scale) {
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) {
    y[i] = k::DropoutApply(x[i], k::DropoutBits(key, static_cast<uint64_t>(offset + i)), threshold,
                           scale);
  }
}

}  // namespace

cudaError_t Dropout(const float* x, float* y, int64_t n, uint64_t key, int64_t offset,
                    uint32_t threshold, float scale) {
  if (n <= 0) return cudaSuccess;
  DropoutKernel<<<GridFor(n), kThreads>>>(x, y, n, key, offset, threshold, scale);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace kernels
