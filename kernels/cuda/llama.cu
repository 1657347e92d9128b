// CUDA launchers of the Llama layers' bodies; see kernels/cuda/kernels.h. RMSNorm runs one
// warp per row with shuffle reductions (as LayerNorm in kernels.cu); silu(a) * b and the
// rotary packing of q, k, v run grid-stride over their outputs. Indexing is int64.
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda/kernels.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/elementwise.h"
#include "kernels/math.h"
#include "kernels/rowwise.h"

namespace kernels {
namespace cuda {
namespace {

namespace k = ::kernels;

// ---- RMSNorm, one warp per row.

// y fp32, or bf16 (each element the fp32 value rounded once).
template <typename W, typename Y>
__global__ void RmsNormForwardKernel(const float* x, const W* w, float eps, Y* y, float* xhat,
                                     float* rstd, int64_t rows, int64_t cols) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const float* xr = x + row * cols;
  float sq = 0.0f;
  for (int64_t j = lane; j < cols; j += 32) sq += xr[j] * xr[j];
  const float r = k::RmsNormRstd(WarpSum(sq) / static_cast<float>(cols), eps);
  Y* yr = y + row * cols;
  float* hr = xhat + row * cols;
  for (int64_t j = lane; j < cols; j += 32) {
    k::Store(yr, j, k::RmsNormApply(xr[j], r, w, j, &hr[j]));
  }
  if (lane == 0) rstd[row] = r;
}

template <typename W>
__global__ void RmsNormBackwardInputKernel(const float* g, const float* xhat, const float* rstd,
                                           const W* w, float* gx, int64_t rows, int64_t cols) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const float* gr = g + row * cols;
  const float* hr = xhat + row * cols;
  float sum = 0.0f;
  for (int64_t j = lane; j < cols; j += 32) sum += k::LayerNormGradHat<float>(gr[j], w, j) * hr[j];
  const float mean = WarpSum(sum) / static_cast<float>(cols);
  const float r = rstd[row];
  float* out = gx + row * cols;
  for (int64_t j = lane; j < cols; j += 32) {
    out[j] = k::RmsNormBackwardInput<float>(gr[j], w, j, hr[j], r, mean);
  }
}

// gx = residual + the input gradient, and its bf16 copy when gx16 is not null (NOTE [Fused
// ops]).
template <typename W>
__global__ void RmsNormBackwardInputAddKernel(const float* g, const float* xhat,
                                              const float* rstd, const W* w,
                                              const float* residual, float* gx, uint16_t* gx16,
                                              int64_t rows, int64_t cols) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const float* gr = g + row * cols;
  const float* hr = xhat + row * cols;
  float sum = 0.0f;
  for (int64_t j = lane; j < cols; j += 32) sum += k::LayerNormGradHat<float>(gr[j], w, j) * hr[j];
  const float mean = WarpSum(sum) / static_cast<float>(cols);
  const float r = rstd[row];
  const float* res = residual + row * cols;
  float* out = gx + row * cols;
  uint16_t* out16 = gx16 != nullptr ? gx16 + row * cols : nullptr;
  for (int64_t j = lane; j < cols; j += 32) {
    const float v = k::RmsNormBackwardInputAdd<float>(res[j], gr[j], w, j, hr[j], r, mean);
    out[j] = v;
    if (out16 != nullptr) k::Store(out16, j, v);
  }
}

// ---- SwiGLU.

__global__ void SiluMulForwardKernel(const float* a, const float* b, float* h, int64_t n) {
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) h[i] = k::SiluMulForward(a[i], b[i]);
}

__global__ void SiluMulBackwardKernel(const float* a, const float* b, const float* gh, float* ga,
                                      float* gb, int64_t n) {
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) {
    ga[i] = k::SiluMulGradGate(a[i], b[i], gh[i]);
    gb[i] = k::SiluMulGradUp(a[i], gh[i]);
  }
}

// ---- Rotary embedding and the grouped heads (layouts in kernels/cpu/kernels.h).

// Element j of `head` (width 2 half) turned by the angles with cosines c and sines sign * s.
__device__ __forceinline__ float RotatedAt(const float* head, const float* c, const float* s,
                                           float sign, int64_t j, int64_t half) {
  const bool first = j < half;
  const int64_t i = first ? j : j - half;
  return k::RotaryRotate(head[j], head[first ? j + half : j - half], c[i], sign * s[i], first);
}

// Element j summed over the `group` heads of width D starting at `base`, in head order.
__device__ __forceinline__ float GroupSum(const float* base, int64_t j, int64_t group, int64_t D) {
  float acc = base[j];
  for (int64_t m = 1; m < group; ++m) acc = k::Add(acc, base[m * D + j]);
  return acc;
}

__global__ void RotaryPackKernel(const float* q, const float* key, const float* v,
                                 const float* cos, const float* sin, float* qkv, int64_t rows,
                                 int64_t T, int64_t H, int64_t KV, int64_t D) {
  const int64_t C = H * D, KW = KV * D, half = D / 2, group = H / KV, n = rows * 3 * C;
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) {
    const int64_t r = i / (3 * C), col = i % (3 * C);
    const int64_t part = col / C, h = (col % C) / D, j = col % D;
    const float* c = cos + (r % T) * half;
    const float* s = sin + (r % T) * half;
    const int64_t src = r * KW + (h / group) * D;
    float out;
    if (part == 0) {
      out = RotatedAt(q + r * C + h * D, c, s, 1.0f, j, half);
    } else if (part == 1) {
      out = RotatedAt(key + src, c, s, 1.0f, j, half);
    } else {
      out = v[src + j];
    }
    qkv[i] = out;
  }
}

