// Linear: y = x W^T + b on the last dimension, as torch.nn.Linear.
//
//   auto fc = std::make_shared<nn::Linear>(/*in=*/64, /*out=*/256, /*bias=*/true, /*seed=*/7);
//   ASSIGN_OR_RETURN(core::Tensor y, fc->Forward(x));        // x [..., 64] -> y [..., 256]
//   ASSIGN_OR_RETURN(core::Tensor gx, fc->Backward(grad_y));  // adds into weight()->grad
//
//   // A head that reuses an embedding's weight [V, C] (weight tying, as GPT-2):
//   auto lm_head = nn::Linear::Tied(wte->weight(), /*bias=*/false);   // [..., C] -> [..., V]
#ifndef NN_LINEAR_H_
#define NN_LINEAR_H_

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/module.h"
#include "core/parameter.h"
#include "core/tensor.h"

namespace nn {

class Linear : public core::Module {
 public:
  // Parameters "weight" [out, in] and, if `bias`, "bias" [out], both drawn from
  // U(-1/sqrt(in), 1/sqrt(in)) (PyTorch's default init), weight first in row-major order
  // then bias, from core::Rng(seed). A non-positive `in` or `out` makes every Forward
  // return InvalidArgument naming it.
  Linear(int64_t in_features, int64_t out_features, bool bias = true, uint64_t seed = 0);

  // A Linear whose "weight" is `weight` itself (the same Parameter object, so gradients
  // from every user accumulate into one grad), with in/out taken from its [out, in]
  // shape. A bias, if requested, starts at zero. A null or non-2-D weight makes every
  // Forward return InvalidArgument.
  static std::shared_ptr<Linear> Tied(core::ParameterPtr weight, bool bias);

  std::string TypeName() const override { return "Linear"; }

  // The weight Parameter ([out, in]).
  const core::ParameterPtr& weight() const { return weight_; }
  // The bias Parameter ([out]), or nullptr without a bias.
  const core::ParameterPtr& bias() const { return bias_; }
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  // The seed the constructor initialised from (0 for Tied).
  uint64_t seed() const { return seed_; }

  // For a layer that fuses this one with the op around it (CausalSelfAttention's qkv,
  // GroupedQueryAttention's and SwiGluMlp's shared inputs), and only when
  // nn::internal::Fusable(*this), and as the reference nn/functional's fused ops are checked
  // against (fused_test): these run no hooks.
  // - ForwardWithoutBias(x) is Forward(x) minus the bias (y = x W^T, with every check
  //   and cache of Forward). BackwardFused(g) is Backward(g) (dL/dx returned, dL/dW and
  //   dL/db accumulated), for a parent that computed g in its own fused op.
  // - NOTE [GEMM epilogues] (nn/tensor_ops.h): ForwardForGemm(x) is Forward(x) stored
  //   bf16 when the weight is bf16 (for a consumer that would round it to bf16 anyway:
  //   the same bits, without the fp32 copy and the rounding pass; and the GPT's logits,
  //   NOTE [bf16 logits] in nn/gpt.h); with an fp32 weight it is Forward(x). ForwardGelu(x, &pre) is GELU(Forward(x)) with the bias and the GELU
  //   in the GEMM's epilogue; it sets `pre` to the pre-activation, and both are bf16 when
  //   the weight is (else fp32). It needs a bias.
  // - BackwardForGemm(g) is Backward(g) with dL/dx stored bf16 when the Forward's weight
  //   was bf16. BackwardThroughGelu(g, pre), for a layer whose input was GELU(pre) with
  //   `pre` from ForwardGelu, is Backward(g) with dL/dx multiplied by GELU'(pre) in the
  //   GEMM's epilogue: the gradient at the pre-activation, in pre's dtype.
  // - ForwardResidual(x, residual) is residual + Forward(x) (fp32, a new tensor), the bias
  //   (if any) and the residual added in the GEMM's epilogue (NOTE [GEMM epilogues]:
  //   kBiasResidual, or kResidual without a bias); residual fp32 of the output's shape.
  // - BackwardAdd(g, addend) is addend + Backward(g) (fp32, a new tensor; dL/dW and dL/db
  //   accumulated as by Backward), the add in the epilogue of the input gradient's GEMM
  //   (kResidual): for a parent whose input feeds several Linears, summing their input
  //   gradients as it would with AddTensors(addend, Backward(g)), bit for bit. addend fp32
  //   of the input's shape, left as it is.
  absl::StatusOr<core::Tensor> ForwardWithoutBias(const core::Tensor& x);
  absl::StatusOr<core::Tensor> ForwardResidual(const core::Tensor& x,
                                               const core::Tensor& residual);
  absl::StatusOr<core::Tensor> BackwardFused(const core::Tensor& grad_output);
  absl::StatusOr<core::Tensor> BackwardAdd(const core::Tensor& grad_output,
                                           const core::Tensor& addend);
  absl::StatusOr<core::Tensor> ForwardForGemm(const core::Tensor& x);
  absl::StatusOr<core::Tensor> ForwardGelu(const core::Tensor& x, core::Tensor* pre);
  absl::StatusOr<core::Tensor> BackwardForGemm(const core::Tensor& grad_output);
  absl::StatusOr<core::Tensor> BackwardThroughGelu(const core::Tensor& grad_output,
                                                   const core::Tensor& pre);
  // The dtype in which Backward would use grad_output: bf16 after a Forward with a bf16
  // weight (NOTE [bf16 GEMMs]: grad_output is rounded once to bf16 for its GEMMs), else
  // fp32. After such a Forward, Backward also takes grad_output already in bf16 (no
  // rounding pass, half the bytes): dL/dx and dL/dW are those of the fp32 gradient it is
  // the rounding of, bit for bit, and dL/db sums the bf16 values. nn::CrossEntropyLoss can
  // write its gradient so. A bf16 grad_output after an fp32 Forward is InvalidArgument.
  core::DType GradOutputDType() const {
    return input_.defined() ? input_.dtype() : core::DType::kFloat32;
  }

