#include "nn/cuda/gemm.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/device.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "kernels/cuda/kernels.h"
#include "kernels/tuning_switches.h"
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

// NOTE [GEMM tuning] (gemm.h): on unless FSDP_GEMM_TUNING=0 is in the environment.
std::atomic<bool>& TuningOn() {
  static std::atomic<bool> on{::kernels::TuningSwitchOn(std::getenv(::kernels::kGemmTuningEnv))};
  return on;
}

std::mutex& ReportMutex() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}

std::vector<std::string>& TuningReports() {
  static auto* reports = new std::vector<std::string>;
  return *reports;
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
    return absl::InvalidArgumentError(
        absl::StrCat("cuBLASLt: device index ", device, " outside [0, ", kMaxDevices, ")"));
  }
  std::lock_guard<std::mutex> lock(ContextMutex());
  DeviceContext* ctx = &Contexts()[device];
  if (ctx->handle != nullptr) return ctx;
  RETURN_IF_ERROR(
      StatusFromCuda(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")")));
  // The workspace comes from core's allocator (tag kOther) so it is counted with the
  // rest of the device memory; the Tensor is leaked on purpose to keep it alive.
  absl::StatusOr<core::Tensor> ws =
      core::Tensor::Allocate({kWorkspaceBytes / 4}, core::DType::kInt32, core::MemoryTag::kOther,
                             core::Device::Cuda(device));
  if (!ws.ok()) {
    return core::Annotate(ws.status(), absl::StrCat("cuBLASLt workspace on cuda:", device));
  }
  cublasLtHandle_t handle = nullptr;
  RETURN_IF_ERROR(
      StatusFromCublas(cublasLtCreate(&handle), absl::StrCat("cublasLtCreate on cuda:", device)));
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
  RETURN_IF_ERROR(
      StatusFromCublas(cublasLtMatrixLayoutCreate(layout, type, static_cast<uint64_t>(rows),
                                                  static_cast<uint64_t>(cols), ld),
                       what));
  if (batch > 1) {
    RETURN_IF_ERROR(
        StatusFromCublas(cublasLtMatrixLayoutSetAttribute(
                             *layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)),
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

// One call of Gemm: its arguments, and `where`, the prefix of its errors and report lines.
struct GemmCall {
  int device;
  bool trans_a, trans_b;
  int64_t batch, m, n, k;
  float alpha;
  GemmOperand a, b;
  float beta;
  GemmOperand c;
  GemmEpilogueArgs ep;
  std::string where;
};

// Whether the epilogue adds a bias: kBias, kBiasGelu and kBiasResidual.
bool AddsBias(GemmEpilogue kind) {
  return kind == GemmEpilogue::kBias || kind == GemmEpilogue::kBiasGelu ||
         kind == GemmEpilogue::kBiasResidual;
}

// Whether the epilogue writes (kBiasGelu) or reads (kDGelu) cuBLASLt's GELU aux matrix.
bool GeluAux(GemmEpilogue kind) {
  return kind == GemmEpilogue::kBiasGelu || kind == GemmEpilogue::kDGelu;
}

// Whether the epilogue reads a residual as cuBLASLt's C, with beta 1, writing D away from
// it: kBiasResidual and kResidual.
bool ResidualIsC(GemmEpilogue kind) {
  return kind == GemmEpilogue::kBiasResidual || kind == GemmEpilogue::kResidual;
}

// cuBLASLt's bias vector: the bias, or the bias gradient's fp32 output.
const void* BiasPointer(const GemmEpilogueArgs& ep) {
  return ep.bias_grad != nullptr ? ep.bias_grad : ep.bias;
}

// No epilogue, no bias gradient and an fp32 C: the problems cublasGemmStridedBatchedEx
// takes when cuBLASLt does not.
bool Plain(const GemmCall& call) {
  return call.ep.kind == GemmEpilogue::kNone && !call.c.bf16 && call.ep.bias_grad == nullptr;
}

// InvalidArgument naming `where` and the offending argument, or OK: Gemm's contract
// (nn/cuda/gemm.h).
absl::Status ValidateGemm(const GemmCall& call) {
  const auto& [device, trans_a, trans_b, batch, m, n, k, alpha, a, b, beta, c, ep, where] = call;
  if (a.bf16 != b.bf16) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": operands must both be fp32 or both bf16"));
  }
  if (c.bf16 && beta != 0.0f) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": a bf16 C needs beta 0"));
  }
  if (ep.kind < GemmEpilogue::kNone || ep.kind > GemmEpilogue::kResidual ||
      (AddsBias(ep.kind) && ep.bias == nullptr) ||
      ((GeluAux(ep.kind) || ResidualIsC(ep.kind)) && ep.aux == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": epilogue ", static_cast<int>(ep.kind),
                                                   " lacks its bias or aux pointer"));
  }
  if (ep.kind != GemmEpilogue::kNone && (batch != 1 || c.ld != n)) {
    // cuBLASLt's aux and bias vectors are set for one dense matrix (no batch strides).
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": an epilogue needs batch 1 and a dense C (ld ", c.ld, ", n ", n, ")"));
  }
  if (ResidualIsC(ep.kind) && (c.bf16 || beta != 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": a residual epilogue needs an fp32 C and beta 0"));
  }
  if (ep.bias_grad != nullptr &&
      (ep.kind != GemmEpilogue::kNone || !a.bf16 || !trans_a || batch != 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where,
                     ": a bias gradient needs no other epilogue, bf16 operands, a transposed A and "
                     "batch 1"));
  }
  if (batch < 1 || m < 1 || n < 1 || k < 1 || !FitsInt32(batch) || !FitsInt32(m) || !FitsInt32(n) ||
      !FitsInt32(k) || !FitsInt32(a.ld) || !FitsInt32(b.ld) || !FitsInt32(c.ld)) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": sizes must be in [1, 2^31) (lda ",
                                                   a.ld, ", ldb ", b.ld, ", ldc ", c.ld, ")"));
  }
  return absl::OkStatus();
}

