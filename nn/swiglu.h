// SwiGluMlp: Llama's feed-forward block (Hugging Face's LlamaMLP with mlp_bias false and
// hidden_act "silu"): y = down_proj(silu(gate_proj(x)) * up_proj(x)), silu(a) = a sigmoid(a).
//
//   auto mlp = std::make_shared<nn::SwiGluMlp>(/*hidden=*/512, /*intermediate=*/1376);
//   ASSIGN_OR_RETURN(core::Tensor y, mlp->Forward(x));   // x [..., 512] -> [..., 512]
//
// silu(a) * b and its two gradients are one fused op each (nn::SiluMulForward /
// SiluMulBackward, nn/tensor_ops.h).
#ifndef NN_SWIGLU_H_
#define NN_SWIGLU_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/module.h"
#include "core/tensor.h"
#include "nn/linear.h"

namespace nn {

class SwiGluMlp : public core::Module {
 public:
  // Children "gate_proj" and "up_proj" Linear(hidden, intermediate) and "down_proj"
  // Linear(intermediate, hidden), all without bias, seeded DeriveSeed(seed, 0 .. 2). A
  // non-positive size makes every Forward return InvalidArgument naming it.
  SwiGluMlp(int64_t hidden, int64_t intermediate, uint64_t seed = 0);

  std::string TypeName() const override { return "SwiGluMlp"; }

  const std::shared_ptr<Linear>& gate_proj() const { return gate_proj_; }
  const std::shared_ptr<Linear>& up_proj() const { return up_proj_; }
  const std::shared_ptr<Linear>& down_proj() const { return down_proj_; }
  // Whether Forward takes its input in bf16 (a producer's bf16 copy of the fp32 input,
  // NOTE [GEMM epilogues] in nn/tensor_ops.h): when gate and up would round it to bf16
  // themselves (nn::SharesBf16Input: bf16 weights, no hooks). Else the input is fp32.
  bool TakesBf16Input() const;

 protected:
  // x: fp32 (or bf16: TakesBf16Input) [..., hidden] -> [..., hidden].
  absl::StatusOr<core::Tensor> ForwardImpl(const core::Tensor& x) override;
  // Returns dL/dx; the projections add their weight gradients.
  absl::StatusOr<core::Tensor> BackwardImpl(const core::Tensor& grad_output) override;
  void ReleaseActivations() override {
    gate_ = core::Tensor();
    up_ = core::Tensor();
  }

 private:
  std::string config_error_;
  std::shared_ptr<Linear> gate_proj_;
  std::shared_ptr<Linear> up_proj_;
  std::shared_ptr<Linear> down_proj_;
  // The projections' outputs a and b [..., intermediate], cached by Forward for the
  // gradient of silu(a) * b, released by Backward.
  core::Tensor gate_;
  core::Tensor up_;
};

}  // namespace nn

#endif  // NN_SWIGLU_H_
