#include "nn/tensor_ops.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/cpu.h"
#include "kernels/elementwise.h"
#include "kernels/math.h"
#include "kernels/rowwise.h"
#include "nn/internal/op_checks.h"
#include "nn/ops.h"

#if defined(_OPENMP)
#include <omp.h>
#endif

#ifdef FSDP_WITH_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/kernels.h"
#endif

namespace nn {
namespace {

namespace k = ::kernels;
using core::DType;
using core::Tensor;
using internal::Arg;
using internal::CheckDevices;
using internal::CheckElementwiseF32;
using internal::CheckDType;
using internal::CheckNumel;
using internal::CheckWeightDType;
using internal::F32;
using internal::IsBf16;
using internal::MutF32;
using internal::WithWeight;
#ifdef FSDP_WITH_CUDA
namespace kc = ::kernels::cuda;
using internal::Launched;
using internal::UseDevice;
#else
using internal::NoCuda;
#endif

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

// pre = x + bias, y = GELU(pre) (NOTE [Fused ops]; pre may be x).
template <typename W>
FSDP_CPU_INLINE void BiasGeluRows(const float* x, const W* FSDP_RESTRICT bias, float* pre,
                                  float* FSDP_RESTRICT y, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* pr = pre + r * cols;
    float* yr = y + r * cols;
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) {
      const float p = k::BiasAdd(xr[j], bias, j);
      pr[j] = p;
      yr[j] = k::GeluTanhForward(p);
    }
  }
}
FSDP_CPU_CLONES void BiasGeluLoop(const float* x, const float* bias, float* pre, float* y,
                                  int64_t rows, int64_t cols) {
  BiasGeluRows(x, bias, pre, y, rows, cols);
}
FSDP_CPU_CLONES void BiasGeluLoop(const float* x, const uint16_t* bias, float* pre, float* y,
                                  int64_t rows, int64_t cols) {
  BiasGeluRows(x, bias, pre, y, rows, cols);
}

// gx = gy * GELU'(pre) for columns [0, cols) of `rows` rows `ld` apart, and, with `sums`
// non-null, sums[j] += gx[r, j] for each row in order: ColumnSumsLoop's additions, in its
// order (NOTE [Fused ops]).
FSDP_CPU_CLONES void GeluBackwardColumnSumsLoop(const float* FSDP_RESTRICT pre,
                                                const float* FSDP_RESTRICT g,
                                                float* FSDP_RESTRICT gx,
                                                double* FSDP_RESTRICT sums, int64_t rows,
                                                int64_t cols, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* pr = pre + r * ld;
    const float* gr = g + r * ld;
    float* o = gx + r * ld;
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) o[j] = k::GeluTanhBackward(pr[j], gr[j]);
    if (sums != nullptr) {
      // The row just written is still in L1.
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) sums[j] += static_cast<double>(o[j]);
    }
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

// One row of LayerNorm: y, xhat from x; returns rstd.
template <typename W>
FSDP_CPU_INLINE float LayerNormRow(const float* FSDP_RESTRICT xr, const W* FSDP_RESTRICT w,
                                   const W* FSDP_RESTRICT b, float eps, float* FSDP_RESTRICT yr,
                                   float* FSDP_RESTRICT hr, int64_t cols) {
  const float inv_cols = 1.0f / static_cast<float>(cols);
  const float sum = k::LaneSum<float>(cols, [&](int64_t j) { return xr[j]; });
  const float mean = sum * inv_cols;
  const float sq = k::LaneSum<float>(cols, [&](int64_t j) {
    const float d = xr[j] - mean;
    return d * d;
  });
  const float inv = k::LayerNormRstd(sq * inv_cols, eps);
#pragma omp simd
  for (int64_t j = 0; j < cols; ++j) yr[j] = k::LayerNormApply(xr[j], mean, inv, w, b, j, &hr[j]);
  return inv;
}

// LayerNorm of `rows` rows of x; with `add` non-null, of x + add, written to `sum` first
// (NOTE [Fused ops]; sum may be x or add).
template <typename W>
FSDP_CPU_INLINE void LayerNormRows(const float* x, const float* add, float* sum,
                                   const W* FSDP_RESTRICT w, const W* FSDP_RESTRICT b, float eps,
                                   float* FSDP_RESTRICT y, float* FSDP_RESTRICT xhat,
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
    rstd[r] = LayerNormRow(xr, w, b, eps, y + r * cols, xhat + r * cols, cols);
  }
}
FSDP_CPU_CLONES void LayerNormLoop(const float* x, const float* add, float* sum, const float* w,
                                   const float* b, float eps, float* y, float* xhat, float* rstd,
                                   int64_t rows, int64_t cols) {
  LayerNormRows(x, add, sum, w, b, eps, y, xhat, rstd, rows, cols);
}
FSDP_CPU_CLONES void LayerNormLoop(const float* x, const float* add, float* sum,
                                   const uint16_t* w, const uint16_t* b, float eps, float* y,
                                   float* xhat, float* rstd, int64_t rows, int64_t cols) {
  LayerNormRows(x, add, sum, w, b, eps, y, xhat, rstd, rows, cols);
}

