// Eigen 3.4 behind the bench/cpu GEMM shim interface (gemm_bench.cc, KIND shim). Built twice
// by bench/cpu/gemm.sh: portable x86-64 (-O2, SSE2 only) and -O2 -mavx2 -mfma; the AVX2 build
// answers bench_supported() with a reason when the CPU lacks AVX2 or FMA, so it is never
// called there (the run-time check a library build would need). Single-threaded (no OpenMP).
#include <Eigen/Core>
#include <cstdint>

namespace {
using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const RowMat, 0, Eigen::OuterStride<>>;
using Map = Eigen::Map<RowMat, 0, Eigen::OuterStride<>>;
}  // namespace

extern "C" {

// "" when this build can run on this CPU, else why not.
const char* bench_supported() {
#if defined(__AVX2__) || defined(__FMA__)
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2")) return "built with -mavx2 and the CPU has no AVX2";
  if (!__builtin_cpu_supports("fma")) return "built with -mfma and the CPU has no FMA";
#endif
  return "";
}

#define BENCH_STR2(x) #x
#define BENCH_STR(x) BENCH_STR2(x)
#define BENCH_EIGEN_VERSION      \
  BENCH_STR(EIGEN_WORLD_VERSION) \
  "." BENCH_STR(EIGEN_MAJOR_VERSION) "." BENCH_STR(EIGEN_MINOR_VERSION)

const char* bench_info() {
#if defined(__AVX2__) && defined(__FMA__)
  return "Eigen " BENCH_EIGEN_VERSION ", -O2 -mavx2 -mfma";
#else
  return "Eigen " BENCH_EIGEN_VERSION ", -O2 (x86-64 baseline, SSE2)";
#endif
}

// Row-major C[m,n] = alpha op(A) op(B) + beta C. Returns 0.
int bench_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                int64_t ldc) {
  ConstMap A(a, trans_a ? k : m, trans_a ? m : k, Eigen::OuterStride<>(lda));
  ConstMap B(b, trans_b ? n : k, trans_b ? k : n, Eigen::OuterStride<>(ldb));
  Map C(c, m, n, Eigen::OuterStride<>(ldc));
  if (beta == 0.0f) {
    C.setZero();
  } else if (beta != 1.0f) {
    C *= beta;
  }
  if (!trans_a && !trans_b) C.noalias() += alpha * A * B;
  if (!trans_a && trans_b) C.noalias() += alpha * A * B.transpose();
  if (trans_a && !trans_b) C.noalias() += alpha * A.transpose() * B;
  if (trans_a && trans_b) C.noalias() += alpha * A.transpose() * B.transpose();
  return 0;
}

}  // extern "C"
