// Elementwise ops as differentiable free functions (torch.add, sub, mul, div with NumPy
// broadcasting; scalar forms; GELU, ReLU, SiLU, tanh), float32 on the CPU or CUDA. Each
// output is a fresh tensor on its inputs' device.
//
//   namespace F = nn::functional;
//   // y [B, T, C] = x [B, T, C] * scale [C] + shift [C]:
//   absl::StatusOr<core::Tensor> y = F::Add(F::Mul(x, scale), shift);
//   absl::StatusOr<core::Tensor> h = F::Gelu(F::AddScalar(x, 1.0f));
//
// NOTE [Broadcasting]: two shapes are aligned from the right; in each dim the sizes must be
// equal or one of them 1 (or absent), and the output takes the larger. The gradient of an
// operand that was stretched is the output's gradient summed over the stretched dims
// (SumToShape, nn/functional/reduce.h; bits as NOTE [Sum order]). Ranks are at most 8.
//
// Errors: InvalidArgument "<Op>: ..." naming the argument and its shape (a tensor that is
// undefined or not fp32, operands on two devices, shapes that do not broadcast); an Arg's
// own error is returned unchanged.
#ifndef NN_FUNCTIONAL_ELEMENTWISE_H_
#define NN_FUNCTIONAL_ELEMENTWISE_H_

#include "absl/status/statusor.h"
#include "core/autograd.h"
#include "core/tensor.h"

namespace nn {
namespace functional {

// a + b, a - b, a * b, a / b with NOTE [Broadcasting]; the output has the broadcast shape.
// Gradients: d(a + b) = (g, g), d(a - b) = (g, -g), d(a b) = (g b, g a),
// d(a / b) = (g / b, -g a / b^2), each summed to its operand's shape.
absl::StatusOr<core::Tensor> Add(core::Arg a, core::Arg b);
absl::StatusOr<core::Tensor> Sub(core::Arg a, core::Arg b);
absl::StatusOr<core::Tensor> Mul(core::Arg a, core::Arg b);
absl::StatusOr<core::Tensor> Div(core::Arg a, core::Arg b);

// x + c and x * c, x's shape. Gradients: g and g c.
absl::StatusOr<core::Tensor> AddScalar(core::Arg x, float c);
absl::StatusOr<core::Tensor> MulScalar(core::Arg x, float c);
// -x: MulScalar(x, -1) (its errors and node are MulScalar's).
absl::StatusOr<core::Tensor> Neg(core::Arg x);

// GELU, tanh form (PyTorch's approximate='tanh'), through nn::GeluForward and
// GeluBackward: the bits of the GELU layer.
absl::StatusOr<core::Tensor> Gelu(core::Arg x);
// max(x, 0), through nn::ReluForward and ReluBackward (gradient 0 at 0).
absl::StatusOr<core::Tensor> Relu(core::Arg x);
// x sigmoid(x) (torch.nn.functional.silu), SwiGLU's body (kernels/elementwise.h).
absl::StatusOr<core::Tensor> Silu(core::Arg x);
// log(1 + e^x) (torch.nn.functional.softplus with beta 1), as max(x, 0) + log1p(e^-|x|)
// (kernels::SoftplusForward: no overflow, no lost digits for very negative x); gradient
// g sigmoid(x). The same kernel body runs on the CPU and CUDA (within an ulp or two: the
// devices' log1p differ).
absl::StatusOr<core::Tensor> Softplus(core::Arg x);
// tanh(x) by kernels::FastTanh (within about 1e-7 of tanh); gradient g (1 - y^2).
absl::StatusOr<core::Tensor> Tanh(core::Arg x);

// x in `dtype` (torch's Tensor.to(dtype)): fp32 <-> bf16, each element rounded to nearest even
// into bf16 (widened exactly into fp32); x itself when it has that dtype already. Gradient: g as
// it arrives (fp32). InvalidArgument "ToDType: ..." for an x or a dtype other than fp32 or bf16.
absl::StatusOr<core::Tensor> ToDType(core::Arg x, core::DType dtype);

}  // namespace functional
}  // namespace nn

#endif  // NN_FUNCTIONAL_ELEMENTWISE_H_
