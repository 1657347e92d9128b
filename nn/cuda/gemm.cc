#include "nn/cuda/gemm.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <limits>
#include <memory>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/device.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "nn/cuda/status.h"

namespace nn {
namespace cuda {
namespace {

constexpr int kMaxDevices = 64;
constexpr int64_t kWorkspaceBytes = int64_t{32} << 20;

struct DeviceContext {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
  cublasHandle_t fallback = nullptr;  // cublasGemmStridedBatchedEx's, made on first need
};

std::atomic<bool>& ForceFallback() {
  static std::atomic<bool> force{false};
  return force;
}

std::atomic<int64_t>& EpilogueFallbacks() {
  static std::atomic<int64_t> count{0};
  return count;
}

constexpr absl::string_view kNoAlgorithm =
    "no cuBLASLt algorithm with this epilogue or output type";

// The answer for a problem with an epilogue, a bias gradient or a bf16 C that cuBLASLt
// will not run: the caller falls back (NOTE [GEMM epilogues]). Counted for the tests.
absl::Status NoLtAlgorithm(const std::string& where, absl::string_view why) {
  EpilogueFallbacks().fetch_add(1);
  return absl::UnimplementedError(absl::StrCat(where, ": ", why));
}

std::mutex& ContextMutex() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}

DeviceContext* Contexts() {
  static DeviceContext* contexts = new DeviceContext[kMaxDevices];
  return contexts;
}

// The handle and workspace of `device`, created on first use. They live until the
// process exits (no teardown ordering problems with the CUDA runtime).
absl::StatusOr<DeviceContext*> Context(int device) {
  if (device < 0 || device >= kMaxDevices) {
    return absl::InvalidArgumentError(absl::StrCat("cuBLASLt: device index ", device,
                                                   " outside [0, ", kMaxDevices, ")"));
  }
  std::lock_guard<std::mutex> lock(ContextMutex());
  DeviceContext* ctx = &Contexts()[device];
  if (ctx->handle != nullptr) return ctx;
  RETURN_IF_ERROR(StatusFromCuda(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")")));
  // The workspace comes from core's allocator (tag kOther) so it is counted with the
  // rest of the device memory; the Tensor is leaked on purpose to keep it alive.
  absl::StatusOr<core::Tensor> ws =
      core::Tensor::Allocate({kWorkspaceBytes / 4}, core::DType::kInt32, core::MemoryTag::kOther,
                             core::Device::Cuda(device));
  if (!ws.ok()) {
    return absl::Status(ws.status().code(),
                        absl::StrCat("cuBLASLt workspace on cuda:", device, ": ",
                                     ws.status().message()));
  }
  cublasLtHandle_t handle = nullptr;
  RETURN_IF_ERROR(StatusFromCublas(cublasLtCreate(&handle),
                                   absl::StrCat("cublasLtCreate on cuda:", device)));
  auto* keep = new core::Tensor(*std::move(ws));
  ctx->workspace = keep->raw_data();
  ctx->workspace_bytes = kWorkspaceBytes;
  ctx->handle = handle;
  return ctx;
}

// Destroys the cuBLASLt descriptors it holds when it goes out of scope.
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descriptors() {
    if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
  // Hands the matmul and layout descriptors to the caller (the preference is destroyed).
  void Release(cublasLtMatmulDesc_t* op_out, cublasLtMatrixLayout_t* a_out,
               cublasLtMatrixLayout_t* b_out, cublasLtMatrixLayout_t* c_out) {
    *op_out = op;
    *a_out = a;
    *b_out = b;
    *c_out = c;
    op = nullptr;
    a = b = c = nullptr;
  }
};

// A column-major layout rows x cols with leading dimension ld, batched.
absl::Status MakeLayout(cublasLtMatrixLayout_t* layout, cudaDataType_t type, int64_t rows,
                        int64_t cols, int64_t ld, int32_t batch, int64_t stride,
                        absl::string_view what) {
  RETURN_IF_ERROR(StatusFromCublas(
      cublasLtMatrixLayoutCreate(layout, type, static_cast<uint64_t>(rows),
                                 static_cast<uint64_t>(cols), ld),
      what));
  if (batch > 1) {
    RETURN_IF_ERROR(StatusFromCublas(
        cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                         sizeof(batch)),
        what));
    RETURN_IF_ERROR(StatusFromCublas(
        cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                         &stride, sizeof(stride)),
        what));
  }
  return absl::OkStatus();
}

