#include "nn/ops.h"

#include <omp.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "oneapi/dnnl/dnnl.h"
#include "oneapi/dnnl/dnnl_debug.h"

namespace nn {
namespace {

// OpenMP's thread count is an attribute of each calling thread, so Gemm brings its
// caller's count in line with IntraOpThreads().
void UseIntraOpThreads() {
  const int want = IntraOpThreads();
  if (omp_get_max_threads() != want) omp_set_num_threads(want);
}

}  // namespace

absl::Status Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                  const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                  int64_t ldc) {
  if (m == 0 || n == 0) return absl::OkStatus();
  if (k == 0) {
    // C = beta * C without touching A or B (BLAS libraries differ in what they read here).
    for (int64_t i = 0; i < m; ++i) {
      float* row = c + i * ldc;
      for (int64_t j = 0; j < n; ++j) row[j] = beta == 0.0f ? 0.0f : beta * row[j];
    }
    return absl::OkStatus();
  }
  // No zero-fill before beta == 0: oneDNN writes C without reading it then (ops_test
  // checks this with C full of NaN).
  UseIntraOpThreads();
  const dnnl_status_t status = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha,
                                          a, lda, b, ldb, beta, c, ldc);
  if (status != dnnl_success) {
    return absl::InternalError(
        absl::StrCat("nn::Gemm: oneDNN dnnl_sgemm failed (", dnnl_status2str(status), ") on C[", m,
                     ", ", n, "] = ", alpha, " * A", trans_a ? "^T" : "", "[", m, ", ", k, "] * B",
                     trans_b ? "^T" : "", "[", k, ", ", n, "] + ", beta,
                     " * C with row strides lda ", lda, ", ldb ", ldb, ", ldc ", ldc));
  }
  return absl::OkStatus();
}

absl::Status Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                  const float* a, const float* b, float beta, float* c) {
  const int64_t lda = trans_a ? m : k;
  const int64_t ldb = trans_b ? k : n;
  return Gemm(trans_a, trans_b, m, n, k, alpha, a, lda > 0 ? lda : 1, b, ldb > 0 ? ldb : 1, beta, c,
              n > 0 ? n : 1);
}

std::string GemmLibrary() {
  const dnnl_version_t* v = dnnl_version();
  // dnnl_cpu_isa2str names e.g. "cpu_isa_avx2"; the prefix says nothing.
  absl::string_view isa = dnnl_cpu_isa2str(dnnl_get_effective_cpu_isa());
  absl::ConsumePrefix(&isa, "cpu_isa_");
  return absl::StrCat("oneDNN ", v->major, ".", v->minor, ".", v->patch, " (isa ", isa, ")");
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
