// CausalSelfAttention: GPT-2 / nanoGPT multi-head self-attention with a causal mask.
//
//   auto attn = std::make_shared<nn::CausalSelfAttention>(/*n_embd=*/64, /*n_head=*/4);
//   ASSIGN_OR_RETURN(core::Tensor y, attn->Forward(x));   // x [B, T, 64] -> [B, T, 64]
//
// qkv = x Wqkv^T + bqkv is [B, T, 3C], read as q = qkv[..., 0:C], k = qkv[..., C:2C],
// v = qkv[..., 2C:3C] (nanoGPT's c_attn split), each split into n_head heads of
// hd = C / n_head consecutive columns. Per batch and head,
//   att = softmax((q k^T) / sqrt(hd) with entries (t, s > t) set to -inf), y_h = att v,
// the heads are concatenated back to [B, T, C] and projected: out = y Wproj^T + bproj.
// The output at position t depends only on inputs at positions <= t.
//
// NOTE [bf16 attention]: when qkv's weight is bf16 (FSDP mixed precision), the attention
// GEMMs run bf16 x bf16 with fp32 accumulation, like the Linears' (NOTE [bf16 GEMMs] in
// nn/linear.h): q, k and v are rounded once, the scores are fp32 and the softmax writes
// the probabilities rounded to bf16, which the value GEMM reads and the backward keeps
// (half the bytes of fp32 ones); the backward rounds the heads' gradient once and its
// softmax writes the score gradient rounded to bf16 for dq and dk. With an fp32 weight
// everything is fp32, as before.
//
// NOTE [Fused attention]: on CUDA, under bf16 attention and with a head width of 64 or 128,
// the scores, softmax and value product of every head run as one fused kernel
// (kernels/cuda/flash_attention.h, nn::FusedAttentionForward): a flash-attention pass over
// 64 x 64 tiles with an online softmax, so the [B, H, T, T] scores and probabilities never
// exist in memory. The layer keeps q, k, v (bf16), the heads' output y and one fp32
// statistic per row for the backward, which recomputes each tile's probabilities from them
// (three kernels, deterministic). y is stored bf16 when proj's bf16 GEMM takes it, and
// dL/dqkv bf16 when qkv's bf16 GEMMs take it (each the rounding those GEMMs would do, so no
// rounding pass and no fp32 copy; fp32 when a hook on proj or qkv could observe them). Rounding
// differs from the unfused path in two places: the fused forward rounds each probability
// to bf16 before the row's normalisation rather than after (the sum itself is fp32), and
// the backward's row sums <dL/dy, y> read the stored (bf16) y, so the two agree to within
// the bf16 rounding bound, not bit for bit. set_fused(false) selects the unfused path (the
// reference in the GPU tests).
#ifndef NN_ATTENTION_H_
#define NN_ATTENTION_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/module.h"
#include "core/tensor.h"
#include "nn/linear.h"

namespace nn {

class CausalSelfAttention : public core::Module {
 public:
  // Children "qkv" = Linear(C, 3C) and "proj" = Linear(C, C), seeded from `seed`
  // through DeriveSeed(seed, 0) and DeriveSeed(seed, 1). If n_embd or n_head is not
  // positive or n_embd % n_head != 0, every Forward returns InvalidArgument naming it.
  CausalSelfAttention(int64_t n_embd, int64_t n_head, uint64_t seed = 0);

  std::string TypeName() const override { return "CausalSelfAttention"; }

  const std::shared_ptr<Linear>& qkv() const { return qkv_; }
  const std::shared_ptr<Linear>& proj() const { return proj_; }
  int64_t n_embd() const { return n_embd_; }
  int64_t n_head() const { return n_head_; }
  // Whether the forward may take the fused path where it applies (NOTE [Fused attention]);
  // true by default. Takes effect at the next forward.
  void set_fused(bool fused) { fused_ = fused; }
  bool fused() const { return fused_; }

  // The heads' output y [B, T, C] for x [B, T, C] (fp32, or bf16 with a bf16 qkv weight),
  // before proj: qkv through F::LinearForGemm when it runs inline (q, k, v stored bf16 under a
  // bf16 weight), else called with its hooks and its output rounded for bf16 attention, then
  // F::CausalSelfAttentionCore (nn/functional/fused.h). `y_bf16`: the fused kernel stores y
  // bf16 for a bf16 proj GEMM that takes it so. For this module's forward and for a parent that
  // runs this attention inline and adds its residual in proj's GEMM (NOTE [Block forwards] in
  // nn/transformer.h). InvalidArgument naming this module for a bad configuration or input.
  absl::StatusOr<core::Tensor> Heads(const core::Tensor& x, bool y_bf16);

 protected:
  // {x}: fp32 [B, T, C] on the parameters' device -> {proj(Heads(x))} [B, T, C], fp32. A
  // graph module (NOTE [Graph modules] in core/module.h): proj runs inline when nothing could
  // tell (nn::ApplyLinear), else is called with its hooks.
  absl::StatusOr<core::Tensors> ForwardGraph(const core::Tensors& in) override;

 private:
  int64_t n_embd_ = 0;
  int64_t n_head_ = 0;
  std::string config_error_;
  std::shared_ptr<Linear> qkv_;
  std::shared_ptr<Linear> proj_;
  bool fused_ = true;
};

}  // namespace nn

#endif  // NN_ATTENTION_H_