bool FitsInt32(int64_t v) { return v >= 0 && v <= std::numeric_limits<int32_t>::max(); }

// The alignment in bytes (a power of two, at most 256) every matrix of a batch starts at:
// the lowest set bit of the address and, for batches, of the batch stride in bytes.
// cuBLASLt assumes 256 unless told, and would pick kernels that fault on head offsets.
uint32_t AlignmentOf(const void* ptr, int64_t stride_elements, int64_t element_bytes,
                     int64_t batch) {
  uint64_t bits = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(ptr)) | 256u;
  if (batch > 1) bits |= static_cast<uint64_t>(stride_elements * element_bytes);
  return static_cast<uint32_t>(bits & (~bits + 1));
}

// One problem (device, transposes, types, shapes, leading dimensions, strides, alignments
// and epilogue): everything its descriptors and algorithm depend on.
using GemmKey = std::array<int64_t, 20>;

// A problem's descriptors and the algorithm cuBLASLt's heuristic picked, built on its first
// GEMM and kept until the process exits, so a steady-state step neither rebuilds
// descriptors nor queries the heuristic: about 1,150 GEMMs a step for GPT-2 124M use a
// few dozen problems. `has_algo` false: the heuristic found none (nothing else is set).
// The bias and aux pointers change from call to call: they are set on `op` under `mu`
// just before the matmul that uses them.
struct CachedGemm {
  bool has_algo = false;
  // Set when cublasLtMatmul refused the algorithm the heuristic offered for an epilogue or
  // a bf16 output: later calls take the fallback at once.
  mutable std::atomic<bool> refused{false};
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo;
  mutable std::mutex mu;
};

std::map<GemmKey, const CachedGemm*>& GemmCache() {
  static auto* cache = new std::map<GemmKey, const CachedGemm*>;
  return *cache;
}

// cuBLASLt's epilogue for nn::GemmEpilogue's number `kind`, or for a bias gradient
// (NOTE [GEMM epilogues]).
cublasLtEpilogue_t LtEpilogue(int kind, bool bias_grad) {
  // Our A is cuBLASLt's second operand, B: its bias gradient sums op(A)'s rows over k,
  // one value for each of D's m columns (D is C^T [n x m]).
  if (bias_grad) return CUBLASLT_EPILOGUE_BGRADB;
  switch (kind) {
    case 1:
      return CUBLASLT_EPILOGUE_BIAS;
    case 2:
      return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case 3:
      return CUBLASLT_EPILOGUE_DGELU;
    case 4:  // the residual is C, with beta 1
      return CUBLASLT_EPILOGUE_BIAS;
    default:
      return CUBLASLT_EPILOGUE_DEFAULT;
  }
}

