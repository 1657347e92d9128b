#include "nn/ops.h"

#include <cblas.h>

#include <cmath>
#include <vector>

namespace nn {

void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // BLAS would do this too, but some implementations read A/B anyway; be explicit.
    for (int64_t i = 0; i < m; ++i) {
      float* row = c + i * ldc;
      for (int64_t j = 0; j < n; ++j) row[j] = beta == 0.0f ? 0.0f : beta * row[j];
    }
    return;
  }
  if (beta == 0.0f) {
    // BLAS treats beta == 0 as "ignore C", but make that explicit for NaN garbage in
    // freshly allocated outputs.
    for (int64_t i = 0; i < m; ++i) {
      float* row = c + i * ldc;
      for (int64_t j = 0; j < n; ++j) row[j] = 0.0f;
    }
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          const float* b, float beta, float* c) {
  const int64_t lda = trans_a ? m : k;
  const int64_t ldb = trans_b ? k : n;
  Gemm(trans_a, trans_b, m, n, k, alpha, a, lda > 0 ? lda : 1, b, ldb > 0 ? ldb : 1, beta, c,
       n > 0 ? n : 1);
}

int64_t RowsOf(const core::Shape& shape) {
  if (shape.empty()) return 0;
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
  return rows;
}

core::Shape WithLastDim(core::Shape shape, int64_t last) {
  if (shape.empty()) {
    shape.push_back(last);
  } else {
    shape.back() = last;
  }
  return shape;
}

void Axpy(int64_t n, float alpha, const float* x, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

void AddRowVector(int64_t rows, int64_t cols, const float* bias, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = out + r * cols;
    for (int64_t j = 0; j < cols; ++j) row[j] += bias[j];
  }
}

void AccumulateColumnSums(int64_t rows, int64_t cols, const float* x, float* acc) {
  std::vector<double> sums(static_cast<size_t>(cols), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * cols;
    for (int64_t j = 0; j < cols; ++j) sums[j] += row[j];
  }
  for (int64_t j = 0; j < cols; ++j) acc[j] = static_cast<float>(acc[j] + sums[j]);
}

double DotDouble(int64_t n, const float* x, const float* w) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * w[i];
  return s;
}

namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoeff = 0.044715f;
}  // namespace

float GeluTanh(float x) {
  const float inner = kSqrt2OverPi * (x + kGeluCoeff * x * x * x);
  return 0.5f * x * (1.0f + std::tanh(inner));
}

float GeluTanhGrad(float x) {
  const float x2 = x * x;
  const float inner = kSqrt2OverPi * (x + kGeluCoeff * x2 * x);
  const float t = std::tanh(inner);
  const float d_inner = kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * x2);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * d_inner;
}

void FillUniform(const core::Tensor& t, float lo, float hi, core::Rng* rng) {
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = rng->Uniform(lo, hi);
}

void FillNormal(const core::Tensor& t, float mean, float stddev, core::Rng* rng) {
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = rng->Normal(mean, stddev);
}

uint64_t DeriveSeed(uint64_t seed, uint64_t stream) {
  return core::Rng(seed).Fork(stream).NextU64();
}

}  // namespace nn
