// CUDA launchers of the attention mask; see kernels/cuda/attention_mask.h. One warp per
// row for the mask (its lanes over the columns, coalesced; the row's validity a warp
// vote), grid-stride over the elements for the backward.
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/attention_mask.h"
#include "kernels/cuda/attention_mask.h"
#include "kernels/cuda/launch.cuh"

namespace kernels {
namespace cuda {
namespace {

namespace k = ::kernels;

__global__ void AttentionMaskKernel(AttentionMaskLayout m, const float* fmask, const int32_t* imask,
                                    float* add, float* valid, int64_t rows) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  bool any = false;
  for (int64_t s = lane; s < m.S; s += 32) {
    add[row * m.S + s] = k::AttentionMaskValue(m, fmask, imask, row, s);
    any = any || k::AttentionMaskKeeps(m, fmask, imask, row, s);
  }
  any = __any_sync(0xffffffffu, any);
  if (lane == 0) valid[row] = any ? 1.0f : 0.0f;
}

__global__ void AttentionMaskBackwardKernel(AttentionMaskLayout m, const float* fmask,
                                            const int32_t* imask, const float* g, float* gmask,
                                            int64_t n) {
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) {
    const int64_t row = i / m.S, s = i - row * m.S;
    gmask[i] = k::AttentionMaskKeeps(m, fmask, imask, row, s) ? g[i] : 0.0f;
  }
}

}  // namespace

cudaError_t AttentionMask(const AttentionMaskLayout& m, const float* fmask, const int32_t* imask,
                          float* add, float* valid, int64_t rows) {
  if (rows <= 0) return cudaSuccess;
  AttentionMaskKernel<<<GridForRows(rows), kThreads>>>(m, fmask, imask, add, valid, rows);
  return cudaGetLastError();
}

cudaError_t AttentionMaskBackward(const AttentionMaskLayout& m, const float* fmask,
                                  const int32_t* imask, const float* g, float* gmask,
                                  int64_t rows) {
  const int64_t n = rows * m.S;
  if (n <= 0) return cudaSuccess;
  AttentionMaskBackwardKernel<<<GridFor(n), kThreads>>>(m, fmask, imask, g, gmask, n);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace kernels
