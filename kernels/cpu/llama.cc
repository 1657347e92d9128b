// CPU launchers of the Llama layers' bodies (kernels/cpu/kernels.h): RMSNorm, SwiGLU's
// silu(a) * b and the rotary embedding packed with grouped-query attention's head
// expansion. Compiled with CPU_LOOP_COPTS (kernels/cpu_loops.bzl): the rules of
// kernels/cpu.h, as kernels/cpu/kernels.cc.
#include <stdint.h>

#include "kernels/cpu.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu_runtime.h"
#include "kernels/elementwise.h"
#include "kernels/math.h"
#include "kernels/rowwise.h"

namespace kernels {
namespace cpu {
namespace {

namespace k = ::kernels;

// Elementwise chunks start on 64-byte lines (16 floats).
constexpr int64_t kAlign = 16;

// ---- RMSNorm, one row at a time; the row sums through k::LaneSum in 8 float lanes.

template <typename W, typename Y>
FSDP_CPU_INLINE void RmsNormRows(const float* FSDP_RESTRICT x, const W* FSDP_RESTRICT w,
                                 float eps, Y* FSDP_RESTRICT y, float* FSDP_RESTRICT xhat,
                                 float* FSDP_RESTRICT rstd, int64_t rows, int64_t cols) {
  const float inv_cols = 1.0f / static_cast<float>(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    Y* yr = y + r * cols;
    float* hr = xhat + r * cols;
    const float sq = k::LaneSum<float>(cols, [&](int64_t j) { return xr[j] * xr[j]; });
    const float rs = k::RmsNormRstd(sq * inv_cols, eps);
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) k::Store(yr, j, k::RmsNormApply(xr[j], rs, w, j, &hr[j]));
    rstd[r] = rs;
  }
}
// w and y each fp32 or bf16.
#define FSDP_RMS_NORM_LOOP(W, Y)                                                          \
  FSDP_CPU_CLONES void RmsNormLoop(const float* x, const W* w, float eps, Y* y, float* xhat, \
                                   float* rstd, int64_t rows, int64_t cols) {              \
    RmsNormRows(x, w, eps, y, xhat, rstd, rows, cols);                                     \
  }
FSDP_RMS_NORM_LOOP(float, float)
FSDP_RMS_NORM_LOOP(uint16_t, float)
FSDP_RMS_NORM_LOOP(float, uint16_t)
FSDP_RMS_NORM_LOOP(uint16_t, uint16_t)
#undef FSDP_RMS_NORM_LOOP

// RMSNorm's input gradient for `rows` rows; with `residual` non-null, residual + it (NOTE
// [Fused ops]), and with gx16 non-null also that sum rounded to bf16 there.
template <typename W>
FSDP_CPU_INLINE void RmsNormBackwardRows(const float* FSDP_RESTRICT g,
                                         const float* FSDP_RESTRICT xhat,
                                         const float* FSDP_RESTRICT rstd,
                                         const W* FSDP_RESTRICT w,
                                         const float* FSDP_RESTRICT residual,
                                         float* FSDP_RESTRICT gx, uint16_t* FSDP_RESTRICT gx16,
                                         int64_t rows, int64_t cols) {
  const float inv_cols = 1.0f / static_cast<float>(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* gr = g + r * cols;
    const float* hr = xhat + r * cols;
    const float sum = k::LaneSum<float>(
        cols, [&](int64_t j) { return k::LayerNormGradHat<float>(gr[j], w, j) * hr[j]; });
    const float mean = sum * inv_cols;
    const float rs = rstd[r];
    float* o = gx + r * cols;
    if (residual == nullptr) {
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) {
        o[j] = k::RmsNormBackwardInput(gr[j], w, j, hr[j], rs, mean);
      }
    } else if (gx16 == nullptr) {
      const float* res = residual + r * cols;
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) {
        o[j] = k::RmsNormBackwardInputAdd(res[j], gr[j], w, j, hr[j], rs, mean);
      }
    } else {
      const float* res = residual + r * cols;
      uint16_t* o16 = gx16 + r * cols;
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) {
        const float sum_j = k::RmsNormBackwardInputAdd(res[j], gr[j], w, j, hr[j], rs, mean);
        o[j] = sum_j;
        k::Store(o16, j, sum_j);
      }
    }
  }
}
FSDP_CPU_CLONES void RmsNormBackwardLoop(const float* g, const float* xhat, const float* rstd,
                                         const float* w, const float* residual, float* gx,
                                         uint16_t* gx16, int64_t rows, int64_t cols) {
  RmsNormBackwardRows(g, xhat, rstd, w, residual, gx, gx16, rows, cols);
}
FSDP_CPU_CLONES void RmsNormBackwardLoop(const float* g, const float* xhat, const float* rstd,
                                         const uint16_t* w, const float* residual, float* gx,
                                         uint16_t* gx16, int64_t rows, int64_t cols) {
  RmsNormBackwardRows(g, xhat, rstd, w, residual, gx, gx16, rows, cols);
}