// Whether cuBLASLt may be asked about the call at all. Its epilogues, bf16 D and its aux
// need bf16 operands (fp32 ones take the fallback), and the GELU aux matrix a leading
// dimension divisible by 8. The bias (or bias gradient) and the GELU aux go to it 16-byte
// aligned only: the heuristic is told their alignment, but users of its epilogues (llm.c,
// Marian) saw misaligned bias vectors fault, and a fault would end the process's use of
// the device.
bool LtCanRun(const GemmCall& call) {
  const GemmEpilogueArgs& ep = call.ep;
  const void* bias_ptr = BiasPointer(ep);
  const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return Plain(call) ||
         (call.a.bf16 && (!GeluAux(ep.kind) || (call.n % 8 == 0 && aligned16(ep.aux))) &&
          (bias_ptr == nullptr || aligned16(bias_ptr)));
}

// The alignments (AlignmentOf) cuBLASLt is told and a problem's key holds: cuBLASLt's
// first operand (our B), its second (our A), C and D, the bias vector and the aux matrix
// (0 for an absent one).
struct Alignments {
  uint32_t first, second, c, bias, aux;
};

Alignments AlignmentsOf(const GemmCall& call) {
  const int64_t in_bytes = call.a.bf16 ? 2 : 4;
  const void* bias_ptr = BiasPointer(call.ep);
  Alignments align;
  align.first = AlignmentOf(call.b.ptr, call.b.stride, in_bytes, call.batch);
  align.second = AlignmentOf(call.a.ptr, call.a.stride, in_bytes, call.batch);
  // kBiasResidual and kResidual read their residual as cuBLASLt's C: the alignment of both
  // C and D.
  align.c =
      std::min(AlignmentOf(call.c.ptr, call.c.stride, call.c.bf16 ? 2 : 4, call.batch),
               ResidualIsC(call.ep.kind) ? AlignmentOf(call.ep.aux, call.c.stride, 4, call.batch)
                                         : uint32_t{256});
  align.bias = bias_ptr != nullptr ? AlignmentOf(bias_ptr, 0, 0, 1) : 0;
  align.aux = call.ep.aux != nullptr ? AlignmentOf(call.ep.aux, 0, 0, 1) : 0;
  return align;
}

// One problem (device, transposes, types, shapes, leading dimensions, strides, alignments
// and epilogue, and whether tuning was on): everything its descriptors and algorithm
// depend on.
struct GemmKey {
  int device;
  bool trans_a, trans_b, bf16_operands;
  int64_t batch, m, n, k;
  int64_t lda, ldb, ldc;
  int64_t stride_a, stride_b, stride_c;
  uint32_t align_first, align_second, align_c;
  bool bf16_c;
  GemmEpilogue epilogue;
  bool bias_bf16, bias_grad;
  uint32_t align_bias, align_aux;
  bool tuning;

  auto Fields() const {
    return std::tie(device, trans_a, trans_b, bf16_operands, batch, m, n, k, lda, ldb, ldc,
                    stride_a, stride_b, stride_c, align_first, align_second, align_c, bf16_c,
                    epilogue, bias_bf16, bias_grad, align_bias, align_aux, tuning);
  }
  bool operator<(const GemmKey& other) const { return Fields() < other.Fields(); }

  // The same problem without its epilogue or bias gradient, at the same alignments of the
  // operands, C and D.
  GemmKey WithoutEpilogue() const {
    GemmKey plain = *this;
    plain.epilogue = GemmEpilogue::kNone;
    plain.bias_bf16 = plain.bias_grad = false;
    plain.align_bias = plain.align_aux = 0;
    return plain;
  }
};

GemmKey KeyOf(const GemmCall& call, const Alignments& align, bool tune) {
  GemmKey key;
  key.device = call.device;
  key.trans_a = call.trans_a;
  key.trans_b = call.trans_b;
  key.bf16_operands = call.a.bf16;
  key.batch = call.batch;
  key.m = call.m;
  key.n = call.n;
  key.k = call.k;
  key.lda = call.a.ld;
  key.ldb = call.b.ld;
  key.ldc = call.c.ld;
  key.stride_a = call.a.stride;
  key.stride_b = call.b.stride;
  key.stride_c = call.c.stride;
  key.align_first = align.first;
  key.align_second = align.second;
  key.align_c = align.c;
  key.bf16_c = call.c.bf16;
  key.epilogue = call.ep.kind;
  key.bias_bf16 = call.ep.bias_bf16;
  key.bias_grad = call.ep.bias_grad != nullptr;
  key.align_bias = align.bias;
  key.align_aux = align.aux;
  key.tuning = tune;
  return key;
}

// How many of the heuristic's answers a tuned problem tries, and the timed runs of each.
constexpr int kCandidates = 8;
constexpr int kTimedRuns = 3;

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
  // The heuristic's first answer; its other answers when built for tuning.
  cublasLtMatmulAlgo_t first;
  std::vector<cublasLtMatmulAlgo_t> others;
  // What runs: `first` until the first GEMM tunes (NOTE [GEMM tuning]), under `mu`.
  mutable cublasLtMatmulAlgo_t algo;
  mutable bool tuned = false;
  mutable float tuned_beta = 0.0f;  // the beta `algo` was checked with
  // Whether GemmTuningReport has the line saying this problem takes the fallback.
  mutable std::atomic<bool> fallback_reported{false};
  mutable std::mutex mu;
};

std::map<GemmKey, const CachedGemm*>& GemmCache() {
  static auto* cache = new std::map<GemmKey, const CachedGemm*>;
  return *cache;
}

