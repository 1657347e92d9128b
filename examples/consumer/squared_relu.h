// The consumer's own differentiable op, written through fsdp's public targets only: a
// forward kernel (a plain CPU loop) and its derivative recorded with core::RecordFunction,
// so it composes with nn::functional ops and the autograd graph differentiates it.
//
//   namespace F = nn::functional;
//   absl::StatusOr<core::Tensor> h = consumer::SquaredRelu(F::Linear(x, w, b));
//   RETURN_IF_ERROR(h.status());
//
// Its test checks the derivative with the library's gradient checker
// (nn/functional/gradcheck.h), as a user's op should be.
#ifndef EXAMPLES_CONSUMER_SQUARED_RELU_H_
#define EXAMPLES_CONSUMER_SQUARED_RELU_H_

#include "absl/status/statusor.h"
#include "core/autograd.h"
#include "core/tensor.h"

namespace consumer {

// y = max(x, 0)^2 elementwise, a fresh fp32 CPU tensor of x's shape. Gradient:
// dy/dx = 2 max(x, 0), so g * 2 max(x, 0) (0 at 0). Records a node "SquaredRelu" when x
// requires gradients and grad mode is on. x must be a defined fp32 CPU tensor:
// InvalidArgument "SquaredRelu: input x ..." naming what is wrong otherwise. An Arg holding
// an error (an earlier op's) is returned unchanged.
absl::StatusOr<core::Tensor> SquaredRelu(core::Arg x);

}  // namespace consumer

#endif  // EXAMPLES_CONSUMER_SQUARED_RELU_H_