// LayerNorm's input gradient for `rows` rows; with `residual` non-null, residual + it
// (NOTE [Fused ops]).
template <typename W>
FSDP_CPU_INLINE void LayerNormBackwardRows(const float* FSDP_RESTRICT g,
                                           const float* FSDP_RESTRICT xhat,
                                           const float* FSDP_RESTRICT rstd,
                                           const W* FSDP_RESTRICT w,
                                           const float* FSDP_RESTRICT residual,
                                           float* FSDP_RESTRICT gx, int64_t rows, int64_t cols) {
  const float inv_cols = 1.0f / static_cast<float>(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* gr = g + r * cols;
    const float* hr = xhat + r * cols;
    const float sum_gh =
        k::LaneSum<float>(cols, [&](int64_t j) { return k::LayerNormGradHat<float>(gr[j], w, j); });
    const float sum_gh_h = k::LaneSum<float>(
        cols, [&](int64_t j) { return k::LayerNormGradHat<float>(gr[j], w, j) * hr[j]; });
    const float mean_gh = sum_gh * inv_cols;
    const float mean_gh_h = sum_gh_h * inv_cols;
    const float rs = rstd[r];
    float* o = gx + r * cols;
    if (residual != nullptr) {
      const float* res = residual + r * cols;
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) {
        o[j] = k::Add(res[j], k::LayerNormBackwardInput(gr[j], w, j, hr[j], rs, mean_gh, mean_gh_h));
      }
    } else {
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) {
        o[j] = k::LayerNormBackwardInput(gr[j], w, j, hr[j], rs, mean_gh, mean_gh_h);
      }
    }
  }
}
FSDP_CPU_CLONES void LayerNormBackwardLoop(const float* g, const float* xhat, const float* rstd,
                                           const float* w, const float* residual, float* gx,
                                           int64_t rows, int64_t cols) {
  LayerNormBackwardRows(g, xhat, rstd, w, residual, gx, rows, cols);
}
FSDP_CPU_CLONES void LayerNormBackwardLoop(const float* g, const float* xhat, const float* rstd,
                                           const uint16_t* w, const float* residual, float* gx,
                                           int64_t rows, int64_t cols) {
  LayerNormBackwardRows(g, xhat, rstd, w, residual, gx, rows, cols);
}

// Rows [first, end) of [rows, T] scores, row r attending to s <= r % T; in place.
FSDP_CPU_CLONES void CausalSoftmaxLoop(float* FSDP_RESTRICT p, int64_t first, int64_t end,
                                       int64_t T) {
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
  }
}

FSDP_CPU_CLONES void CausalSoftmaxBackwardLoop(const float* FSDP_RESTRICT p,
                                               float* FSDP_RESTRICT g, int64_t first,
                                               int64_t end, int64_t T, float scale) {
  for (int64_t r = first; r < end; ++r) {
    const int64_t t = r % T;
    const float* pr = p + r * T;
    float* gr = g + r * T;
    const float dot = k::LaneSum<float>(t + 1, [&](int64_t s) { return gr[s] * pr[s]; });
#pragma omp simd
    for (int64_t s = 0; s < T; ++s) {
      gr[s] = k::CausalMasked(t, s) ? 0.0f : k::SoftmaxBackward(pr[s], gr[s], dot, scale);
    }
  }
}

// Cross-entropy rows [first, end) in double lanes (the loss is checked to 1e-12); stores
// each row's loss in row_loss[i].
FSDP_CPU_CLONES void CrossEntropyLoop(const float* FSDP_RESTRICT x,
                                      const int32_t* FSDP_RESTRICT targets,
                                      float* FSDP_RESTRICT grad, double* FSDP_RESTRICT row_loss,
                                      int64_t first, int64_t end, int64_t V, double inv_n) {
  for (int64_t i = first; i < end; ++i) {
    const float* row = x + i * V;
    float* grow = grad + i * V;
    float maxf = row[0];
#pragma omp simd reduction(max : maxf)
    for (int64_t j = 1; j < V; ++j) maxf = maxf > row[j] ? maxf : row[j];
    const double max = maxf;
    const double sum =
        k::LaneSum<double>(V, [&](int64_t j) { return k::CrossEntropyExp(row[j], max); });
    const double log_sum = k::Log(sum);
    const int64_t tg = targets[i];
    row_loss[i] = k::CrossEntropyRowLoss(sum, max, row[tg]);
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) {
      grow[j] = k::CrossEntropyGrad(row[j], max, log_sum, j == tg, inv_n);
    }
  }
}

// Elementwise chunks start on 64-byte lines (16 floats).
constexpr int64_t kAlign = 16;

// ColumnSumsLoop over all columns on the calling thread: it streams its inputs once at
// memory speed, and splitting it over two threads measured no faster (kernels_bench) while
// the team's start made LayerNorm's backward slower.
void ColumnSums(const float* x, const float* y, double* sums, int64_t rows, int64_t cols) {
  ColumnSumsLoop(x, y, sums, rows, cols, cols);
}

