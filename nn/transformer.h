// The GPT-2 transformer block and its MLP.
//
//   auto block = std::make_shared<nn::TransformerBlock>(/*n_embd=*/64, /*n_head=*/4, /*seed=*/3);
//   ASSIGN_OR_RETURN(core::Tensor y, block->Forward(x));   // x [B, T, 64] -> [B, T, 64]
//
// Mlp:              y = proj(gelu(fc(x))), fc = Linear(C, 4C), proj = Linear(4C, C).
// TransformerBlock: pre-LN with residuals, h = x + attn(ln_1(x)); y = h + mlp(ln_2(h)).
//
// NOTE [Fused layers]: where a pass over memory can be saved, a parent runs two steps as
// one fused op (NOTE [Fused ops], nn/tensor_ops.h, and NOTE [GEMM epilogues] there)
// instead of calling a child's public Forward / Backward, but only while
// nn::internal::Fusable(child) holds: the child has no hooks, constructed cleanly and is
// not checkpointed on its own, so nothing can tell the difference. With fp32 weights the
// results, parameter gradients included, are the same bits either way (transformer_test
// checks it by hooking the children). Fused here:
// - Mlp: fc's GEMM adds the bias and applies the GELU in its epilogue (forward), proj's
//   input-gradient GEMM multiplies by GELU' (backward), when fc, gelu and proj are all
//   Fusable at Forward; under bf16 weights h and the pre-activation are stored bf16 (the
//   unfused path keeps them fp32 and rounds h for proj). A Backward after a fused
//   Forward needs them still Fusable (a hook added in between is FailedPrecondition,
//   since gelu never saw the Forward its hook would report).
// - TransformerBlock: the residual add h = x + a with ln_2 (forward), and each
//   LayerNorm's backward with the residual add that follows it (backward), decided per
//   call by whether ln_2 / ln_1 are Fusable. Under bf16 weights, when attention is
//   Fusable and takes a bf16 gradient (CausalSelfAttention::GradOutputDType: its proj
//   would round it so), ln_2's backward also writes the sum's bf16 copy in its pass and
//   attention gets that copy (the same bits as the fp32 sum, one rounding pass fewer).
// - LlamaDecoderLayer (nn/llama.h): each RmsNorm's backward with the residual add that
//   follows it (RmsNorm::BackwardAdd), decided per call by whether the norm is Fusable;
//   post_attention_layernorm's also writes the sum's bf16 copy for self_attn when it is
//   Fusable and takes a bf16 gradient (GroupedQueryAttention::GradOutputDType), as ln_2's.
// FSDP hooks wrapped units only, so children of a wrapped block stay Fusable; a policy
// that wraps fc or a LayerNorm on its own gets the unfused path, hooks and all.
#ifndef NN_TRANSFORMER_H_
#define NN_TRANSFORMER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/module.h"
#include "core/tensor.h"
#include "nn/activations.h"
#include "nn/attention.h"
#include "nn/layer_norm.h"
#include "nn/linear.h"

namespace nn {

class Mlp : public core::Module {
 public:
  // Children "fc" Linear(C, 4C) seeded DeriveSeed(seed, 0), "gelu" GELU, "proj"
  // Linear(4C, C) seeded DeriveSeed(seed, 1). A non-positive n_embd makes every
  // Forward return InvalidArgument.
  explicit Mlp(int64_t n_embd, uint64_t seed = 0);

  std::string TypeName() const override { return "Mlp"; }

  const std::shared_ptr<Linear>& fc() const { return fc_; }
  const std::shared_ptr<GELU>& gelu() const { return gelu_; }
  const std::shared_ptr<Linear>& proj() const { return proj_; }

  // For a parent that fuses the residual add after this MLP (NOTE [Fused layers]), only
  // when nn::internal::Fusable(*this) and AddsResidualInGemm(): residual + Forward(x)
  // (residual fp32 [..., C]), the add in the epilogue of proj's GEMM
  // (Linear::ForwardResidual), running no hooks of this module. Backward as after Forward.
  // FailedPrecondition when !AddsResidualInGemm() (a hook on a child, a missing bias).
  absl::StatusOr<core::Tensor> ForwardResidual(const core::Tensor& x,
                                               const core::Tensor& residual);
  bool AddsResidualInGemm() const;

 protected:
  // x: fp32 [..., C] -> [..., C].
  absl::StatusOr<core::Tensor> ForwardImpl(const core::Tensor& x) override;
  absl::StatusOr<core::Tensor> BackwardImpl(const core::Tensor& grad_output) override;
  void ReleaseActivations() override { pre_ = core::Tensor(); }

 private:
  // Forward(x), or ForwardResidual(x, residual) when `residual` is defined.
  absl::StatusOr<core::Tensor> ForwardPlus(const core::Tensor& x, const core::Tensor& residual);

  // "mlp.fc (Linear) + mlp.gelu (GELU)", for the fused ops' messages.
  std::string FusedWhat() const;

  std::string config_error_;
  std::shared_ptr<Linear> fc_;
  std::shared_ptr<GELU> gelu_;
  std::shared_ptr<Linear> proj_;
  // fc's output plus bias, cached by a fused Forward (NOTE [Fused layers]); undefined
  // after an unfused one and after Backward.
  core::Tensor pre_;
};

class TransformerBlock : public core::Module {
 public:
  // Children in order "ln_1" LayerNorm(C), "attn" CausalSelfAttention(C, n_head) seeded
  // DeriveSeed(seed, 0), "ln_2" LayerNorm(C), "mlp" Mlp(C) seeded DeriveSeed(seed, 1).
  // Invalid sizes are reported by the children on Forward.
  TransformerBlock(int64_t n_embd, int64_t n_head, uint64_t seed = 0);

  std::string TypeName() const override { return "TransformerBlock"; }

  const std::shared_ptr<LayerNorm>& ln_1() const { return ln_1_; }
  const std::shared_ptr<CausalSelfAttention>& attn() const { return attn_; }
  const std::shared_ptr<LayerNorm>& ln_2() const { return ln_2_; }
  const std::shared_ptr<Mlp>& mlp() const { return mlp_; }

 protected:
  // x: fp32 [B, T, C] -> [B, T, C].
  absl::StatusOr<core::Tensor> ForwardImpl(const core::Tensor& x) override;
  absl::StatusOr<core::Tensor> BackwardImpl(const core::Tensor& grad_output) override;
  void ReleaseActivations() override { input_shape_.clear(); }

 private:
  std::shared_ptr<LayerNorm> ln_1_;
  std::shared_ptr<CausalSelfAttention> attn_;
  std::shared_ptr<LayerNorm> ln_2_;
  std::shared_ptr<Mlp> mlp_;
  core::Shape input_shape_;  // of the cached Forward; empty when none
};

}  // namespace nn

#endif  // NN_TRANSFORMER_H_
