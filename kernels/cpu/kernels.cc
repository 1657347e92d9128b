// CPU launchers of the kernels/ bodies; see kernels/cpu/kernels.h. Compiled with
// CPU_LOOP_COPTS (kernels/cpu_loops.bzl): the rules of kernels/cpu.h.
#include "kernels/cpu/kernels.h"

#include <stdint.h>

#include <vector>

#include "core/bf16_hd.h"
#include "kernels/cpu.h"
#include "kernels/cpu_runtime.h"
#include "kernels/elementwise.h"
#include "kernels/grad.h"
#include "kernels/math.h"
#include "kernels/rowwise.h"

namespace kernels {
namespace cpu {
namespace {

namespace k = ::kernels;

// ---- CPU loops. Each is compiled per ISA (FSDP_CPU_CLONES, kernels/cpu.h) and written
// so GCC vectorises it: raw restrict pointers, `omp simd`, bodies from kernels/ inlined,
// row sums through k::LaneSum in 8 float lanes (4 double lanes where a test needs double
// accuracy), in a fixed order. Every result, sums included, has the same bits in every clone.

FSDP_CPU_CLONES void GeluForwardLoop(const float* FSDP_RESTRICT x, float* FSDP_RESTRICT y,
                                     int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = k::GeluTanhForward(x[i]);
}

FSDP_CPU_CLONES void GeluBackwardLoop(const float* FSDP_RESTRICT x, const float* FSDP_RESTRICT g,
                                      float* FSDP_RESTRICT gx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) gx[i] = k::GeluTanhBackward(x[i], g[i]);
}

FSDP_CPU_CLONES void ReluForwardLoop(const float* FSDP_RESTRICT x, float* FSDP_RESTRICT y,
                                     int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = k::ReluForward(x[i]);
}

FSDP_CPU_CLONES void ReluBackwardLoop(const float* FSDP_RESTRICT y, const float* FSDP_RESTRICT g,
                                      float* FSDP_RESTRICT gx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) gx[i] = k::ReluBackward(y[i], g[i]);
}

// out may alias a or b (in-place residual adds): no restrict.
FSDP_CPU_CLONES void AddLoop(const float* a, const float* b, float* out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = k::Add(a[i], b[i]);
}

// out may alias x (in-place bias add).
template <typename W>
FSDP_CPU_INLINE void BiasAddRows(const float* x, const W* FSDP_RESTRICT bias, float* out,
                                 int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* orow = out + r * cols;
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) orow[j] = k::BiasAdd(xr[j], bias, j);
  }
}
FSDP_CPU_CLONES void BiasAddLoop(const float* x, const float* bias, float* out, int64_t rows,
                                 int64_t cols) {
  BiasAddRows(x, bias, out, rows, cols);
}
FSDP_CPU_CLONES void BiasAddLoop(const float* x, const uint16_t* bias, float* out, int64_t rows,
                                 int64_t cols) {
  BiasAddRows(x, bias, out, rows, cols);
}

// NOTE [GEMM epilogues]: rows of a GEMM's fp32 product `acc` through the epilogue `kind`
// into `out` (fp32 or bf16 T), the pre-activation into `aux` (T) for kGemmEpilogueBiasGelu,
// read from it for kGemmEpilogueDGelu, the residual read from it for
// kGemmEpilogueBiasResidual and kGemmEpilogueResidual. out may be acc (fp32).
template <typename W, typename T>
FSDP_CPU_INLINE void GemmEpilogueRows(const float* acc, int kind, const W* FSDP_RESTRICT bias,
                                      T* aux, T* out, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* ar = acc + r * cols;
    T* xr = aux != nullptr ? aux + r * cols : nullptr;
    T* orow = out + r * cols;
    // One loop per kind, so each vectorises.
    if (kind == k::kGemmEpilogueBiasGelu) {
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) {
        const float pre = k::GemmEpiloguePre(k::kGemmEpilogueBiasGelu, ar[j], bias, j);
        k::Store(xr, j, pre);
        k::Store(orow, j, k::GemmEpilogueOut(k::kGemmEpilogueBiasGelu, pre, 0.0f));
      }
    } else if (kind == k::kGemmEpilogueDGelu) {
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) {
        k::Store(orow, j, k::GemmEpilogueOut(k::kGemmEpilogueDGelu, ar[j], k::Load(xr, j)));
      }
    } else if (kind == k::kGemmEpilogueBias) {
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) {
        k::Store(orow, j, k::GemmEpiloguePre(k::kGemmEpilogueBias, ar[j], bias, j));
      }
    } else if (kind == k::kGemmEpilogueBiasResidual) {
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) {
        const float pre = k::GemmEpiloguePre(k::kGemmEpilogueBiasResidual, ar[j], bias, j);
        k::Store(orow, j, k::GemmEpilogueOut(k::kGemmEpilogueBiasResidual, pre, k::Load(xr, j)));
      }
    } else if (kind == k::kGemmEpilogueResidual) {
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) {
        k::Store(orow, j, k::GemmEpilogueOut(k::kGemmEpilogueResidual, ar[j], k::Load(xr, j)));
      }
    } else {
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) k::Store(orow, j, ar[j]);
    }
  }
}
#define FSDP_GEMM_EPILOGUE_LOOP(W, T)                                                              \
  FSDP_CPU_CLONES void GemmEpilogueLoop(const float* acc, int kind, const W* bias, T* aux, T* out, \
                                        int64_t rows, int64_t cols) {                              \
    GemmEpilogueRows(acc, kind, bias, aux, out, rows, cols);                                       \
  }