// InvalidArgument unless `a` and `b` (both defined) start at different addresses. The
// fused ops' callers pass whole tensors, so distinct starts mean no overlap.
absl::Status CheckDistinct(absl::string_view what, const char* a_name, const Tensor& a,
                           const char* b_name, const Tensor& b) {
  if (a.raw_data() == b.raw_data() && a.numel() > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", a_name, " and ", b_name, " must be different tensors"));
  }
  return absl::OkStatus();
}

}  // namespace



absl::Status GeluForward(absl::string_view what, const Tensor& x, const Tensor& y) {
  RETURN_IF_ERROR(CheckElementwiseF32(what, {{"input", &x}, {"output", &y}}));
  const int64_t n = x.numel();
  if (x.device().is_cuda()) {
    NN_ON_CUDA(x.device(), what, "GELU forward", kc::GeluForward(F32(x), MutF32(y), n));
  }
  const float* in = F32(x);
  float* out = MutF32(y);
  k::ParallelChunks(IntraOpThreads(), n, n, kAlign,
                    [&](int64_t b, int64_t e) { GeluForwardLoop(in + b, out + b, e - b); });
  return absl::OkStatus();
}

absl::Status GeluBackward(absl::string_view what, const Tensor& x, const Tensor& gy,
                          const Tensor& gx) {
  RETURN_IF_ERROR(CheckElementwiseF32(
      what, {{"input", &x}, {"grad_output", &gy}, {"grad_input", &gx}}));
  const int64_t n = x.numel();
  if (x.device().is_cuda()) {
    NN_ON_CUDA(x.device(), what, "GELU backward",
               kc::GeluBackward(F32(x), F32(gy), MutF32(gx), n));
  }
  const float* in = F32(x);
  const float* g = F32(gy);
  float* out = MutF32(gx);
  k::ParallelChunks(IntraOpThreads(), n, n, kAlign,
                    [&](int64_t b, int64_t e) { GeluBackwardLoop(in + b, g + b, out + b, e - b); });
  return absl::OkStatus();
}

absl::Status ReluForward(absl::string_view what, const Tensor& x, const Tensor& y) {
  RETURN_IF_ERROR(CheckElementwiseF32(what, {{"input", &x}, {"output", &y}}));
  const int64_t n = x.numel();
  if (x.device().is_cuda()) {
    NN_ON_CUDA(x.device(), what, "ReLU forward", kc::ReluForward(F32(x), MutF32(y), n));
  }
  const float* in = F32(x);
  float* out = MutF32(y);
  k::ParallelChunks(IntraOpThreads(), n, n, kAlign,
                    [&](int64_t b, int64_t e) { ReluForwardLoop(in + b, out + b, e - b); });
  return absl::OkStatus();
}

absl::Status ReluBackward(absl::string_view what, const Tensor& y, const Tensor& gy,
                          const Tensor& gx) {
  RETURN_IF_ERROR(CheckElementwiseF32(
      what, {{"output", &y}, {"grad_output", &gy}, {"grad_input", &gx}}));
  const int64_t n = y.numel();
  if (y.device().is_cuda()) {
    NN_ON_CUDA(y.device(), what, "ReLU backward",
               kc::ReluBackward(F32(y), F32(gy), MutF32(gx), n));
  }
  const float* out = F32(y);
  const float* g = F32(gy);
  float* gi = MutF32(gx);
  k::ParallelChunks(IntraOpThreads(), n, n, kAlign,
                    [&](int64_t b, int64_t e) { ReluBackwardLoop(out + b, g + b, gi + b, e - b); });
  return absl::OkStatus();
}

absl::Status AddTensors(absl::string_view what, const Tensor& a, const Tensor& b,
                        const Tensor& out) {
  RETURN_IF_ERROR(CheckElementwiseF32(
      what, {{"first operand", &a}, {"second operand", &b}, {"sum", &out}}));
  const int64_t n = a.numel();
  if (a.device().is_cuda()) {
    NN_ON_CUDA(a.device(), what, "add", kc::Add(F32(a), F32(b), MutF32(out), n));
  }
  const float* pa = F32(a);
  const float* pb = F32(b);
  float* po = MutF32(out);
  k::ParallelChunks(IntraOpThreads(), n, n, kAlign,
                    [&](int64_t s, int64_t e) { AddLoop(pa + s, pb + s, po + s, e - s); });
  return absl::OkStatus();
}

namespace {

// BiasAdd's argument checks; the number of rows.
absl::StatusOr<int64_t> CheckBiasAdd(absl::string_view what, const Tensor& x, const Tensor& bias,
                                     const Tensor& out) {
  RETURN_IF_ERROR(CheckDevices(what, {{"input", &x}, {"bias", &bias}, {"output", &out}}));
  RETURN_IF_ERROR(CheckDType(what, "input", x, DType::kFloat32));
  RETURN_IF_ERROR(CheckWeightDType(what, "bias", bias));
  RETURN_IF_ERROR(CheckDType(what, "output", out, DType::kFloat32));
  RETURN_IF_ERROR(CheckNumel(what, "output", out, x.numel()));
  const int64_t cols = bias.numel();
  if (cols == 0 || x.numel() % cols != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": bias ", bias.ToString(),
                                                   " does not tile input ", x.ToString()));
  }
  return x.numel() / cols;
}

}  // namespace

