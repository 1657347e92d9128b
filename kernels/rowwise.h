// Row-wise kernel bodies: LayerNorm, RMSNorm, the causal masked softmax of attention, the
// cross-entropy row, and the plain softmax and log-softmax of nn/functional. A row's
// reductions (sums, maxima, dot products) are done by the launcher, a loop on the CPU and
// warp/block shuffles on CUDA; the bodies below take the
// reduced quantities as arguments and compute one element. `Acc` is the type the
// launcher reduced in (float lanes on the CPU for LayerNorm and softmax, double for
// cross-entropy; float or double on CUDA).
//
//   // LayerNorm forward of one row x[0..C):
//   float mean = sum(x) / C, var = sum((x - mean)^2) / C;
//   float rstd = kernels::LayerNormRstd(var, eps);
//   for (j...) y[j] = kernels::LayerNormApply(x[j], mean, rstd, w, b, j);
//   // The backward recomputes xhat[j] = kernels::LayerNormHat(x[j], mean, rstd) from the
//   // kept input and the stored float mean and rstd: the same bits the forward used (both
//   // launchers reduce in float, so Acc is float on both sides).
#ifndef KERNELS_ROWWISE_H_
#define KERNELS_ROWWISE_H_

#include <stdint.h>

#include "core/hd.h"
#include "kernels/math.h"

