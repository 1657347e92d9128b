// libxsmm 1.17 behind the bench/cpu GEMM shim interface (gemm_bench.cc, KIND shim), built by
// bench/cpu/gemm.sh against Debian's static libxsmm.a. libxsmm_sgemm JIT-compiles a kernel
// for the CPU it runs on when m*n*k <= LIBXSMM_MAX_MNK (64^3 in Debian's build) and hands
// larger products to the BLAS linked beside it (here the OpenBLAS gemm.sh unpacks, -lopenblas):
// bench_info names the JIT target and that threshold so the JSON says which path each
// shape took. Single-threaded (libxsmm.a, not libxsmmext).
#include <libxsmm.h>

#include <cstdint>
#include <string>

extern "C" {

const char* bench_supported() { return ""; }

const char* bench_info() {
  static std::string info;
  if (info.empty()) {
    libxsmm_init();
    info = std::string("libxsmm ") + LIBXSMM_VERSION + ", JIT target " + libxsmm_get_target_arch() +
           ", JIT when m*n*k <= " + std::to_string(LIBXSMM_MAX_MNK) +
           ", larger products fall back to the system OpenBLAS (sgemm_)";
  }
  return info.c_str();
}

// Row-major C[m,n] = alpha op(A) op(B) + beta C as the column-major
// C^T[n,m] = alpha op(B)^T op(A)^T + beta C^T. Returns 0.
int bench_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                int64_t ldc) {
  const char ta = trans_b ? 'T' : 'N', tb = trans_a ? 'T' : 'N';
  const libxsmm_blasint M = n, N = m, K = k, LDA = ldb, LDB = lda, LDC = ldc;
  libxsmm_sgemm(&ta, &tb, &M, &N, &K, &alpha, b, &LDA, a, &LDB, &beta, c, &LDC);
  return 0;
}

}  // extern "C"