// The descriptors and algorithm of one problem (its arguments as Gemm's, checked), owned
// by the caller.
absl::StatusOr<const CachedGemm*> BuildGemm(DeviceContext* ctx, bool trans_a, bool trans_b,
                                            int64_t batch, int64_t m, int64_t n, int64_t k,
                                            const GemmOperand& a, const GemmOperand& b,
                                            const GemmOperand& c, const GemmEpilogueArgs& ep,
                                            uint32_t align_first, uint32_t align_second,
                                            uint32_t align_c, const std::string& where) {
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLASLt's first
  // operand is our B, its second our A, and its output C^T [n x m] with ld ldc.
  const cudaDataType_t in_type = a.bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const cublasOperation_t op_first = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int32_t batch32 = static_cast<int32_t>(batch);
  Descriptors d;
  RETURN_IF_ERROR(
      StatusFromCublas(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), where));
  RETURN_IF_ERROR(StatusFromCublas(
      cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first,
                                     sizeof(op_first)),
      where));
  RETURN_IF_ERROR(StatusFromCublas(
      cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second,
                                     sizeof(op_second)),
      where));
  // Our B stored row-major [k, n] (or [n, k] when trans_b) is column-major [n, k] ([k, n]).
  RETURN_IF_ERROR(MakeLayout(&d.a, in_type, trans_b ? k : n, trans_b ? n : k, b.ld, batch32,
                             b.stride, where));
  RETURN_IF_ERROR(MakeLayout(&d.b, in_type, trans_a ? m : k, trans_a ? k : m, a.ld, batch32,
                             a.stride, where));
  const cudaDataType_t out_type = c.bf16 ? CUDA_R_16BF : CUDA_R_32F;
  RETURN_IF_ERROR(MakeLayout(&d.c, out_type, n, m, c.ld, batch32, c.stride, where));
  // NOTE [GEMM epilogues]. Column-major, D is C^T [n x m]: the bias runs along D's rows and
  // the aux matrix is [n x m] with leading dimension n, like D.
  if (ep.kind != 0 || ep.bias_grad != nullptr) {
    const cublasLtEpilogue_t epilogue = LtEpilogue(ep.kind, ep.bias_grad != nullptr);
    RETURN_IF_ERROR(StatusFromCublas(
        cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                       sizeof(epilogue)),
        where));
    // The bias, or the bias gradient's fp32 output (cuBLASLt's bias vector either way).
    const void* bias = ep.bias_grad != nullptr ? ep.bias_grad : ep.bias;
    if (bias != nullptr) {
      const int32_t bias_type =
          ep.bias_grad == nullptr && ep.bias_bf16 ? CUDA_R_16BF : CUDA_R_32F;
      RETURN_IF_ERROR(StatusFromCublas(
          cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                         sizeof(bias_type)),
          where));
      RETURN_IF_ERROR(StatusFromCublas(
          cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                         sizeof(bias)),
          where));
    }
    if (ep.aux != nullptr && (ep.kind == 2 || ep.kind == 3)) {  // kind 4's aux is C
      const int64_t aux_ld = n;
      RETURN_IF_ERROR(StatusFromCublas(
          cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ep.aux,
                                         sizeof(ep.aux)),
          where));
      RETURN_IF_ERROR(StatusFromCublas(
          cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
                                         sizeof(aux_ld)),
          where));
    }
  }
  RETURN_IF_ERROR(StatusFromCublas(cublasLtMatmulPreferenceCreate(&d.pref), where));
  const uint64_t ws_bytes = static_cast<uint64_t>(ctx->workspace_bytes);
  RETURN_IF_ERROR(StatusFromCublas(
      cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &ws_bytes, sizeof(ws_bytes)),
      where));
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_first},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_second},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c}};
  for (const auto& [attribute, bytes] : alignments) {
    RETURN_IF_ERROR(StatusFromCublas(
        cublasLtMatmulPreferenceSetAttribute(d.pref, attribute, &bytes, sizeof(bytes)), where));
  }
  cublasLtMatmulHeuristicResult_t heuristic = {};
  int found = 0;
  const cublasStatus_t queried = cublasLtMatmulAlgoGetHeuristic(
      ctx->handle, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &heuristic, &found);
  auto* built = new CachedGemm;
  // An unsupported combination (an epilogue or a type this cuBLASLt lacks; for an epilogue
  // or a bf16 output also one it calls an invalid value, as cublasLtMatmul's refusal
  // below) is "no algorithm", like an empty answer: the caller falls back.
  const bool plain = ep.kind == 0 && !c.bf16 && ep.bias_grad == nullptr;
  if (queried == CUBLAS_STATUS_NOT_SUPPORTED ||
      (!plain && queried == CUBLAS_STATUS_INVALID_VALUE) ||
      (queried == CUBLAS_STATUS_SUCCESS &&
       (found < 1 || heuristic.state != CUBLAS_STATUS_SUCCESS))) {
    return built;
  }
  if (queried != CUBLAS_STATUS_SUCCESS) {
    delete built;
    return StatusFromCublas(queried, where);
  }
  built->has_algo = true;
  built->algo = heuristic.algo;
  d.Release(&built->op, &built->a, &built->b, &built->c);
  return built;
}

