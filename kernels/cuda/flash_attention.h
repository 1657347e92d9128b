// Fused causal self-attention on CUDA (only under --config=cuda): NOTE [Fused attention]
// in nn/attention.h says when the layer uses it. Flash-attention style: each block keeps a
// 64-query tile in shared memory and walks the 64-key tiles up to the diagonal with an
// online softmax, so the [T, T] scores never reach device memory. The products run on the
// tensor cores (mma.sync with ldmatrix loads, bf16 x bf16 with fp32 accumulation); the
// softmax statistics are fp32.
//
// Layout (nanoGPT's c_attn split, as nn::CausalSelfAttention): qkv [B, T, 3C] bf16 with q,
// k, v at columns [0, C), [C, 2C), [2C, 3C), head h at columns h*hd .. (h+1)*hd of each;
// y and gy [B, T, C]. Scores are scale * q k^T, entries with key > query masked.
//
//   if (kernels::FlashAttentionSupports(hd)) {
//     err = kernels::cuda::FlashAttentionForward(qkv, y, /*y_bf16=*/true, lse, B, T, H, hd,
//                                                scale);
//     ...
//     err = kernels::cuda::FlashAttentionBackward(qkv, y, /*y_bf16=*/true, gy, lse, delta,
//                                                 gqkv, /*gqkv_bf16=*/true, B, T, H, hd, scale);
//   }
//
// Every launch goes to the compute stream (the legacy default stream) and returns the
// launch's error, never synchronising, except the first call for a problem size (below).
// The backward is deterministic: dK and dV are summed by the block that owns the key tile
// and dQ by the block that owns the query tile (no atomics), so the same inputs give the
// same bits on every run.
//
// NOTE [Flash block shapes]: each of the three kernels (forward, dK/dV, dQ) comes in a few
// block shapes: how many rows (queries, or keys for dK/dV) a block owns, how many warps
// share them, the registers a thread may take, (backward) whether a warp holds its own
// rows' operands in registers for the whole pass and (dK/dV) whether it takes each streamed
// tile as two halves of 32 queries. Every row is computed the same way in
// every shape (its keys, or queries, in the same 64-row tiles, in the same order, with the
// same arithmetic), so a shape changes the speed and never the bits. Shape 0 is the
// reference: 64 rows, 4 warps. The first call for a problem size (B, T, H, head width,
// output dtypes) tunes: it runs each shape on the call's own inputs, each on outputs first
// filled with 0xff, keeps those whose outputs have shape 0's bits (a shape that differs, or
// fails to launch, is never chosen), times them with CUDA events and takes the fastest;
// that call synchronises and copies the outputs to the host to compare them. Later calls
// launch the chosen shapes. `FlashShapes` pins shapes instead (benchmarks, tests).
// Two environment switches, read once per process (kernels/tuning_switches.h), route
// around a shape that misbehaves on some machine; pinned shapes take precedence over both:
//   FSDP_ATTENTION_SHAPES=reference  every kernel launches shape 0 and nothing is tuned (no
//                                    extra launches, no host copies); `tuned` (or unset) is
//                                    the default; any other value makes every unpinned call
//                                    return cudaErrorInvalidValue, and nn's fused attention
//                                    refuses it first with InvalidArgument naming the
//                                    variable and its value;
//   FSDP_ATTENTION_TUNING=0          the tuner is off: each kernel launches its untuned
//                                    default, shape 0 (no other shape has been measured to be
//                                    faster at every size), without timing anything.
// FlashTuningReport says which switch is in force.
#ifndef KERNELS_CUDA_FLASH_ATTENTION_H_
#define KERNELS_CUDA_FLASH_ATTENTION_H_

#include <cuda_runtime_api.h>
#include <stdint.h>

#include <string>

#include "kernels/rowwise.h"  // kFlashTile (query and key rows per tile), FlashAttentionSupports

namespace kernels {
namespace cuda {

enum class FlashKernel { kForward = 0, kBackwardKV = 1, kBackwardQ = 2 };

// The number of block shapes of `kernel` at `head_dim` (0 where the head width has no
// kernel), and shape i's name ("64 rows, 4 warps").
int FlashShapeCount(FlashKernel kernel, int64_t head_dim);
std::string FlashShapeName(FlashKernel kernel, int64_t head_dim, int shape);

// One shape per kernel; -1 is the tuned choice (NOTE [Flash block shapes]).
struct FlashShapes {
  int forward = -1;
  int backward_kv = -1;
  int backward_q = -1;
};

// The shapes the tuner chose for a problem size, and each candidate's time: "forward:
// shape 0 0.231 ms, shape 1 0.198 ms (chosen), ..."; empty where that size was not tuned.
// With a switch in force (NOTE [Flash block shapes]), the shapes every size runs: "tuning
// off (FSDP_ATTENTION_SHAPES=reference): forward: 64 queries, 4 warps; dK/dV: ...", or
// "every unpinned call fails: " and why the switch was refused.
std::string FlashTuningReport(int64_t B, int64_t T, int64_t H, int64_t head_dim);

// y [B, T, C] = the heads' attention outputs (before the output projection), fp32, or
// bf16 (rounded once) when `y_bf16`; lse [B, H, T] fp32 = each row's log2-sum-exp2 of the
// scaled scores in log2 units (scale * log2(e) * q.k), which the backward reads. Returns
// cudaErrorInvalidValue for a head width kernels::FlashAttentionSupports rejects or sizes
// that do not fit a launch, a shape in `shapes` out of range, or, for a kernel left
// unpinned, an unknown FSDP_ATTENTION_SHAPES (NOTE [Flash block shapes]).
cudaError_t FlashAttentionForward(const uint16_t* qkv, void* y, bool y_bf16, float* lse, int64_t B,
                                  int64_t T, int64_t H, int64_t head_dim, float scale,
                                  const FlashShapes& shapes = {});

// gqkv [B, T, 3C] = dL/dqkv (every element written), fp32 or, when `gqkv_bf16`, bf16, from
// the forward's qkv, y (fp32 or bf16, as `y_bf16` says) and lse and gy = dL/dy rounded to
// bf16; delta [B, H, T] fp32 is scratch (each row's <gy, y>). Three launches: delta, then
// dK and dV per key tile, then dQ per query tile.
cudaError_t FlashAttentionBackward(const uint16_t* qkv, const void* y, bool y_bf16,
                                   const uint16_t* gy, const float* lse, float* delta, void* gqkv,
                                   bool gqkv_bf16, int64_t B, int64_t T, int64_t H,
                                   int64_t head_dim, float scale, const FlashShapes& shapes = {});

}  // namespace cuda
}  // namespace kernels

#endif  // KERNELS_CUDA_FLASH_ATTENTION_H_
