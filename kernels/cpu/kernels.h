// CPU launchers of the kernels/ bodies: the host twins of kernels/cuda/kernels.h (same
// names, same argument order, raw host pointers), the fused CPU-only loops of NOTE [Fused
// ops] (nn/tensor_ops.h), and fsdp's gradient arithmetic (kernels/grad.h, the twins of
// kernels/cuda/grad.h). The hot loops are FSDP_CPU_CLONES clones (kernels/cpu.h): every
// element has the bits of its scalar body, row sums go through LaneSum, and independent
// rows, columns or elements are split over IntraOpThreads() threads (kernels/cpu_runtime.h)
// by ParallelChunks, so results are bit-identical for any thread count.
//
// Callers (nn/tensor_ops*.cc, fsdp/device_ops.cc) check sizes, dtypes and devices first:
// these functions validate nothing, never fail and return once the work is done.
// `bf16` arguments say whether a `const void*` weight holds bf16 (uint16_t bits) or fp32.
//
//   kernels::cpu::GeluForward(x, y, n);
//   kernels::cpu::LayerNormForward(x, w, b, /*bf16=*/false, 1e-5f, y, mean, rstd, rows, cols);
#ifndef KERNELS_CPU_KERNELS_H_
#define KERNELS_CPU_KERNELS_H_

#include <stdint.h>

