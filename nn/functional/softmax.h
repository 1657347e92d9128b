// Softmax and log-softmax over the last dimension as differentiable ops
// (torch.nn.functional.softmax and log_softmax).
//
//   namespace F = nn::functional;
//   absl::StatusOr<core::Tensor> p = F::Softmax(scores);        // each row sums to 1
//   absl::StatusOr<core::Tensor> lp = F::LogSoftmax(logits);    // log p, without exp's overflow
//
// Each row is max-subtracted before its exponentials (kernels::SoftmaxExp, within 1.5e-7
// relative of exp) and summed in a fixed order: 8 float lanes on the CPU, a warp's lanes on
// CUDA (kernels/cpu/functional_rows.h, kernels/cuda/functional_rows.h), so each device
// gives the same bits every run and for any thread count; the two devices differ by fp32
// summation order. A row of -inf gives NaN, as in PyTorch.
#ifndef NN_FUNCTIONAL_SOFTMAX_H_
#define NN_FUNCTIONAL_SOFTMAX_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "core/autograd.h"
#include "core/tensor.h"

namespace nn {
namespace functional {

// y = exp(x - max) / sum(exp(x - max)) over dimension `dim` of x (fp32, at least 1-D); y
// fp32 of x's shape on its device. Only the last dimension is supported: dim -1 or
// x.dim() - 1. The gradient is y (g - sum(g y)) per row. InvalidArgument "Softmax: ..." for
// a tensor that is not fp32 or is 0-D, a dim outside [-x.dim(), x.dim()), or another dim
// ("only the last dim").
absl::StatusOr<core::Tensor> Softmax(core::Arg x, int64_t dim = -1);

// y = (x - max) - log(sum(exp(x - max))) over the last dimension, as Softmax; the gradient
// is g - exp(y) sum(g) per row. Errors as Softmax's, "LogSoftmax: ...".
absl::StatusOr<core::Tensor> LogSoftmax(core::Arg x, int64_t dim = -1);

}  // namespace functional
}  // namespace nn

#endif  // NN_FUNCTIONAL_SOFTMAX_H_
