// The mask of nn/functional's ScaledDotProductAttention (NOTE [Attention masks] in
// nn/functional/attention.h) as one element's math, written once for the CPU loops
// (kernels/cpu/attention_mask.h) and the CUDA kernels (kernels/cuda/attention_mask.h): the
// causal cut and the caller's int32 or fp32 mask, read in place through broadcast strides,
// become one additive fp32 mask.
//
//   kernels::AttentionMaskLayout m;   // heads, T, S, strides, causal
//   add[row * S + s] = kernels::AttentionMaskValue(m, fmask, imask, row, s);
#ifndef KERNELS_ATTENTION_MASK_H_
#define KERNELS_ATTENTION_MASK_H_

#include <stdint.h>

#include "core/hd.h"

namespace kernels {

// What a masked position adds to its score. exp(kMaskedScore + s - max) is 0 in fp32 for
// any score s within 1e29 of the row's largest kept one, and a few of them added together
// stay finite (fp32 reaches 3.4e38), so no sum of masks becomes -inf.
inline constexpr float kMaskedScore = -1e30f;

// The mask rows [Bm, Hm, T] (row = (b Hm + h) T + t) with S columns each, and where the
// caller's mask holds row `row`, column s: element strides of its b, h, t and s dims (0
// for a dim it is broadcast over).
struct AttentionMaskLayout {
  int64_t heads = 1;  // Hm
  int64_t T = 1;
  int64_t S = 1;
  int64_t stride_b = 0;
  int64_t stride_h = 0;
  int64_t stride_t = 0;
  int64_t stride_s = 0;
  bool causal = false;  // columns s > t are masked
};

FSDP_HD inline int64_t AttentionMaskIndex(const AttentionMaskLayout& m, int64_t row, int64_t s) {
  const int64_t t = row % m.T, bh = row / m.T;
  return (bh / m.heads) * m.stride_b + (bh % m.heads) * m.stride_h + t * m.stride_t +
         s * m.stride_s;
}

// Whether column s of row `row` takes part in the softmax: not cut by the causal mask, and,
// where there is a mask (fmask or imask, at most one not null), its int32 entry nonzero or
// its fp32 entry not at or below kMaskedScore (-inf included; NaN is kept and spreads).
FSDP_HD inline bool AttentionMaskKeeps(const AttentionMaskLayout& m, const float* fmask,
                                       const int32_t* imask, int64_t row, int64_t s) {
  if (m.causal && s > row % m.T) return false;
  if (imask != nullptr) return imask[AttentionMaskIndex(m, row, s)] != 0;
  if (fmask != nullptr) return !(fmask[AttentionMaskIndex(m, row, s)] <= kMaskedScore);
  return true;
}

// The additive mask's element: kMaskedScore where masked, else the fp32 mask's entry (0
// without one).
FSDP_HD inline float AttentionMaskValue(const AttentionMaskLayout& m, const float* fmask,
                                        const int32_t* imask, int64_t row, int64_t s) {
  if (!AttentionMaskKeeps(m, fmask, imask, row, s)) return kMaskedScore;
  return fmask != nullptr ? fmask[AttentionMaskIndex(m, row, s)] : 0.0f;
}

}  // namespace kernels

#endif  // KERNELS_ATTENTION_MASK_H_
