// Dropout as a differentiable op (torch.nn.functional.dropout) whose mask is a pure
// function of (seed, step, element index), NOTE [Dropout mask] in kernels/dropout.h: the
// same on the CPU and CUDA, for any thread count, and for any split of a tensor across
// ranks.
//
//   namespace F = nn::functional;
//   // Training step `step`: each element kept with probability 0.9 and scaled by 1 / 0.9.
//   absl::StatusOr<core::Tensor> h = F::Dropout(x, 0.1, /*seed=*/1234, step, training);
//
// NOTE [Dropout offset]: element i of x draws its decision at index offset + i, i counting
// x's elements in row-major order. A rank that holds rows [r0, r1) of a global tensor whose
// rows have n elements each passes offset = r0 n and draws exactly the decisions the whole
// tensor would give those elements, whatever the world size; a tensor cut into pieces
// along its first dim reproduces the whole's mask the same way.
#ifndef NN_FUNCTIONAL_DROPOUT_H_
#define NN_FUNCTIONAL_DROPOUT_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "core/autograd.h"
#include "core/tensor.h"

namespace nn {
namespace functional {

// y = x * mask / (1 - p), x fp32, mask[i] = 1 with probability 1 - p (the mask of (seed,
// step, offset + i), NOTE [Dropout offset]); y fp32 of x's shape on its device (a dropped
// element is 0, also where x is NaN or infinite). The gradient is the output's times the
// same mask and scale (drawn again, nothing saved). With p == 0 or !training, x itself
// (the same tensor and record: no copy, no node). InvalidArgument "Dropout: ..." for an
// undefined or non-fp32 x, p not in [0, 1) (NaN included) or a negative offset.
absl::StatusOr<core::Tensor> Dropout(core::Arg x, double p, uint64_t seed, uint64_t step,
                                     bool training = true, int64_t offset = 0);

}  // namespace functional
}  // namespace nn

#endif  // NN_FUNCTIONAL_DROPOUT_H_
