// CUDA launchers of the Llama layers' bodies; see kernels/cuda/kernels.h. silu(a) * b runs
// grid-stride over its outputs, the rotary packing of q, k, v a thread per output column
// over the rows (RMSNorm runs on LayerNorm's kernels in kernels.cu). Indexing is int64 (a
// column within a row int32).
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda/kernels.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/elementwise.h"
#include "kernels/math.h"

namespace kernels {
namespace cuda {
namespace {

namespace k = ::kernels;

// ---- SwiGLU; each output fp32 or bf16 (k::Store: the fp32 value rounded once).

template <typename H>
__global__ void SiluMulForwardKernel(const float* a, const float* b, H* h, int64_t n) {
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) {
    k::Store(h, i, k::SiluMulForward(a[i], b[i]));
  }
}

template <typename GA, typename GB>
__global__ void SiluMulBackwardKernel(const float* a, const float* b, const float* gh, GA* ga,
                                      GB* gb, int64_t n) {
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) {
    k::Store(ga, i, k::SiluMulGradGate(a[i], b[i], gh[i]));
    k::Store(gb, i, k::SiluMulGradUp(a[i], gh[i]));
  }
}

// ---- Rotary embedding and the grouped heads (layouts in kernels/cpu/kernels.h); each
// output fp32 or bf16.

// Element j of `head` (width 2 half) turned by the angles with cosines c and sines sign * s.
__device__ __forceinline__ float RotatedAt(const float* head, const float* c, const float* s,
                                           float sign, int j, int half) {
  const bool first = j < half;
  const int i = first ? j : j - half;
  return k::RotaryRotate(head[j], head[first ? j + half : j - half], c[i], sign * s[i], first);
}

// The packing and its backward run a thread per output column (x: the columns of a row,
// int32) and loop over the rows (y), so a column's place (q, k or v, its head, its element)
// is worked out once per thread with 32-bit divisions, not per element with 64-bit ones.
dim3 GridForColumns(int64_t rows, int64_t width) {
  const int64_t y = rows < 65535 ? rows : 65535;
  return dim3(static_cast<unsigned int>((width + kThreads - 1) / kThreads),
              static_cast<unsigned int>(y));
}

template <typename Y>
__global__ void RotaryPackKernel(const float* q, const float* key, const float* v, const float* cos,
                                 const float* sin, Y* qkv, int64_t rows, int64_t T, int H, int KV,
                                 int D) {
  const int C = H * D, half = D / 2, group = H / KV;
  const int col = static_cast<int>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= 3 * C) return;
  const int part = col / C, within = col - part * C, h = within / D, j = within - h * D;
  const int64_t KW = static_cast<int64_t>(KV) * D, kv_head = static_cast<int64_t>(h / group) * D;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const int64_t t = r % T;
    const float* c = cos + t * half;
    const float* s = sin + t * half;
    const int64_t src = r * KW + kv_head;
    float out;
    if (part == 0) {
      out = RotatedAt(q + r * C + static_cast<int64_t>(h) * D, c, s, 1.0f, j, half);
    } else if (part == 1) {
      out = RotatedAt(key + src, c, s, 1.0f, j, half);
    } else {
      out = v[src + j];
    }
    k::Store(qkv, r * 3 * C + col, out);
  }
}

