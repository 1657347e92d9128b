// Reductions as differentiable free functions (torch.sum, mean, max along a dim), with
// SumToShape and BroadcastTo, the pair that undoes and does NumPy broadcasting (the
// gradients of broadcast elementwise ops). float32 in and out, on the CPU or CUDA.
//
//   namespace F = nn::functional;
//   absl::StatusOr<core::Tensor> loss = F::Mean(F::Mul(err, err));        // shape {}
//   absl::StatusOr<core::Tensor> row_sums = F::Sum(x, {-1}, /*keepdim=*/true);
//   absl::StatusOr<std::vector<core::Tensor>> m = F::Max(logits, -1);     // {values, indices}
//
// NOTE [Sum order] (kernels/tensor.h): every sum adds its terms in an order fixed by the
// number of terms alone (chunks of 4096 consecutive terms, 32 interleaved lanes in double
// each, the lanes then the chunks added in order) and rounds once to fp32, so its bits
// do not depend on the thread count, the run, or the device (CPU and CUDA agree bit for bit).
//
// Errors: InvalidArgument "<Op>: ..." naming the argument and its shape (a tensor that is
// not fp32, a dim out of range or repeated, shapes that do not broadcast); an Arg's own
// error is returned unchanged.
#ifndef NN_FUNCTIONAL_REDUCE_H_
#define NN_FUNCTIONAL_REDUCE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/autograd.h"
#include "core/tensor.h"

namespace nn {
namespace functional {

// The sum (mean) of all of x's elements, shape {}. The mean of no elements is NaN.
// Gradient: the output's gradient (divided by the count for Mean) at every element.
absl::StatusOr<core::Tensor> Sum(core::Arg x);
absl::StatusOr<core::Tensor> Mean(core::Arg x);

// The sum (mean) over the dims `dims` (at least one, distinct, negative counted from the
// end): the output drops them, or keeps them as size 1 with keepdim. Gradient as above,
// spread over the reduced dims.
absl::StatusOr<core::Tensor> Sum(core::Arg x, const std::vector<int64_t>& dims,
                                 bool keepdim = false);
absl::StatusOr<core::Tensor> Mean(core::Arg x, const std::vector<int64_t>& dims,
                                  bool keepdim = false);

// {values, indices}: the maximum along `dim` and where it is (int32; the first maximal
// element; NaN counts as above every number), the dim dropped or kept as size 1. x must
// not be empty along dim. Gradient of x: the values' gradient at each first maximal
// element, zeros elsewhere (indices carry none).
absl::StatusOr<std::vector<core::Tensor>> Max(core::Arg x, int64_t dim, bool keepdim = false);

// x summed down to `shape`, a shape that broadcasts to x's (aligned from the right, each
// of its dims equal to x's or 1): the gradient of a broadcast operand. Gradient:
// BroadcastTo of the output's gradient.
absl::StatusOr<core::Tensor> SumToShape(core::Arg x, const core::Shape& shape);

// x stretched to `shape` by NumPy broadcasting (a copy). Gradient: SumToShape of the
// output's gradient to x's shape.
absl::StatusOr<core::Tensor> BroadcastTo(core::Arg x, const core::Shape& shape);

}  // namespace functional
}  // namespace nn

#endif  // NN_FUNCTIONAL_REDUCE_H_