// RMSNorm's input gradient over row chunks of the intra-op threads; with residual non-null,
// residual + it (and its bf16 copy when gx16 is not null).
void RmsNormBackwardRowsParallel(const float* g, const float* xhat, const float* rstd,
                                 const void* w, bool bf16, const float* residual, float* gx,
                                 uint16_t* gx16, int64_t rows, int64_t cols) {
  ParallelChunks(IntraOpThreads(), rows, rows * cols, 1, [&](int64_t s, int64_t e) {
    const int64_t o = s * cols;
    const float* res = residual != nullptr ? residual + o : nullptr;
    uint16_t* out16 = gx16 != nullptr ? gx16 + o : nullptr;
    if (bf16) {
      RmsNormBackwardLoop(g + o, xhat + o, rstd + s, static_cast<const uint16_t*>(w), res, gx + o,
                          out16, e - s, cols);
    } else {
      RmsNormBackwardLoop(g + o, xhat + o, rstd + s, static_cast<const float*>(w), res, gx + o,
                          out16, e - s, cols);
    }
  });
}

// ---- SwiGLU.

FSDP_CPU_CLONES void SiluMulLoop(const float* FSDP_RESTRICT a, const float* FSDP_RESTRICT b,
                                 float* FSDP_RESTRICT h, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) h[i] = k::SiluMulForward(a[i], b[i]);
}

FSDP_CPU_CLONES void SiluMulBackwardLoop(const float* FSDP_RESTRICT a,
                                         const float* FSDP_RESTRICT b,
                                         const float* FSDP_RESTRICT gh, float* FSDP_RESTRICT ga,
                                         float* FSDP_RESTRICT gb, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    ga[i] = k::SiluMulGradGate(a[i], b[i], gh[i]);
    gb[i] = k::SiluMulGradUp(a[i], gh[i]);
  }
}

// ---- Rotary embedding and the grouped heads.

// y = the head x of width 2 half turned by the angles whose cosines are c and sines
// sign * s (sign -1: the inverse rotation).
FSDP_CPU_INLINE void RotateHead(const float* FSDP_RESTRICT x, const float* FSDP_RESTRICT c,
                                const float* FSDP_RESTRICT s, float sign, float* FSDP_RESTRICT y,
                                int64_t half) {
#pragma omp simd
  for (int64_t i = 0; i < half; ++i) {
    y[i] = k::RotaryRotate(x[i], x[half + i], c[i], sign * s[i], true);
  }
#pragma omp simd
  for (int64_t i = 0; i < half; ++i) {
    y[half + i] = k::RotaryRotate(x[half + i], x[i], c[i], sign * s[i], false);
  }
}

// Rows [first, end) of RotaryPackQkv.
FSDP_CPU_CLONES void RotaryPackLoop(const float* FSDP_RESTRICT q, const float* FSDP_RESTRICT key,
                                    const float* FSDP_RESTRICT v, const float* cos,
                                    const float* sin, float* FSDP_RESTRICT qkv, int64_t first,
                                    int64_t end, int64_t T, int64_t H, int64_t KV, int64_t D) {
  const int64_t C = H * D, KW = KV * D, half = D / 2, group = H / KV;
  for (int64_t r = first; r < end; ++r) {
    const float* c = cos + (r % T) * half;
    const float* s = sin + (r % T) * half;
    float* out = qkv + r * 3 * C;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t src = r * KW + (h / group) * D;
      RotateHead(q + r * C + h * D, c, s, 1.0f, out + h * D, half);
      RotateHead(key + src, c, s, 1.0f, out + C + h * D, half);
      float* vo = out + 2 * C + h * D;
#pragma omp simd
      for (int64_t j = 0; j < D; ++j) vo[j] = v[src + j];
    }
  }
}

