// CPU launchers of the row bodies nn/functional adds (kernels/rowwise.h): the softmax and
// log-softmax of whole rows with their backward rows, and an array scaled by a scalar that
// lives beside it (a loss's incoming gradient). The host twins of
// kernels/cuda/functional_rows.h: same names, same arguments, raw host pointers. The loops
// follow kernels/cpu.h (FSDP_CPU_CLONES, row sums through LaneSum, rows split by
// ParallelChunks), so every result has the same bits for any ISA clone and thread count.
// Callers (nn/functional) check sizes first; these validate nothing and never fail.
//
//   kernels::cpu::SoftmaxForward(x, y, rows, cols);       // y = softmax of each row of x
//   kernels::cpu::SoftmaxBackward(y, gy, gx, rows, cols);  // gx = y (gy - <gy, y>)
#ifndef KERNELS_CPU_FUNCTIONAL_ROWS_H_
#define KERNELS_CPU_FUNCTIONAL_ROWS_H_

#include <stdint.h>

namespace kernels {
namespace cpu {

// y = softmax of each row of x [rows, cols]: exp(x - max) over its sum (kernels::SoftmaxExp,
// SoftmaxNormalize), the sum in 8 float lanes (LaneSum). y may not be x.
void SoftmaxForward(const float* x, float* y, int64_t rows, int64_t cols);
// gx = y (gy - sum_j gy_j y_j) per row (kernels::SoftmaxBackward, scale 1), y the forward's
// output. gx is neither y nor gy.
void SoftmaxBackward(const float* y, const float* gy, float* gx, int64_t rows, int64_t cols);
// y = log softmax of each row of x (kernels::LogSoftmaxOut). y may not be x.
void LogSoftmaxForward(const float* x, float* y, int64_t rows, int64_t cols);
// gx = gy - exp(y) sum_j gy_j per row (kernels::LogSoftmaxBackward), y the forward's
// output. gx is neither y nor gy.
void LogSoftmaxBackward(const float* y, const float* gy, float* gx, int64_t rows, int64_t cols);
// out[i] = x[i] * s[0] (kernels::ScaleTerm), or x[i] * -s[0] when `negate`; s is one float
// on x's device. out may be x.
void ScaleByScalar(const float* x, const float* s, bool negate, float* out, int64_t n);

}  // namespace cpu
}  // namespace kernels

#endif  // KERNELS_CPU_FUNCTIONAL_ROWS_H_