absl::Status BiasAdd(absl::string_view what, const Tensor& x, const Tensor& bias,
                     const Tensor& out) {
  ASSIGN_OR_RETURN(const int64_t rows, CheckBiasAdd(what, x, bias, out));
  const int64_t cols = bias.numel();
  if (x.device().is_cuda()) {
    NN_ON_CUDA(x.device(), what, "bias add",
               kc::BiasAdd(F32(x), bias.raw_data(), IsBf16(bias), MutF32(out), rows, cols));
  }
  const float* in = F32(x);
  float* o = MutF32(out);
  WithWeight(bias, [&](const auto* b) {
    k::ParallelChunks(IntraOpThreads(), rows, rows * cols, 1, [&](int64_t s, int64_t e) {
      BiasAddLoop(in + s * cols, b, o + s * cols, e - s, cols);
    });
  });
  return absl::OkStatus();
}

absl::Status BiasGeluForward(absl::string_view what, const Tensor& x, const Tensor& bias,
                             const Tensor& pre, const Tensor& y) {
  ASSIGN_OR_RETURN(const int64_t rows, CheckBiasAdd(what, x, bias, pre));
  RETURN_IF_ERROR(CheckElementwiseF32(what, {{"pre-activation", &pre}, {"output", &y}}));
  RETURN_IF_ERROR(CheckDistinct(what, "output", y, "input", x));
  RETURN_IF_ERROR(CheckDistinct(what, "output", y, "pre-activation", pre));
  if (x.device().is_cuda()) {
    RETURN_IF_ERROR(BiasAdd(what, x, bias, pre));
    return GeluForward(what, pre, y);
  }
  const int64_t cols = bias.numel();
  const float* in = F32(x);
  float* p = MutF32(pre);
  float* o = MutF32(y);
  WithWeight(bias, [&](const auto* b) {
    k::ParallelChunks(IntraOpThreads(), rows, rows * cols, 1, [&](int64_t s, int64_t e) {
      BiasGeluLoop(in + s * cols, b, p + s * cols, o + s * cols, e - s, cols);
    });
  });
  return absl::OkStatus();
}

namespace {

// AccumulateColumnSums's argument checks (y optional); the number of rows.
absl::StatusOr<int64_t> CheckColumnSums(absl::string_view what, const Tensor& x, const Tensor& y,
                                        const Tensor& acc) {
  if (y.defined()) {
    RETURN_IF_ERROR(CheckDevices(what, {{"input", &x}, {"second factor", &y}, {"sums", &acc}}));
    RETURN_IF_ERROR(CheckDType(what, "second factor", y, DType::kFloat32));
    RETURN_IF_ERROR(CheckNumel(what, "second factor", y, x.numel()));
  } else {
    RETURN_IF_ERROR(CheckDevices(what, {{"input", &x}, {"sums", &acc}}));
  }
  RETURN_IF_ERROR(CheckDType(what, "input", x, DType::kFloat32));
  RETURN_IF_ERROR(CheckDType(what, "sums", acc, DType::kFloat32));
  const int64_t cols = acc.numel();
  if (cols == 0 || x.numel() % cols != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": sums ", acc.ToString(),
                                                   " do not tile input ", x.ToString()));
  }
  return x.numel() / cols;
}

}  // namespace

absl::Status GeluBackwardBiasGrad(absl::string_view what, const Tensor& pre, const Tensor& gy,
                                  const Tensor& gx, const Tensor& gb) {
  RETURN_IF_ERROR(CheckElementwiseF32(
      what, {{"pre-activation", &pre}, {"grad_output", &gy}, {"grad_input", &gx}}));
  RETURN_IF_ERROR(CheckDistinct(what, "grad_input", gx, "pre-activation", pre));
  RETURN_IF_ERROR(CheckDistinct(what, "grad_input", gx, "grad_output", gy));
  int64_t rows = 1;
  int64_t cols = gx.numel();
  if (gb.defined()) {
    ASSIGN_OR_RETURN(rows, CheckColumnSums(what, gx, Tensor(), gb));
    cols = gb.numel();
  }
  if (pre.device().is_cuda()) {
    RETURN_IF_ERROR(GeluBackward(what, pre, gy, gx));
    if (!gb.defined()) return absl::OkStatus();
    return AccumulateColumnSums(what, gx, Tensor(), gb);
  }
  const float* pp = F32(pre);
  const float* pg = F32(gy);
  float* out = MutF32(gx);
  std::vector<double> sums(gb.defined() ? static_cast<size_t>(cols) : 0, 0.0);
  double* ps = gb.defined() ? sums.data() : nullptr;
  // Threads take column ranges, so each column's sum adds its rows in order, as one thread.
  k::ParallelChunks(IntraOpThreads(), cols, rows * cols, kAlign, [&](int64_t s, int64_t e) {
    GeluBackwardColumnSumsLoop(pp + s, pg + s, out + s, ps != nullptr ? ps + s : nullptr, rows,
                               e - s, cols);
  });
  if (gb.defined()) {
    float* pacc = MutF32(gb);
    for (int64_t j = 0; j < cols; ++j) pacc[j] = static_cast<float>(pacc[j] + sums[j]);
  }
  return absl::OkStatus();
}