FSDP_GEMM_EPILOGUE_LOOP(float, float)
FSDP_GEMM_EPILOGUE_LOOP(float, uint16_t)
FSDP_GEMM_EPILOGUE_LOOP(uint16_t, float)
FSDP_GEMM_EPILOGUE_LOOP(uint16_t, uint16_t)
#undef FSDP_GEMM_EPILOGUE_LOOP

// sums[j] += sum_r x[r, j] for j < cols of a bf16 x, rows `ld` apart: ColumnSumsLoop's
// additions of the widened values.
FSDP_CPU_CLONES void ColumnSumsBf16Loop(const uint16_t* FSDP_RESTRICT x, double* FSDP_RESTRICT sums,
                                        int64_t rows, int64_t cols, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* xr = x + r * ld;
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) sums[j] += static_cast<double>(k::Load(xr, j));
  }
}

// sums[j] += sum_r x[r, j] * (y ? y[r, j] : 1) for j < cols, rows `ld` apart; double
// accumulators, columns in lanes, rows added in order.
FSDP_CPU_CLONES void ColumnSumsLoop(const float* FSDP_RESTRICT x, const float* FSDP_RESTRICT y,
                                    double* FSDP_RESTRICT sums, int64_t rows, int64_t cols,
                                    int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ld;
    if (y != nullptr) {
      const float* yr = y + r * ld;
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) sums[j] += static_cast<double>(xr[j]) * yr[j];
    } else {
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) sums[j] += static_cast<double>(xr[j]);
    }
  }
}

// The parameter gradients' column sums of a norm's backward for `rows` rows, in one pass over
// g and x: sw[j] += g * xhat (xhat = LayerNormHat(x, mean, rstd), or without Centered
// RmsNormHat(x, rstd)) where SW, sb[j] += g where SB; double accumulators, rows added in
// order: ColumnSumsLoop's additions over an xhat made first, without writing it.
template <bool Centered, bool SW, bool SB>
FSDP_CPU_INLINE void NormParamGradRows(const float* FSDP_RESTRICT g, const float* FSDP_RESTRICT x,
                                       const float* mean, const float* rstd,
                                       double* FSDP_RESTRICT sw, double* FSDP_RESTRICT sb,
                                       int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* gr = g + r * cols;
    const float* xr = x + r * cols;
    const float mu = Centered ? mean[r] : 0.0f, rs = rstd[r];
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) {
      if constexpr (SW) {
        const float h = Centered ? k::LayerNormHat(xr[j], mu, rs) : k::RmsNormHat(xr[j], rs);
        sw[j] += static_cast<double>(gr[j]) * h;
      }
      if constexpr (SB) sb[j] += static_cast<double>(gr[j]);
    }
  }
}
FSDP_CPU_CLONES void NormParamGradsLoop(const float* g, const float* x, const float* mean,
                                        const float* rstd, double* sw, double* sb, int64_t rows,
                                        int64_t cols) {
  if (mean != nullptr) {
    if (sw != nullptr && sb != nullptr) {
      NormParamGradRows<true, true, true>(g, x, mean, rstd, sw, sb, rows, cols);
    } else if (sw != nullptr) {
      NormParamGradRows<true, true, false>(g, x, mean, rstd, sw, sb, rows, cols);
    } else {
      NormParamGradRows<true, false, true>(g, x, mean, rstd, sw, sb, rows, cols);
    }
  } else if (sw != nullptr) {
    NormParamGradRows<false, true, false>(g, x, mean, rstd, sw, sb, rows, cols);
  }
}

