// GroupedQueryAttention: Llama's causal self-attention (Hugging Face's LlamaAttention with
// attention_bias false): rotary position embedding on q and k, n_kv_head key/value heads
// shared by groups of n_head / n_kv_head query heads.
//
//   auto attn = std::make_shared<nn::GroupedQueryAttention>(/*hidden=*/512, /*n_head=*/8,
//                                                           /*n_kv_head=*/2);
//   ASSIGN_OR_RETURN(core::Tensor y, attn->Forward(x));   // x [B, T, 512] -> [B, T, 512]
//
// With D = hidden / n_head: q = x Wq^T [B, T, n_head D], k = x Wk^T and v = x Wv^T
// [B, T, n_kv_head D]; q and k turned by the rotary embedding of their position t in
// 0 .. T-1 (nn/rotary.h, theta rope_theta); per batch element and query head h, with kv
// head g = h / (n_head / n_kv_head), y_h = softmax(q_h k_g^T / sqrt(D), causal) v_g; the
// heads concatenated to [B, T, n_head D] and out = y Wo^T. The output at position t
// depends only on inputs at positions <= t.
//
// NOTE [Grouped-query attention]: the attention itself is CausalSelfAttention's
// (nn/internal/attention_core.h: the unfused GEMMs and causal softmax, NOTE [bf16
// attention], NOTE [Fused attention]), reused by expanding k and v to n_head heads: one op
// (nn::RotaryPackQkv) applies the rotary embedding and writes q, k and v in the [B, T, 3C]
// layout that code reads, each kv head copied for every query head of its group; its
// backward (nn::RotaryPackQkvBackward) sums each group's k and v gradients and turns q's and
// k's back. The cost against a kernel that reads the shared heads in place: the packed
// q, k, v kept for the backward holds 3C instead of C + 2 n_kv_head D values per token (the
// 2 (n_head - n_kv_head) D expanded ones, bf16 under bf16 attention), the expansion and the
// group sums are one more pass over those bytes each way, and the attention reads every kv
// head once per query head of its group (the attention GEMMs and the fused kernel do so
// per head anyway, so their FLOPs are those of multi-head attention). With n_kv_head ==
// n_head it is multi-head attention with the rotary embedding, and nothing is expanded.
#ifndef NN_GROUPED_QUERY_ATTENTION_H_
#define NN_GROUPED_QUERY_ATTENTION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "core/module.h"
#include "core/tensor.h"
#include "nn/internal/attention_core.h"
#include "nn/linear.h"
#include "nn/rotary.h"

namespace nn {

class GroupedQueryAttention : public core::Module {
 public:
  // Children "q_proj" Linear(hidden, n_head D), "k_proj" and "v_proj" Linear(hidden,
  // n_kv_head D), "o_proj" Linear(n_head D, hidden), all without bias, seeded
  // DeriveSeed(seed, 0 .. 3). Unless hidden, n_head and n_kv_head are positive, hidden %
  // n_head == 0, n_head % n_kv_head == 0, D is even and rope_theta finite and > 0, every
  // Forward returns InvalidArgument naming the argument.
  GroupedQueryAttention(int64_t hidden, int64_t n_head, int64_t n_kv_head,
                        double rope_theta = 10000.0, uint64_t seed = 0);

  std::string TypeName() const override { return "GroupedQueryAttention"; }

  const std::shared_ptr<Linear>& q_proj() const { return q_proj_; }
  const std::shared_ptr<Linear>& k_proj() const { return k_proj_; }
  const std::shared_ptr<Linear>& v_proj() const { return v_proj_; }
  const std::shared_ptr<Linear>& o_proj() const { return o_proj_; }
  int64_t hidden() const { return hidden_; }
  int64_t n_head() const { return n_head_; }
  int64_t n_kv_head() const { return n_kv_head_; }
  double rope_theta() const { return rope_theta_; }
  // Whether Forward takes its input in bf16 (a producer's bf16 copy of the fp32 input,
  // NOTE [GEMM epilogues] in nn/tensor_ops.h): when q, k and v would round it to bf16
  // themselves (nn::SharesBf16Input: bf16 weights, no hooks). Else the input is fp32.
  bool TakesBf16Input() const;
  // The dtype Backward takes its gradient in besides fp32: bf16 after a Forward with bf16
  // weights when nothing can observe o_proj's input gradient (no hooks on o_proj), since
  // o_proj's GEMMs round it to bf16 anyway (the same bits either way; what a Llama decoder
  // layer's caller may hand it); fp32 otherwise.
  core::DType GradOutputDType() const;
  // Whether Forward may take the fused path where it applies (NOTE [Fused attention] in
  // nn/attention.h); true by default. Takes effect at the next Forward.
  void set_fused(bool fused) { fused_ = fused; }
  bool fused() const { return fused_; }
  // The rotary tables this layer reads (nn/rotary.h), rebuilt in place when they hold
  // fewer positions than a Forward's T, another head width or theta, or live on another
  // device. The layers of one model share one object (Llama's do), so the tables exist
  // once per model. Not null.
  void set_rotary_tables(std::shared_ptr<RotaryTables> tables) { tables_ = std::move(tables); }
  const std::shared_ptr<RotaryTables>& rotary_tables() const { return tables_; }
  // rotary_tables(), first rebuilt unless they serve T positions of this layer's head width
  // and theta on `device` (as Forward does); for a parent that runs this attention inline
  // (NOTE [Block forwards] in nn/transformer.h).
  absl::Status EnsureTables(int64_t T, const core::Device& device);

 protected:
  // x: fp32 (or bf16: TakesBf16Input) [B, T, hidden] on the parameters' device -> [B, T,
  // hidden]. With a bf16 q_proj weight the packed q, k, v are rounded to bf16 once (NOTE
  // [bf16 attention]).
  absl::StatusOr<core::Tensor> ForwardImpl(const core::Tensor& x) override;
  // grad_output: fp32 [B, T, hidden], or bf16 when GradOutputDType() is (else
  // InvalidArgument naming this module). Returns dL/dx; the four projections add their
  // weight gradients.
  absl::StatusOr<core::Tensor> BackwardImpl(const core::Tensor& grad_output) override;
  // The rotary tables are not activations (a function of T): they stay.
  void ReleaseActivations() override { core_.Release(); }

 private:
  int64_t hidden_ = 0;
  int64_t n_head_ = 0;
  int64_t n_kv_head_ = 0;
  double rope_theta_ = 0.0;
  std::string config_error_;
  std::shared_ptr<Linear> q_proj_;
  std::shared_ptr<Linear> k_proj_;
  std::shared_ptr<Linear> v_proj_;
  std::shared_ptr<Linear> o_proj_;
  bool fused_ = true;
  std::shared_ptr<RotaryTables> tables_ = std::make_shared<RotaryTables>();
  // The attention and its caches (the packed q, k, v and the probabilities or the fused
  // path's statistics), from Forward to Backward.
  internal::CausalAttentionCore core_;
};

}  // namespace nn

#endif  // NN_GROUPED_QUERY_ATTENTION_H_