// cuBLASLt's epilogue for `kind`, or for a bias gradient (NOTE [GEMM epilogues]).
cublasLtEpilogue_t LtEpilogue(GemmEpilogue kind, bool bias_grad) {
  // Our A is cuBLASLt's second operand, B: its bias gradient sums op(A)'s rows over k,
  // one value for each of D's m columns (D is C^T [n x m]).
  if (bias_grad) return CUBLASLT_EPILOGUE_BGRADB;
  switch (kind) {
    case GemmEpilogue::kBias:
      return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::kBiasGelu:
      return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case GemmEpilogue::kDGelu:
      return CUBLASLT_EPILOGUE_DGELU;
    case GemmEpilogue::kBiasResidual:  // the residual is C, with beta 1
      return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::kNone:
    case GemmEpilogue::kResidual:  // the residual is C, with beta 1
      break;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// An algorithm's capability `cap` (an int32 or uint64 one) into *value; false where it
// cannot be read.
bool AlgoCapability(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoCapAttributes_t cap,
                    uint64_t* value) {
  *value = 0;
  size_t written = 0;
  const size_t bytes =
      cap == CUBLASLT_ALGO_CAP_NUMERICAL_IMPL_FLAGS ? sizeof(uint64_t) : sizeof(int32_t);
  return cublasLtMatmulAlgoCapGetAttribute(&algo, cap, value, bytes, &written) ==
         CUBLAS_STATUS_SUCCESS;
}

// Sets the epilogue of `call` (NOTE [GEMM epilogues]) on `op`, with the bias and aux
// pointers of the call that builds the problem (later calls set their own, SetCallPointers).
// Column-major, D is C^T [n x m]: the bias runs along D's rows and the aux matrix is [n x m]
// with leading dimension n, like D.
absl::Status SetEpilogue(cublasLtMatmulDesc_t op, const GemmCall& call) {
  const GemmEpilogueArgs& ep = call.ep;
  const std::string& where = call.where;
  const cublasLtEpilogue_t epilogue = LtEpilogue(ep.kind, ep.bias_grad != nullptr);
  RETURN_IF_ERROR(StatusFromCublas(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                                  &epilogue, sizeof(epilogue)),
                                   where));
  // The bias, or the bias gradient's fp32 output (cuBLASLt's bias vector either way).
  const void* bias = BiasPointer(ep);
  if (bias != nullptr) {
    const int32_t bias_type = ep.bias_grad == nullptr && ep.bias_bf16 ? CUDA_R_16BF : CUDA_R_32F;
    RETURN_IF_ERROR(
        StatusFromCublas(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                        &bias_type, sizeof(bias_type)),
                         where));
    RETURN_IF_ERROR(StatusFromCublas(
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
        where));
  }
  if (ep.aux != nullptr && GeluAux(ep.kind)) {  // kBiasResidual's and kResidual's aux is C
    const int64_t aux_ld = call.n;
    RETURN_IF_ERROR(StatusFromCublas(
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ep.aux,
                                       sizeof(ep.aux)),
        where));
    RETURN_IF_ERROR(
        StatusFromCublas(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                        &aux_ld, sizeof(aux_ld)),
                         where));
  }
  return absl::OkStatus();
}

// The matmul and layout descriptors of `call` into `d`.
absl::Status MakeDescriptors(const GemmCall& call, Descriptors* d) {
  const auto& [device, trans_a, trans_b, batch, m, n, k, alpha, a, b, beta, c, ep, where] = call;
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLASLt's first
  // operand is our B, its second our A, and its output C^T [n x m] with ld ldc.
  const cudaDataType_t in_type = a.bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const cublasOperation_t op_first = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int32_t batch32 = static_cast<int32_t>(batch);
  RETURN_IF_ERROR(
      StatusFromCublas(cublasLtMatmulDescCreate(&d->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), where));
  RETURN_IF_ERROR(
      StatusFromCublas(cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first,
                                                      sizeof(op_first)),
                       where));
  RETURN_IF_ERROR(
      StatusFromCublas(cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_TRANSB,
                                                      &op_second, sizeof(op_second)),
                       where));
  // Our B stored row-major [k, n] (or [n, k] when trans_b) is column-major [n, k] ([k, n]).
  RETURN_IF_ERROR(
      MakeLayout(&d->a, in_type, trans_b ? k : n, trans_b ? n : k, b.ld, batch32, b.stride, where));
  RETURN_IF_ERROR(
      MakeLayout(&d->b, in_type, trans_a ? m : k, trans_a ? k : m, a.ld, batch32, a.stride, where));
  const cudaDataType_t out_type = c.bf16 ? CUDA_R_16BF : CUDA_R_32F;
  RETURN_IF_ERROR(MakeLayout(&d->c, out_type, n, m, c.ld, batch32, c.stride, where));
  if (ep.kind != GemmEpilogue::kNone || ep.bias_grad != nullptr) {
    RETURN_IF_ERROR(SetEpilogue(d->op, call));
  }
  return absl::OkStatus();
}

// The heuristic's preference into `d`: the workspace, and the alignments of the operands,
// C and D.
absl::Status MakePreference(const DeviceContext& ctx, const Alignments& align, Descriptors* d,
                            const std::string& where) {
  RETURN_IF_ERROR(StatusFromCublas(cublasLtMatmulPreferenceCreate(&d->pref), where));
  const uint64_t ws_bytes = static_cast<uint64_t>(ctx.workspace_bytes);
  RETURN_IF_ERROR(StatusFromCublas(
      cublasLtMatmulPreferenceSetAttribute(d->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &ws_bytes, sizeof(ws_bytes)),
      where));
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align.first},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align.second},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align.c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align.c}};
  for (const auto& [attribute, bytes] : alignments) {
    RETURN_IF_ERROR(StatusFromCublas(
        cublasLtMatmulPreferenceSetAttribute(d->pref, attribute, &bytes, sizeof(bytes)), where));
  }
  return absl::OkStatus();
}

// The heuristic's usable answers for `d`, best first: those that run without error, and
// write out of place where `out_of_place`. `*queried` is the heuristic's own status.
std::vector<cublasLtMatmulAlgo_t> UsableAnswers(const DeviceContext& ctx, const Descriptors& d,
                                                bool out_of_place, cublasStatus_t* queried) {
  // As many answers with tuning off as on, so both take the same first one.
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int found = 0;
  *queried = cublasLtMatmulAlgoGetHeuristic(ctx.handle, d.op, d.a, d.b, d.c, d.c, d.pref,
                                            kCandidates, results, &found);
  std::vector<cublasLtMatmulAlgo_t> usable;
  for (int i = 0; *queried == CUBLAS_STATUS_SUCCESS && i < found && i < kCandidates; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
    uint64_t out_of_place_ok = 0;
    if (out_of_place &&
        (!AlgoCapability(results[i].algo, CUBLASLT_ALGO_CAP_OUT_OF_PLACE_RESULT_SUPPORT,
                         &out_of_place_ok) ||
         out_of_place_ok == 0)) {
      continue;
    }
    usable.push_back(results[i].algo);
  }
  return usable;
}