// One row of LayerNorm: y from x; its mean in *mean_out; returns rstd. Without Centered,
// one row of RMSNorm instead (no mean, no bias: b and mean_out unused).
template <bool Centered, typename W, typename Y>
FSDP_CPU_INLINE float LayerNormRow(const float* FSDP_RESTRICT xr, const W* FSDP_RESTRICT w,
                                   const W* FSDP_RESTRICT b, float eps, Y* FSDP_RESTRICT yr,
                                   float* mean_out, int64_t cols) {
  const float inv_cols = 1.0f / static_cast<float>(cols);
  if constexpr (!Centered) {
    const float sq = k::LaneSum<float>(cols, [&](int64_t j) { return xr[j] * xr[j]; });
    const float inv = k::RmsNormRstd(sq * inv_cols, eps);
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) k::Store(yr, j, k::RmsNormApply(xr[j], inv, w, j));
    return inv;
  } else {
    const float sum = k::LaneSum<float>(cols, [&](int64_t j) { return xr[j]; });
    const float mean = sum * inv_cols;
    const float sq = k::LaneSum<float>(cols, [&](int64_t j) {
      const float d = xr[j] - mean;
      return d * d;
    });
    const float inv = k::LayerNormRstd(sq * inv_cols, eps);
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) {
      k::Store(yr, j, k::LayerNormApply(xr[j], mean, inv, w, b, j));
    }
    *mean_out = mean;
    return inv;
  }
}

// LayerNorm of `rows` rows of x; with `add` non-null, of x + add, written to `sum` first
// (NOTE [Fused ops]; sum may be x or add). With mean null, RMSNorm (b unused).
template <typename W, typename Y>
FSDP_CPU_INLINE void LayerNormRows(const float* x, const float* add, float* sum,
                                   const W* FSDP_RESTRICT w, const W* FSDP_RESTRICT b, float eps,
                                   Y* FSDP_RESTRICT y, float* FSDP_RESTRICT mean,
                                   float* FSDP_RESTRICT rstd, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    if (add != nullptr) {
      const float* ar = add + r * cols;
      float* sr = sum + r * cols;
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) sr[j] = k::Add(xr[j], ar[j]);
      xr = sr;
    }
    rstd[r] = mean != nullptr ? LayerNormRow<true>(xr, w, b, eps, y + r * cols, mean + r, cols)
                              : LayerNormRow<false>(xr, w, b, eps, y + r * cols, nullptr, cols);
  }
}
// y fp32 or bf16 (NOTE [GEMM epilogues]: an output whose consumer is a bf16 GEMM).
#define FSDP_LAYER_NORM_LOOP(W, Y)                                                             \
  FSDP_CPU_CLONES void LayerNormLoop(const float* x, const float* add, float* sum, const W* w, \
                                     const W* b, float eps, Y* y, float* mean, float* rstd,    \
                                     int64_t rows, int64_t cols) {                             \
    LayerNormRows(x, add, sum, w, b, eps, y, mean, rstd, rows, cols);                          \
  }
FSDP_LAYER_NORM_LOOP(float, float)
FSDP_LAYER_NORM_LOOP(uint16_t, float)
FSDP_LAYER_NORM_LOOP(float, uint16_t)
FSDP_LAYER_NORM_LOOP(uint16_t, uint16_t)
#undef FSDP_LAYER_NORM_LOOP

// Row r of `out` ([rows, T] bf16) from the finished fp32 row, rounded once, while the row
// is still in cache.
FSDP_CPU_INLINE void RoundRow(const float* FSDP_RESTRICT row, uint16_t* FSDP_RESTRICT out,
                              int64_t T) {
#pragma omp simd
  for (int64_t s = 0; s < T; ++s) out[s] = core::FloatToBf16Bits(row[s]);
}

