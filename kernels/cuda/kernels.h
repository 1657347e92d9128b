// CUDA launchers of the kernels/ bodies (built only under --config=cuda, compiled by
// nvcc in kernels.cu). Raw device pointers; every launch goes to the compute stream (the
// legacy default stream) and returns the launch's error (cudaGetLastError), never
// synchronising. Their CPU twins are kernels/cpu/kernels.h. Callers (nn/tensor_ops*.cc)
// validate sizes and pointers first and turn the error into an absl::Status naming the
// tensor.
//
//   cudaError_t err = kernels::cuda::GeluForward(x, y, n);
//   RETURN_IF_ERROR(core::cuda::StatusFromCuda(err, "GeluForward of ..."));
//
// `bf16` arguments say whether a `const void*` weight holds bf16 (uint16_t bits) or fp32.
#ifndef KERNELS_CUDA_KERNELS_H_
#define KERNELS_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>
#include <stdint.h>

namespace kernels {
namespace cuda {

cudaError_t GeluForward(const float* x, float* y, int64_t n);
cudaError_t GeluBackward(const float* x, const float* gy, float* gx, int64_t n);
cudaError_t ReluForward(const float* x, float* y, int64_t n);
cudaError_t ReluBackward(const float* y, const float* gy, float* gx, int64_t n);
cudaError_t Add(const float* a, const float* b, float* out, int64_t n);
// out[r, j] = x[r, j] + bias[j] for a [rows, cols] matrix.
cudaError_t BiasAdd(const float* x, const void* bias, bool bf16, float* out, int64_t rows,
                    int64_t cols);
// acc[j] += sum_r x[r, j] * (y ? y[r, j] : 1). The rows are split into
// kernels::ColumnSumChunks(rows, cols) chunks (kernels/rowwise.h) summed by separate blocks
// (so the whole GPU works on a [16K, 768] gradient), each chunk's fixed tree sum goes to
// `partial` ([chunks, cols] fp32 scratch; may be null for one chunk, else
// cudaErrorInvalidValue) and a second kernel adds the chunks into acc in chunk order:
// deterministic, run to run.
cudaError_t ColumnSums(const float* x, const float* y, float* acc, int64_t rows, int64_t cols,
                       float* partial);
// ColumnSums of a bf16 x (no second factor).
cudaError_t ColumnSumsBf16(const uint16_t* x, float* acc, int64_t rows, int64_t cols,
                           float* partial);
// NOTE [GEMM epilogues] (nn/tensor_ops.h): the epilogue of a GEMM product cuBLASLt stored
// plainly, for the problems its own epilogues do not take; arguments as the CPU launcher's.
cudaError_t GemmEpilogue(const float* acc, int kind, const void* bias, bool bias_bf16, void* aux,
                         void* out, bool out_bf16, int64_t rows, int64_t cols);
// One warp per row of x [rows, cols]: y (bf16 when y_bf16), mean and rstd [rows]; a null
// mean is cudaErrorInvalidValue (RMSNorm's forward is RmsNormForward), as in
// AddLayerNormForward.
cudaError_t LayerNormForward(const float* x, const void* w, const void* b, bool bf16, float eps,
                             void* y, float* mean, float* rstd, int64_t rows, int64_t cols,
                             bool y_bf16 = false);
// One warp per row: gx from g, the forward's x, mean and rstd (xhat recomputed), and w. The
// backward launchers here take a null mean for RMSNorm's backward (kernels::RmsNormHat and
// RmsNormBackwardInput; no bias gradient).
cudaError_t LayerNormBackwardInput(const float* g, const float* x, const float* mean,
                                   const float* rstd, const void* w, bool bf16, float* gx,
                                   int64_t rows, int64_t cols);
// xhat [rows, cols] from x, mean and rstd (kernels::LayerNormHat, or RmsNormHat with a null
// mean; for the weight gradient's ColumnSums where LayerNormBackward cannot take it).
cudaError_t LayerNormHat(const float* x, const float* mean, const float* rstd, float* xhat,
                         int64_t rows, int64_t cols);
// The fused ops of NOTE [Fused ops] (nn/tensor_ops.h), one kernel each, with the CPU
// launchers' arguments (kernels/cpu/kernels.h): sum = a + b then its LayerNorm (sum may be
// a or b); gx = residual + the LayerNorm input gradient.
cudaError_t AddLayerNormForward(const float* a, const float* b, float* sum, const void* w,
                                const void* bias, bool bf16, float eps, void* y, float* mean,
                                float* rstd, int64_t rows, int64_t cols, bool y_bf16 = false);
cudaError_t LayerNormBackwardInputAdd(const float* g, const float* x, const float* mean,
                                      const float* rstd, const void* w, bool bf16,
                                      const float* residual, float* gx, int64_t rows, int64_t cols,
                                      uint16_t* gx16 = nullptr);
// LayerNorm's backward in one pass (for cols with kernels::LayerNormGradWarps(cols, stats)
// > 0, stats = kernels::NormGradStats(mean != nullptr), kernels/rowwise.h;
// cudaErrorInvalidValue otherwise): gx as LayerNormBackwardInput (plus residual when not
// null, as LayerNormBackwardInputAdd, and then gx rounded to bf16 into gx16 when that is not
// null: nn passes gx16 only with a residual, as the CPU twin takes it), and gw += column sums
// of g * xhat, gb += column sums of g (each when not null). The rows are split into
// kernels::LayerNormGradChunks(rows, cols, stats) blocks whose warps sum their own rows;
// each block's sums go to `partial` ([chunks, stats, cols] fp32 scratch; may be null for one
// chunk, else cudaErrorInvalidValue) and a second kernel per gradient adds the chunks in
// order: deterministic, run to run.
cudaError_t LayerNormBackward(const float* g, const float* x, const float* mean, const float* rstd,
                              const void* w, bool bf16, const float* residual, float* gx, float* gw,
                              float* gb, int64_t rows, int64_t cols, float* partial,
                              uint16_t* gx16 = nullptr);
// One warp per row of T scores; row r is query r % T. Arguments as the CPU launchers'.
cudaError_t CausalSoftmaxForward(float* scores, int64_t rows, int64_t T,
                                 uint16_t* probs16 = nullptr);
cudaError_t CausalSoftmaxBackward(const void* p, bool p_bf16, float* g, int64_t rows, int64_t T,
                                  float scale, uint16_t* out16 = nullptr);
// y[i, :] = table[ids[i], :]; ids outside [0, num) give zero rows (callers reject them).
cudaError_t EmbeddingForward(const int32_t* ids, int64_t n_ids, const void* table, bool bf16,
                             int64_t num, int64_t dim, float* y);
// gw[ids[i], :] += g[i, :] for i in order, ids outside [0, num) skipped: the positions are
// sorted by id (a stable radix sort into `scratch`, at least
// EmbeddingBackwardScratchBytes(n_ids) bytes), then one block per id adds that id's rows
// in position order, so every run, and the CPU loop, give the same bits (no atomics).
// n_ids at most 2^31 - 1. The scratch size goes to *bytes (0 for no ids), or the error of
// CUB's size query (cudaErrorInvalidValue for more than 2^31 - 1 ids).
cudaError_t EmbeddingBackwardScratchBytes(int64_t n_ids, size_t* bytes);
cudaError_t EmbeddingBackward(const int32_t* ids, int64_t n_ids, const float* g, int64_t num,
                              int64_t dim, float* gw, void* scratch, size_t scratch_bytes);
// A fingerprint of `bytes` bytes at p (2-byte aligned, `bytes` even), for telling whether
// two kernels wrote the same bits: out[0] = the sum over the 16-bit words w_i of
// SplitMix64(i << 16 | w_i) modulo 2^64, out[1] = how many words are nonzero. Sums of
// integers, so the same bits every run whatever the order. `out` is two device words,
// overwritten. (The cuBLASLt tuner's check, nn/cuda/gemm.cc.)
cudaError_t Fingerprint(const void* p, int64_t bytes, unsigned long long* out);
// One block per row of logits [rows, V]: grad [rows, V] and row_loss [rows] (double); with
// grad16 set the gradient goes there as bf16 instead (grad may be null), as on the CPU.
// bf16 logits (the bits) are widened exactly as they are read.
cudaError_t CrossEntropy(const float* logits, const int32_t* targets, int64_t rows, int64_t V,
                         double inv_n, float* grad, double* row_loss, uint16_t* grad16 = nullptr);
cudaError_t CrossEntropy(const uint16_t* logits, const int32_t* targets, int64_t rows, int64_t V,
                         double inv_n, float* grad, double* row_loss, uint16_t* grad16 = nullptr);
// The Llama layers' launchers, with the CPU launchers' arguments (kernels/cpu/kernels.h,
// where each output is fp32 or bf16 by its flag). RMSNorm (kernels.cu) runs on LayerNorm's
// kernels without the mean and the bias: one warp per row; its backward is LayerNorm's
// launchers above with a null mean (and bias gradient), taking x and rstd (xhat recomputed,
// the forward's bits). In kernels/cuda/llama.cu: silu(a) * b and its
// gradients grid-stride over their outputs; the rotary packing of q, k, v and its backward
// a thread per output column over the rows (cudaErrorInvalidValue for rows of 3 H D > 2^31 -
// 257 elements, so that no thread's column passes 2^31).
cudaError_t RmsNormForward(const float* x, const void* w, bool bf16, float eps, void* y,
                           float* rstd, int64_t rows, int64_t cols, bool y_bf16 = false);
cudaError_t SiluMulForward(const float* a, const float* b, void* h, int64_t n, bool h_bf16 = false);
cudaError_t SiluMulBackward(const float* a, const float* b, const float* gh, void* ga, void* gb,
                            int64_t n, bool ga_bf16 = false, bool gb_bf16 = false);
cudaError_t RotaryPackQkv(const float* q, const float* k, const float* v, const float* cos,
                          const float* sin, void* qkv, int64_t rows, int64_t T, int64_t H,
                          int64_t KV, int64_t D, bool qkv_bf16 = false);
cudaError_t RotaryPackQkvBackward(const float* gqkv, const float* cos, const float* sin, void* gq,
                                  void* gk, void* gv, int64_t rows, int64_t T, int64_t H,
                                  int64_t KV, int64_t D, bool gq_bf16 = false, bool gk_bf16 = false,
                                  bool gv_bf16 = false);
// c_i[r, j] = beta * c_i[r, j] (0 when beta == 0, even over NaN) for the `batch` row-major
// [rows, cols] matrices at c + i * stride with row stride ld: a GEMM with k == 0.
cudaError_t ScaleMatrices(float* c, int64_t batch, int64_t rows, int64_t cols, int64_t ld,
                          int64_t stride, float beta);

}  // namespace cuda
}  // namespace kernels

#endif  // KERNELS_CUDA_KERNELS_H_