// Whether two algorithms split the problem over the same grid: the same tile, split-K
// count, reduction scheme and cluster shape (unreadable attributes count as different).
bool SameGrid(const cublasLtMatmulAlgo_t& x, const cublasLtMatmulAlgo_t& y) {
  auto same = [&](cublasLtMatmulAlgoConfigAttributes_t attribute, size_t bytes) {
    uint32_t vx = 0, vy = 0;  // every attribute compared fits in 4 bytes
    size_t written = 0;
    return cublasLtMatmulAlgoConfigGetAttribute(&x, attribute, &vx, bytes, &written) ==
               CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulAlgoConfigGetAttribute(&y, attribute, &vy, bytes, &written) ==
               CUBLAS_STATUS_SUCCESS &&
           vx == vy;
  };
  return same(CUBLASLT_ALGO_CONFIG_TILE_ID, sizeof(uint32_t)) &&
         same(CUBLASLT_ALGO_CONFIG_SPLITK_NUM, sizeof(int32_t)) &&
         same(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, sizeof(uint32_t)) &&
         same(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, sizeof(uint16_t));
}

// C = alpha op(A) op(B) + beta C through cublasGemmStridedBatchedEx (fp32 C only), for the
// plain problems cuBLASLt's heuristic has no algorithm for.
absl::Status GemmEx(DeviceContext* ctx, int device, bool trans_a, bool trans_b, int64_t batch,
                    int64_t m, int64_t n, int64_t k, float alpha, const GemmOperand& a,
                    const GemmOperand& b, float beta, const GemmOperand& c,
                    const std::string& where) {
  {
    std::lock_guard<std::mutex> lock(ContextMutex());
    if (ctx->fallback == nullptr) {
      cublasHandle_t handle = nullptr;
      RETURN_IF_ERROR(StatusFromCublas(cublasCreate(&handle),
                                       absl::StrCat("cublasCreate on cuda:", device)));
      // The legacy default stream (the compute stream), no TF32 (CUBLAS_COMPUTE_32F).
      RETURN_IF_ERROR(StatusFromCublas(cublasSetStream(handle, nullptr), where));
      ctx->fallback = handle;
    }
  }
  const cudaDataType_t in_type = a.bf16 ? CUDA_R_16BF : CUDA_R_32F;
  // Column-major, as BuildGemm: C^T = op(B)^T op(A)^T.
  return StatusFromCublas(
      cublasGemmStridedBatchedEx(
          ctx->fallback, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
          static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b.ptr, in_type,
          static_cast<int>(b.ld), b.stride, a.ptr, in_type, static_cast<int>(a.ld), a.stride,
          &beta, const_cast<void*>(c.ptr), CUDA_R_32F, static_cast<int>(c.ld), c.stride,
          static_cast<int>(batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      absl::StrCat(where, " (cublasGemmStridedBatchedEx)"));
}

}  // namespace

void ForceGemmFallbackForTesting(bool on) { ForceFallback().store(on); }

int64_t GemmEpilogueFallbacksForTesting() { return EpilogueFallbacks().load(); }

absl::Status Gemm(int device, bool trans_a, bool trans_b, int64_t batch, int64_t m, int64_t n,
                  int64_t k, float alpha, const GemmOperand& a, const GemmOperand& b, float beta,
                  const GemmOperand& c, absl::string_view what, const GemmEpilogueArgs& ep) {
  const std::string where = absl::StrCat(what, ": cuBLASLt GEMM [", m, " x ", k, "] x [", k,
                                         " x ", n, "] batch ", batch, " on cuda:", device);
  if (a.bf16 != b.bf16) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": operands must both be fp32 or both bf16"));
  }
  if (c.bf16 && beta != 0.0f) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": a bf16 C needs beta 0"));
  }
  if (ep.kind < 0 || ep.kind > 4 ||
      ((ep.kind == 1 || ep.kind == 2 || ep.kind == 4) && ep.bias == nullptr) ||
      ((ep.kind == 2 || ep.kind == 3 || ep.kind == 4) && ep.aux == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": epilogue ", ep.kind, " lacks its bias or aux pointer"));
  }
  if (ep.kind != 0 && (batch != 1 || c.ld != n)) {
    // cuBLASLt's aux and bias vectors are set for one dense matrix (no batch strides).
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": an epilogue needs batch 1 and a dense C (ld ", c.ld, ", n ", n,
                     ")"));
  }
  if (ep.kind == 4 && (c.bf16 || beta != 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": the bias + residual epilogue needs an fp32 C and beta 0"));
  }
  if (ep.bias_grad != nullptr && (ep.kind != 0 || !a.bf16 || !trans_a || batch != 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": a bias gradient needs no other epilogue, bf16 operands, a transposed A and "
        "batch 1"));
  }
  if (batch < 1 || m < 1 || n < 1 || k < 1 || !FitsInt32(batch) || !FitsInt32(m) ||
      !FitsInt32(n) || !FitsInt32(k) || !FitsInt32(a.ld) || !FitsInt32(b.ld) ||
      !FitsInt32(c.ld)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": sizes must be in [1, 2^31) (lda ", a.ld, ", ldb ", b.ld, ", ldc ",
                     c.ld, ")"));
  }
  ASSIGN_OR_RETURN(DeviceContext * ctx, Context(device));
  RETURN_IF_ERROR(StatusFromCuda(cudaSetDevice(device), where));
  const bool plain = ep.kind == 0 && !c.bf16 && ep.bias_grad == nullptr;
  // cuBLASLt's epilogues, bf16 D and its aux need bf16 operands (fp32 ones take the
  // fallback), and the GELU aux matrix a leading dimension divisible by 8. The bias (or
  // bias gradient) and the GELU aux go to it 16-byte aligned only: the heuristic is told
  // their alignment, but users of its epilogues (llm.c, Marian) saw misaligned bias
  // vectors fault, and a fault would end the process's use of the device.
  const bool gelu_aux = ep.kind == 2 || ep.kind == 3;
  const void* bias_ptr = ep.bias_grad != nullptr ? ep.bias_grad : ep.bias;
  const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool lt_can = plain || (a.bf16 && (!gelu_aux || (n % 8 == 0 && aligned16(ep.aux))) &&
                                (bias_ptr == nullptr || aligned16(bias_ptr)));
  if (ForceFallback().load() || !lt_can) {
    if (!plain) return NoLtAlgorithm(where, kNoAlgorithm);
    return GemmEx(ctx, device, trans_a, trans_b, batch, m, n, k, alpha, a, b, beta, c, where);
  }
  const int64_t in_bytes = a.bf16 ? 2 : 4;
  const uint32_t align_first = AlignmentOf(b.ptr, b.stride, in_bytes, batch);
  const uint32_t align_second = AlignmentOf(a.ptr, a.stride, in_bytes, batch);
  // Kind 4 reads its residual as cuBLASLt's C: the alignment of both C and D.
  const uint32_t align_c =
      std::min(AlignmentOf(c.ptr, c.stride, c.bf16 ? 2 : 4, batch),
               ep.kind == 4 ? AlignmentOf(ep.aux, c.stride, 4, batch) : uint32_t{256});
  const uint32_t align_bias = bias_ptr != nullptr ? AlignmentOf(bias_ptr, 0, 0, 1) : 0;
  const uint32_t align_aux = ep.aux != nullptr ? AlignmentOf(ep.aux, 0, 0, 1) : 0;
  const GemmKey key = {device,       trans_a ? 1 : 0, trans_b ? 1 : 0, a.bf16 ? 1 : 0,
                       batch,        m,               n,               k,
                       a.ld,         b.ld,            c.ld,            a.stride,
                       b.stride,     c.stride,        align_first | (int64_t{align_second} << 16),
                       align_c,      c.bf16 ? 1 : 0,
                       ep.kind | (ep.bias_bf16 ? 16 : 0) | (ep.bias_grad != nullptr ? 32 : 0),
                       align_bias,   align_aux};
  // The cached problem of `problem_key`, built with `problem_ep` on its first use.
  auto cached = [&](const GemmKey& problem_key, const GemmEpilogueArgs& problem_ep,
                    bool* built) -> absl::StatusOr<const CachedGemm*> {
    {
      std::lock_guard<std::mutex> lock(ContextMutex());
      auto it = GemmCache().find(problem_key);
      if (it != GemmCache().end()) return it->second;
    }
    ASSIGN_OR_RETURN(const CachedGemm* fresh,
                     BuildGemm(ctx, trans_a, trans_b, batch, m, n, k, a, b, c, problem_ep,
                               align_first, align_second, align_c, where));
    std::lock_guard<std::mutex> lock(ContextMutex());
    auto [it, inserted] = GemmCache().emplace(problem_key, fresh);
    if (!inserted) {  // another thread built it meanwhile: use the cached one
      delete fresh;   // (its descriptors leak; a race on a first use only)
      return it->second;
    }
    *built = true;
    return fresh;
  };
  bool built = false;
  ASSIGN_OR_RETURN(const CachedGemm* gemm, cached(key, ep, &built));
  if (built && ep.bias_grad != nullptr && gemm->has_algo) {
    // NOTE [GEMM epilogues]: the bias gradient rides in the GEMM only where cuBLASLt runs
    // it on the plain GEMM's grid (tile, split-K, reduction, cluster): an epilogue that
    // costs the GEMM its split-K would lose more than the column-sums pass it saves.
    GemmKey plain_key = key;
    plain_key[17] = ep.kind | (ep.bias_bf16 ? 16 : 0);
    plain_key[18] = 0;
    bool unused = false;
    const absl::StatusOr<const CachedGemm*> plain_gemm =
        cached(plain_key, GemmEpilogueArgs(), &unused);
    if (!plain_gemm.ok() || !(*plain_gemm)->has_algo ||
        !SameGrid(gemm->algo, (*plain_gemm)->algo)) {
      gemm->refused.store(true);  // unchecked is refused: later calls take the fallback
    }
    RETURN_IF_ERROR(plain_gemm.status());
  }
  if (!gemm->has_algo || gemm->refused.load()) {
    if (!plain) return NoLtAlgorithm(where, kNoAlgorithm);
    return GemmEx(ctx, device, trans_a, trans_b, batch, m, n, k, alpha, a, b, beta, c, where);
  }
  std::lock_guard<std::mutex> lock(gemm->mu);
  if (bias_ptr != nullptr) {
    RETURN_IF_ERROR(StatusFromCublas(
        cublasLtMatmulDescSetAttribute(gemm->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr,
                                       sizeof(bias_ptr)),
        where));
  }
  if (gelu_aux) {
    RETURN_IF_ERROR(StatusFromCublas(
        cublasLtMatmulDescSetAttribute(gemm->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                       &ep.aux, sizeof(ep.aux)),
        where));
  }
  // Kind 4: D = (P + residual) + bias, the residual as C with beta 1.
  const void* c_in = ep.kind == 4 ? ep.aux : c.ptr;
  const float beta_in = ep.kind == 4 ? 1.0f : beta;
  const cublasStatus_t ran =
      cublasLtMatmul(ctx->handle, gemm->op, &alpha, b.ptr, gemm->a, a.ptr, gemm->b, &beta_in,
                     c_in, gemm->c, const_cast<void*>(c.ptr), gemm->c, &gemm->algo,
                     ctx->workspace, static_cast<size_t>(ctx->workspace_bytes), /*stream=*/0);
  if (!plain && (ran == CUBLAS_STATUS_NOT_SUPPORTED || ran == CUBLAS_STATUS_INVALID_VALUE)) {
    // Checked before anything is queued: nothing ran, the caller's fallback runs instead.
    gemm->refused.store(true);
    return NoLtAlgorithm(where, "cuBLASLt refused the epilogue or output type");
  }
  return StatusFromCublas(ran, where);
}

}  // namespace cuda
}  // namespace nn