// LayerNorm's input gradient for one row, xhat recomputed from x, mean and rstd (without
// Centered, RMSNorm's from x and rstd; mu unused); with `residual` non-null, residual + it
// (NOTE [Fused ops]), and with gx16 non-null also that sum rounded to bf16 there.
template <bool Centered, typename W>
FSDP_CPU_INLINE void LayerNormBackwardRow(const float* FSDP_RESTRICT gr,
                                          const float* FSDP_RESTRICT xr, float mu, float rs,
                                          const W* FSDP_RESTRICT w, const float* FSDP_RESTRICT res,
                                          float* FSDP_RESTRICT o, uint16_t* FSDP_RESTRICT o16,
                                          int64_t cols) {
  const float inv_cols = 1.0f / static_cast<float>(cols);
  const auto hat = [&](int64_t j) {
    if constexpr (Centered) {
      return k::LayerNormHat(xr[j], mu, rs);
    } else {
      return k::RmsNormHat(xr[j], rs);
    }
  };
  float mean_gh = 0.0f;
  if constexpr (Centered) {
    mean_gh = k::LaneSum<float>(
                  cols, [&](int64_t j) { return k::LayerNormGradHat<float>(gr[j], w, j); }) *
              inv_cols;
  }
  const float mean_gh_h =
      k::LaneSum<float>(
          cols, [&](int64_t j) { return k::LayerNormGradHat<float>(gr[j], w, j) * hat(j); }) *
      inv_cols;
  const auto input_grad = [&](int64_t j) {
    if constexpr (Centered) {
      return k::LayerNormBackwardInput(gr[j], w, j, hat(j), rs, mean_gh, mean_gh_h);
    } else {
      return k::RmsNormBackwardInput(gr[j], w, j, hat(j), rs, mean_gh_h);
    }
  };
  if (res != nullptr) {
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) o[j] = k::Add(res[j], input_grad(j));
    if (o16 != nullptr) RoundRow(o, o16, cols);
  } else {
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) o[j] = input_grad(j);
  }
}
// `rows` rows of that; with mean null, RMSNorm's.
template <typename W>
FSDP_CPU_INLINE void LayerNormBackwardRows(const float* g, const float* x, const float* mean,
                                           const float* rstd, const W* w, const float* residual,
                                           float* gx, uint16_t* gx16, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t o = r * cols;
    const float* res = residual != nullptr ? residual + o : nullptr;
    uint16_t* o16 = gx16 != nullptr ? gx16 + o : nullptr;
    if (mean != nullptr) {
      LayerNormBackwardRow<true>(g + o, x + o, mean[r], rstd[r], w, res, gx + o, o16, cols);
    } else {
      LayerNormBackwardRow<false>(g + o, x + o, 0.0f, rstd[r], w, res, gx + o, o16, cols);
    }
  }
}
FSDP_CPU_CLONES void LayerNormBackwardLoop(const float* g, const float* x, const float* mean,
                                           const float* rstd, const float* w, const float* residual,
                                           float* gx, uint16_t* gx16, int64_t rows, int64_t cols) {
  LayerNormBackwardRows(g, x, mean, rstd, w, residual, gx, gx16, rows, cols);
}
FSDP_CPU_CLONES void LayerNormBackwardLoop(const float* g, const float* x, const float* mean,
                                           const float* rstd, const uint16_t* w,
                                           const float* residual, float* gx, uint16_t* gx16,
                                           int64_t rows, int64_t cols) {
  LayerNormBackwardRows(g, x, mean, rstd, w, residual, gx, gx16, rows, cols);
}

// xhat of `rows` rows of LayerNorm's input x from each row's mean and rstd (with mean null,
// RMSNorm's from rstd).
FSDP_CPU_CLONES void LayerNormHatLoop(const float* FSDP_RESTRICT x, const float* mean,
                                      const float* rstd, float* FSDP_RESTRICT xhat, int64_t rows,
                                      int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const float rs = rstd[r];
    const float* xr = x + r * cols;
    float* hr = xhat + r * cols;
    if (mean != nullptr) {
      const float mu = mean[r];
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) hr[j] = k::LayerNormHat(xr[j], mu, rs);
    } else {
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) hr[j] = k::RmsNormHat(xr[j], rs);
    }
  }
}