// The descriptors and algorithm of the problem of `call` (checked), owned by the caller;
// with the heuristic's other answers where `tune`.
absl::StatusOr<const CachedGemm*> BuildGemm(DeviceContext* ctx, const GemmCall& call,
                                            const Alignments& align, bool tune) {
  Descriptors d;
  RETURN_IF_ERROR(MakeDescriptors(call, &d));
  RETURN_IF_ERROR(MakePreference(*ctx, align, &d, call.where));
  // kBiasResidual and kResidual write D away from their C (the residual).
  cublasStatus_t queried = CUBLAS_STATUS_SUCCESS;
  const std::vector<cublasLtMatmulAlgo_t> usable =
      UsableAnswers(*ctx, d, ResidualIsC(call.ep.kind), &queried);
  auto* built = new CachedGemm;
  // An unsupported combination (an epilogue or a type this cuBLASLt lacks; for an epilogue
  // or a bf16 output also one it calls an invalid value, as cublasLtMatmul's refusal in
  // LaunchLt) is "no algorithm", like an empty answer: the caller falls back.
  if (queried == CUBLAS_STATUS_NOT_SUPPORTED ||
      (!Plain(call) && queried == CUBLAS_STATUS_INVALID_VALUE) ||
      (queried == CUBLAS_STATUS_SUCCESS && usable.empty())) {
    return built;
  }
  if (queried != CUBLAS_STATUS_SUCCESS) {
    delete built;
    return StatusFromCublas(queried, call.where);
  }
  built->has_algo = true;
  built->first = built->algo = usable[0];
  if (tune) built->others.assign(usable.begin() + 1, usable.end());
  d.Release(&built->op, &built->a, &built->b, &built->c);
  return built;
}

// `algo`'s value of `attribute` (`bytes` wide, at most 4, read little-endian into the low
// bytes), or nullopt when cuBLASLt cannot read it.
std::optional<uint32_t> ConfigValue(const cublasLtMatmulAlgo_t& algo,
                                    cublasLtMatmulAlgoConfigAttributes_t attribute, size_t bytes) {
  uint32_t value = 0;
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attribute, &value, bytes, &written) !=
      CUBLAS_STATUS_SUCCESS) {
    return std::nullopt;
  }
  return value;
}

// Whether two algorithms have the same value of `attribute` (`bytes` wide, at most 4);
// an unreadable attribute counts as different.
bool SameAttribute(const cublasLtMatmulAlgo_t& x, const cublasLtMatmulAlgo_t& y,
                   cublasLtMatmulAlgoConfigAttributes_t attribute, size_t bytes) {
  const std::optional<uint32_t> vx = ConfigValue(x, attribute, bytes);
  const std::optional<uint32_t> vy = ConfigValue(y, attribute, bytes);
  return vx.has_value() && vy.has_value() && *vx == *vy;
}

// Whether two algorithms sum over k alike: the same split-K count and reduction scheme,
// and the same numerical implementation (cuBLASLt's flags: FMA or HMMA and its shape,
// accumulator and input types).
bool SameSums(const cublasLtMatmulAlgo_t& x, const cublasLtMatmulAlgo_t& y) {
  uint64_t fx = 0, fy = 0;
  return SameAttribute(x, y, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, sizeof(int32_t)) &&
         SameAttribute(x, y, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, sizeof(uint32_t)) &&
         AlgoCapability(x, CUBLASLT_ALGO_CAP_NUMERICAL_IMPL_FLAGS, &fx) &&
         AlgoCapability(y, CUBLASLT_ALGO_CAP_NUMERICAL_IMPL_FLAGS, &fy) && fx == fy;
}

// Whether two algorithms split the problem over the same grid: the same tile, split-K
// count, reduction scheme and cluster shape.
bool SameGrid(const cublasLtMatmulAlgo_t& x, const cublasLtMatmulAlgo_t& y) {
  return SameAttribute(x, y, CUBLASLT_ALGO_CONFIG_TILE_ID, sizeof(uint32_t)) && SameSums(x, y) &&
         SameAttribute(x, y, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, sizeof(uint16_t));
}

// Whether `algo` may add its split-K parts onto what its output already holds: more than
// one part without a workspace reduction (cuBLASLt's INPLACE adds the parts up in the
// output buffer, so with a residual as C they join it one by one instead of as one sum).
// An unreadable attribute counts as yes.
bool MayAddPartsInPlace(const cublasLtMatmulAlgo_t& algo) {
  const std::optional<uint32_t> parts =
      ConfigValue(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, sizeof(int32_t));
  if (!parts.has_value()) return true;
  if (*parts <= 1) return false;
  const std::optional<uint32_t> scheme =
      ConfigValue(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, sizeof(uint32_t));
  return !scheme.has_value() || (*scheme != CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE &&
                                 *scheme != CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE);
}

