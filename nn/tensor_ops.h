// Device- and dtype-aware tensor operations behind the nn/ layers: each dispatches on
// its tensors' device, calling the CPU launcher of a kernels/ body (kernels/cpu/kernels.h)
// or its CUDA launcher (kernels/cuda/kernels.h, builds with --config=cuda; GEMMs: oneDNN
// or cuBLASLt), so a layer is written once for both devices.
//
//   // y[R, out] = x[R, in] W^T with W fp32 or bf16, on x's device:
//   nn::GemmArgs g;
//   g.trans_b = true;
//   g.m = R; g.n = out; g.k = in;
//   g.a.tensor = x; g.b.tensor = w; g.c.tensor = y;
//   RETURN_IF_ERROR(nn::MatMul("fc (Linear)", g));
//   RETURN_IF_ERROR(nn::GeluForward("mlp.gelu (GELU)", y, h));
//
// NOTE [Device dispatch]
// Every tensor passed to one call must be defined and on one device (CPU or one CUDA
// device); activations, activation gradients and parameter gradients are fp32; weights
// (GEMM operands, LayerNorm/bias/embedding tables) may be fp32 or bf16 (bf16 is widened
// exactly to fp32 for the math; on CUDA, a GEMM whose operands mix fp32 and bf16 rounds
// the fp32 one to bf16 first and runs bf16 x bf16 -> fp32 with fp32 accumulation). A
// violation is InvalidArgument naming `what` (the caller: a module's Describe() or a
// loss), the tensor and both devices; nothing runs then. CUDA work is queued on the
// compute stream (the legacy default stream) and is asynchronous unless noted; a CUDA
// failure is Internal naming the operation and `what`. In a build without CUDA, CUDA
// tensors give FailedPrecondition.
#ifndef NN_TENSOR_OPS_H_
#define NN_TENSOR_OPS_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/tensor.h"
#include "kernels/cpu_runtime.h"
#include "nn/gemm_epilogue.h"