// Rows [first, end) of [rows, T] scores, row r attending to s <= r % T; in place, and
// rounded into out16 too when it is not null.
FSDP_CPU_CLONES void CausalSoftmaxLoop(float* FSDP_RESTRICT p, uint16_t* out16, int64_t first,
                                       int64_t end, int64_t T) {
  for (int64_t r = first; r < end; ++r) {
    const int64_t t = r % T;
    float* row = p + r * T;
    float max = row[0];
#pragma omp simd reduction(max : max)
    for (int64_t s = 1; s <= t; ++s) max = max > row[s] ? max : row[s];
#pragma omp simd
    for (int64_t s = 0; s <= t; ++s) row[s] = k::SoftmaxExp(row[s], max);
    const float sum = k::LaneSum<float>(t + 1, [&](int64_t s) { return row[s]; });
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int64_t s = 0; s < T; ++s) {
      row[s] = k::CausalMasked(t, s) ? 0.0f : k::SoftmaxNormalize(row[s], inv);
    }
    if (out16 != nullptr) RoundRow(row, out16 + r * T, T);
  }
}

// Rows [first, end) of the softmax backward with probabilities P (fp32 or bf16): in place
// on g, and rounded into out16 too when it is not null.
template <typename P>
FSDP_CPU_INLINE void CausalSoftmaxBackwardRows(const P* FSDP_RESTRICT p, float* FSDP_RESTRICT g,
                                               uint16_t* out16, int64_t first, int64_t end,
                                               int64_t T, float scale) {
  for (int64_t r = first; r < end; ++r) {
    const int64_t t = r % T;
    const P* pr = p + r * T;
    float* gr = g + r * T;
    const float dot = k::LaneSum<float>(t + 1, [&](int64_t s) { return gr[s] * k::Load(pr, s); });
#pragma omp simd
    for (int64_t s = 0; s < T; ++s) {
      gr[s] = k::CausalMasked(t, s) ? 0.0f : k::SoftmaxBackward(k::Load(pr, s), gr[s], dot, scale);
    }
    if (out16 != nullptr) RoundRow(gr, out16 + r * T, T);
  }
}
FSDP_CPU_CLONES void CausalSoftmaxBackwardLoop(const float* p, float* g, uint16_t* out16,
                                               int64_t first, int64_t end, int64_t T, float scale) {
  CausalSoftmaxBackwardRows(p, g, out16, first, end, T, scale);
}
FSDP_CPU_CLONES void CausalSoftmaxBackwardLoop(const uint16_t* p, float* g, uint16_t* out16,
                                               int64_t first, int64_t end, int64_t T, float scale) {
  CausalSoftmaxBackwardRows(p, g, out16, first, end, T, scale);
}

// Cross-entropy rows [first, end) of logits X (fp32, or bf16 widened exactly) in double
// lanes (the loss is checked to 1e-12); stores each row's loss in row_loss[i].
template <typename X>
FSDP_CPU_INLINE void CrossEntropyRows(const X* FSDP_RESTRICT x,
                                      const int32_t* FSDP_RESTRICT targets,
                                      float* FSDP_RESTRICT grad, double* FSDP_RESTRICT row_loss,
                                      uint16_t* FSDP_RESTRICT grad16, int64_t first, int64_t end,
                                      int64_t V, double inv_n) {
  for (int64_t i = first; i < end; ++i) {
    const X* row = x + i * V;
    float maxf = k::Load(row, 0);
#pragma omp simd reduction(max : maxf)
    for (int64_t j = 1; j < V; ++j) {
      const float v = k::Load(row, j);
      maxf = maxf > v ? maxf : v;
    }
    const double max = maxf;
    const double sum =
        k::LaneSum<double>(V, [&](int64_t j) { return k::CrossEntropyExp(k::Load(row, j), max); });
    const double log_sum = k::Log(sum);
    const int64_t tg = targets[i];
    row_loss[i] = k::CrossEntropyRowLoss(sum, max, k::Load(row, tg));
    if (grad16 != nullptr) {
      uint16_t* grow = grad16 + i * V;
#pragma omp simd
      for (int64_t j = 0; j < V; ++j) {
        grow[j] = core::FloatToBf16Bits(
            k::CrossEntropyGrad(k::Load(row, j), max, log_sum, j == tg, inv_n));
      }
    } else {
      float* grow = grad + i * V;
#pragma omp simd
      for (int64_t j = 0; j < V; ++j) {
        grow[j] = k::CrossEntropyGrad(k::Load(row, j), max, log_sum, j == tg, inv_n);
      }
    }
  }
}
FSDP_CPU_CLONES void CrossEntropyLoop(const float* x, const int32_t* targets, float* grad,
                                      double* row_loss, uint16_t* grad16, int64_t first,
                                      int64_t end, int64_t V, double inv_n) {
  CrossEntropyRows(x, targets, grad, row_loss, grad16, first, end, V, inv_n);
}
FSDP_CPU_CLONES void CrossEntropyLoop(const uint16_t* x, const int32_t* targets, float* grad,
                                      double* row_loss, uint16_t* grad16, int64_t first,
                                      int64_t end, int64_t V, double inv_n) {
  CrossEntropyRows(x, targets, grad, row_loss, grad16, first, end, V, inv_n);
}

