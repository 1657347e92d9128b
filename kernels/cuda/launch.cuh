// Launch geometry and warp reductions the CUDA launchers share (kernels/cuda/*.cu; nvcc
// only): grid-stride loops over elements, one warp per row, and shuffle sums and maxima.
//
//   SomeKernel<<<GridFor(n), kThreads, 0, stream>>>(...);            // grid-stride over n
//   RowKernel<<<GridForRows(rows), kThreads, 0, stream>>>(...);      // a warp per row
#ifndef KERNELS_CUDA_LAUNCH_CUH_
#define KERNELS_CUDA_LAUNCH_CUH_

#include <cuda_runtime.h>
#include <stdint.h>

namespace kernels {
namespace cuda {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;
constexpr int64_t kMaxBlocks = 65536;

// Blocks for a grid-stride loop over n elements (n >= 1).
inline unsigned int GridFor(int64_t n) {
  int64_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  if (blocks < 1) blocks = 1;
  return static_cast<unsigned int>(blocks);
}

// Blocks for one warp per row.
inline unsigned int GridForRows(int64_t rows) {
  return static_cast<unsigned int>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

// Raises a kernel's dynamic shared-memory limit to `bytes` (needed past 48 KB).
template <typename Kernel>
cudaError_t AllowSharedMemory(Kernel kernel, int bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

__device__ __forceinline__ int64_t GlobalIndex() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t GlobalStride() {
  return static_cast<int64_t>(blockDim.x) * gridDim.x;
}

// The sum (maximum) of `v` over the warp, in every lane.
template <typename T>
__device__ __forceinline__ T WarpSum(T v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

}  // namespace cuda
}  // namespace kernels

#endif  // KERNELS_CUDA_LAUNCH_CUH_