// Rows [first, end) of RotaryPackQkvBackward. Each group's gradients are added in head
// order, as the CUDA kernel adds them, into gk's and gv's rows; gk's row is then turned
// back in place, pair by pair.
FSDP_CPU_CLONES void RotaryPackBackwardLoop(const float* FSDP_RESTRICT gqkv, const float* cos,
                                            const float* sin, float* FSDP_RESTRICT gq,
                                            float* FSDP_RESTRICT gk, float* FSDP_RESTRICT gv,
                                            int64_t first, int64_t end, int64_t T, int64_t H,
                                            int64_t KV, int64_t D) {
  const int64_t C = H * D, KW = KV * D, half = D / 2, group = H / KV;
  for (int64_t r = first; r < end; ++r) {
    const float* c = cos + (r % T) * half;
    const float* s = sin + (r % T) * half;
    const float* g = gqkv + r * 3 * C;
    for (int64_t h = 0; h < H; ++h) RotateHead(g + h * D, c, s, -1.0f, gq + r * C + h * D, half);
    for (int64_t kv = 0; kv < KV; ++kv) {
      const float* gk0 = g + C + kv * group * D;
      const float* gv0 = g + 2 * C + kv * group * D;
      float* ko = gk + r * KW + kv * D;
      float* vo = gv + r * KW + kv * D;
#pragma omp simd
      for (int64_t j = 0; j < D; ++j) {
        ko[j] = gk0[j];
        vo[j] = gv0[j];
      }
      for (int64_t m = 1; m < group; ++m) {
#pragma omp simd
        for (int64_t j = 0; j < D; ++j) {
          ko[j] = k::Add(ko[j], gk0[m * D + j]);
          vo[j] = k::Add(vo[j], gv0[m * D + j]);
        }
      }
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const float a = ko[i], b = ko[half + i];
        ko[i] = k::RotaryRotate(a, b, c[i], -1.0f * s[i], true);
        ko[half + i] = k::RotaryRotate(b, a, c[i], -1.0f * s[i], false);
      }
    }
  }
}

}  // namespace

void RmsNormForward(const float* x, const void* w, bool bf16, float eps, void* y, float* xhat,
                    float* rstd, int64_t rows, int64_t cols, bool y_bf16) {
  ParallelChunks(IntraOpThreads(), rows, rows * cols, 1, [&](int64_t s, int64_t e) {
    const int64_t o = s * cols;
    const auto with_y = [&](const auto* wp) {
      if (y_bf16) {
        RmsNormLoop(x + o, wp, eps, static_cast<uint16_t*>(y) + o, xhat + o, rstd + s, e - s,
                    cols);
      } else {
        RmsNormLoop(x + o, wp, eps, static_cast<float*>(y) + o, xhat + o, rstd + s, e - s, cols);
      }
    };
    if (bf16) {
      with_y(static_cast<const uint16_t*>(w));
    } else {
      with_y(static_cast<const float*>(w));
    }
  });
}

void RmsNormBackwardInput(const float* g, const float* xhat, const float* rstd, const void* w,
                          bool bf16, float* gx, int64_t rows, int64_t cols) {
  RmsNormBackwardRowsParallel(g, xhat, rstd, w, bf16, nullptr, gx, nullptr, rows, cols);
}

void RmsNormBackwardInputAdd(const float* g, const float* xhat, const float* rstd, const void* w,
                             bool bf16, const float* residual, float* gx, int64_t rows,
                             int64_t cols, uint16_t* gx16) {
  RmsNormBackwardRowsParallel(g, xhat, rstd, w, bf16, residual, gx, gx16, rows, cols);
}

void SiluMulForward(const float* a, const float* b, float* h, int64_t n) {
  ParallelChunks(IntraOpThreads(), n, n, kAlign,
                 [&](int64_t s, int64_t e) { SiluMulLoop(a + s, b + s, h + s, e - s); });
}

void SiluMulBackward(const float* a, const float* b, const float* gh, float* ga, float* gb,
                     int64_t n) {
  ParallelChunks(IntraOpThreads(), n, n, kAlign, [&](int64_t s, int64_t e) {
    SiluMulBackwardLoop(a + s, b + s, gh + s, ga + s, gb + s, e - s);
  });
}

void RotaryPackQkv(const float* q, const float* k, const float* v, const float* cos,
                   const float* sin, float* qkv, int64_t rows, int64_t T, int64_t H, int64_t KV,
                   int64_t D) {
  ParallelChunks(IntraOpThreads(), rows, rows * 3 * H * D, 1, [&](int64_t s, int64_t e) {
    RotaryPackLoop(q, k, v, cos, sin, qkv, s, e, T, H, KV, D);
  });
}

void RotaryPackQkvBackward(const float* gqkv, const float* cos, const float* sin, float* gq,
                           float* gk, float* gv, int64_t rows, int64_t T, int64_t H, int64_t KV,
                           int64_t D) {
  ParallelChunks(IntraOpThreads(), rows, rows * 3 * H * D, 1, [&](int64_t s, int64_t e) {
    RotaryPackBackwardLoop(gqkv, cos, sin, gq, gk, gv, s, e, T, H, KV, D);
  });
}

}  // namespace cpu
}  // namespace kernels
