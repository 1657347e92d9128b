// CPU fp32 math on raw pointers: a row-major GEMM over oneDNN (dnnl_sgemm), the intra-op
// thread count of the process (kernels/cpu_runtime.h), shape helpers, Axpy, and random fills for
// initialisation. The layers compute through the device- and dtype-aware
// nn/tensor_ops.h (whose CPU side uses Gemm below); these pointer functions stay for CPU
// callers.
//
//   RETURN_IF_ERROR(nn::SetIntraOpThreads(2));  // GEMMs and OpenMP loops use 2 threads
//   // y[R, out] = x[R, in] * W[out, in]^T, then gW[out, in] += g[R, out]^T * x[R, in]
//   RETURN_IF_ERROR(nn::Gemm(false, true, R, out, in, 1.0f, x, w, 0.0f, y));
//   RETURN_IF_ERROR(nn::Gemm(true, false, out, in, R, 1.0f, g, x, 1.0f, gw));
//
// Layers act on the last dimension of their input and treat every leading dimension
// as a row: RowsOf({B, T, C}) == B * T. Core tensors are contiguous, so a tensor is a
// dense row-major matrix [RowsOf(shape), shape.back()].
//
// The pointer functions trust their arguments (sizes >= 0, buffers large enough); the
// layers validate tensors before calling them.
#ifndef NN_OPS_H_
#define NN_OPS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "core/random.h"
#include "core/tensor.h"
#include "kernels/cpu_runtime.h"

namespace nn {

// C = alpha * op(A) * op(B) + beta * C, all row-major fp32, where op(A) is [m, k],
// op(B) is [k, n] and C is [m, n]. op(X) is X^T when the trans flag is set, so A is
// stored [k, m] when trans_a (likewise B [n, k] when trans_b). lda/ldb/ldc are the row
// strides of the matrices as stored (>= their stored column count), which lets callers
// address column blocks, e.g. one attention head inside a [T, 3C] buffer. With
// beta == 1 the product is added to C (gradient accumulation); with beta == 0 C's old
// contents are ignored, even NaN (C is written, never read). Any of m, n, k may be 0
// (k == 0 scales C by beta without reading A or B). Runs on up to IntraOpThreads()
// threads (oneDNN uses fewer on small shapes); the result may differ in the last bits
// between thread counts (oneDNN may split K: ops_test measured it), never between two
// runs with the same count. Returns an error naming the shape and strides
// when oneDNN refuses the call (e.g. a row stride smaller than its row); C is then
// unspecified.
absl::Status Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                  const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                  int64_t ldc);

// Gemm on densely stored matrices (each row stride equals its stored column count).
absl::Status Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                  const float* a, const float* b, float beta, float* c);

// The GEMM library and the instruction set it chose on this CPU at run time, e.g.
// "oneDNN 2.6.3 (isa avx2)" (the ISA is the most capable one oneDNN may use here).
std::string GemmLibrary();

// The intra-op thread count every later Gemm and every CPU loop of kernels/, nn/ and
// optim/ runs on: kernels::SetIntraOpThreads / IntraOpThreads (kernels/cpu.h), under the
// names nn's callers know.
using ::kernels::IntraOpThreads;
using ::kernels::SetIntraOpThreads;

// Product of all dimensions but the last (1 for a 1-D shape, 0 for a scalar {}): the
// number of rows a layer acting on the last dimension sees.
int64_t RowsOf(const core::Shape& shape);

// `shape` with its last dimension replaced by `last` (appended for a scalar shape).
core::Shape WithLastDim(core::Shape shape, int64_t last);

// y[i] += alpha * x[i] for i < n.
void Axpy(int64_t n, float alpha, const float* x, float* y);

// Fills an fp32 CPU tensor, in element order, with draws from `rng`.
void FillUniform(const core::Tensor& t, float lo, float hi, core::Rng* rng);
void FillNormal(const core::Tensor& t, float mean, float stddev, core::Rng* rng);

// A derived seed: stream `stream` of Rng(seed), so children of a layer get
// independent, reproducible initialisations.
uint64_t DeriveSeed(uint64_t seed, uint64_t stream);

}  // namespace nn

#endif  // NN_OPS_H_