absl::Status AccumulateColumnSums(absl::string_view what, const Tensor& x, const Tensor& y,
                                  const Tensor& acc) {
  ASSIGN_OR_RETURN(const int64_t rows, CheckColumnSums(what, x, y, acc));
  const int64_t cols = acc.numel();
  if (x.device().is_cuda()) {
    NN_ON_CUDA(x.device(), what, "column sums",
               kc::ColumnSums(F32(x), y.defined() ? F32(y) : nullptr, MutF32(acc), rows, cols));
  }
  const float* px = F32(x);
  const float* py = y.defined() ? F32(y) : nullptr;
  float* pacc = MutF32(acc);
  std::vector<double> sums(static_cast<size_t>(cols), 0.0);
  ColumnSums(px, py, sums.data(), rows, cols);
  for (int64_t j = 0; j < cols; ++j) pacc[j] = static_cast<float>(pacc[j] + sums[j]);
  return absl::OkStatus();
}

namespace {

// LayerNormForward's argument checks; the number of rows.
absl::StatusOr<int64_t> CheckLayerNormForward(absl::string_view what, const Tensor& x,
                                              const Tensor& w, const Tensor& b, const Tensor& y,
                                              const Tensor& xhat, const Tensor& rstd) {
  RETURN_IF_ERROR(CheckDevices(what, {{"input", &x}, {"weight", &w}, {"bias", &b}, {"output", &y},
                                      {"normalised input", &xhat}, {"rstd", &rstd}}));
  RETURN_IF_ERROR(CheckDType(what, "input", x, DType::kFloat32));
  RETURN_IF_ERROR(CheckWeightDType(what, "weight", w));
  if (b.dtype() != w.dtype()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": bias ", b.ToString(),
                                                   " must have the weight's dtype, ",
                                                   core::DTypeName(w.dtype())));
  }
  const int64_t cols = w.numel();
  RETURN_IF_ERROR(CheckNumel(what, "bias", b, cols));
  if (cols == 0 || x.numel() % cols != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": weight ", w.ToString(),
                                                   " does not tile input ", x.ToString()));
  }
  const int64_t rows = x.numel() / cols;
  RETURN_IF_ERROR(CheckDType(what, "output", y, DType::kFloat32));
  RETURN_IF_ERROR(CheckDType(what, "normalised input", xhat, DType::kFloat32));
  RETURN_IF_ERROR(CheckDType(what, "rstd", rstd, DType::kFloat32));
  RETURN_IF_ERROR(CheckNumel(what, "output", y, x.numel()));
  RETURN_IF_ERROR(CheckNumel(what, "normalised input", xhat, x.numel()));
  RETURN_IF_ERROR(CheckNumel(what, "rstd", rstd, rows));
  return rows;
}

// LayerNorm on the CPU of x, or of x + add written to sum when add is non-null.
void LayerNormForwardCpu(const float* x, const float* add, float* sum, const Tensor& w,
                         const Tensor& b, float eps, const Tensor& y, const Tensor& xhat,
                         const Tensor& rstd, int64_t rows) {
  const int64_t cols = w.numel();
  float* py = MutF32(y);
  float* ph = MutF32(xhat);
  float* pr = MutF32(rstd);
  WithWeight(w, [&](const auto* wp) {
    using W = std::remove_const_t<std::remove_pointer_t<decltype(wp)>>;
    const W* bp = static_cast<const W*>(b.raw_data());
    k::ParallelChunks(IntraOpThreads(), rows, rows * cols, 1, [&](int64_t s, int64_t e) {
      const int64_t o = s * cols;
      LayerNormLoop(x + o, add != nullptr ? add + o : nullptr, sum != nullptr ? sum + o : nullptr,
                    wp, bp, eps, py + o, ph + o, pr + s, e - s, cols);
    });
  });
}

// LayerNormBackward's argument checks; the number of rows.
absl::StatusOr<int64_t> CheckLayerNormBackward(absl::string_view what, const Tensor& g,
                                               const Tensor& xhat, const Tensor& rstd,
                                               const Tensor& w, const Tensor& gx,
                                               const Tensor& gw, const Tensor& gb) {
  RETURN_IF_ERROR(CheckDevices(what, {{"grad_output", &g}, {"normalised input", &xhat},
                                      {"rstd", &rstd}, {"weight", &w}, {"grad_input", &gx}}));
  RETURN_IF_ERROR(CheckDType(what, "grad_output", g, DType::kFloat32));
  RETURN_IF_ERROR(CheckDType(what, "normalised input", xhat, DType::kFloat32));
  RETURN_IF_ERROR(CheckDType(what, "rstd", rstd, DType::kFloat32));
  RETURN_IF_ERROR(CheckDType(what, "grad_input", gx, DType::kFloat32));
  RETURN_IF_ERROR(CheckWeightDType(what, "weight", w));
  const int64_t cols = w.numel();
  if (cols == 0 || g.numel() % cols != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": weight ", w.ToString(),
                                                   " does not tile grad_output ", g.ToString()));
  }
  const int64_t rows = g.numel() / cols;
  RETURN_IF_ERROR(CheckNumel(what, "normalised input", xhat, g.numel()));
  RETURN_IF_ERROR(CheckNumel(what, "grad_input", gx, g.numel()));
  RETURN_IF_ERROR(CheckNumel(what, "rstd", rstd, rows));
  for (const Arg& a : {Arg{"weight gradient", &gw}, Arg{"bias gradient", &gb}}) {
    if (!a.tensor->defined()) continue;
    RETURN_IF_ERROR(CheckDevices(what, {{"grad_output", &g}, a}));
    RETURN_IF_ERROR(CheckDType(what, a.name, *a.tensor, DType::kFloat32));
    RETURN_IF_ERROR(CheckNumel(what, a.name, *a.tensor, cols));
  }
  return rows;
}


}  // namespace

