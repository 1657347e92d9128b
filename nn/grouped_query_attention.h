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
// (F::CausalSelfAttentionCore: the unfused GEMMs and causal softmax, NOTE [bf16
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

  // The heads' output y [B, T, n_head D] for x [B, T, hidden] (fp32, or bf16 with bf16
  // projection weights), before o_proj: q, k and v projected, turned and packed (F::RotaryQkv
  // when the three projections run inline, else each through nn::ApplyLinear and
  // F::PackRotaryQkv), then F::CausalSelfAttentionCore. `y_bf16`: the fused kernel stores y bf16
  // for a bf16 o_proj GEMM that takes it so. For this module's forward and for a parent that
  // runs this attention inline and adds its residual in o_proj's GEMM (NOTE [Block forwards] in
  // nn/transformer.h). InvalidArgument naming this module for a bad configuration or input.
  absl::StatusOr<core::Tensor> Heads(const core::Tensor& x, bool y_bf16);

 protected:
  // {x}: fp32 [B, T, hidden] on the parameters' device -> {o_proj(Heads(x))} [B, T, hidden].
  // With a bf16 q_proj weight the packed q, k, v are bf16 (NOTE [bf16 attention]).
  absl::StatusOr<core::Tensors> ForwardGraph(const core::Tensors& in) override;

 private:
  // rotary_tables(), first rebuilt unless they serve T positions of this layer's head width
  // and theta on `device`.
  absl::Status EnsureTables(int64_t T, const core::Device& device);

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
};

}  // namespace nn

#endif  // NN_GROUPED_QUERY_ATTENTION_H_
