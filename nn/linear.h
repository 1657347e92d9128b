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
#include "core/autograd.h"
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

  int64_t in_ = 0;
  int64_t out_ = 0;
  uint64_t seed_ = 0;
  std::string config_error_;  // empty when the constructor arguments were valid
  core::ParameterPtr weight_;
  core::ParameterPtr bias_;
  core::Tensor input_;  // cached by Forward (bf16 under NOTE [bf16 GEMMs]), released by Backward
};

// y = x W^T + b by `linear` inside a graph module's forward (NOTE [Block forwards] in
// nn/transformer.h): nn::functional::Linear on its parameters when internal::RunsInline(linear)
// (no hooks, not checkpointed: nothing could tell), else linear.CallOne({x}), so that hooks a
// policy placed on it run. An error names the Linear.
absl::StatusOr<core::Tensor> ApplyLinear(Linear& linear, core::Arg x);
// linear's bias as an op's argument: the parameter, or an undefined tensor (none) without one.
core::Arg BiasArg(const Linear& linear);

}  // namespace nn

#endif  // NN_LINEAR_H_