absl::Status LayerNormForward(absl::string_view what, const Tensor& x, const Tensor& w,
                              const Tensor& b, float eps, const Tensor& y, const Tensor& xhat,
                              const Tensor& rstd) {
  ASSIGN_OR_RETURN(const int64_t rows, CheckLayerNormForward(what, x, w, b, y, xhat, rstd));
  if (x.device().is_cuda()) {
    NN_ON_CUDA(x.device(), what, "LayerNorm forward",
               kc::LayerNormForward(F32(x), w.raw_data(), b.raw_data(), IsBf16(w), eps,
                                      MutF32(y), MutF32(xhat), MutF32(rstd), rows, w.numel()));
  }
  LayerNormForwardCpu(F32(x), nullptr, nullptr, w, b, eps, y, xhat, rstd, rows);
  return absl::OkStatus();
}

absl::Status AddLayerNormForward(absl::string_view what, const Tensor& a, const Tensor& b,
                                 const Tensor& w, const Tensor& bias, float eps, const Tensor& h,
                                 const Tensor& y, const Tensor& xhat, const Tensor& rstd) {
  RETURN_IF_ERROR(CheckElementwiseF32(
      what, {{"first operand", &a}, {"second operand", &b}, {"sum", &h}}));
  ASSIGN_OR_RETURN(const int64_t rows, CheckLayerNormForward(what, h, w, bias, y, xhat, rstd));
  for (const Arg& out : {Arg{"output", &y}, Arg{"normalised input", &xhat}}) {
    for (const Arg& in : {Arg{"first operand", &a}, Arg{"second operand", &b}, Arg{"sum", &h}}) {
      RETURN_IF_ERROR(CheckDistinct(what, out.name, *out.tensor, in.name, *in.tensor));
    }
  }
  if (a.device().is_cuda()) {
    RETURN_IF_ERROR(AddTensors(what, a, b, h));
    return LayerNormForward(what, h, w, bias, eps, y, xhat, rstd);
  }
  LayerNormForwardCpu(F32(a), F32(b), MutF32(h), w, bias, eps, y, xhat, rstd, rows);
  return absl::OkStatus();
}

namespace {

// LayerNormBackward on the CPU; with `residual` non-null, gx = residual + the gradient.
void LayerNormBackwardCpu(const Tensor& g, const Tensor& xhat, const Tensor& rstd,
                          const Tensor& w, const float* residual, const Tensor& gx,
                          const Tensor& gw, const Tensor& gb, int64_t rows) {
  const int64_t cols = w.numel();
  const float* pg = F32(g);
  const float* ph = F32(xhat);
  const float* pr = F32(rstd);
  float* out = MutF32(gx);
  WithWeight(w, [&](const auto* wp) {
    k::ParallelChunks(IntraOpThreads(), rows, rows * cols, 1, [&](int64_t s, int64_t e) {
      const int64_t o = s * cols;
      LayerNormBackwardLoop(pg + o, ph + o, pr + s, wp, residual != nullptr ? residual + o : nullptr,
                            out + o, e - s, cols);
    });
  });
  std::vector<double> sums(static_cast<size_t>(cols));
  for (auto [acc, factor] : {std::pair<const Tensor*, const float*>{&gw, ph}, {&gb, nullptr}}) {
    if (!acc->defined()) continue;
    std::fill(sums.begin(), sums.end(), 0.0);
    ColumnSums(pg, factor, sums.data(), rows, cols);
    float* pacc = MutF32(*acc);
    for (int64_t j = 0; j < cols; ++j) pacc[j] = static_cast<float>(pacc[j] + sums[j]);
  }
}

}  // namespace

absl::Status LayerNormBackward(absl::string_view what, const Tensor& g, const Tensor& xhat,
                               const Tensor& rstd, const Tensor& w, const Tensor& gx,
                               const Tensor& gw, const Tensor& gb) {
  ASSIGN_OR_RETURN(const int64_t rows, CheckLayerNormBackward(what, g, xhat, rstd, w, gx, gw, gb));
  if (g.device().is_cuda()) {
#ifdef FSDP_WITH_CUDA
    const int64_t cols = w.numel();
    RETURN_IF_ERROR(UseDevice(g.device(), what));
    RETURN_IF_ERROR(Launched(kc::LayerNormBackwardInput(F32(g), F32(xhat), F32(rstd),
                                                          w.raw_data(), IsBf16(w), MutF32(gx),
                                                          rows, cols),
                             what, "LayerNorm backward"));
    if (gw.defined()) {
      RETURN_IF_ERROR(Launched(kc::ColumnSums(F32(g), F32(xhat), MutF32(gw), rows, cols), what,
                               "LayerNorm weight gradient"));
    }
    if (gb.defined()) {
      RETURN_IF_ERROR(Launched(kc::ColumnSums(F32(g), nullptr, MutF32(gb), rows, cols), what,
                               "LayerNorm bias gradient"));
    }
    return absl::OkStatus();
#else
    return NoCuda(g.device(), what);
#endif
  }
  LayerNormBackwardCpu(g, xhat, rstd, w, nullptr, gx, gw, gb, rows);
  return absl::OkStatus();
}