// Elementwise chunks start on 64-byte lines (16 floats).
constexpr int64_t kAlign = 16;

// acc[j] = acc[j] + sums[j], rounded once to float.
void AddSums(const std::vector<double>& sums, float* acc) {
  for (size_t j = 0; j < sums.size(); ++j) acc[j] = static_cast<float>(acc[j] + sums[j]);
}

// LayerNorm of x, or of x + add written to sum when add is non-null; with mean null,
// RMSNorm (b unused).
void LayerNormRowsParallel(const float* x, const float* add, float* sum, const void* w,
                           const void* b, bool bf16, float eps, void* y, bool y_bf16, float* mean,
                           float* rstd, int64_t rows, int64_t cols) {
  k::WithStored(w, bf16, [&](const auto* wp) {
    const auto* bp = static_cast<decltype(wp)>(b);
    ParallelChunks(IntraOpThreads(), rows, rows * cols, 1, [&](int64_t s, int64_t e) {
      const int64_t o = s * cols;
      const float* xo = x + o;
      const float* ao = add != nullptr ? add + o : nullptr;
      float* so = sum != nullptr ? sum + o : nullptr;
      float* mo = mean != nullptr ? mean + s : nullptr;
      if (y_bf16) {
        LayerNormLoop(xo, ao, so, wp, bp, eps, static_cast<uint16_t*>(y) + o, mo, rstd + s, e - s,
                      cols);
      } else {
        LayerNormLoop(xo, ao, so, wp, bp, eps, static_cast<float*>(y) + o, mo, rstd + s, e - s,
                      cols);
      }
    });
  });
}

// LayerNorm's input gradient (with mean null, RMSNorm's); with residual non-null,
// residual + it.
void LayerNormBackwardRowsParallel(const float* g, const float* x, const float* mean,
                                   const float* rstd, const void* w, bool bf16,
                                   const float* residual, float* gx, uint16_t* gx16, int64_t rows,
                                   int64_t cols) {
  k::WithStored(w, bf16, [&](const auto* wp) {
    ParallelChunks(IntraOpThreads(), rows, rows * cols, 1, [&](int64_t s, int64_t e) {
      const int64_t o = s * cols;
      LayerNormBackwardLoop(g + o, x + o, mean != nullptr ? mean + s : nullptr, rstd + s, wp,
                            residual != nullptr ? residual + o : nullptr, gx + o,
                            gx16 != nullptr ? gx16 + o : nullptr, e - s, cols);
    });
  });
}

}  // namespace

void GeluForward(const float* x, float* y, int64_t n) {
  ParallelChunks(IntraOpThreads(), n, n, kAlign,
                 [&](int64_t b, int64_t e) { GeluForwardLoop(x + b, y + b, e - b); });
}

void GeluBackward(const float* x, const float* gy, float* gx, int64_t n) {
  ParallelChunks(IntraOpThreads(), n, n, kAlign,
                 [&](int64_t b, int64_t e) { GeluBackwardLoop(x + b, gy + b, gx + b, e - b); });
}

void ReluForward(const float* x, float* y, int64_t n) {
  ParallelChunks(IntraOpThreads(), n, n, kAlign,
                 [&](int64_t b, int64_t e) { ReluForwardLoop(x + b, y + b, e - b); });
}

void ReluBackward(const float* y, const float* gy, float* gx, int64_t n) {
  ParallelChunks(IntraOpThreads(), n, n, kAlign,
                 [&](int64_t b, int64_t e) { ReluBackwardLoop(y + b, gy + b, gx + b, e - b); });
}

