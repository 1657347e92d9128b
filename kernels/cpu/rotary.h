// CPU launcher of the standalone rotary embedding (nn/functional/rotary.h), the host twin
// of kernels/cuda/rotary.h: same name, same arguments, raw host pointers. Each element is
// kernels::RotaryRotate (kernels/elementwise.h), the body nn::RotaryPackQkv turns q and k
// with, so with the same tables a row gets the packing's bits. Rows are split by
// ParallelChunks (kernels/cpu.h), so the bits do not depend on the thread count. Callers
// check sizes (and positions) first; this validates nothing and never fails.
//
//   kernels::cpu::RotaryRows(x, cos, sin, P, nullptr, 1, offset, y, rows, T, D, false);
#ifndef KERNELS_CPU_ROTARY_H_
#define KERNELS_CPU_ROTARY_H_

#include <stdint.h>

namespace kernels {
namespace cpu {

// y [rows, D] = each row of x [rows, D] (D even) turned by the rotary angles of its
// position (`inverse`: turned back, the rotation's transpose). Row r is step t = r % T of
// block l = r / T; its position is offset + t, or positions[(l / per) * T + t] when
// positions is not null. cos and sin are [P, D / 2] (nn::RotaryTables); a position outside
// [0, P) leaves its row as it is. y may not be x.
void RotaryRows(const float* x, const float* cos, const float* sin, int64_t P,
                const int32_t* positions, int64_t per, int64_t offset, float* y, int64_t rows,
                int64_t T, int64_t D, bool inverse);

}  // namespace cpu
}  // namespace kernels

#endif  // KERNELS_CPU_ROTARY_H_
