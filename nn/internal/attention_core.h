// Private to nn/: the causal multi-head attention between the projections, run by
// F::CausalSelfAttentionCore (nn/functional/fused.h) for CausalSelfAttention (nn/attention.h)
// and GroupedQueryAttention (nn/grouped_query_attention.h). It takes q, k and v packed as qkv
// [B, T, 3C] (q, k, v at columns 0, C, 2C; head h at columns h * hd .. of each, hd = C /
// n_head), computes per batch element and head y_h = softmax(q k^T / sqrt(hd), causal) v into
// y [B, T, C] and keeps what the backward needs. Both paths of nn/attention.h are here: the unfused
// GEMMs + causal softmax (fp32, or NOTE [bf16 attention] when qkv is bf16) and, on CUDA with bf16
// q, k, v and a head width of 64 or 128, NOTE [Fused attention].
//
//   internal::CausalAttentionCore core;
//   ASSIGN_OR_RETURN(core::Tensor y, core.Forward(module, qkv, n_head, /*fused=*/true));
//   ...
//   ASSIGN_OR_RETURN(core::Tensor gqkv, core.Backward(module, gy));   // dL/dqkv, fp32
#ifndef NN_INTERNAL_ATTENTION_CORE_H_
#define NN_INTERNAL_ATTENTION_CORE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "core/module.h"
#include "core/tensor.h"

namespace nn {
namespace internal {

class CausalAttentionCore {
 public:
  // qkv: [B, T, 3C] on any device, fp32 or bf16 (rounded once by the caller: NOTE [bf16
  // attention]), C divisible by n_head (checked by the caller). Returns the heads' output
  // y [B, T, C] (fp32; bf16 from the fused path when `y_bf16`, for a bf16 GEMM that takes
  // it) and keeps qkv and the probabilities (or, fused, y and the row statistics) until
  // Backward or Release. `fused`: whether the fused path may run where it applies. `m` is
  // the calling module: it names the ops and their errors.
  absl::StatusOr<core::Tensor> Forward(const core::Module& m, core::Tensor qkv, int64_t n_head,
                                       bool fused, bool y_bf16 = false);

  // gy: dL/dy [B, T, C] fp32 (or bf16) on qkv's device (checked by the caller) -> dL/dqkv
  // [B, T, 3C] (written whole), fp32, or bf16 from the fused path when `gqkv_bf16`.
  // Releases the caches. FailedPrecondition without a preceding Forward.
  absl::StatusOr<core::Tensor> Backward(const core::Module& m, core::Tensor gy,
                                        bool gqkv_bf16 = false);

  // The qkv the last Forward kept (undefined when none): its shape gives B and T.
  const core::Tensor& qkv() const { return qkv_; }

  // Drops the caches.
  void Release();

 private:
  absl::StatusOr<core::Tensor> FusedBackward(const core::Module& m, core::Tensor gy,
                                             bool gqkv_bf16);

  int64_t n_head_ = 0;
  // qkv [B, T, 3C] and the attention probabilities [B, n_head, T, T] (zero above the
  // diagonal); bf16 under NOTE [bf16 attention]. Under NOTE [Fused attention] att_ stays
  // empty and the heads' output y_ [B, T, C] and the row statistics lse_ [B, n_head, T]
  // are kept instead.
  core::Tensor qkv_;
  core::Tensor att_;
  core::Tensor y_;
  core::Tensor lse_;
};

}  // namespace internal
}  // namespace nn

#endif  // NN_INTERNAL_ATTENTION_CORE_H_