void Add(const float* a, const float* b, float* out, int64_t n) {
  ParallelChunks(IntraOpThreads(), n, n, kAlign,
                 [&](int64_t s, int64_t e) { AddLoop(a + s, b + s, out + s, e - s); });
}

void BiasAdd(const float* x, const void* bias, bool bf16, float* out, int64_t rows, int64_t cols) {
  k::WithStored(bias, bf16, [&](const auto* b) {
    ParallelChunks(IntraOpThreads(), rows, rows * cols, 1, [&](int64_t s, int64_t e) {
      BiasAddLoop(x + s * cols, b, out + s * cols, e - s, cols);
    });
  });
}

// All columns on the calling thread: the loop streams its inputs once at memory speed,
// and splitting it over two threads measured no faster (nn/kernels_bench) while the
// team's start made LayerNorm's backward slower.
void ColumnSums(const float* x, const float* y, float* acc, int64_t rows, int64_t cols) {
  std::vector<double> sums(static_cast<size_t>(cols), 0.0);
  ColumnSumsLoop(x, y, sums.data(), rows, cols, cols);
  AddSums(sums, acc);
}

void NormParamGrads(const float* g, const float* x, const float* mean, const float* rstd, float* gw,
                    float* gb, int64_t rows, int64_t cols) {
  if (gw == nullptr && gb == nullptr) return;
  std::vector<double> sw(gw != nullptr ? static_cast<size_t>(cols) : 0, 0.0);
  std::vector<double> sb(gb != nullptr ? static_cast<size_t>(cols) : 0, 0.0);
  NormParamGradsLoop(g, x, mean, rstd, gw != nullptr ? sw.data() : nullptr,
                     gb != nullptr ? sb.data() : nullptr, rows, cols);
  if (gw != nullptr) AddSums(sw, gw);
  if (gb != nullptr) AddSums(sb, gb);
}

void ColumnSumsBf16(const uint16_t* x, float* acc, int64_t rows, int64_t cols) {
  std::vector<double> sums(static_cast<size_t>(cols), 0.0);
  ColumnSumsBf16Loop(x, sums.data(), rows, cols, cols);
  AddSums(sums, acc);
}

void GemmEpilogue(const float* acc, int kind, const void* bias, bool bias_bf16, void* aux,
                  void* out, bool out_bf16, int64_t rows, int64_t cols) {
  k::WithStored(bias, bias_bf16, [&](const auto* b) {
    ParallelChunks(IntraOpThreads(), rows, rows * cols, 1, [&](int64_t s, int64_t e) {
      const int64_t o = s * cols;
      if (out_bf16) {
        uint16_t* x = static_cast<uint16_t*>(aux);
        GemmEpilogueLoop(acc + o, kind, b, x != nullptr ? x + o : nullptr,
                         static_cast<uint16_t*>(out) + o, e - s, cols);
      } else {
        float* x = static_cast<float*>(aux);
        GemmEpilogueLoop(acc + o, kind, b, x != nullptr ? x + o : nullptr,
                         static_cast<float*>(out) + o, e - s, cols);
      }
    });
  });
}

void LayerNormForward(const float* x, const void* w, const void* b, bool bf16, float eps, void* y,
                      float* mean, float* rstd, int64_t rows, int64_t cols, bool y_bf16) {
  LayerNormRowsParallel(x, nullptr, nullptr, w, b, bf16, eps, y, y_bf16, mean, rstd, rows, cols);
}

void LayerNormBackwardInput(const float* g, const float* x, const float* mean, const float* rstd,
                            const void* w, bool bf16, float* gx, int64_t rows, int64_t cols) {
  LayerNormBackwardRowsParallel(g, x, mean, rstd, w, bf16, nullptr, gx, nullptr, rows, cols);
}

void LayerNormHat(const float* x, const float* mean, const float* rstd, float* xhat, int64_t rows,
                  int64_t cols) {
  ParallelChunks(IntraOpThreads(), rows, rows * cols, 1, [&](int64_t s, int64_t e) {
    LayerNormHatLoop(x + s * cols, mean != nullptr ? mean + s : nullptr, rstd + s, xhat + s * cols,
                     e - s, cols);
  });
}

void RmsNormForward(const float* x, const void* w, bool bf16, float eps, void* y, float* rstd,
                    int64_t rows, int64_t cols, bool y_bf16) {
  LayerNormRowsParallel(x, nullptr, nullptr, w, nullptr, bf16, eps, y, y_bf16, nullptr, rstd, rows,
                        cols);
}