template <typename GQ, typename GK, typename GV>
__global__ void RotaryPackBackwardKernel(const float* gqkv, const float* cos, const float* sin,
                                         GQ* gq, GK* gk, GV* gv, int64_t rows, int64_t T, int H,
                                         int KV, int D) {
  const int C = H * D, KW = KV * D, half = D / 2, group = H / KV, width = C + 2 * KW;
  const int col = static_cast<int>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= width) return;
  // The column's part and place: q's (col < C), k's (next KW) or v's (last KW); j its element
  // within the head, base the offset in a row of gqkv of its head (q) or its group's first
  // head (k, v).
  const int part = col < C ? 0 : (col < C + KW ? 1 : 2);
  const int pc = part == 0 ? col : (part == 1 ? col - C : col - C - KW);
  const int head = pc / D, j = pc - head * D;
  const int64_t base =
      part == 0 ? static_cast<int64_t>(head) * D
                : part * static_cast<int64_t>(C) + static_cast<int64_t>(head) * group * D;
  const bool first = j < half;
  const int p = first ? j + half : j - half, pair = first ? j : j - half;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const int64_t t = r % T;
    const float* c = cos + t * half;
    const float* s = sin + t * half;
    const float* g = gqkv + r * 3 * C + base;
    if (part == 0) {
      k::Store(gq, r * C + pc, RotatedAt(g, c, s, -1.0f, j, half));
    } else if (part == 1) {
      k::Store(gk, r * KW + pc,
               k::RotaryRotate(k::RotaryGroupSum(g, j, group, D), k::RotaryGroupSum(g, p, group, D),
                               c[pair], -1.0f * s[pair], first));
    } else {
      k::Store(gv, r * KW + pc, k::RotaryGroupSum(g, j, group, D));
    }
  }
}

}  // namespace

cudaError_t SiluMulForward(const float* a, const float* b, void* h, int64_t n, bool h_bf16) {
  if (n <= 0) return cudaSuccess;
  k::WithStored(h, h_bf16,
                [&](auto* hp) { SiluMulForwardKernel<<<GridFor(n), kThreads>>>(a, b, hp, n); });
  return cudaGetLastError();
}

cudaError_t SiluMulBackward(const float* a, const float* b, const float* gh, void* ga, void* gb,
                            int64_t n, bool ga_bf16, bool gb_bf16) {
  if (n <= 0) return cudaSuccess;
  k::WithStored(ga, ga_bf16, [&](auto* gap) {
    k::WithStored(gb, gb_bf16, [&](auto* gbp) {
      SiluMulBackwardKernel<<<GridFor(n), kThreads>>>(a, b, gh, gap, gbp, n);
    });
  });
  return cudaGetLastError();
}

cudaError_t RotaryPackQkv(const float* q, const float* k, const float* v, const float* cos,
                          const float* sin, void* qkv, int64_t rows, int64_t T, int64_t H,
                          int64_t KV, int64_t D, bool qkv_bf16) {
  if (rows <= 0 || H <= 0 || D <= 0) return cudaSuccess;
  // A thread's column (int) stays below 2^31 in the last block of the row.
  if (3 * H * D > INT32_MAX - kThreads) return cudaErrorInvalidValue;
  k::WithStored(qkv, qkv_bf16, [&](auto* out) {
    RotaryPackKernel<<<GridForColumns(rows, 3 * H * D), kThreads>>>(
        q, k, v, cos, sin, out, rows, T, static_cast<int>(H), static_cast<int>(KV),
        static_cast<int>(D));
  });
  return cudaGetLastError();
}

cudaError_t RotaryPackQkvBackward(const float* gqkv, const float* cos, const float* sin, void* gq,
                                  void* gk, void* gv, int64_t rows, int64_t T, int64_t H,
                                  int64_t KV, int64_t D, bool gq_bf16, bool gk_bf16, bool gv_bf16) {
  if (rows <= 0 || H <= 0 || D <= 0) return cudaSuccess;
  // A thread's column (int) stays below 2^31 in the last block of the row.
  if (3 * H * D > INT32_MAX - kThreads) return cudaErrorInvalidValue;
  k::WithStored(gq, gq_bf16, [&](auto* gqp) {
    k::WithStored(gk, gk_bf16, [&](auto* gkp) {
      k::WithStored(gv, gv_bf16, [&](auto* gvp) {
        RotaryPackBackwardKernel<<<GridForColumns(rows, (H + 2 * KV) * D), kThreads>>>(
            gqkv, cos, sin, gqp, gkp, gvp, rows, T, static_cast<int>(H), static_cast<int>(KV),
            static_cast<int>(D));
      });
    });
  });
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace kernels