absl::Status LayerNormBackwardAdd(absl::string_view what, const Tensor& g, const Tensor& xhat,
                                  const Tensor& rstd, const Tensor& w, const Tensor& residual,
                                  const Tensor& gx, const Tensor& gw, const Tensor& gb) {
  ASSIGN_OR_RETURN(const int64_t rows, CheckLayerNormBackward(what, g, xhat, rstd, w, gx, gw, gb));
  RETURN_IF_ERROR(CheckElementwiseF32(what, {{"grad_output", &g}, {"residual", &residual}}));
  RETURN_IF_ERROR(CheckDistinct(what, "grad_input", gx, "residual", residual));
  if (g.device().is_cuda()) {
    RETURN_IF_ERROR(LayerNormBackward(what, g, xhat, rstd, w, gx, gw, gb));
    return AddTensors(what, residual, gx, gx);
  }
  LayerNormBackwardCpu(g, xhat, rstd, w, F32(residual), gx, gw, gb, rows);
  return absl::OkStatus();
}

absl::Status CausalSoftmaxForward(absl::string_view what, const Tensor& scores, int64_t T) {
  RETURN_IF_ERROR(CheckDevices(what, {{"attention scores", &scores}}));
  RETURN_IF_ERROR(CheckDType(what, "attention scores", scores, DType::kFloat32));
  if (T <= 0 || scores.numel() % T != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": attention scores ", scores.ToString(),
                                                   " are not rows of ", T));
  }
  const int64_t rows = scores.numel() / T;
  if (scores.device().is_cuda()) {
    NN_ON_CUDA(scores.device(), what, "causal softmax forward",
               kc::CausalSoftmaxForward(MutF32(scores), rows, T));
  }
  float* p = MutF32(scores);
  k::ParallelChunks(IntraOpThreads(), rows, rows * T, 1,
                    [&](int64_t s, int64_t e) { CausalSoftmaxLoop(p, s, e, T); });
  return absl::OkStatus();
}

absl::Status CausalSoftmaxBackward(absl::string_view what, const Tensor& p, const Tensor& g,
                                   int64_t T, float scale) {
  RETURN_IF_ERROR(CheckDevices(what, {{"attention probabilities", &p}, {"their gradient", &g}}));
  RETURN_IF_ERROR(CheckDType(what, "attention probabilities", p, DType::kFloat32));
  RETURN_IF_ERROR(CheckDType(what, "their gradient", g, DType::kFloat32));
  RETURN_IF_ERROR(CheckNumel(what, "their gradient", g, p.numel()));
  if (T <= 0 || p.numel() % T != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": attention probabilities ",
                                                   p.ToString(), " are not rows of ", T));
  }
  const int64_t rows = p.numel() / T;
  if (p.device().is_cuda()) {
    NN_ON_CUDA(p.device(), what, "causal softmax backward",
               kc::CausalSoftmaxBackward(F32(p), MutF32(g), rows, T, scale));
  }
  const float* pp = F32(p);
  float* pg = MutF32(g);
  k::ParallelChunks(IntraOpThreads(), rows, rows * T, 1, [&](int64_t s, int64_t e) {
    CausalSoftmaxBackwardLoop(pp, pg, s, e, T, scale);
  });
  return absl::OkStatus();
}

absl::Status EmbeddingForward(absl::string_view what, const Tensor& table, const Tensor& ids,
                              const Tensor& y) {
  RETURN_IF_ERROR(CheckDevices(what, {{"weight", &table}, {"ids", &ids}, {"output", &y}}));
  RETURN_IF_ERROR(CheckWeightDType(what, "weight", table));
  RETURN_IF_ERROR(CheckDType(what, "ids", ids, DType::kInt32));
  RETURN_IF_ERROR(CheckDType(what, "output", y, DType::kFloat32));
  if (table.dim() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": weight must be 2-D [num, dim], got ", table.ToString()));
  }
  const int64_t num = table.size(0), dim = table.size(1), n = ids.numel();
  RETURN_IF_ERROR(CheckNumel(what, "output", y, n * dim));
  if (table.device().is_cuda()) {
    NN_ON_CUDA(table.device(), what, "embedding gather",
               kc::EmbeddingForward(ids.data<int32_t>(), n, table.raw_data(), IsBf16(table),
                                      num, dim, MutF32(y)));
  }
  const int32_t* id = ids.data<int32_t>();
  float* out = MutF32(y);
  WithWeight(table, [&](const auto* tp) {
    for (int64_t i = 0; i < n; ++i) {
      float* row = out + i * dim;
      if (!k::EmbeddingIdValid(id[i], num)) {
        for (int64_t j = 0; j < dim; ++j) row[j] = 0.0f;
        continue;
      }
      for (int64_t j = 0; j < dim; ++j) row[j] = k::EmbeddingGather(tp, id[i], dim, j);
    }
  });
  return absl::OkStatus();
}