 protected:
  // x: fp32 [..., in] (at least 1-D; bf16 when the weight is) on the parameters' device
  // -> [..., out] there, fp32. The
  // weight and bias may be fp32 or bf16 (see NOTE [Device dispatch] in nn/tensor_ops.h);
  // an input on another device is InvalidArgument naming both devices.
  absl::StatusOr<core::Tensor> ForwardImpl(const core::Tensor& x) override;
  // grad_output: [..., out] -> grad_input [..., in]; adds dL/dW and dL/db into the
  // parameters' grads (those with requires_grad).
  absl::StatusOr<core::Tensor> BackwardImpl(const core::Tensor& grad_output) override;
  void ReleaseActivations() override { input_ = core::Tensor(); }

 private:
  struct TiedTag {};
  Linear(TiedTag, core::ParameterPtr weight, bool bias);

  // NOTE [bf16 GEMMs]: with a bf16 weight (FSDP mixed precision) every GEMM of the layer
  // runs bf16 x bf16 with fp32 accumulation (tensor cores on CUDA; exact widening into
  // oneDNN's fp32 GEMM on the CPU, so both devices compute on the same rounded values).
  // The input is rounded once in the forward and kept rounded for the weight gradient
  // (half the bytes of an fp32 copy), grad_output once in the backward for both its
  // GEMMs. With an fp32 weight everything stays fp32. Returns `t` itself or its bf16
  // copy; `name` names it in an error.
  absl::StatusOr<core::Tensor> GemmOperand(const core::Tensor& t, const char* name) const;
  // The forward GEMM with the bias (unless !with_bias) in its epilogue, and the GELU when
  // `pre` is non-null, or the bias and `residual` when that is defined; stored bf16 when
  // `gemm_out` and the weight is bf16.
  absl::StatusOr<core::Tensor> ForwardGemm(const core::Tensor& x, bool with_bias, bool gemm_out,
                                           core::Tensor* pre,
                                           const core::Tensor& residual = core::Tensor());
  // The backward GEMMs and dL/db, dL/dx times GELU'(gelu_pre) when gelu_pre is defined
  // (in its dtype), plus `addend` when that is defined (fp32), else stored bf16 when
  // `gemm_out` and the Forward was bf16.
  absl::StatusOr<core::Tensor> BackwardGemms(const core::Tensor& grad_output, bool gemm_out,
                                             const core::Tensor& gelu_pre,
                                             const core::Tensor& addend = core::Tensor());

  int64_t in_ = 0;
  int64_t out_ = 0;
  uint64_t seed_ = 0;
  std::string config_error_;  // empty when the constructor arguments were valid
  core::ParameterPtr weight_;
  core::ParameterPtr bias_;
  core::Tensor input_;  // cached by Forward (bf16 under NOTE [bf16 GEMMs]), released by Backward
};

// NOTE [bf16 GEMMs]: `x` rounded once for several Linears that all take it as their input
// (Llama's q, k and v projections; SwiGLU's gate and up): its bf16 copy when every one of
// them has a bf16 weight and nothing could see its input (internal::Fusable: no hooks, no
// activation checkpointing of its own), else `x` itself, which each then rounds alone. Each
// keeps the copy it is given for its weight gradient, so they share one stored copy and one
// rounding pass instead of one each; the bits are the same either way. `owner` names an
// error (the rounding's allocation).
absl::StatusOr<core::Tensor> SharedGemmInput(const core::Module& owner, const core::Tensor& x,
                                             std::initializer_list<const Linear*> takers);
// Whether SharedGemmInput rounds for `takers` (each has a bf16 weight and is Fusable): a
// parent may then hand their owner the input already in bf16 (NOTE [GEMM epilogues]).
bool SharesBf16Input(std::initializer_list<const Linear*> takers);
// OK unless `x` is bf16 while SharesBf16Input(takers) is false (a taker has an fp32 weight,
// a hook or activation checkpointing of its own): then InvalidArgument naming `owner`, the
// takers (`names`) and why the input must be fp32.
absl::Status CheckSharedBf16Input(const core::Module& owner, const core::Tensor& x,
                                  std::initializer_list<const Linear*> takers,
                                  absl::string_view names);

// The dtype in which a producer (a parent's fused op) stores the gradient `taker` takes as
// its grad_output: bf16 when its Backward would round it to bf16 itself (GradOutputDType)
// and nothing could see it (internal::Fusable: no hooks, no activation checkpointing of its
// own), else fp32. The same bits either way, one rounding pass fewer.
core::DType GradOutputDTypeFor(const Linear& taker);

// The gradient at an input that several Linears took (Llama's q, k and v projections;
// SwiGLU's gate and up): the sum of their input gradients from the (Linear, gradient at its
// output) pairs, in their order, each Linear's weight gradient accumulated as by Backward.
// Every Linear after the first that is internal::Fusable adds the sum so far in the epilogue
// of its input gradient's GEMM (Linear::BackwardAdd); one with hooks runs Backward, its
// result added by AddTensors. The bits are the same either way. `owner` names an error.
absl::StatusOr<core::Tensor> SharedInputGradient(
    const core::Module& owner, std::initializer_list<std::pair<Linear*, core::Tensor>> takers);

}  // namespace nn

#endif  // NN_LINEAR_H_
