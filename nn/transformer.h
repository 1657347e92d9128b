// The GPT-2 transformer block and its MLP.
//
//   auto block = std::make_shared<nn::TransformerBlock>(/*n_embd=*/64, /*n_head=*/4, /*seed=*/3);
//   ASSIGN_OR_RETURN(core::Tensor y, block->CallOne({x}));   // x [B, T, 64] -> [B, T, 64]
//
// Mlp:              y = proj(gelu(fc(x))), fc = Linear(C, 4C), proj = Linear(4C, C).
// TransformerBlock: pre-LN with residuals, h = x + attn(ln_1(x)); y = h + mlp(ln_2(h)).
//
// Both are graph modules (NOTE [Graph modules] in core/module.h): they write only a forward;
// Forward/Backward (one tensor in and out) and Call both work.
//
// NOTE [Block forwards]: the forward computes a child inline, its parameters passed to the
// fused functions of nn/functional/fused.h, while nn::internal::RunsInline(child) holds (no
// module of its subtree has hooks or is checkpointed), and calls the child otherwise, so a
// policy that wraps or checkpoints a child gets its hooks and its own forward. Inline:
// - Mlp: fc's GEMM adds the bias and applies the GELU in its epilogue (F::LinearGelu) and proj's
//   input-gradient GEMM multiplies by GELU' (F::GeluLinear); under bf16 weights h and the
//   pre-activation are stored bf16.
// - TransformerBlock, per half (ln_1 with attn, ln_2 with mlp): the LayerNorm's backward adds the
//   residual's gradient in its pass (F::ResidualLayerNorm), the sublayer's last GEMM adds the bias
//   and the residual in its epilogue (F::LinearResidual, F::GeluLinear), and under bf16 weights
//   the LayerNorm's output and qkv are stored bf16 for the GEMMs that take them.
// - LlamaDecoderLayer (nn/llama.h): the same with RmsNorm, rotary q/k and SwiGLU
//   (nn/functional/llama_fused.h).
// A half with a child called instead runs norm, sublayer and the residual add (F::Add) as
// three steps. With fp32 weights both give the same bits (transformer_test hooks the children).
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
  // forward return InvalidArgument.
  explicit Mlp(int64_t n_embd, uint64_t seed = 0);

  std::string TypeName() const override { return "Mlp"; }

  const std::shared_ptr<Linear>& fc() const { return fc_; }
  const std::shared_ptr<GELU>& gelu() const { return gelu_; }
  const std::shared_ptr<Linear>& proj() const { return proj_; }

 protected:
  // {x}: fp32 [..., C] -> {y} [..., C].
  absl::StatusOr<core::Tensors> ForwardGraph(const core::Tensors& in) override;

 private:
  std::string config_error_;
  std::shared_ptr<Linear> fc_;
  std::shared_ptr<GELU> gelu_;
  std::shared_ptr<Linear> proj_;
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
  // {x}: fp32 [B, T, C] -> {y} [B, T, C].
  absl::StatusOr<core::Tensors> ForwardGraph(const core::Tensors& in) override;

 private:
  std::shared_ptr<LayerNorm> ln_1_;
  std::shared_ptr<CausalSelfAttention> attn_;
  std::shared_ptr<LayerNorm> ln_2_;
  std::shared_ptr<Mlp> mlp_;
};

}  // namespace nn

#endif  // NN_TRANSFORMER_H_
