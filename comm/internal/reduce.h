// CPU reduction kernels for the gloo backend. bf16 values are accumulated in fp32 and
// rounded to bf16 once, at the end.
#ifndef COMM_INTERNAL_REDUCE_H_
#define COMM_INTERNAL_REDUCE_H_

#include <cstdint>

#include "comm/process_group.h"
#include "core/dtype.h"

namespace comm {
namespace internal {

// out[i] = op over j in [0, n) of chunks[j][i] (k elements each), for i in [0, k),
// combining the chunks in order j = 0, 1, ... (so every rank that runs it gets identical
// bits); Average divides the sum by n. `out` may be one of the chunks (in place: element
// i of every chunk is read before out[i] is written), but must not partly overlap one.
void ReduceChunkList(core::DType dtype, ReduceOp op, const void* const* chunks, int n, int64_t k,
                     void* out);

// Elementwise c = a op b over `count` elements of `dtype` (sum or max), as gloo's
// allreduce calls it. bf16 is not handled here (the backend reduces bf16 in fp32).
void ReducePair(core::DType dtype, ReduceOp op, void* c, const void* a, const void* b,
                size_t count);

// data[i] /= n for `count` fp32 values.
void DivideInPlace(float* data, int64_t count, int n);

}  // namespace internal
}  // namespace comm

#endif  // COMM_INTERNAL_REDUCE_H_