absl::Status EmbeddingBackward(absl::string_view what, const Tensor& ids, const Tensor& g,
                               const Tensor& gw) {
  RETURN_IF_ERROR(CheckDevices(what, {{"weight gradient", &gw}, {"ids", &ids},
                                      {"grad_output", &g}}));
  RETURN_IF_ERROR(CheckDType(what, "ids", ids, DType::kInt32));
  RETURN_IF_ERROR(CheckDType(what, "grad_output", g, DType::kFloat32));
  RETURN_IF_ERROR(CheckDType(what, "weight gradient", gw, DType::kFloat32));
  if (gw.dim() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": weight gradient must be 2-D [num, dim], got ", gw.ToString()));
  }
  const int64_t num = gw.size(0), dim = gw.size(1), n = ids.numel();
  RETURN_IF_ERROR(CheckNumel(what, "grad_output", g, n * dim));
  if (gw.device().is_cuda()) {
    NN_ON_CUDA(gw.device(), what, "embedding gradient scatter-add",
               kc::EmbeddingBackward(ids.data<int32_t>(), n, F32(g), num, dim, MutF32(gw)));
  }
  const int32_t* id = ids.data<int32_t>();
  const float* pg = F32(g);
  float* pw = MutF32(gw);
  for (int64_t i = 0; i < n; ++i) {
    if (!k::EmbeddingIdValid(id[i], num)) continue;
    Axpy(dim, 1.0f, pg + i * dim, pw + static_cast<int64_t>(id[i]) * dim);
  }
  return absl::OkStatus();
}

absl::StatusOr<double> CrossEntropyForwardBackward(absl::string_view what, const Tensor& logits,
                                                   const Tensor& targets, const Tensor& grad) {
  RETURN_IF_ERROR(CheckDevices(what, {{"logits", &logits}, {"targets", &targets},
                                      {"gradient", &grad}}));
  RETURN_IF_ERROR(CheckDType(what, "logits", logits, DType::kFloat32));
  RETURN_IF_ERROR(CheckDType(what, "targets", targets, DType::kInt32));
  RETURN_IF_ERROR(CheckDType(what, "gradient", grad, DType::kFloat32));
  RETURN_IF_ERROR(CheckNumel(what, "gradient", grad, logits.numel()));
  const int64_t n = targets.numel();
  if (n == 0 || logits.numel() % n != 0 || logits.numel() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": logits ", logits.ToString(),
                                                   " are not rows for targets ",
                                                   targets.ToString()));
  }
  const int64_t V = logits.numel() / n;
  const double inv_n = 1.0 / static_cast<double>(n);
  if (logits.device().is_cuda()) {
#ifdef FSDP_WITH_CUDA
    RETURN_IF_ERROR(UseDevice(logits.device(), what));
    // Per-row losses as doubles (8 bytes = 2 int32 elements each).
    ASSIGN_OR_RETURN(Tensor row_loss, Tensor::Allocate({2 * n}, DType::kInt32,
                                                       core::MemoryTag::kActivation,
                                                       logits.device()));
    RETURN_IF_ERROR(Launched(
        kc::CrossEntropy(F32(logits), targets.data<int32_t>(), n, V, inv_n, MutF32(grad),
                           static_cast<double*>(row_loss.raw_data())),
        what, "cross-entropy"));
    std::vector<double> host(static_cast<size_t>(n));
    RETURN_IF_ERROR(Launched(cudaMemcpy(host.data(), row_loss.raw_data(),
                                        sizeof(double) * static_cast<size_t>(n),
                                        cudaMemcpyDeviceToHost),
                             what, "copy of the cross-entropy row losses to the host"));
    double total = 0.0;
    for (double v : host) total += v;
    return total * inv_n;
#else
    return NoCuda(logits.device(), what);
#endif
  }
  const float* px = F32(logits);
  const int32_t* tg = targets.data<int32_t>();
  float* pg = MutF32(grad);
  std::vector<double> row_loss(static_cast<size_t>(n));
  k::ParallelChunks(IntraOpThreads(), n, n * V, 1, [&](int64_t s, int64_t e) {
    CrossEntropyLoop(px, tg, pg, row_loss.data(), s, e, V, inv_n);
  });
  double total = 0.0;  // in row order, whatever the thread count
  for (double l : row_loss) total += l;
  return total * inv_n;
}

absl::Status ZeroTensor(absl::string_view what, const Tensor& t) {
  if (!t.defined()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": zeroing an undefined tensor"));
  }
  if (t.numel() == 0) return absl::OkStatus();
  if (t.device().is_cuda()) {
    NN_ON_CUDA(t.device(), what, "memset",
               cudaMemsetAsync(t.raw_data(), 0, static_cast<size_t>(t.nbytes()), 0));
  }
  std::memset(t.raw_data(), 0, static_cast<size_t>(t.nbytes()));
  return absl::OkStatus();
}

}  // namespace nn
