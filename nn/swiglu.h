// SwiGluMlp: Llama's feed-forward block (Hugging Face's LlamaMLP with mlp_bias false and
// hidden_act "silu"): y = down_proj(silu(gate_proj(x)) * up_proj(x)), silu(a) = a sigmoid(a).
//
//   auto mlp = std::make_shared<nn::SwiGluMlp>(/*hidden=*/512, /*intermediate=*/1376);
//   ASSIGN_OR_RETURN(core::Tensor y, mlp->Forward(x));   // x [..., 512] -> [..., 512]
//
// silu(a) * b and its two gradients are one fused op each (nn::SiluMulForward /
// SiluMulBackward, nn/tensor_ops.h), inside F::SwiGlu or F::SiluMul (nn/functional/llama_fused.h).
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
  // h = silu(gate_proj(x)) * up_proj(x) [..., intermediate] for x [..., hidden] (fp32, or
  // bf16 with bf16 projection weights), before down_proj: F::SwiGlu (the two GEMMs on x rounded
  // once, h stored bf16 under bf16 weights when `h_for_gemm`) when gate_proj and up_proj run
  // inline, else each through nn::ApplyLinear and F::SiluMul. For this module's forward and for
  // a parent that runs this MLP inline and adds its residual in down_proj's GEMM (NOTE [Block
  // forwards] in nn/transformer.h). InvalidArgument naming this module for a bad size.
  absl::StatusOr<core::Tensor> Hidden(const core::Tensor& x, bool h_for_gemm);

 protected:
  // {x}: fp32 [..., hidden] -> {down_proj(Hidden(x))} [..., hidden]. A graph module (NOTE
  // [Graph modules] in core/module.h).
  absl::StatusOr<core::Tensors> ForwardGraph(const core::Tensors& in) override;

 private:
  std::string config_error_;
  std::shared_ptr<Linear> gate_proj_;
  std::shared_ptr<Linear> up_proj_;
  std::shared_ptr<Linear> down_proj_;
};

}  // namespace nn

#endif  // NN_SWIGLU_H_