void CausalSoftmaxForward(float* scores, int64_t rows, int64_t T, uint16_t* probs16) {
  ParallelChunks(IntraOpThreads(), rows, rows * T, 1,
                 [&](int64_t s, int64_t e) { CausalSoftmaxLoop(scores, probs16, s, e, T); });
}

void CausalSoftmaxBackward(const void* p, bool p_bf16, float* g, int64_t rows, int64_t T,
                           float scale, uint16_t* out16) {
  ParallelChunks(IntraOpThreads(), rows, rows * T, 1, [&](int64_t s, int64_t e) {
    if (p_bf16) {
      CausalSoftmaxBackwardLoop(static_cast<const uint16_t*>(p), g, out16, s, e, T, scale);
    } else {
      CausalSoftmaxBackwardLoop(static_cast<const float*>(p), g, out16, s, e, T, scale);
    }
  });
}

void EmbeddingForward(const int32_t* ids, int64_t n_ids, const void* table, bool bf16, int64_t num,
                      int64_t dim, float* y) {
  k::WithStored(table, bf16, [&](const auto* tp) {
    for (int64_t i = 0; i < n_ids; ++i) {
      float* row = y + i * dim;
      if (!k::EmbeddingIdValid(ids[i], num)) {
        for (int64_t j = 0; j < dim; ++j) row[j] = 0.0f;
        continue;
      }
      for (int64_t j = 0; j < dim; ++j) row[j] = k::EmbeddingGather(tp, ids[i], dim, j);
    }
  });
}

void EmbeddingBackward(const int32_t* ids, int64_t n_ids, const float* g, int64_t num, int64_t dim,
                       float* gw) {
  for (int64_t i = 0; i < n_ids; ++i) {
    if (!k::EmbeddingIdValid(ids[i], num)) continue;
    const float* gr = g + i * dim;
    float* wr = gw + static_cast<int64_t>(ids[i]) * dim;
    for (int64_t j = 0; j < dim; ++j) wr[j] = k::Add(wr[j], gr[j]);
  }
}

void CrossEntropy(const float* logits, const int32_t* targets, int64_t rows, int64_t V,
                  double inv_n, float* grad, double* row_loss, uint16_t* grad16) {
  ParallelChunks(IntraOpThreads(), rows, rows * V, 1, [&](int64_t s, int64_t e) {
    CrossEntropyLoop(logits, targets, grad, row_loss, grad16, s, e, V, inv_n);
  });
}
void CrossEntropy(const uint16_t* logits, const int32_t* targets, int64_t rows, int64_t V,
                  double inv_n, float* grad, double* row_loss, uint16_t* grad16) {
  ParallelChunks(IntraOpThreads(), rows, rows * V, 1, [&](int64_t s, int64_t e) {
    CrossEntropyLoop(logits, targets, grad, row_loss, grad16, s, e, V, inv_n);
  });
}

void AddLayerNormForward(const float* a, const float* b, float* sum, const void* w,
                         const void* bias, bool bf16, float eps, void* y, float* mean, float* rstd,
                         int64_t rows, int64_t cols, bool y_bf16) {
  LayerNormRowsParallel(a, b, sum, w, bias, bf16, eps, y, y_bf16, mean, rstd, rows, cols);
}

void LayerNormBackwardInputAdd(const float* g, const float* x, const float* mean, const float* rstd,
                               const void* w, bool bf16, const float* residual, float* gx,
                               int64_t rows, int64_t cols, uint16_t* gx16) {
  LayerNormBackwardRowsParallel(g, x, mean, rstd, w, bf16, residual, gx, gx16, rows, cols);
}

void AddInto(float* dst, const void* src, bool src_bf16, int64_t n) {
  if (src_bf16) {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = k::AddTerm(dst[i], k::Load(s, i));
  } else {
    const float* s = static_cast<const float*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = k::AddTerm(dst[i], s[i]);
  }
}

void Scale(float* dst, int64_t n, float factor) {
  for (int64_t i = 0; i < n; ++i) dst[i] = k::ScaleTerm(dst[i], factor);
}

double SumOfSquares(const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += k::SquareTerm(x[i]);
  return s;
}

}  // namespace cpu
}  // namespace kernels
