// CPU launchers of nn/functional's row bodies; see kernels/cpu/functional_rows.h. Compiled
// with CPU_LOOP_COPTS (kernels/cpu_loops.bzl): the rules of kernels/cpu.h.
#include "kernels/cpu/functional_rows.h"

#include <stdint.h>

#include "kernels/cpu.h"
#include "kernels/cpu_runtime.h"
#include "kernels/grad.h"
#include "kernels/math.h"
#include "kernels/rowwise.h"

namespace kernels {
namespace cpu {
namespace {

namespace k = ::kernels;

// The largest element of row[0..cols), cols >= 1.
FSDP_CPU_INLINE float RowMax(const float* FSDP_RESTRICT row, int64_t cols) {
  float max = row[0];
#pragma omp simd reduction(max : max)
  for (int64_t j = 1; j < cols; ++j) max = max > row[j] ? max : row[j];
  return max;
}

// Rows [first, end) of the softmax (log_softmax false) or log-softmax of x [rows, cols].
FSDP_CPU_CLONES void SoftmaxLoop(const float* FSDP_RESTRICT x, float* FSDP_RESTRICT y,
                                 int64_t first, int64_t end, int64_t cols, bool log_softmax) {
  for (int64_t r = first; r < end; ++r) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    const float max = RowMax(xr, cols);
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) yr[j] = k::SoftmaxExp(xr[j], max);
    const float sum = k::LaneSum<float>(cols, [&](int64_t j) { return yr[j]; });
    if (log_softmax) {
      const float log_sum = k::Log(sum);
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) yr[j] = k::LogSoftmaxOut(xr[j], max, log_sum);
    } else {
      const float inv = 1.0f / sum;
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) yr[j] = k::SoftmaxNormalize(yr[j], inv);
    }
  }
}

// Rows [first, end) of the softmax's (log_softmax false) or log-softmax's input gradient.
FSDP_CPU_CLONES void SoftmaxBackwardLoop(const float* FSDP_RESTRICT y,
                                         const float* FSDP_RESTRICT gy, float* FSDP_RESTRICT gx,
                                         int64_t first, int64_t end, int64_t cols,
                                         bool log_softmax) {
  for (int64_t r = first; r < end; ++r) {
    const float* yr = y + r * cols;
    const float* gr = gy + r * cols;
    float* out = gx + r * cols;
    if (log_softmax) {
      const float sum = k::LaneSum<float>(cols, [&](int64_t j) { return gr[j]; });
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) out[j] = k::LogSoftmaxBackward(yr[j], gr[j], sum);
    } else {
      const float dot = k::LaneSum<float>(cols, [&](int64_t j) { return gr[j] * yr[j]; });
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) out[j] = k::SoftmaxBackward(yr[j], gr[j], dot, 1.0f);
    }
  }
}

FSDP_CPU_CLONES void ScaleLoop(const float* x, float factor, float* out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = k::ScaleTerm(x[i], factor);
}

// Elementwise chunks start on 64-byte lines (16 floats).
constexpr int64_t kAlign = 16;

void Rows(const float* x, float* y, int64_t rows, int64_t cols, bool log_softmax) {
  if (cols <= 0) return;
  ParallelChunks(IntraOpThreads(), rows, rows * cols, 1,
                 [&](int64_t s, int64_t e) { SoftmaxLoop(x, y, s, e, cols, log_softmax); });
}

void BackwardRows(const float* y, const float* gy, float* gx, int64_t rows, int64_t cols,
                  bool log_softmax) {
  if (cols <= 0) return;
  ParallelChunks(IntraOpThreads(), rows, rows * cols, 1, [&](int64_t s, int64_t e) {
    SoftmaxBackwardLoop(y, gy, gx, s, e, cols, log_softmax);
  });
}

}  // namespace

void SoftmaxForward(const float* x, float* y, int64_t rows, int64_t cols) {
  Rows(x, y, rows, cols, /*log_softmax=*/false);
}

void SoftmaxBackward(const float* y, const float* gy, float* gx, int64_t rows, int64_t cols) {
  BackwardRows(y, gy, gx, rows, cols, /*log_softmax=*/false);
}

void LogSoftmaxForward(const float* x, float* y, int64_t rows, int64_t cols) {
  Rows(x, y, rows, cols, /*log_softmax=*/true);
}

void LogSoftmaxBackward(const float* y, const float* gy, float* gx, int64_t rows, int64_t cols) {
  BackwardRows(y, gy, gx, rows, cols, /*log_softmax=*/true);
}

void ScaleByScalar(const float* x, const float* s, bool negate, float* out, int64_t n) {
  const float factor = negate ? -s[0] : s[0];
  ParallelChunks(IntraOpThreads(), n, n, kAlign,
                 [&](int64_t b, int64_t e) { ScaleLoop(x + b, factor, out + b, e - b); });
}

}  // namespace cpu
}  // namespace kernels
