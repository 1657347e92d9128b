// Matrix products as differentiable ops: MatMul and Linear (torch.matmul and
// torch.nn.functional.linear). Both run their GEMMs through nn::MatMul (oneDNN on the CPU,
// cuBLASLt on CUDA), on the inputs' device.
//
//   namespace F = nn::functional;
//   // y [B, T, 256] = x [B, T, 64] W^T + b, W [256, 64] a parameter:
//   absl::StatusOr<core::Tensor> y = F::Linear(x, fc_weight, fc_bias);
//   absl::StatusOr<core::Tensor> s = F::MatMul(q, k_t);     // [B, H, T, d] x [B, H, d, T]
//
// NOTE [Functional Linear]: F::Linear issues the dispatch calls of nn::Linear's Forward and
// Backward (nn/linear.h) in their order, so with the same weights, input and output
// gradient it gives the same bits: the output, the input gradient and the weight and bias
// gradients. A weight or bias that is a parameter leaf (core::Value, or a ParameterPtr
// passed as the argument) gets its gradient added into Parameter::grad by the backward's
// own GEMM and column sums (beta 1, NOTE [Autograd] in core/autograd.h), made fp32 zeros
// first where undefined, as the layer does; any other weight or bias gets its gradient
// returned. With a bf16 weight (NOTE [bf16 GEMMs] in nn/linear.h) the input is rounded once
// to bf16 in the forward and kept so for the weight gradient, and the output gradient once
// in the backward for both its GEMMs and the bias gradient.
#ifndef NN_FUNCTIONAL_LINEAR_H_
#define NN_FUNCTIONAL_LINEAR_H_

#include "absl/status/statusor.h"
#include "core/autograd.h"
#include "core/tensor.h"

namespace nn {
namespace functional {

// c = a b: a [..., m, k] and b [..., k, n] with the same leading dimensions (a batch of
// products), or b [k, n] shared by every matrix of a; c [..., m, n] fp32 on their device.
// a and b are fp32 or bf16 (a mixed pair as nn::MatMul takes it: NOTE [Device dispatch] in
// nn/tensor_ops.h). Gradients: dA = dC B^T, dB = A^T dC (summed over the batch for a 2-D
// b), fp32. InvalidArgument "MatMul: ..." naming the operand for a tensor under 2-D, a
// dtype other than fp32 or bf16, inner sizes that differ, leading dimensions that differ
// (unless b is 2-D) or operands on two devices.
absl::StatusOr<core::Tensor> MatMul(core::Arg a, core::Arg b);

// y = x w^T + b over the last dimension (NOTE [Functional Linear]): x [..., in] (at least
// 1-D) fp32, or bf16 when w is; w [out, in] fp32 or bf16; b, when defined, [out] fp32 or
// bf16; y [..., out] fp32 on their device. Gradients: dx = dy w, dw = dy^T x, db = the
// column sums of dy. InvalidArgument "Linear: ..." naming the argument for a wrong shape,
// dtype or device.
absl::StatusOr<core::Tensor> Linear(core::Arg x, core::Arg w, core::Arg b = core::Tensor());

}  // namespace functional
}  // namespace nn

#endif  // NN_FUNCTIONAL_LINEAR_H_