__global__ void RotaryPackBackwardKernel(const float* gqkv, const float* cos, const float* sin,
                                         float* gq, float* gk, float* gv, int64_t rows, int64_t T,
                                         int64_t H, int64_t KV, int64_t D) {
  const int64_t C = H * D, KW = KV * D, half = D / 2, group = H / KV, width = C + 2 * KW;
  const int64_t n = rows * width;
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) {
    const int64_t r = i / width, col = i % width;
    const float* c = cos + (r % T) * half;
    const float* s = sin + (r % T) * half;
    const float* g = gqkv + r * 3 * C;
    if (col < C) {
      gq[r * C + col] = RotatedAt(g + (col / D) * D, c, s, -1.0f, col % D, half);
    } else if (col < C + KW) {
      const int64_t kc = col - C, j = kc % D;
      const float* base = g + C + (kc / D) * group * D;
      const bool first = j < half;
      const int64_t p = first ? j + half : j - half, pair = first ? j : j - half;
      gk[r * KW + kc] = k::RotaryRotate(GroupSum(base, j, group, D), GroupSum(base, p, group, D),
                                        c[pair], -1.0f * s[pair], first);
    } else {
      const int64_t vc = col - C - KW;
      gv[r * KW + vc] = GroupSum(g + 2 * C + (vc / D) * group * D, vc % D, group, D);
    }
  }
}

}  // namespace

cudaError_t RmsNormForward(const float* x, const void* w, bool bf16, float eps, void* y,
                           float* xhat, float* rstd, int64_t rows, int64_t cols, bool y_bf16) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const auto launch = [&](const auto* wp) {
    if (y_bf16) {
      RmsNormForwardKernel<<<GridForRows(rows), kThreads>>>(x, wp, eps, static_cast<uint16_t*>(y),
                                                            xhat, rstd, rows, cols);
    } else {
      RmsNormForwardKernel<<<GridForRows(rows), kThreads>>>(x, wp, eps, static_cast<float*>(y),
                                                            xhat, rstd, rows, cols);
    }
  };
  if (bf16) {
    launch(static_cast<const uint16_t*>(w));
  } else {
    launch(static_cast<const float*>(w));
  }
  return cudaGetLastError();
}

cudaError_t RmsNormBackwardInput(const float* g, const float* xhat, const float* rstd,
                                 const void* w, bool bf16, float* gx, int64_t rows,
                                 int64_t cols) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  if (bf16) {
    RmsNormBackwardInputKernel<<<GridForRows(rows), kThreads>>>(
        g, xhat, rstd, static_cast<const uint16_t*>(w), gx, rows, cols);
  } else {
    RmsNormBackwardInputKernel<<<GridForRows(rows), kThreads>>>(
        g, xhat, rstd, static_cast<const float*>(w), gx, rows, cols);
  }
  return cudaGetLastError();
}

cudaError_t RmsNormBackwardInputAdd(const float* g, const float* xhat, const float* rstd,
                                    const void* w, bool bf16, const float* residual, float* gx,
                                    int64_t rows, int64_t cols, uint16_t* gx16) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  if (bf16) {
    RmsNormBackwardInputAddKernel<<<GridForRows(rows), kThreads>>>(
        g, xhat, rstd, static_cast<const uint16_t*>(w), residual, gx, gx16, rows, cols);
  } else {
    RmsNormBackwardInputAddKernel<<<GridForRows(rows), kThreads>>>(
        g, xhat, rstd, static_cast<const float*>(w), residual, gx, gx16, rows, cols);
  }
  return cudaGetLastError();
}

cudaError_t SiluMulForward(const float* a, const float* b, float* h, int64_t n) {
  if (n <= 0) return cudaSuccess;
  SiluMulForwardKernel<<<GridFor(n), kThreads>>>(a, b, h, n);
  return cudaGetLastError();
}

cudaError_t SiluMulBackward(const float* a, const float* b, const float* gh, float* ga,
                            float* gb, int64_t n) {
  if (n <= 0) return cudaSuccess;
  SiluMulBackwardKernel<<<GridFor(n), kThreads>>>(a, b, gh, ga, gb, n);
  return cudaGetLastError();
}

cudaError_t RotaryPackQkv(const float* q, const float* k, const float* v, const float* cos,
                          const float* sin, float* qkv, int64_t rows, int64_t T, int64_t H,
                          int64_t KV, int64_t D) {
  if (rows <= 0 || H <= 0 || D <= 0) return cudaSuccess;
  RotaryPackKernel<<<GridFor(rows * 3 * H * D), kThreads>>>(q, k, v, cos, sin, qkv, rows, T, H,
                                                            KV, D);
  return cudaGetLastError();
}

cudaError_t RotaryPackQkvBackward(const float* gqkv, const float* cos, const float* sin,
                                  float* gq, float* gk, float* gv, int64_t rows, int64_t T,
                                  int64_t H, int64_t KV, int64_t D) {
  if (rows <= 0 || H <= 0 || D <= 0) return cudaSuccess;
  RotaryPackBackwardKernel<<<GridFor(rows * (H + 2 * KV) * D), kThreads>>>(
      gqkv, cos, sin, gq, gk, gv, rows, T, H, KV, D);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace kernels