namespace kernels {
namespace cpu {

// ---- The twins of kernels/cuda/kernels.h.

void GeluForward(const float* x, float* y, int64_t n);
void GeluBackward(const float* x, const float* gy, float* gx, int64_t n);
void ReluForward(const float* x, float* y, int64_t n);
void ReluBackward(const float* y, const float* gy, float* gx, int64_t n);
// out may be a or b (in-place residual adds).
void Add(const float* a, const float* b, float* out, int64_t n);
// out[r, j] = x[r, j] + bias[j] for a [rows, cols] matrix; out may be x.
void BiasAdd(const float* x, const void* bias, bool bf16, float* out, int64_t rows, int64_t cols);
// acc[j] += sum_r x[r, j] * (y ? y[r, j] : 1): each column summed in double over its rows
// in order on the calling thread, then rounded once into acc[j].
void ColumnSums(const float* x, const float* y, float* acc, int64_t rows, int64_t cols);
// ColumnSums of a bf16 x (no second factor), the widened values summed as ColumnSums does.
void ColumnSumsBf16(const uint16_t* x, float* acc, int64_t rows, int64_t cols);
// NOTE [GEMM epilogues] (nn/tensor_ops.h): the epilogue `kind` (kernels::GemmEpilogueKind)
// applied to a GEMM's fp32 product acc [rows, cols]: out [rows, cols] (bf16 when out_bf16,
// else fp32; may be acc) = GemmEpilogueOut(kind, pre, aux) with pre = acc + bias by column
// where the kind adds one (bias fp32 or bf16, null for kinds without one). aux [rows, cols]
// has out's dtype: written with pre by kGemmEpilogueBiasGelu, read by kGemmEpilogueDGelu,
// kGemmEpilogueBiasResidual and kGemmEpilogueResidual, null otherwise.
void GemmEpilogue(const float* acc, int kind, const void* bias, bool bias_bf16, void* aux,
                  void* out, bool out_bf16, int64_t rows, int64_t cols);
// LayerNorm of each row of x [rows, cols]: y [rows, cols], mean and rstd [rows]; y bf16
// (each value rounded once) when y_bf16, else fp32. The backward takes x, mean and rstd
// (xhat = kernels::LayerNormHat of them, the forward's bits).
void LayerNormForward(const float* x, const void* w, const void* b, bool bf16, float eps, void* y,
                      float* mean, float* rstd, int64_t rows, int64_t cols, bool y_bf16 = false);
// LayerNorm's input gradient gx from g, the forward's x, mean and rstd, and w (the parameter
// gradients are NormParamGrads). This and the backward launchers below (LayerNormHat,
// NormParamGrads, LayerNormBackwardInputAdd) take a null mean for RMSNorm's backward
// (kernels::RmsNormHat and RmsNormBackwardInput; no bias gradient).
void LayerNormBackwardInput(const float* g, const float* x, const float* mean, const float* rstd,
                            const void* w, bool bf16, float* gx, int64_t rows, int64_t cols);
// xhat [rows, cols] of LayerNorm's input x from each row's mean and rstd (for the weight
// gradient's ColumnSums).
void LayerNormHat(const float* x, const float* mean, const float* rstd, float* xhat, int64_t rows,
                  int64_t cols);
// A norm's parameter gradients in one pass over g and x [rows, cols] (all columns on the
// calling thread, as ColumnSums): gw += the column sums of g * xhat, xhat made from x and
// each row's mean and rstd (kernels::LayerNormHat; with mean null, RMSNorm's
// kernels::RmsNormHat, and gb must be null), and gb += the column sums of g, each when not
// null. The bits of LayerNormHat (with a null mean, RMSNorm's) then ColumnSums(g, xhat, gw) and
// ColumnSums(g, null, gb), without writing xhat.
void NormParamGrads(const float* g, const float* x, const float* mean, const float* rstd, float* gw,
                    float* gb, int64_t rows, int64_t cols);
// Softmax of each row of [rows, T] scores in place, row r attending to s <= r % T; when
// probs16 is not null, the probabilities go there rounded to bf16 instead, and the
// scores are scratch (their contents after the call are unspecified).
void CausalSoftmaxForward(float* scores, int64_t rows, int64_t T, uint16_t* probs16 = nullptr);
// g = scale * p * (g - sum_s g p) over the unmasked entries, 0 on the masked ones; in place.
// p is fp32, or bf16 when p_bf16; when out16 is not null the result goes there rounded to
// bf16 instead, and g is scratch.
void CausalSoftmaxBackward(const void* p, bool p_bf16, float* g, int64_t rows, int64_t T,
                           float scale, uint16_t* out16 = nullptr);
// y[i, :] = table[ids[i], :]; ids outside [0, num) give zero rows.
void EmbeddingForward(const int32_t* ids, int64_t n_ids, const void* table, bool bf16, int64_t num,
                      int64_t dim, float* y);
// gw[ids[i], :] += g[i, :] in id order; ids outside [0, num) are skipped.
void EmbeddingBackward(const int32_t* ids, int64_t n_ids, const float* g, int64_t num, int64_t dim,
                       float* gw);
// Softmax cross-entropy of each row of logits [rows, V] against targets (in [0, V)):
// grad [rows, V] (already divided by the batch: times inv_n) and each row's loss in
// row_loss [rows], in double. With grad16 set, the gradient goes there instead, each value
// rounded once to bf16 (the bits of rounding the fp32 gradient), and grad may be null.
// bf16 logits (the bits) give what their fp32 values would, bit for bit.
void CrossEntropy(const float* logits, const int32_t* targets, int64_t rows, int64_t V,
                  double inv_n, float* grad, double* row_loss, uint16_t* grad16 = nullptr);
void CrossEntropy(const uint16_t* logits, const int32_t* targets, int64_t rows, int64_t V,
                  double inv_n, float* grad, double* row_loss, uint16_t* grad16 = nullptr);

// Fused causal attention, the CPU twin of kernels/cuda/flash_attention.h (same layouts,
// outputs and scratch; head widths kernels::FlashAttentionSupports accepts, checked by the
// caller): per query, keys in tiles of kFlashTile with an online softmax, each probability
// rounded to bf16 before the value product and the score gradient before its products,
// fp32 accumulation; y and gqkv fp32, or bf16 (each value rounded once) when `y_bf16`,
// `gqkv_bf16`. The (batch, head) pairs run in parallel; deterministic.
void FlashAttentionForward(const uint16_t* qkv, void* y, bool y_bf16, float* lse, int64_t B,
                           int64_t T, int64_t H, int64_t head_dim, float scale);
void FlashAttentionBackward(const uint16_t* qkv, const void* y, bool y_bf16, const uint16_t* gy,
                            const float* lse, float* delta, void* gqkv, bool gqkv_bf16, int64_t B,
                            int64_t T, int64_t H, int64_t head_dim, float scale);

// ---- The Llama layers' launchers, the twins of kernels/cuda/kernels.h's (RMSNorm in
// kernels/cpu/kernels.cc, the others in kernels/cpu/llama.cc).

// RMSNorm of each row of x [rows, cols]: y [rows, cols] and rstd [rows]; y fp32, or bf16
// when y_bf16 (each element the fp32 value rounded once: NOTE [GEMM epilogues], an output
// whose consumer is a bf16 GEMM). LayerNorm's loops without the mean and the bias; its
// backward is LayerNorm's launchers with a null mean, taking x and rstd (xhat =
// kernels::RmsNormHat of them, the forward's bits).
void RmsNormForward(const float* x, const void* w, bool bf16, float eps, void* y, float* rstd,
                    int64_t rows, int64_t cols, bool y_bf16 = false);
// h = silu(a) * b, elementwise; h fp32, or bf16 when h_bf16 (each element the fp32 value
// rounded once: NOTE [GEMM epilogues], an output whose consumer is a bf16 GEMM).
void SiluMulForward(const float* a, const float* b, void* h, int64_t n, bool h_bf16 = false);
// ga = dL/da and gb = dL/db of h = silu(a) * b from gh = dL/dh; each fp32, or bf16 when its
// flag says (rounded once, as h).
void SiluMulBackward(const float* a, const float* b, const float* gh, void* ga, void* gb, int64_t n,
                     bool ga_bf16 = false, bool gb_bf16 = false);
// The causal attention's input qkv [rows, 3C] (C = H * D, rows = B * T, row r at position
// r % T; the layout nn::FusedAttentionForward and the unfused path read) from q [rows, C]
// and k, v [rows, KV * D] (H % KV == 0, D even): columns [0, C) are q with the rotary
// embedding applied per head, [C, 2C) k rotated and [2C, 3C) v, each of the KV heads
// repeated for the H / KV query heads of its group (head h reads kv head h / (H / KV)).
// cos and sin are [T, D / 2]: the cosine and sine of position t's angle for pair i. qkv
// fp32, or bf16 when qkv_bf16 (each element the fp32 value rounded once).
void RotaryPackQkv(const float* q, const float* k, const float* v, const float* cos,
                   const float* sin, void* qkv, int64_t rows, int64_t T, int64_t H, int64_t KV,
                   int64_t D, bool qkv_bf16 = false);
// The backward of RotaryPackQkv: from gqkv [rows, 3C], gq [rows, C] = the q columns turned
// back by the inverse rotation, and gk, gv [rows, KV * D] = the k (turned back) and v
// columns summed over each group's heads in head order. Each output fp32, or bf16 when its
// flag says (the fp32 value rounded once).
void RotaryPackQkvBackward(const float* gqkv, const float* cos, const float* sin, void* gq,
                           void* gk, void* gv, int64_t rows, int64_t T, int64_t H, int64_t KV,
                           int64_t D, bool gq_bf16 = false, bool gk_bf16 = false,
                           bool gv_bf16 = false);

// ---- CPU-only fused loops (NOTE [Fused ops], nn/tensor_ops.h): the bits of the two
// launches each replaces, run one after the other.

// sum = Add(a, b), then LayerNormForward(sum, ...); sum may be a or b; y, mean and rstd
// must be none of a, b, sum.
void AddLayerNormForward(const float* a, const float* b, float* sum, const void* w,
                         const void* bias, bool bf16, float eps, void* y, float* mean, float* rstd,
                         int64_t rows, int64_t cols, bool y_bf16 = false);
// gx = residual + LayerNormBackwardInput(g, ...); gx must not be residual. With gx16 not
// null, gx rounded to bf16 there too (the operand of a bf16 GEMM that takes it).
void LayerNormBackwardInputAdd(const float* g, const float* x, const float* mean, const float* rstd,
                               const void* w, bool bf16, const float* residual, float* gx,
                               int64_t rows, int64_t cols, uint16_t* gx16 = nullptr);

// ---- The twins of kernels/cuda/grad.h: fsdp's gradient arithmetic, in element order on
// the calling thread.

// dst[i] += src[i] for i < n; src is fp32, or bf16 bits when src_bf16.
void AddInto(float* dst, const void* src, bool src_bf16, int64_t n);
// dst[i] *= factor.
void Scale(float* dst, int64_t n, float factor);
// The sum of x[i]^2 in double, added in index order.
double SumOfSquares(const float* x, int64_t n);

}  // namespace cpu
}  // namespace kernels

#endif  // KERNELS_CPU_KERNELS_H_
