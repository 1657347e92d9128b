// CPU launchers of the general tensor ops' bodies (kernels/tensor.h): the host twins of
// kernels/cuda/tensor_kernels.h (same names, same arguments, raw host pointers), behind
// nn/functional's elementwise, shape and reduce ops. Loops follow kernels/cpu.h
// (FSDP_CPU_CLONES, no FMA contraction); independent elements or outputs are split over
// IntraOpThreads() threads, so results are bit-identical for any thread count.
//
// Callers check shapes, dtypes and index values first: these functions validate nothing
// and never fail. Iteration structs follow NOTE [Strided iteration] in kernels/tensor.h.
//
//   kernels::StridedIter<2> it = ...;  // out's shape; a's and b's strides (0: broadcast)
//   kernels::CoalesceDims(&it);
//   kernels::cpu::Binary(kernels::kBinaryMul, a, b, out, it);
#ifndef KERNELS_CPU_TENSOR_KERNELS_H_
#define KERNELS_CPU_TENSOR_KERNELS_H_

#include <stdint.h>

#include "kernels/tensor.h"

namespace kernels {
namespace cpu {

// out[i] = BinaryOp(kind, a[off_a(i)], b[off_b(i)]) with out contiguous over it's shape.
void Binary(int kind, const float* a, const float* b, float* out, StridedIter<2> it);
// y[i] = UnaryOp(kind, x[i], c); y may be x.
void Unary(int kind, const float* x, float* y, int64_t n, float c);
// gx[i] = UnaryGrad(kind, v[i], g[i]).
void UnaryGrad(int kind, const float* v, const float* g, float* gx, int64_t n);
// dst[off_dst(i)] = src[off_src(i)] for 4-byte elements (fp32 or int32, copied as bits);
// it.strides[0] are src's, it.strides[1] dst's.
void StridedCopy(const void* src, void* dst, StridedIter<2> it);
// NOTE [Sum order]: out[j] = scale * sum over the terms k of x[off_outer(j) + off_terms(k)],
// j over outer's shape (out contiguous). `scratch` holds SumChunks(R) doubles per output
// when that is above 1 (R = IterSize(terms)), else may be null.
void Sum(const float* x, float* out, StridedIter<1> outer, StridedIter<1> terms, double scale,
         double* scratch);
// out[i] = x[off_x(i)] * scale for i over it's shape (out contiguous): a sum's gradient
// spread back over its terms.
void ExpandScaled(const float* x, float* out, StridedIter<1> it, float scale);
// MaxAlong for each output j of outer's shape: values[j], indices[j] over the K elements
// x[off_outer(j) + k * stride] (K >= 1).
void MaxAlongDim(const float* x, float* values, int32_t* indices, StridedIter<1> outer,
                 int64_t stride, int64_t K);
// NOTE [Gather and scatter]: out[other_off(i)] = GatherAt(g, data, index, i) for every i.
void Gather(const float* data, const int32_t* index, float* out, GatherScatter g);
// data[e] += the source elements whose index points at e, in index-shape order
// (ScatterSumAt's bits).
void ScatterAdd(const float* src, const int32_t* index, float* data, GatherScatter g);

}  // namespace cpu
}  // namespace kernels

#endif  // KERNELS_CPU_TENSOR_KERNELS_H_