namespace nn {

// One matrix, or a batch of equally spaced matrices, stored row-major inside a tensor.
struct MatrixRef {
  core::Tensor tensor;
  int64_t offset = 0;        // elements from tensor's first element to matrix 0's first
  int64_t ld = 0;            // row stride as stored; 0 means dense (its stored columns)
  int64_t batch_stride = 0;  // elements from matrix i's first element to matrix i+1's
};

// NOTE [GEMM epilogues]: what a GEMM does to each element of its product P = alpha op(A)
// op(B) (row i, column j) before it stores C, in fp32, each stored value rounded once when
// C is bf16. The layers use them so that a bias, a GELU or a GELU's gradient costs no pass
// over memory of its own and a GEMM feeding another GEMM writes its bf16 operand directly:
//   kNone      C = P (+ beta C)
//   kBias      C = P + bias[j]
//   kBiasGelu  aux = P + bias[j] and C = GELU(P + bias[j]) (tanh form, as GeluForward)
//   kDGelu     C = P * GELU'(aux[i, j]), aux the pre-activation a kBiasGelu stored
//   kBiasResidual  C = aux[i, j] + (P + bias[j]), aux a residual (fp32, read; C fp32)
//   kResidual  C = aux[i, j] + P, aux a residual (fp32, read; C fp32): a residual
//              connection after a Linear without bias, or the sum of the input gradients
//              of Linears that share an input (F::LinearResidual, F::RotaryQkv's and
//              F::SwiGlu's backwards)
// The body is written once (kernels::GemmEpiloguePre/Out, kernels/elementwise.h). On the CPU
// it runs after oneDNN's sgemm; on CUDA it is cuBLASLt's BIAS, GELU_AUX_BIAS or DGELU
// epilogue (kBiasResidual: BIAS with the residual as cuBLASLt's C and beta 1, which
// rounds P + aux before adding the bias: within fp32 rounding of the body's order;
// kResidual: the DEFAULT epilogue with the residual as C and beta 1, aux + P one fp32
// addition of the fp32 product; cuBLASLt runs it only where its algorithm has the plain
// GEMM's grid and adds no split-K parts onto the residual, else the fallback below. The
// body's bits where cuBLASLt's kernel on that grid sums k as the plain GEMM's does, which
// cuBLASLt does not promise: within fp32 rounding of them, and the same bits on every call
// of the cached problem). Its
// bias has D's type: a bf16 bias of a bf16 GEMM into an fp32 C (a projection's, under bf16
// weights) is widened into an fp32 copy first, exactly (op "gemm.widen_bias", recorded on
// both devices). Where cuBLASLt has no algorithm for one (a bias or GELU aux not 16-byte
// aligned, say) MatMul runs the plain GEMM into an fp32 scratch and the same body as one
// kernel (tested by forcing it, nn::cuda::ForceGemmFallbackForTesting; the gpu tests count
// the fallbacks of the GPT's epilogues, nn::cuda::GemmEpilogueFallbacksForTesting).
// The epilogues are nn::GemmEpilogue (nn/gemm_epilogue.h).

// C_i = alpha * op(A_i) * op(B_i) + beta * C_i for i < batch, as nn::Gemm (nn/ops.h):
// op(A) is [m, k] (A stored [k, m] when trans_a), op(B) is [k, n], C is [m, n]. A and B
// are fp32 or bf16, C fp32, or bf16 when beta == 0; beta == 0 ignores C's old contents.
// Every matrix must lie inside its tensor (InvalidArgument otherwise). On CUDA: cuBLASLt,
// fp32 x fp32 with CUBLAS_COMPUTE_32F (TF32 off), bf16 x bf16 -> fp32 or bf16 with fp32
// accumulation; cublasGemmEx when cuBLASLt's heuristic offers no algorithm.
// An epilogue other than kNone needs batch 1, beta 0, C dense ([m, n], ld n, offset 0),
// `bias` ([n], fp32 or bf16) for kBias, kBiasGelu and kBiasResidual, and `aux` (C's shape
// and dtype, dense, distinct from C) for kBiasGelu (written), kDGelu, kBiasResidual and
// kResidual (read; an fp32 C for the last two); InvalidArgument naming the argument
// otherwise.
// `bias_grad` (NOTE [GEMM epilogues]), when defined: bias_grad[i] += the sum over k of
// op(A)[i, :], the row sums of op(A) as A is stored (bf16 values widened), the bias
// gradient of a weight-gradient GEMM dW = g^T x, whose A is g stored [k, m]. It needs
// trans_a, batch 1, A dense (offset 0, its tensor k x m elements), epilogue kNone and an
// fp32 C; bias_grad fp32 of m elements, distinct from C. With bf16 operands on CUDA the
// GEMM computes the sums (cuBLASLt's BGRADB) into a scratch added to bias_grad, where
// cuBLASLt runs that GEMM on the plain GEMM's grid (tile, split-K); otherwise, and on the
// CPU, they are AccumulateColumnSums of A. The CPU records the fused path's ops for bf16
// operands (the GEMM, then an add of m elements).
struct GemmArgs {
  bool trans_a = false;
  bool trans_b = false;
  int64_t batch = 1;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  float alpha = 1.0f;
  float beta = 0.0f;
  MatrixRef a;
  MatrixRef b;
  MatrixRef c;
  GemmEpilogue epilogue = GemmEpilogue::kNone;
  core::Tensor bias;
  core::Tensor aux;
  core::Tensor bias_grad;
};
absl::Status MatMul(absl::string_view what, const GemmArgs& args);

// The weight-gradient GEMM of a Linear over `rows` rows: dW [out, in] += g^T x, with g
// [rows, out] and x [rows, in] as stored, and bias_grad [out] += the column sums of g when
// defined.
GemmArgs WeightGradientGemm(int64_t rows, int64_t out, int64_t in, const core::Tensor& g,
                            const core::Tensor& x, const core::Tensor& dw,
                            const core::Tensor& bias_grad);

// y = GELU(x) (tanh form), elementwise; x and y fp32 of equal numel (y may be x).
absl::Status GeluForward(absl::string_view what, const core::Tensor& x, const core::Tensor& y);
// gx = gy * GELU'(x); all fp32 of equal numel.
absl::Status GeluBackward(absl::string_view what, const core::Tensor& x, const core::Tensor& gy,
                          const core::Tensor& gx);

// y = max(x, 0); gx = gy where y > 0, else 0.
absl::Status ReluForward(absl::string_view what, const core::Tensor& x, const core::Tensor& y);
absl::Status ReluBackward(absl::string_view what, const core::Tensor& y, const core::Tensor& gy,
                          const core::Tensor& gx);

// out = a + b elementwise; fp32 of equal numel (out may alias a or b).
absl::Status AddTensors(absl::string_view what, const core::Tensor& a, const core::Tensor& b,
                        const core::Tensor& out);

// out[r, j] = x[r, j] + bias[j], x and out fp32 viewed as [numel / bias.numel(),
// bias.numel()] (out may be x); bias fp32 or bf16. InvalidArgument unless bias.numel()
// divides x.numel().
absl::Status BiasAdd(absl::string_view what, const core::Tensor& x, const core::Tensor& bias,
                     const core::Tensor& out);

// acc[j] += sum over rows r of x[r, j] (times y[r, j] when y is defined), with x (and y)
// fp32 viewed as [numel / acc.numel(), acc.numel()]; acc fp32. x may be bf16 when y is
// undefined (a gradient a GEMM epilogue stored bf16). Sums are double on the CPU and fp32
// tree sums on CUDA, added to acc once.
absl::Status AccumulateColumnSums(absl::string_view what, const core::Tensor& x,
                                  const core::Tensor& y, const core::Tensor& acc);

// LayerNorm over the last dimension C = w.numel() of x ([rows, C]): y = xhat * w + b with
// xhat = (x - mean) * rstd, rstd = 1 / sqrt(var + eps). Writes y (fp32, or bf16 rounded
// once for a bf16 GEMM that takes it: NOTE [GEMM epilogues]) and each row's mean and rstd
// (fp32, `rows` elements each, distinct) for the backward, which takes x again and makes
// xhat from them with the forward's bits (kernels::LayerNormHat): the layer keeps its input
// instead of an xhat as large. w, b fp32 or bf16.
absl::Status LayerNormForward(absl::string_view what, const core::Tensor& x, const core::Tensor& w,
                              const core::Tensor& b, float eps, const core::Tensor& y,
                              const core::Tensor& mean, const core::Tensor& rstd);
// gx = rstd * (g w - mean(g w) - xhat mean(g w xhat)) per row, with xhat from the forward's
// input x (fp32, g's numel; not gx) and its mean and rstd; gw += sum_r g xhat and
// gb += sum_r g when they are defined (fp32, C elements).
absl::Status LayerNormBackward(absl::string_view what, const core::Tensor& g, const core::Tensor& x,
                               const core::Tensor& mean, const core::Tensor& rstd,
                               const core::Tensor& w, const core::Tensor& gx,
                               const core::Tensor& gw, const core::Tensor& gb);

// NOTE [Fused ops]: each op below gives, bit for bit, what the unfused ops it names give
// one after the other, with the same argument rules. It makes one pass over memory where
// they make two (a row is still in cache for the second step), so it reads one tensor
// fewer: on the CPU one loop, on CUDA one kernel (residual + LayerNorm, LayerNorm
// backward + residual, and RmsNormBackwardAdd below). nn/functional's fused steps call them
// (NOTE [Block forwards] in nn/transformer.h). Bias and GELU fuse into the GEMMs instead (NOTE
// [GEMM epilogues]).

// h = a + b, then LayerNorm of h: AddTensors(a, b, h) then LayerNormForward(h, w, bias,
// eps, y, mean, rstd). h may be a or b; y, mean and rstd must not overlap the others. The
// backward takes h as its input.
absl::Status AddLayerNormForward(absl::string_view what, const core::Tensor& a,
                                 const core::Tensor& b, const core::Tensor& w,
                                 const core::Tensor& bias, float eps, const core::Tensor& h,
                                 const core::Tensor& y, const core::Tensor& mean,
                                 const core::Tensor& rstd);
// LayerNormBackward(g, x, mean, rstd, w, gx, gw, gb), then gx = residual + gx (AddTensors):
// the gradient of a LayerNorm whose input also feeds a residual connection. residual
// (fp32, g's numel) must not overlap gx. When gx16 is defined (bf16, g's numel) the sum is
// also written there rounded once, in the same pass: the copy a bf16 GEMM that takes gx
// would round (RoundToBf16's bits).
absl::Status LayerNormBackwardAdd(absl::string_view what, const core::Tensor& g,
                                  const core::Tensor& x, const core::Tensor& mean,
                                  const core::Tensor& rstd, const core::Tensor& w,
                                  const core::Tensor& residual, const core::Tensor& gx,
                                  const core::Tensor& gw, const core::Tensor& gb,
                                  const core::Tensor& gx16 = core::Tensor());

// In place on `scores`, fp32 viewed as rows of T: row r is query t = r % T; entries
// s > t become 0 and entries s <= t softmax(scores[0..t]). When `probs16` is defined (bf16,
// the scores' numel), the probabilities go there instead, rounded once, and `scores` is
// scratch (its contents afterwards are unspecified).
absl::Status CausalSoftmaxForward(absl::string_view what, const core::Tensor& scores, int64_t T,
                                  const core::Tensor& probs16 = core::Tensor());
// In place on `g` (fp32 dL/dp, viewed like `p`, which is fp32 or bf16): g = scale * p *
// (g - <g, p>) per row, 0 for the masked entries. When `out16` is defined (bf16, g's
// numel), the result goes there instead, rounded once, and `g` is scratch.
absl::Status CausalSoftmaxBackward(absl::string_view what, const core::Tensor& p,
                                   const core::Tensor& g, int64_t T, float scale,
                                   const core::Tensor& out16 = core::Tensor());

// NOTE [Fused attention] (nn/attention.h): causal attention of every head of qkv
// [B, T, 3C] bf16 (q, k, v at columns 0, C, 2C; head h at columns h*hd ..) in one pass,
// without the [T, T] scores in memory. CUDA only, for the head widths
// FusedAttentionSupported accepts; FailedPrecondition elsewhere, InvalidArgument naming the
// tensor for a wrong shape, dtype or device.
bool FusedAttentionSupported(const core::Device& device, int64_t head_dim);
// y [B, T, C] = the heads' outputs, fp32 or bf16 (y's dtype; bf16 for a bf16 GEMM that
// takes it, rounded once in the kernel); lse [B, H, T] fp32 = what the backward needs of
// each row's softmax (its log2-sum-exp2).
absl::Status FusedAttentionForward(absl::string_view what, const core::Tensor& qkv, int64_t n_head,
                                   float scale, const core::Tensor& y, const core::Tensor& lse);
// gqkv [B, T, 3C] = dL/dqkv (written whole), fp32 or bf16 (its dtype), from the forward's
// qkv, y (fp32 or bf16), lse and gy [B, T, C] bf16 = dL/dy rounded once; delta [B, H, T]
// fp32 is scratch. Deterministic.
absl::Status FusedAttentionBackward(absl::string_view what, const core::Tensor& qkv,
                                    const core::Tensor& y, const core::Tensor& gy,
                                    const core::Tensor& lse, const core::Tensor& delta,
                                    int64_t n_head, float scale, const core::Tensor& gqkv);

// ---- The Llama layers' ops (nn/llama.h; RMSNorm's defined in nn/tensor_ops_norm.cc beside
// LayerNorm's, the others in nn/llama_ops.cc).

// RMSNorm over the last dimension C = w.numel() of x ([rows, C]): y = xhat * w with
// xhat = x * rstd and rstd = 1 / sqrt(mean(x^2) + eps) per row, the statistics in fp32.
// Writes y (x's numel: fp32, or bf16 for a bf16 GEMM that takes it, each element the fp32
// value rounded once: NOTE [GEMM epilogues]) and rstd (fp32, `rows` elements) for the
// backward, which takes x again and makes xhat from it with the forward's bits
// (kernels::RmsNormHat): the layer keeps its input instead of an xhat as large. LayerNorm's
// kernels without the mean and the bias; w fp32 or bf16.
absl::Status RmsNormForward(absl::string_view what, const core::Tensor& x, const core::Tensor& w,
                            float eps, const core::Tensor& y, const core::Tensor& rstd);
// gx = rstd * (g w - xhat mean(g w xhat)) per row, with xhat from the forward's input x
// (fp32, g's numel; not gx) and its rstd; gw += sum_r g xhat when it is defined (fp32, C
// elements), in the same pass where LayerNormBackward's would be.
absl::Status RmsNormBackward(absl::string_view what, const core::Tensor& g, const core::Tensor& x,
                             const core::Tensor& rstd, const core::Tensor& w,
                             const core::Tensor& gx, const core::Tensor& gw);
// NOTE [Fused ops]: RmsNormBackward(g, x, rstd, w, gx, gw), then gx = residual + gx
// (AddTensors), in one pass: the gradient of an RMSNorm whose input also feeds a residual
// connection. residual (fp32, g's numel) must not be gx. When gx16 is defined (bf16, g's
// numel) the sum is also written there rounded once: the copy a bf16 GEMM that takes gx
// would round (RoundToBf16's bits).
absl::Status RmsNormBackwardAdd(absl::string_view what, const core::Tensor& g,
                                const core::Tensor& x, const core::Tensor& rstd,
                                const core::Tensor& w, const core::Tensor& residual,
                                const core::Tensor& gx, const core::Tensor& gw,
                                const core::Tensor& gx16 = core::Tensor());

// h = silu(a) * b elementwise (SwiGLU, silu(a) = a sigmoid(a)); of equal numel, h neither
// a nor b; a and b fp32, h fp32 or bf16 (for a bf16 GEMM that takes it, each element the
// fp32 value rounded once: NOTE [GEMM epilogues]).
absl::Status SiluMulForward(absl::string_view what, const core::Tensor& a, const core::Tensor& b,
                            const core::Tensor& h);
// ga = gh * b * silu'(a) and gb = gh * silu(a); of equal numel, ga and gb distinct from each
// other and from the inputs; a, b, gh fp32, ga and gb each fp32 or bf16 (rounded once, as h).
absl::Status SiluMulBackward(absl::string_view what, const core::Tensor& a, const core::Tensor& b,
                             const core::Tensor& gh, const core::Tensor& ga,
                             const core::Tensor& gb);

// NOTE [Grouped-query attention] (nn/grouped_query_attention.h): the causal attention's
// input qkv [B, T, 3C] (C = n_head * D; the layout of FusedAttentionForward and of
// CausalSelfAttention's qkv) from q [B, T, C] and k, v [B, T, n_kv_head * D], all fp32:
// q and k turned per head by the rotary embedding (cos, sin: fp32 [P, D / 2] with P >= T,
// row t the cosines and sines of position t, nn::RotaryTables), k and v repeated for the
// n_head / n_kv_head query heads of each group. qkv may be bf16 instead (the operand of
// bf16 attention GEMMs, each element the fp32 value rounded once: NOTE [GEMM epilogues]).
// InvalidArgument unless n_head % n_kv_head == 0, D is even and the shapes agree.
absl::Status RotaryPackQkv(absl::string_view what, const core::Tensor& q, const core::Tensor& k,
                           const core::Tensor& v, const core::Tensor& cos, const core::Tensor& sin,
                           int64_t n_head, int64_t n_kv_head, const core::Tensor& qkv);
// Its backward from gqkv [B, T, 3C] (fp32): gq (turned back), gk (turned back) and gv, each
// kv head's gradient the sum over its group's heads; shapes as q, k, v above, each fp32 or
// bf16 (rounded once, for a projection's bf16 GEMMs).
absl::Status RotaryPackQkvBackward(absl::string_view what, const core::Tensor& gqkv,
                                   const core::Tensor& cos, const core::Tensor& sin, int64_t n_head,
                                   int64_t n_kv_head, const core::Tensor& gq,
                                   const core::Tensor& gk, const core::Tensor& gv);

// NOTE [Index uploads]: the token embedding and the cross-entropy check their ids and
// targets on the host, then copy them to the device the op runs on. On CUDA that is a
// cudaMemcpy from pageable host memory (core::Tensor::CopyFrom), which first waits for the
// compute stream to drain: a host sync, which CopyFrom records as one. On the CPU the copy
// is a memcpy, or none; the same host sync is recorded there (NOTE [Op accounting]), so the
// CPU's op list, and the estimate of the step from it, counts the drains the GPU takes.
//
// UploadIndices: dst (int32, host's numel, on any device) = host (int32, on the CPU),
// recording the upload's host sync on every device, and nothing else.
absl::Status UploadIndices(absl::string_view what, const core::Tensor& dst,
                           const core::Tensor& host);
// The host sync of uploading `host` (int32 indices on the CPU) where the CPU path needs no
// copy (the CPU op reads them where they are).
void RecordIndexUpload(const core::Tensor& host);

// y[i, :] = table[ids[i], :], table [num, dim] fp32 or bf16, ids int32 (each in [0, num),
// checked by the caller), y fp32 [ids.numel(), dim].
absl::Status EmbeddingForward(absl::string_view what, const core::Tensor& table,
                              const core::Tensor& ids, const core::Tensor& y);
// gw[ids[i], :] += g[i, :] (gw fp32 [num, dim]). On CUDA the adds are atomic, so their
// order (and the last bits of a row used twice) may vary from run to run.
absl::Status EmbeddingBackward(absl::string_view what, const core::Tensor& ids,
                               const core::Tensor& g, const core::Tensor& gw);

// Cross-entropy rows of logits [n, V] (fp32, or bf16 widened exactly: the same results as
// their fp32 values) with targets (int32, n, each in [0, V),
// checked by the caller): writes grad = (softmax - onehot) / n ([n, V], fp32, or bf16
// rounded once from the fp32 value) and returns the mean loss, on the host (one
// synchronisation on CUDA). With `deferred` non-null it returns NaN instead and sets
// *deferred to what reads the mean loss later, the same value (NOTE [Deferred loss] in
// nn/losses.h): on CUDA the row losses stay on the device until it is called.
absl::StatusOr<double> CrossEntropyForwardBackward(
    absl::string_view what, const core::Tensor& logits, const core::Tensor& targets,
    const core::Tensor& grad, std::function<absl::StatusOr<double>()>* deferred = nullptr);

// Sets every element of `t` to zero (asynchronously on CUDA).
absl::Status ZeroTensor(absl::string_view what, const core::Tensor& t);

// The instruction set of the CPU loops' clones picked for this CPU at load time
// (kernels/cpu_runtime.h): "x86-64-v3" or "default".
using ::kernels::CpuLoopIsa;

// The CPU launchers behind the ops above (and optim's AdamW/SGD) split a call of >= 64K elements
// over an OpenMP team of nn::IntraOpThreads() threads (kernels/cpu_runtime.h; 1 runs each call on
// its caller). Results do not depend on the count: only independent rows, columns or elements are
// split.

}  // namespace nn

#endif  // NN_TENSOR_OPS_H_