// C = alpha op(A) op(B) + beta C through cublasGemmStridedBatchedEx (fp32 C only), for the
// plain problems cuBLASLt's heuristic has no algorithm for.
absl::Status GemmEx(DeviceContext* ctx, const GemmCall& call) {
  const auto& [device, trans_a, trans_b, batch, m, n, k, alpha, a, b, beta, c, ep, where] = call;
  {
    std::lock_guard<std::mutex> lock(ContextMutex());
    if (ctx->fallback == nullptr) {
      cublasHandle_t handle = nullptr;
      RETURN_IF_ERROR(
          StatusFromCublas(cublasCreate(&handle), absl::StrCat("cublasCreate on cuda:", device)));
      // The legacy default stream (the compute stream), no TF32 (CUBLAS_COMPUTE_32F).
      RETURN_IF_ERROR(StatusFromCublas(cublasSetStream(handle, nullptr), where));
      ctx->fallback = handle;
    }
  }
  const cudaDataType_t in_type = a.bf16 ? CUDA_R_16BF : CUDA_R_32F;
  // Column-major, as MakeDescriptors: C^T = op(B)^T op(A)^T.
  return StatusFromCublas(
      cublasGemmStridedBatchedEx(
          ctx->fallback, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
          static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b.ptr, in_type,
          static_cast<int>(b.ld), b.stride, a.ptr, in_type, static_cast<int>(a.ld), a.stride, &beta,
          const_cast<void*>(c.ptr), CUDA_R_32F, static_cast<int>(c.ld), c.stride,
          static_cast<int>(batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      absl::StrCat(where, " (cublasGemmStridedBatchedEx)"));
}

// What runs where cuBLASLt does not: cublasGemmStridedBatchedEx for a plain GEMM,
// Unimplemented for the others (the caller falls back, NOTE [GEMM epilogues]).
absl::Status Fallback(DeviceContext* ctx, const GemmCall& call) {
  if (!Plain(call)) return NoLtAlgorithm(call.where, kNoAlgorithm);
  return GemmEx(ctx, call);
}

// Adds the line of one problem to GemmTuningReport.
void ReportTuning(const std::string& where, const std::string& text) {
  std::lock_guard<std::mutex> lock(ReportMutex());
  TuningReports().push_back(absl::StrCat(where, ": ", text));
}

// A device byte range [begin, end).
struct Span {
  const char* begin;
  const char* end;
  bool Overlaps(const Span& o) const { return begin < o.end && o.begin < end; }
};

// The bytes of a row-major rows x cols matrix with row stride ld (one matrix).
Span MatrixSpan(const void* ptr, int64_t rows, int64_t cols, int64_t ld, int64_t element_bytes) {
  const char* p = static_cast<const char*>(ptr);
  return {p, p + ((rows - 1) * ld + cols) * element_bytes};
}

// Runs `algo` writing D to `d` (C's layout) and reading C from `c_in`.
using LtRun =
    std::function<cublasStatus_t(const cublasLtMatmulAlgo_t& algo, void* d, const void* c_in)>;

// What one GEMM of a problem reads and writes, for tuning it (NOTE [GEMM tuning]).
struct TuneProblem {
  LtRun run;
  const void* c_in;  // C as the real GEMM reads it (the residual where ResidualIsC)
  // C is D with a nonzero beta: tuned in place on a copy of C, made afresh for each check.
  bool reads_d;
  Span d, aux, bias_grad;  // what the GEMM writes (aux, bias_grad: empty when not)
};

// The fingerprint (kernels::cuda::Fingerprint) of what `algo` writes, with D at `d`: the
// outputs are first filled with 0xff bytes (so a kernel that leaves an element unwritten
// cannot match), or for a GEMM that reads its D, `d` gets a fresh copy of C. `fp` is two
// device words of scratch. `*ran` is cublasLtMatmul's answer; a CUDA error is the Status.
absl::StatusOr<std::array<unsigned long long, 2>> FingerprintOf(const TuneProblem& t,
                                                                const cublasLtMatmulAlgo_t& algo,
                                                                void* d, unsigned long long* fp,
                                                                cublasStatus_t* ran,
                                                                const std::string& where) {
  const int64_t d_bytes = t.d.end - t.d.begin;
  const Span outputs[] = {
      {static_cast<const char*>(d), static_cast<const char*>(d) + d_bytes}, t.aux, t.bias_grad};
  for (size_t i = 0; i < 3; ++i) {
    const Span& o = outputs[i];
    if (o.end == o.begin) continue;
    char* begin = const_cast<char*>(o.begin);
    RETURN_IF_ERROR(StatusFromCuda(
        i == 0 && t.reads_d
            ? cudaMemcpyAsync(begin, t.d.begin, d_bytes, cudaMemcpyDeviceToDevice, /*stream=*/0)
            : cudaMemsetAsync(begin, 0xff, o.end - o.begin, /*stream=*/0),
        where));
  }
  *ran = t.run(algo, d, t.reads_d ? d : t.c_in);
  std::array<unsigned long long, 2> total = {0, 0};
  if (*ran != CUBLAS_STATUS_SUCCESS) return total;
  for (size_t i = 0; i < 3; ++i) {
    const Span& o = outputs[i];
    if (o.end == o.begin) continue;
    RETURN_IF_ERROR(
        StatusFromCuda(::kernels::cuda::Fingerprint(o.begin, o.end - o.begin, fp), where));
    std::array<unsigned long long, 2> part;
    RETURN_IF_ERROR(
        StatusFromCuda(cudaMemcpy(part.data(), fp, sizeof(part), cudaMemcpyDeviceToHost), where));
    total[0] += part[0] * (2 * i + 1);  // which output a difference is in counts too
    total[1] += part[1];
  }
  return total;
}

// The answers Tune keeps (the first, then those that sum over k as it does and write its
// bits) and how many of the others it set aside, and why.
struct Candidates {
  std::vector<const cublasLtMatmulAlgo_t*> kept;
  int other_sums = 0, other_bits = 0, refused = 0;
};

// Runs each of gemm.others that sums over k as gemm.first does (SameSums) and keeps those
// whose fingerprint is `reference`, the first's.
absl::StatusOr<Candidates> SameBitsAnswers(const CachedGemm& gemm, const TuneProblem& t,
                                           const std::array<unsigned long long, 2>& reference,
                                           void* d, unsigned long long* fp,
                                           const std::string& where) {
  Candidates candidates;
  candidates.kept = {&gemm.first};
  cublasStatus_t ran = CUBLAS_STATUS_SUCCESS;
  for (const cublasLtMatmulAlgo_t& other : gemm.others) {
    if (!SameSums(gemm.first, other)) {
      ++candidates.other_sums;
      continue;
    }
    ASSIGN_OR_RETURN(const auto bits, FingerprintOf(t, other, d, fp, &ran, where));
    if (ran != CUBLAS_STATUS_SUCCESS) {
      ++candidates.refused;
      cudaGetLastError();  // a launch error is not sticky; a fault would show in the next call
    } else if (bits != reference) {
      ++candidates.other_bits;
    } else {
      candidates.kept.push_back(&other);
    }
  }
  return candidates;
}

// The fastest of kTimedRuns of each of `kept`, in milliseconds, D at `d` and C read from
// `c_read`. Synchronises.
absl::StatusOr<std::vector<float>> FastestTimes(
    const TuneProblem& t, const std::vector<const cublasLtMatmulAlgo_t*>& kept, void* d,
    const void* c_read, const std::string& where) {
  cudaEvent_t start = nullptr, stop = nullptr;
  RETURN_IF_ERROR(StatusFromCuda(cudaEventCreate(&start), where));
  absl::Status timed = StatusFromCuda(cudaEventCreate(&stop), where);
  std::vector<float> fastest(kept.size(), 0.0f);
  for (size_t i = 0; i < kept.size() && timed.ok(); ++i) {
    for (int r = 0; r < kTimedRuns && timed.ok(); ++r) {
      float ms = 0.0f;
      timed = StatusFromCuda(cudaEventRecord(start, 0), where);
      if (timed.ok()) timed = StatusFromCublas(t.run(*kept[i], d, c_read), where);
      if (timed.ok()) timed = StatusFromCuda(cudaEventRecord(stop, 0), where);
      if (timed.ok()) timed = StatusFromCuda(cudaEventSynchronize(stop), where);
      if (timed.ok()) timed = StatusFromCuda(cudaEventElapsedTime(&ms, start, stop), where);
      if (r == 0 || ms < fastest[i]) fastest[i] = ms;
    }
  }
  cudaEventDestroy(start);
  if (stop != nullptr) cudaEventDestroy(stop);
  RETURN_IF_ERROR(timed);
  return fastest;
}

// NOTE [GEMM tuning]: runs the heuristic's first answer and then each other answer that
// sums over k alike (SameSums) on the problem's own operands, keeps those that write the
// first's bits, times each kept one (the fastest of kTimedRuns) and sets gemm.algo to the
// fastest that saves at least 3% of the first's time. Synchronises. A problem it cannot
// tune safely keeps the first answer (the report says why).
absl::Status Tune(const CachedGemm& gemm, const TuneProblem& t, int device,
                  const std::string& where) {
  auto done = [&](const std::string& text) {
    ReportTuning(where, text);
    return absl::OkStatus();
  };
  const int64_t d_bytes = t.d.end - t.d.begin;
  auto scratch = [&](int64_t bytes) {
    return core::Tensor::Allocate({(bytes + 3) / 4}, core::DType::kInt32, core::MemoryTag::kOther,
                                  core::Device::Cuda(device));
  };
  absl::StatusOr<core::Tensor> fp_words = scratch(16);
  absl::StatusOr<core::Tensor> d_copy =
      t.reads_d ? scratch(d_bytes) : absl::StatusOr<core::Tensor>(core::Tensor());
  if (!fp_words.ok() || !d_copy.ok()) {
    return done("not tuned (no device memory for its scratch)");
  }
  auto* fp = static_cast<unsigned long long*>(fp_words->raw_data());
  // On a copy of C when the GEMM reads its own output: C stays as it is.
  void* d = t.reads_d ? d_copy->raw_data() : const_cast<char*>(t.d.begin);
  const void* c_read = t.reads_d ? d : t.c_in;
  cublasStatus_t ran = CUBLAS_STATUS_SUCCESS;
  ASSIGN_OR_RETURN(const auto reference, FingerprintOf(t, gemm.first, d, fp, &ran, where));
  if (ran == CUBLAS_STATUS_NOT_SUPPORTED || ran == CUBLAS_STATUS_INVALID_VALUE) {
    // The GEMM itself meets the same refusal (LaunchLt): an epilogue or a bf16 C takes its
    // fallback, a plain GEMM returns the error.
    return done("not tuned (cuBLASLt refused its first answer)");
  }
  RETURN_IF_ERROR(StatusFromCublas(ran, where));
  // Outputs that tell orders of summation apart: where many of their 16-bit words are zero
  // (mostly zero operands, or exact small integers, whose fp32 low words are zero) two
  // orders may round alike on these operands and not on later ones.
  const int64_t words =
      (d_bytes + (t.aux.end - t.aux.begin) + (t.bias_grad.end - t.bias_grad.begin)) / 2;
  if (reference[1] == 0) return done("not tuned (its output is all zeros)");
  if (static_cast<int64_t>(reference[1]) * 10 < words * 9) {
    return done("not tuned (over a tenth of its output words are zero)");
  }
  ASSIGN_OR_RETURN(const Candidates candidates, SameBitsAnswers(gemm, t, reference, d, fp, where));
  const std::vector<const cublasLtMatmulAlgo_t*>& kept = candidates.kept;
  ASSIGN_OR_RETURN(const std::vector<float> fastest, FastestTimes(t, kept, d, c_read, where));
  // Another answer only where it saves at least 3% of the first's time (not the timing's
  // noise), so the same one is kept from run to run wherever that is possible.
  size_t chosen = 0;
  for (size_t i = 1; i < kept.size(); ++i) {
    if (fastest[i] < 0.97f * fastest[0] && fastest[i] < fastest[chosen]) chosen = i;
  }
  gemm.algo = *kept[chosen];
  return done(absl::StrFormat(
      "%d answers; the first %.3f ms, chosen %s %.3f ms; %d kept, %d sum otherwise, %d write "
      "other bits, %d refused",
      1 + gemm.others.size(), fastest[0], chosen == 0 ? "the first" : "another", fastest[chosen],
      kept.size(), candidates.other_sums, candidates.other_bits, candidates.refused));
}

// The problem of `call` as GemmTuningReport names it.
std::string ProblemName(const GemmCall& call) {
  const GemmEpilogueArgs& ep = call.ep;
  return absl::StrCat(
      call.where,
      ep.kind != GemmEpilogue::kNone ? absl::StrCat(", epilogue ", static_cast<int>(ep.kind)) : "",
      ep.bias_grad != nullptr ? ", bias gradient" : "", call.c.bf16 ? ", bf16 C" : "");
}

// The cached problem of `key`, or null.
const CachedGemm* Lookup(const GemmKey& key) {
  std::lock_guard<std::mutex> lock(ContextMutex());
  auto it = GemmCache().find(key);
  return it != GemmCache().end() ? it->second : nullptr;
}

// The cached problem of `key`, built for `call` on its first use; one built with a `grid`
// to match is refused before anyone can use it where its first answer does not run on
// that one's grid, or (kResidual) may add its split-K parts onto the residual.
absl::StatusOr<const CachedGemm*> LookUpOrBuild(DeviceContext* ctx, const GemmCall& call,
                                                const Alignments& align, bool tune,
                                                const GemmKey& key, const CachedGemm* grid) {
  if (const CachedGemm* found = Lookup(key)) return found;
  ASSIGN_OR_RETURN(const CachedGemm* fresh, BuildGemm(ctx, call, align, tune));
  if (grid != nullptr && fresh->has_algo &&
      (!grid->has_algo || !SameGrid(fresh->first, grid->first) ||
       (call.ep.kind == GemmEpilogue::kResidual && MayAddPartsInPlace(fresh->first)))) {
    fresh->refused.store(true);
  }
  std::lock_guard<std::mutex> lock(ContextMutex());
  auto [it, inserted] = GemmCache().emplace(key, fresh);
  if (!inserted) {  // another thread built it meanwhile: use the cached one
    delete fresh;   // (its descriptors leak; a race on a first use only)
    return it->second;
  }
  return fresh;
}

// The cached problem of `call` (descriptors and algorithm), built on its first use.
// NOTE [GEMM epilogues]: the bias gradient rides in the GEMM only where cuBLASLt runs it
// on the plain GEMM's grid (tile, split-K, reduction, cluster): an epilogue that costs the
// GEMM its split-K would lose more than the column-sums pass it saves. The residual
// epilogue (kResidual) runs in cuBLASLt only on the plain GEMM's grid, and not where its
// split-K parts may add up in its output (onto the residual): then P + residual is one
// fp32 addition of the plain GEMM's P, the bits of the separate add, wherever cuBLASLt's
// kernel on that grid sums as the plain one does (cuBLASLt does not promise it; the gpu
// test holds the result to fp32 rounding and reports the bits). Refused, the caller's
// fallback runs the plain GEMM and adds the residual in its epilogue kernel.
// (Looked up first: only a problem's first use needs the plain one.)
absl::StatusOr<const CachedGemm*> CachedPlan(DeviceContext* ctx, const GemmCall& call, bool tune) {
  const Alignments align = AlignmentsOf(call);
  const GemmKey key = KeyOf(call, align, tune);
  if (const CachedGemm* found = Lookup(key)) return found;
  const CachedGemm* grid = nullptr;
  if (call.ep.bias_grad != nullptr || call.ep.kind == GemmEpilogue::kResidual) {
    GemmCall plain = call;  // no epilogue, at the same alignments
    plain.ep = GemmEpilogueArgs();
    ASSIGN_OR_RETURN(grid, LookUpOrBuild(ctx, plain, align, tune, key.WithoutEpilogue(),
                                         /*grid=*/nullptr));
  }
  return LookUpOrBuild(ctx, call, align, tune, key, grid);
}

// Sets the bias and GELU aux pointers of `call` on the cached problem's descriptor (they
// change from call to call). Under gemm.mu.
absl::Status SetCallPointers(const CachedGemm& gemm, const GemmCall& call) {
  const void* bias_ptr = BiasPointer(call.ep);
  if (bias_ptr != nullptr) {
    RETURN_IF_ERROR(
        StatusFromCublas(cublasLtMatmulDescSetAttribute(gemm.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                        &bias_ptr, sizeof(bias_ptr)),
                         call.where));
  }
  if (GeluAux(call.ep.kind)) {
    RETURN_IF_ERROR(StatusFromCublas(
        cublasLtMatmulDescSetAttribute(gemm.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                       &call.ep.aux, sizeof(call.ep.aux)),
        call.where));
  }
  return absl::OkStatus();
}

// Whether an output of `t` (D, the GELU aux, the bias gradient) overlaps an input of
// `call` (A, B, the bias, the aux or residual it reads); tuning overwrites the outputs.
bool OutputOverlapsInput(const GemmCall& call, const TuneProblem& t) {
  const auto& [device, trans_a, trans_b, batch, m, n, k, alpha, a, b, beta, c, ep, where] = call;
  const int64_t esize = a.bf16 ? 2 : 4, c_esize = c.bf16 ? 2 : 4;
  const Span a_span =
      trans_a ? MatrixSpan(a.ptr, k, m, a.ld, esize) : MatrixSpan(a.ptr, m, k, a.ld, esize);
  const Span b_span =
      trans_b ? MatrixSpan(b.ptr, n, k, b.ld, esize) : MatrixSpan(b.ptr, k, n, b.ld, esize);
  const Span none{nullptr, nullptr};
  const Span bias_span =
      ep.bias != nullptr ? MatrixSpan(ep.bias, 1, n, n, ep.bias_bf16 ? 2 : 4) : none;
  // kDGelu reads its aux (the GELU pre-activation), kBiasResidual and kResidual their
  // residual (as cuBLASLt's C).
  const Span aux_in = ep.kind == GemmEpilogue::kDGelu || ResidualIsC(ep.kind)
                          ? MatrixSpan(ep.aux, m, n, n, c_esize)
                          : none;
  for (const Span& out : {t.d, t.aux, t.bias_grad}) {
    if (out.begin == out.end) continue;
    for (const Span& in : {a_span, b_span, bias_span, aux_in}) {
      if (in.begin != in.end && out.Overlaps(in)) return true;
    }
  }
  return false;
}

// The first GEMM of a problem while tuning is on (NOTE [GEMM tuning]): tunes it where that
// is safe, else reports why not. `run` runs an algorithm of it, reading cuBLASLt's C from
// `c_in` with beta `beta_in`. Under gemm.mu.
absl::Status TuneOnFirstUse(const CachedGemm& gemm, const GemmCall& call, const LtRun& run,
                            const void* c_in, float beta_in, bool tunable_scalars) {
  gemm.tuned = true;
  gemm.tuned_beta = beta_in;
  const GemmEpilogueArgs& ep = call.ep;
  const int64_t c_esize = call.c.bf16 ? 2 : 4;
  const Span none{nullptr, nullptr};
  TuneProblem t;
  t.run = run;
  t.c_in = c_in;
  t.reads_d = beta_in != 0.0f && c_in == call.c.ptr;
  t.d = MatrixSpan(call.c.ptr, call.m, call.n, call.n, c_esize);
  t.aux = ep.kind == GemmEpilogue::kBiasGelu ? MatrixSpan(ep.aux, call.m, call.n, call.n, c_esize)
                                             : none;
  t.bias_grad = ep.bias_grad != nullptr ? MatrixSpan(ep.bias_grad, 1, call.m, call.m, 4) : none;
  // One dense matrix, tunable scalars, outputs that overlap no input (they are overwritten
  // while tuning), and enough outputs that a different order of summation shows in their
  // bits: a bf16 store hides most last-bit differences of its fp32 sums (about 1 output in
  // 6,000 changes), so bf16 outputs need 2^20 of them.
  const char* why_not = nullptr;
  if (gemm.others.empty()) {
    why_not = "one answer";
  } else if (call.batch != 1 || call.c.ld != call.n) {
    why_not = "batched or strided";
  } else if (!tunable_scalars) {
    why_not = "alpha is not 1 or beta not 0 or 1";
  } else if (OutputOverlapsInput(call, t)) {
    why_not = "an output overlaps an input";
  } else if (call.m * call.n < (call.c.bf16 ? int64_t{1} << 20 : int64_t{1} << 12)) {
    why_not = "too few outputs to tell its answers apart";
  }
  if (why_not != nullptr) {
    ReportTuning(ProblemName(call), absl::StrCat("not tuned (", why_not, ")"));
    return absl::OkStatus();
  }
  return Tune(gemm, t, call.device, ProblemName(call));
}

// Runs `call` on its cached problem `gemm` (which has an algorithm): the call's pointers,
// the tuning on the problem's first GEMM, then the tuned answer or the first. Holds gemm.mu
// throughout: the descriptor's pointers and the tuning state are the problem's.
absl::Status LaunchLt(DeviceContext* ctx, const CachedGemm& gemm, const GemmCall& call, bool tune) {
  std::lock_guard<std::mutex> lock(gemm.mu);
  RETURN_IF_ERROR(SetCallPointers(gemm, call));
  // kBiasResidual: D = (P + residual) + bias, kResidual: D = P + residual, the residual as
  // C with beta 1.
  const void* c_in = ResidualIsC(call.ep.kind) ? call.ep.aux : call.c.ptr;
  const float beta_in = ResidualIsC(call.ep.kind) ? 1.0f : call.beta;
  auto run = [&](const cublasLtMatmulAlgo_t& algo, void* d, const void* c_read) {
    return cublasLtMatmul(ctx->handle, gemm.op, &call.alpha, call.b.ptr, gemm.a, call.a.ptr, gemm.b,
                          &beta_in, c_read, gemm.c, d, gemm.c, &algo, ctx->workspace,
                          static_cast<size_t>(ctx->workspace_bytes), /*stream=*/0);
  };
  // NOTE [GEMM tuning]: the tuned answer serves alpha 1 and beta 0 or 1 only, and only the
  // beta it was checked with; other calls of the problem take the first answer.
  const bool tunable_scalars = call.alpha == 1.0f && (beta_in == 0.0f || beta_in == 1.0f);
  if (!gemm.tuned && tune) {
    RETURN_IF_ERROR(TuneOnFirstUse(gemm, call, run, c_in, beta_in, tunable_scalars));
  }
  const bool tuned_fits = tunable_scalars && beta_in == gemm.tuned_beta;
  const cublasStatus_t ran =
      run(tuned_fits ? gemm.algo : gemm.first, const_cast<void*>(call.c.ptr), c_in);
  if (!Plain(call) && (ran == CUBLAS_STATUS_NOT_SUPPORTED || ran == CUBLAS_STATUS_INVALID_VALUE)) {
    // Checked before anything is queued: nothing ran, the caller's fallback runs instead.
    gemm.refused.store(true);
    return NoLtAlgorithm(call.where, "cuBLASLt refused the epilogue or output type");
  }
  return StatusFromCublas(ran, call.where);
}

}  // namespace

void ForceGemmFallbackForTesting(bool on) { ForceFallback().store(on); }

void SetGemmTuning(bool on) { TuningOn().store(on); }

bool GemmTuning() { return TuningOn().load(); }

std::vector<std::string> GemmTuningReport() {
  std::lock_guard<std::mutex> lock(ReportMutex());
  return TuningReports();
}

int64_t GemmEpilogueFallbacksForTesting() { return EpilogueFallbacks().load(); }

absl::Status Gemm(int device, bool trans_a, bool trans_b, int64_t batch, int64_t m, int64_t n,
                  int64_t k, float alpha, const GemmOperand& a, const GemmOperand& b, float beta,
                  const GemmOperand& c, absl::string_view what, const GemmEpilogueArgs& ep) {
  std::string where = absl::StrCat(what, ": cuBLASLt GEMM [", m, " x ", k, "] x [", k, " x ", n,
                                   "] batch ", batch, " on cuda:", device);
  const GemmCall call{device, trans_a, trans_b, batch, m, n,  k,
                      alpha,  a,       b,       beta,  c, ep, std::move(where)};
  RETURN_IF_ERROR(ValidateGemm(call));
  ASSIGN_OR_RETURN(DeviceContext * ctx, Context(device));
  RETURN_IF_ERROR(StatusFromCuda(cudaSetDevice(device), call.where));
  if (ForceFallback().load() || !LtCanRun(call)) return Fallback(ctx, call);
  const bool tune = TuningOn().load();
  ASSIGN_OR_RETURN(const CachedGemm* gemm, CachedPlan(ctx, call, tune));
  if (!gemm->has_algo || gemm->refused.load()) {
    if (tune && !gemm->fallback_reported.exchange(true)) {
      ReportTuning(ProblemName(call), gemm->has_algo
                                          ? "not tuned (refused: the fallback runs)"
                                          : "not tuned (no cuBLASLt algorithm: the fallback runs)");
    }
    return Fallback(ctx, call);
  }
  return LaunchLt(ctx, *gemm, call, tune);
}

}  // namespace cuda
}  // namespace nn
