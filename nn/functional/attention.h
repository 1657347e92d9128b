// Scaled dot-product attention as a differentiable op
// (torch.nn.functional.scaled_dot_product_attention), with grouped-query heads, a causal
// cut and an int32 or fp32 mask, on the CPU or CUDA.
//
//   namespace F = nn::functional;
//   F::AttentionOptions opts;
//   opts.causal = true;
//   // q [B, 8, T, 64], k and v [B, 2, T, 64]: each kv head serves 4 query heads.
//   absl::StatusOr<core::Tensor> y = F::ScaledDotProductAttention(q, k, v, opts);  // [B, 8, T, 64]
//
// NOTE [Attention masks]: row t of a head's scores (query t) against column s (key s) is
// masked where the causal cut or the mask says so, and a masked position adds
// kernels::kMaskedScore (-1e30, kernels/attention_mask.h) to its score before the softmax:
// its probability is exactly 0 when the row keeps any position. The causal cut is
// top-left aligned, as torch's is_causal: query t sees keys 0 .. t, also when T != S. An
// int32 mask masks its zeros out; an fp32 mask is added to the scores (after the scale),
// and its entries at or below kMaskedScore (-inf included) count as masked positions, so
// -inf masks as 0 does in an int32 mask. A row whose every position is masked has output
// 0 and passes no gradient to q, k, v or the mask (as torch's _safe_softmax gives; a plain
// softmax would give NaN, or a uniform average over masked keys).
//
// NOTE [Attention paths]: the op is the composition
//   y = MatMul(Softmax(MatMul(q * scale, k^T) + mask) [* row kept], v)
// of nn/functional's own ops (MulScalar, Transpose, MatMul, Add, Softmax, Mul), so the
// graph differentiates it and it runs in fp32 wherever they run. Grouped heads are not
// copied: query heads g G .. g G + G - 1 (G = H / Hkv) are consecutive in q, so
// q [B, H, T, D] viewed as [B, Hkv, G T, D] meets kv head g in one batched GEMM. With
// `fused`, causal attention without a mask of T == S positions and a head width the fused
// kernel takes (nn::FusedAttentionSupported: 64 or 128) runs nn::FusedAttentionForward
// instead (NOTE [Fused attention] in nn/attention.h), as one custom function with its own
// backward: q, k, v are packed into the [B, T, 3 H D] bf16 layout that kernel reads (each
// kv head repeated for its group, their gradients summed back), so that path computes in
// bf16 (NOTE [bf16 attention]) and agrees with the fp32 one to within bf16 rounding, not
// bit for bit; the [B, H, T, T] probabilities are never stored. The copies into and out of
// that layout cost O(B H T D) bytes against the O(B H T T) the kernel saves (attention.cc
// weighs them). On the CPU the kernel's twin runs, a reference loop slower than the
// composition's GEMMs: `fused` is for CUDA.
#ifndef NN_FUNCTIONAL_ATTENTION_H_
#define NN_FUNCTIONAL_ATTENTION_H_

#include <optional>

#include "absl/status/statusor.h"
#include "core/autograd.h"
#include "core/tensor.h"

namespace nn {
namespace functional {

struct AttentionOptions {
  // Mask the columns s > t of row t (NOTE [Attention masks]).
  bool causal = false;
  // Undefined (no mask), or fp32 or int32 broadcastable to [B, H, T, S] (NOTE
  // [Broadcasting] in elementwise.h) on q's device. An fp32 mask receives its gradient.
  core::Arg mask = core::Tensor();
  // The scores' factor; 1 / sqrt(D) when unset.
  std::optional<float> scale;
  // Take the fused bf16 kernel where it applies (NOTE [Attention paths]); off: fp32 always.
  bool fused = false;
};

// y [B, H, T, D] = softmax(q k^T scale + mask) v per batch element and query head h, with
// kv head h / (H / Hkv): q [B, H, T, D], k and v [B, Hkv, S, D], all fp32 on one device,
// Hkv dividing H; y fp32 on their device. Gradients for q, k, v and an fp32 mask (NOTE
// [Attention masks]). InvalidArgument "ScaledDotProductAttention: ..." naming the argument
// and its shape for an undefined tensor, a dtype other than fp32 (fp32 or int32 for the
// mask), tensors that are not 4-D or whose B, D or kv shapes disagree, Hkv not dividing H,
// a mask that does not broadcast to [B, H, T, S], tensors on two devices, or a scale that
// is not finite. An error in any Arg is returned unchanged.
absl::StatusOr<core::Tensor> ScaledDotProductAttention(core::Arg q, core::Arg k, core::Arg v,
                                                       const AttentionOptions& options = {});

}  // namespace functional
}  // namespace nn

#endif  // NN_FUNCTIONAL_ATTENTION_H_
