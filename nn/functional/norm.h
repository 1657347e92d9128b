// Normalisations over the last dimension as differentiable ops: LayerNorm and RmsNorm
// (torch.nn.functional.layer_norm, and Llama's RMSNorm).
//
//   namespace F = nn::functional;
//   absl::StatusOr<core::Tensor> h = F::LayerNorm(x, ln_weight, ln_bias);   // x [B, T, C]
//   absl::StatusOr<core::Tensor> r = F::RmsNorm(x, norm_weight, 1e-6f);
//
// NOTE [Functional norms]: each op issues the dispatch calls of its layer's Forward and
// Backward (nn::LayerNorm, nn::RmsNorm) in their order: nn::LayerNormForward and
// nn::LayerNormBackward (nn::RmsNormForward, nn::RmsNormBackward), so with the same weights,
// input and output gradient it gives the same bits. The forward keeps the input and each
// row's statistics (fp32), from which the backward makes the normalised input again. A
// weight or bias that is a parameter leaf gets its gradient added into Parameter::grad by
// the backward's column sums (made fp32 zeros first where undefined), as the layer does;
// any other weight or bias gets its gradient returned.
#ifndef NN_FUNCTIONAL_NORM_H_
#define NN_FUNCTIONAL_NORM_H_

#include "absl/status/statusor.h"
#include "core/autograd.h"
#include "core/tensor.h"

namespace nn {
namespace functional {

// y = (x - mean) / sqrt(var + eps) * w + b over the last dimension C (var biased), as
// nn::LayerNorm (NOTE [Functional norms]): x fp32 [..., C] (at least 1-D, C >= 1); w and b
// [C], both fp32 or both bf16; y fp32 of x's shape on their device. Gradients for x, w and
// b. InvalidArgument "LayerNorm: ..." naming the argument for a wrong shape, dtype or
// device, or an eps that is negative or not finite.
absl::StatusOr<core::Tensor> LayerNorm(core::Arg x, core::Arg w, core::Arg b, float eps = 1e-5f);

// y = x / sqrt(mean(x^2) + eps) * w over the last dimension C, as nn::RmsNorm (NOTE
// [Functional norms]): x fp32 [..., C] (at least 1-D, C >= 1), w [C] fp32 or bf16, y fp32
// of x's shape. Gradients for x and w. Errors as LayerNorm's, "RmsNorm: ...".
absl::StatusOr<core::Tensor> RmsNorm(core::Arg x, core::Arg w, float eps = 1e-6f);

// LayerNorm and RmsNorm, but y is stored bf16 when w is bf16, each element its fp32 value rounded
// once: the input of a bf16 GEMM (a head's: NOTE [GEMM epilogues] in nn/tensor_ops.h), which
// would round it so. The same gradients, fp32 with an fp32 w.
absl::StatusOr<core::Tensor> LayerNormForGemm(core::Arg x, core::Arg w, core::Arg b,
                                              float eps = 1e-5f);
absl::StatusOr<core::Tensor> RmsNormForGemm(core::Arg x, core::Arg w, float eps = 1e-6f);

}  // namespace functional
}  // namespace nn

#endif  // NN_FUNCTIONAL_NORM_H_
