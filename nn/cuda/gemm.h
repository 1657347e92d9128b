// cuBLASLt GEMM on the compute stream (only under --config=cuda), row-major, strided
// batched. One cuBLASLt handle and one 32 MiB workspace per device, created on first use
// and kept for the life of the process.
//
//   nn::cuda::GemmOperand a{x_ptr, /*bf16=*/false, /*ld=*/in, /*stride=*/0};
//   RETURN_IF_ERROR(nn::cuda::Gemm(0, false, true, 1, R, out, in, 1.0f, a, w, 0.0f, c,
//                                  "fc (Linear) forward"));
#ifndef NN_CUDA_GEMM_H_
#define NN_CUDA_GEMM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "nn/gemm_epilogue.h"

namespace nn {
namespace cuda {

// A row-major device matrix (batch): element (r, c) of matrix i at ptr + i*stride + r*ld + c.
struct GemmOperand {
  const void* ptr = nullptr;
  bool bf16 = false;  // bf16 (uint16_t bits) or fp32
  int64_t ld = 0;
  int64_t stride = 0;
};

// NOTE [GEMM epilogues] (nn/tensor_ops.h): `bias` ([n], fp32 or bf16) for kBias, kBiasGelu
// and kBiasResidual, `aux` (C's dtype, [m, n] dense) for kBiasGelu, kDGelu, kBiasResidual
// and kResidual (the last two: the residual, cuBLASLt's C with beta 1; an fp32 C and beta 0
// only). `bias_grad` (fp32 [m]), with kNone, bf16 operands, trans_a and batch 1: the GEMM
// also writes (not adds) bias_grad[i] = the sum over k of op(A)[i, :] (cuBLASLt's BGRADB:
// the bias gradient of a weight-gradient GEMM dW = g^T x, whose A is g).
struct GemmEpilogueArgs {
  GemmEpilogue kind = GemmEpilogue::kNone;
  const void* bias = nullptr;
  bool bias_bf16 = false;
  void* aux = nullptr;
  float* bias_grad = nullptr;
};

// C_i = alpha op(A_i) op(B_i) + beta C_i for i < batch on CUDA device `device`, with
// nn::Gemm's conventions (nn/ops.h), then the epilogue. A and B must both be fp32
// (CUBLAS_COMPUTE_32F, TF32 off) or both bf16 (fp32 accumulation); C is fp32, or bf16
// (then beta must be 0); an epilogue needs batch 1 and a dense C (ld n). InvalidArgument
// otherwise. Requires m, n, k, batch >= 1 and batch,
// m, n, k, ld within cuBLASLt's int32 limits. Each problem's descriptors and algorithm are
// built once and cached. When cuBLASLt's heuristic offers no algorithm: a plain GEMM with an
// fp32 C runs through cublasGemmStridedBatchedEx instead; an epilogue, a bias gradient or
// a bf16 C gives Unimplemented, and the caller runs the plain GEMM and the epilogue kernel
// or the column sums (nn::MatMul). Asynchronous; errors name `what`.
absl::Status Gemm(int device, bool trans_a, bool trans_b, int64_t batch, int64_t m, int64_t n,
                  int64_t k, float alpha, const GemmOperand& a, const GemmOperand& b, float beta,
                  const GemmOperand& c, absl::string_view what,
                  const GemmEpilogueArgs& epilogue = GemmEpilogueArgs());

// NOTE [GEMM tuning]: the first GEMM of each problem (shape, types, epilogue, alignments)
// runs the other answers of cuBLASLt's heuristic (up to 8 in all) that sum over k as its
// first answer does (split-K count, reduction scheme, numerical implementation flags) on
// the GEMM's own operands, keeps those that write the first's bits exactly (a device
// fingerprint of every output, filled with 0xff before each run; a GEMM that reads its C,
// beta 1, runs on a fresh copy of C each time), times them and keeps the fastest where it
// saves at least 3% of the first's time, for the process's life. The choice cannot change
// a result, so runs stay bit-identical whichever is faster on the day. That first GEMM
// synchronises. Not tuned (the first answer runs): batched or strided problems, alpha != 1
// or beta other than 0 or 1 (later calls of a tuned problem with another alpha or beta than
// its tuning call's take the first answer too), outputs that overlap an input, an output
// with over a tenth of its 16-bit words zero (all zeros, mostly zeros, or exact small
// integers: operands on which different orders may round alike), and problems with fewer than 2^12
// outputs (2^20 for a bf16 C, whose rounding hides most differences in the order of summation). On
// by default; off with SetGemmTuning(false) (problems built while off keep the first answer) or
// FSDP_GEMM_TUNING=0 in the environment. GemmTuningReport has a line for each problem
// built while tuning was on: how many answers were kept, summed otherwise, wrote other
// bits or were refused, the first's time and the chosen one's; or why it was not tuned,
// including that cuBLASLt had no algorithm for it or refused it and the fallback runs
// (problems cuBLASLt is never asked about, fp32 operands with an epilogue or a misaligned
// vector, have no line).
void SetGemmTuning(bool on);
bool GemmTuning();
std::vector<std::string> GemmTuningReport();

// Tests only: while on, Gemm behaves as if cuBLASLt's heuristic found no algorithm for any
// problem (cublasGemmStridedBatchedEx for plain GEMMs, Unimplemented for the others), so
// the fallbacks run on problems cuBLASLt would take.
void ForceGemmFallbackForTesting(bool on);

// Tests only: how many Gemm calls with an epilogue, a bias gradient or a bf16 C this
// process has answered Unimplemented (the caller's fallback ran instead of cuBLASLt).
int64_t GemmEpilogueFallbacksForTesting();

}  // namespace cuda
}  // namespace nn

#endif  // NN_CUDA_GEMM_H_