namespace kernels {

// ---- LayerNorm: y = (x - mean) * rstd * w + b over the last dimension.

// 1 / sqrt(var + eps), var the biased variance of the row.
template <typename Acc>
FSDP_HD inline Acc LayerNormRstd(Acc var, Acc eps) {
  return Acc(1) / Sqrt(var + eps);
}

// The normalised input xhat = (x - mean) * rstd, rounded to float: computed by the forward
// and again by the backward from the same x, mean and rstd (so the same bits; the input is
// kept instead of xhat). The product only ever multiplies (y = xhat * w + b, the backward's
// terms), so no FMA contraction can round it differently on the two sides; a build with
// reciprocal division (--use_fast_math) would not keep that promise for the mean.
template <typename Acc>
FSDP_HD inline float LayerNormHat(float x, Acc mean, Acc rstd) {
  return static_cast<float>((x - mean) * rstd);
}

// Element j: xhat * w[j] + b[j] with xhat = LayerNormHat(x, mean, rstd) (w, b fp32 or bf16).
template <typename Acc, typename W>
FSDP_HD inline float LayerNormApply(float x, Acc mean, Acc rstd, const W* w, const W* b,
                                    int64_t j) {
  return LayerNormHat(x, mean, rstd) * Load(w, j) + Load(b, j);
}

// gh = g * w[j], the row's first backward term; the launcher reduces mean(gh) and
// mean(gh * xhat) over the row.
template <typename Acc, typename W>
FSDP_HD inline Acc LayerNormGradHat(float g, const W* w, int64_t j) {
  return static_cast<Acc>(g) * Load(w, j);
}

// dL/dx of element j: rstd * (gh - mean(gh) - xhat * mean(gh * xhat)).
template <typename Acc, typename W>
FSDP_HD inline float LayerNormBackwardInput(float g, const W* w, int64_t j, float xhat, Acc rstd,
                                            Acc mean_gh, Acc mean_gh_xhat) {
  const Acc gh = LayerNormGradHat<Acc>(g, w, j);
  return static_cast<float>(rstd * (gh - mean_gh - xhat * mean_gh_xhat));
}

// ---- RMSNorm: y = x * rstd * w over the last dimension, rstd = 1 / sqrt(mean(x^2) + eps)
// (Hugging Face's LlamaRMSNorm; the launchers reduce in fp32, as it does).

// 1 / sqrt(mean_square + eps), mean_square the mean of the row's squares.
template <typename Acc>
FSDP_HD inline Acc RmsNormRstd(Acc mean_square, Acc eps) {
  return Acc(1) / Sqrt(mean_square + eps);
}

// The normalised input xhat = x * rstd, rounded to float: computed by the forward and again
// by the backward from the kept input and the stored float rstd (the same bits, as
// LayerNormHat; it only ever multiplies, so no FMA contraction rounds it differently).
template <typename Acc>
FSDP_HD inline float RmsNormHat(float x, Acc rstd) {
  return static_cast<float>(x * rstd);
}

// Element j: xhat * w[j] with xhat = RmsNormHat(x, rstd) (w fp32 or bf16).
template <typename Acc, typename W>
FSDP_HD inline float RmsNormApply(float x, Acc rstd, const W* w, int64_t j) {
  return RmsNormHat(x, rstd) * Load(w, j);
}

// dL/dx of element j: rstd * (gh - xhat * mean(gh * xhat)) with gh = g * w[j]
// (LayerNormGradHat); the launcher reduces mean(gh * xhat) over the row.
template <typename Acc, typename W>
FSDP_HD inline float RmsNormBackwardInput(float g, const W* w, int64_t j, float xhat, Acc rstd,
                                          Acc mean_gh_xhat) {
  const Acc gh = LayerNormGradHat<Acc>(g, w, j);
  return static_cast<float>(rstd * (gh - xhat * mean_gh_xhat));
}

// ---- Causal softmax of one attention row t over s in [0, t] (entries s > t are masked).

// exp(score - max), max the row's largest unmasked score (FastExp: within 1.5e-7 relative).
FSDP_HD inline float SoftmaxExp(float score, float max) { return FastExp(score - max); }

// The probability from exp(score - max) and inv = 1 / (sum of the row's exps).
FSDP_HD inline float SoftmaxNormalize(float e, float inv) { return e * inv; }

// True when column s of row t is masked (s > t): its probability and gradient are 0.
FSDP_HD inline bool CausalMasked(int64_t t, int64_t s) { return s > t; }

// dL/dscore = scale * p * (g - dot), g = dL/dp and dot = sum_s g_s p_s over the row;
// `scale` is the factor the scores were multiplied by (1 / sqrt(head_dim)).
template <typename Acc>
FSDP_HD inline float SoftmaxBackward(float p, float g, Acc dot, float scale) {
  return scale * p * (g - static_cast<float>(dot));
}

// ---- Cross-entropy of one row of logits x[0..V) with target class `target`.

// exp(x - max), the term the launcher sums (max = the row's largest logit); RowExp: within
// 1.5e-7 (float on the host) or 3e-16 (double) relative of exp, one MUFU on a CUDA device
// (the loss is a log of a sum of thousands of these; the gradient is rounded to bf16 or
// compared at 1e-5).
template <typename Acc>
FSDP_HD inline Acc CrossEntropyExp(float x, Acc max) {
  return RowExp(static_cast<Acc>(x) - max);
}

// The row's loss -log softmax(x)[target] = log(sum exp(x - max)) + max - x[target].
template <typename Acc>
FSDP_HD inline Acc CrossEntropyRowLoss(Acc sum_exp, Acc max, float x_target) {
  return Log(sum_exp) + max - static_cast<Acc>(x_target);
}

// d mean-loss / d x_j = (softmax(x)_j - [j == target]) * inv_n, inv_n = 1 / tokens.
template <typename Acc>
FSDP_HD inline float CrossEntropyGrad(float x, Acc max, Acc log_sum, bool is_target, Acc inv_n) {
  const Acc p = RowExp(static_cast<Acc>(x) - max - log_sum);
  return static_cast<float>((p - (is_target ? Acc(1) : Acc(0))) * inv_n);
}

// ---- Column sums acc[j] += sum_r x[r, j] (* y[r, j]).

// How many row chunks the CUDA launcher splits a [rows, cols] column sum into: about 4
// blocks of 32 columns per SM of a 132-SM GPU, chunks of at least 64 rows. A function of
// the shape only, so the order of the sums is too (kernels/cuda/kernels.h ColumnSums).
inline int64_t ColumnSumChunks(int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return 1;
  const int64_t kTargetBlocks = 528, kMinRowsPerChunk = 64, kMaxChunks = 65535;
  const int64_t col_blocks = (cols + 31) / 32;
  const int64_t by_rows = rows / kMinRowsPerChunk;  // every chunk keeps >= 64 rows
  int64_t chunks = kTargetBlocks / col_blocks;
  if (chunks > by_rows) chunks = by_rows;
  if (chunks > kMaxChunks) chunks = kMaxChunks;
  return chunks > 1 ? chunks : 1;
}

// LayerNorm's backward with its weight and bias gradients in the same pass (CUDA,
// kernels/cuda/kernels.h LayerNormBackward): each warp keeps the column sums of g * xhat
// and of g over its rows in shared memory (`stats` = 2 sums, 8 * cols bytes; RMSNorm's
// backward keeps only g * xhat's: stats = 1), so a block has as many warps as fit in
// 48 KiB, at most 8; 0 where one warp's sums do not fit (LayerNorm's cols > 6144, RMSNorm's
// > 12288: the column sums then run as their own kernels). NormGradStats: LayerNorm's
// `stats` (centered) or RMSNorm's.
inline constexpr int NormGradStats(bool centered) { return centered ? 2 : 1; }
inline int LayerNormGradWarps(int64_t cols, int stats) {
  constexpr int64_t kSharedBytes = 48 * 1024, kMaxWarps = 8;
  const int64_t per_warp = 4 * static_cast<int64_t>(stats) * cols;
  if (cols <= 0 || stats <= 0 || per_warp > kSharedBytes) return 0;
  const int64_t warps = kSharedBytes / per_warp;
  return static_cast<int>(warps < kMaxWarps ? warps : kMaxWarps);
}

// How many blocks (row chunks) that kernel splits [rows, cols] into: about 4 per SM of a
// 132-SM GPU, with at least 4 rows for each warp. A function of the shape (and `stats`)
// only, so the order of the sums is too.
inline int64_t LayerNormGradChunks(int64_t rows, int64_t cols, int stats) {
  const int64_t warps = LayerNormGradWarps(cols, stats);
  if (rows <= 0 || warps == 0) return 1;
  constexpr int64_t kTargetBlocks = 528, kMinRowsPerWarp = 4;
  int64_t chunks = rows / (kMinRowsPerWarp * warps);
  if (chunks > kTargetBlocks) chunks = kTargetBlocks;
  return chunks > 1 ? chunks : 1;
}

// ---- Fused causal attention (NOTE [Fused attention] in nn/attention.h): the CUDA kernels
// (kernels/cuda/flash_attention.h) and their CPU twins (kernels/cpu/kernels.h) walk the keys
// in tiles of kFlashTile with an online softmax, for these head widths only.
inline constexpr int64_t kFlashTile = 64;
inline constexpr bool FlashAttentionSupports(int64_t head_dim) {
  return head_dim == 64 || head_dim == 128;
}

// ---- Softmax and log-softmax of a whole row x[0..C) (nn/functional/softmax.h). The
// softmax is SoftmaxExp and SoftmaxNormalize above with max the row's largest value and no
// mask; its backward is SoftmaxBackward with scale 1. The launchers sum each row in a fixed
// order (kernels/cpu/functional_rows.h, kernels/cuda/functional_rows.h).

// log softmax(x)_j = (x - max) - log_sum, log_sum = log(sum over the row of
// SoftmaxExp(x_k, max)).
FSDP_HD inline float LogSoftmaxOut(float x, float max, float log_sum) {
  return (x - max) - log_sum;
}

// dL/dx_j of y = log softmax(x) from y_j, g_j = dL/dy_j and sum_g = the row's sum of g:
// g_j - exp(y_j) sum_g (FastExp; y_j <= 0).
template <typename Acc>
FSDP_HD inline float LogSoftmaxBackward(float y, float g, Acc sum_g) {
  return g - FastExp(y) * static_cast<float>(sum_g);
}

}  // namespace kernels

#endif  // KERNELS_ROWWISE_H_
