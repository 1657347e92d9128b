// What each op of nn/tensor_ops.h costs on its CUDA path (NOTE [Op accounting] in
// core/op_profile.h): device-memory bytes read and written once, FLOPs, kernels launched.
// The ops record these on every device, so an op list recorded on the CPU is the one the
// GPU runs (a fused op is one kernel on both devices and records its fused cost).
#ifndef NN_INTERNAL_OP_COSTS_H_
#define NN_INTERNAL_OP_COSTS_H_

#include <cstdint>

#include "core/op_profile.h"
#include "kernels/rowwise.h"

namespace nn {
namespace internal {

// `tensors` fp32 tensors of n elements each read or written once, `flops` per element.
inline core::OpCost ElementwiseCost(int64_t n, int tensors, double flops_per_element) {
  return core::OpCost::Memory(4.0 * tensors * n, flops_per_element * n);
}

// GELU (tanh form): about 12 operations forward, 20 backward per element.
inline core::OpCost GeluForwardCost(int64_t n) { return ElementwiseCost(n, 2, 12); }
inline core::OpCost GeluBackwardCost(int64_t n) { return ElementwiseCost(n, 3, 20); }
inline core::OpCost AddCost(int64_t n) { return ElementwiseCost(n, 3, 1); }

inline core::OpCost BiasAddCost(int64_t rows, int64_t cols, int64_t bias_bytes) {
  return core::OpCost::Memory(8.0 * rows * cols + static_cast<double>(bias_bytes) * cols,
                              1.0 * rows * cols);
}

// acc[j] += sum_r x[r, j] (* y[r, j]); split into row chunks, a second launch adds the
// chunks' partial sums (written and read once) into acc.
inline core::OpCost ColumnSumsCost(int64_t rows, int64_t cols, bool two_factors,
                                   int64_t x_bytes = 4) {
  const int64_t chunks = ::kernels::ColumnSumChunks(rows, cols);
  core::OpCost c = core::OpCost::Rows(
      (static_cast<double>(x_bytes) + (two_factors ? 4.0 : 0.0)) * rows * cols + 8.0 * cols,
      (two_factors ? 2.0 : 1.0) * rows * cols);
  if (chunks > 1) {
    c.bytes += 8.0 * chunks * cols;
    c.launches = 2;
  }
  return c;
}

// Reads x, writes y (and mean and rstd per row); about 8 operations per element. The
// fused residual + LayerNorm also reads the second operand and writes the sum.
inline core::OpCost LayerNormForwardCost(int64_t rows, int64_t cols, int64_t w_bytes,
                                         bool add = false, int64_t y_bytes = 4) {
  return core::OpCost::Rows(((add ? 12.0 : 4.0) + static_cast<double>(y_bytes)) * rows * cols +
                                8.0 * rows + 2.0 * w_bytes * cols,
                            (add ? 9.0 : 8.0) * rows * cols);
}

// The input gradient (reads g and the input x, with each row's mean and rstd to make xhat
// again, writes gx, and its bf16 copy when asked; the fused residual add also reads the
// residual) and the column sums for each of gw and gb that is asked for, as the CUDA path
// launches them: in the same pass where the row fits (kernels::LayerNormGradWarps; each
// block's partial sums written once and read once by the launch that adds them into gw or
// gb), else as their own kernels. Without `centered`, RMSNorm's (no mean, no gb).
inline core::OpCost NormBackwardCost(bool centered, int64_t rows, int64_t cols, int64_t w_bytes,
                                     bool gw, bool gb, bool residual, bool bf16_copy) {
  const double row_stats = centered ? 8.0 : 4.0;  // bytes a row: mean and rstd, or rstd
  core::OpCost c =
      core::OpCost::Rows(((residual ? 16.0 : 12.0) + (bf16_copy ? 2.0 : 0.0)) * rows * cols +
                             row_stats * rows + static_cast<double>(w_bytes) * cols,
                         ((centered ? 12.0 : 6.0) + (residual ? 1.0 : 0.0)) * rows * cols);
  const int wanted = (gw ? 1 : 0) + (gb ? 1 : 0);
  const int stats = ::kernels::NormGradStats(centered);
  if (wanted > 0 && ::kernels::LayerNormGradWarps(cols, stats) > 0) {
    const int64_t chunks = ::kernels::LayerNormGradChunks(rows, cols, stats);
    c.flops += (gw ? 2.0 : 0.0) * rows * cols + (gb ? 1.0 : 0.0) * rows * cols;
    c.bytes += 8.0 * wanted * cols;  // gw and gb read and written
    if (chunks > 1) {
      c.bytes += 4.0 * stats * chunks * cols + 4.0 * wanted * chunks * cols;
      c.launches += wanted;
    }
    return c;
  }
  auto add = [&](const core::OpCost& sums) {
    c.bytes += sums.bytes;
    c.flops += sums.flops;
    c.launches += sums.launches;
  };
  if (gw) {  // xhat written by its own kernel, then the sums of g * xhat
    add(core::OpCost::Rows(8.0 * rows * cols + row_stats * rows,
                           (centered ? 2.0 : 1.0) * rows * cols));
    add(ColumnSumsCost(rows, cols, /*two_factors=*/true));
  }
  if (gb) add(ColumnSumsCost(rows, cols, /*two_factors=*/false));
  return c;
}
inline core::OpCost LayerNormBackwardCost(int64_t rows, int64_t cols, int64_t w_bytes, bool gw,
                                          bool gb, bool residual = false, bool bf16_copy = false) {
  return NormBackwardCost(/*centered=*/true, rows, cols, w_bytes, gw, gb, residual, bf16_copy);
}

// Reads the fp32 scores and writes the probabilities (fp32 in place, or a bf16 copy; the
// row stays in cache between its passes); about 5 operations and an exponential per entry.
inline core::OpCost SoftmaxForwardCost(int64_t rows, int64_t T, bool bf16_out) {
  return core::OpCost::Rows((4.0 + (bf16_out ? 2.0 : 4.0)) * rows * T, 5.0 * rows * T,
                            /*launches=*/1, /*exps=*/1.0 * rows * T);
}
// Reads p (fp32 or bf16) and the fp32 gradient, writes the result (fp32 in place, or a bf16
// copy); about 4 operations per entry.
inline core::OpCost SoftmaxBackwardCost(int64_t rows, int64_t T, bool bf16_p, bool bf16_out) {
  return core::OpCost::Rows((4.0 + (bf16_p ? 2.0 : 4.0) + (bf16_out ? 2.0 : 4.0)) * rows * T,
                            4.0 * rows * T);
}

// The fused attention (NOTE [Fused attention] in nn/attention.h) as its kernels execute
// it, on 64-row tiles (kernels/cuda/flash_attention.cu): per (query tile, key tile <= it)
// pair, the diagonal tile whole (its masked half computed and discarded), the forward runs 2
// tile products (S = Q K^T, P V) and 64 x 64 + 64 exponentials (P, and each row's rescale);
// the backward recomputes S and P in both of its tile kernels, 7 products (dK and dV: S,
// dP, P^T dO, dS^T Q; dQ: S, dP, dS K) and 2 x 64 x 64 exponentials. Each tile product is
// 2 * 64 * 64 * hd FLOPs on the tensor cores (mma.sync: OpEngine::kTensorCoreMma). Bytes:
// each kernel reads its inputs from device memory once and writes its outputs once; the
// tiles it streams again for every pair come from shared memory and L2. The forward reads
// q, k, v and writes y and the row statistics; the backward's delta kernel reads y and gy
// and writes delta, its dK/dV and dQ kernels each read q, k, v, gy, the statistics and
// delta and write their part of gqkv.
inline double FusedAttentionPairs(int64_t T) {
  const double tiles = static_cast<double>((T + 63) / 64);
  return tiles * (tiles + 1) / 2;
}
// `y_bytes` and `g_bytes`: the element sizes of y and gqkv (4 fp32, 2 bf16).
inline core::OpCost FusedAttentionForwardCost(int64_t B, int64_t T, int64_t H, int64_t hd,
                                              int64_t y_bytes) {
  const double bh = static_cast<double>(B) * H, tile = 2.0 * 64 * 64 * hd;
  const double pairs = FusedAttentionPairs(T);
  return core::OpCost{bh * pairs * 2 * tile,
                      bh * (static_cast<double>(T) * hd * (3 * 2 + y_bytes) + 4.0 * T), 1,
                      core::OpEngine::kTensorCoreMma, bh * pairs * (64 * 64 + 64)};
}
inline core::OpCost FusedAttentionBackwardCost(int64_t B, int64_t T, int64_t H, int64_t hd,
                                               int64_t y_bytes, int64_t g_bytes) {
  const double bh = static_cast<double>(B) * H, tile = 2.0 * 64 * 64 * hd;
  const double pairs = FusedAttentionPairs(T);
  // Per row of a head: delta (y and gy read, delta written), then the two tile kernels
  // (q, k, v and gy read by each, lse and delta read by each, gqkv written once).
  const double per_row =
      static_cast<double>(hd) * (y_bytes + 2 + 2 * (3 * 2 + 2) + 3 * g_bytes) + 4.0 + 2 * 8.0;
  return core::OpCost{bh * pairs * 7 * tile, bh * static_cast<double>(T) * per_row, 3,
                      core::OpEngine::kTensorCoreMma, bh * pairs * 2 * 64 * 64};
}

// RMSNorm (LayerNorm's kernels without the mean and the bias): reads x, writes y
// (`y_bytes` an element: 4 fp32, 2 bf16) and rstd per row, about 4 operations per element;
// the backward as NormBackwardCost.
inline core::OpCost RmsNormForwardCost(int64_t rows, int64_t cols, int64_t w_bytes,
                                       int64_t y_bytes = 4) {
  return core::OpCost::Rows((4.0 + static_cast<double>(y_bytes)) * rows * cols + 4.0 * rows +
                                static_cast<double>(w_bytes) * cols,
                            4.0 * rows * cols);
}
inline core::OpCost RmsNormBackwardCost(int64_t rows, int64_t cols, int64_t w_bytes, bool gw,
                                        bool residual = false, bool bf16_copy = false) {
  return NormBackwardCost(/*centered=*/false, rows, cols, w_bytes, gw, /*gb=*/false, residual,
                          bf16_copy);
}

// silu(a) * b: reads a and b, writes h (`h_bytes` an element: 4 fp32, 2 bf16), about 8
// operations; the backward reads a, b and gh, writes ga and gb (their element sizes), about
// 14.
inline core::OpCost SiluMulForwardCost(int64_t n, int64_t h_bytes = 4) {
  return core::OpCost::Memory((8.0 + static_cast<double>(h_bytes)) * n, 8.0 * n);
}
inline core::OpCost SiluMulBackwardCost(int64_t n, int64_t ga_bytes = 4, int64_t gb_bytes = 4) {
  return core::OpCost::Memory((12.0 + static_cast<double>(ga_bytes + gb_bytes)) * n, 14.0 * n);
}

// The rotary packing of grouped q, k, v: reads q [rows, C] and k, v [rows, KW] (each k and v
// element once per group head, from cache), writes [rows, 3C] (`qkv_bytes` an element);
// 3 operations per rotated element. The backward reads [rows, 3C] and writes gq [rows, C]
// and gk, gv [rows, KW] (their element sizes).
inline core::OpCost RotaryPackCost(int64_t rows, int64_t C, int64_t KW, int64_t qkv_bytes = 4) {
  return core::OpCost::Memory((4.0 * (C + 2 * KW) + static_cast<double>(qkv_bytes) * 3 * C) * rows,
                              6.0 * rows * C);
}
inline core::OpCost RotaryPackBackwardCost(int64_t rows, int64_t C, int64_t KW,
                                           int64_t gq_bytes = 4, int64_t gk_bytes = 4,
                                           int64_t gv_bytes = 4) {
  return core::OpCost::Memory((4.0 * 3 * C + static_cast<double>(gq_bytes) * C +
                               static_cast<double>(gk_bytes + gv_bytes) * KW) *
                                  rows,
                              6.0 * rows * C);
}

inline core::OpCost EmbeddingForwardCost(int64_t n, int64_t dim, int64_t table_bytes) {
  return core::OpCost::Memory(4.0 * n + (static_cast<double>(table_bytes) + 4.0) * n * dim);
}
// Sorts the ids with their positions (a radix sort: the ids and positions read and
// written once a pass, 4 passes), then reads g and adds each id's rows into gw (read and
// write once a row used). Launches: the positions, the sort's histogram and 4 passes, the
// sums.
inline core::OpCost EmbeddingBackwardCost(int64_t n, int64_t dim) {
  return core::OpCost::Memory(4.0 * n + 4 * 16.0 * n + 12.0 * n * dim, 1.0 * n * dim,
                              /*launches=*/7);
}

// Reads the logits (fp32 or bf16), writes their gradient (fp32 or bf16) and a loss per row;
// about 6 operations and 2 exponentials (the row's sum, the gradient) each. A row is read
// from device memory once where the staged kernel takes it (V % 4 == 0, V / 4 >= 512 and
// the row within a block's shared memory: 227 KB on the Hopper GPUs of core/roofline.h, less
// the kernel's scratch; kernels/cuda/kernels.cu), and twice otherwise: the row kernel
// reads it again for the gradient, after a few hundred rows too many for the cache.
inline core::OpCost CrossEntropyCost(int64_t n, int64_t V, bool bf16_grad,
                                     bool bf16_logits = false) {
  const double x_bytes = bf16_logits ? 2.0 : 4.0;
  constexpr double kStagedRowBytes = 227 * 1024 - 384;
  const bool staged = V % 4 == 0 && V / 4 >= 512 && x_bytes * V <= kStagedRowBytes;
  return core::OpCost::Rows(
      ((staged ? 1.0 : 2.0) * x_bytes + (bf16_grad ? 2.0 : 4.0)) * n * V + 12.0 * n, 6.0 * n * V,
      /*launches=*/1, /*exps=*/2.0 * n * V);
}

}  // namespace internal
}  // namespace nn

#endif  // NN_INTERNAL_OP_COSTS_H_
