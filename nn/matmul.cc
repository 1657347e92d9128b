// MatMul of nn/tensor_ops.h: oneDNN (nn::Gemm) per matrix on the CPU, cuBLASLt on CUDA.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/bf16_hd.h"
#include "core/op_profile.h"
#include "core/status_macros.h"
#include "kernels/cpu/kernels.h"
#include "kernels/elementwise.h"
#include "nn/internal/op_checks.h"
#include "nn/internal/op_costs.h"
#include "nn/ops.h"
#include "nn/tensor_ops.h"

#ifdef FSDP_WITH_CUDA
#include "core/cuda/kernels.h"
#include "kernels/cuda/kernels.h"
#include "nn/cuda/gemm.h"
#endif

namespace nn {
namespace {

using core::DType;
using core::Tensor;
using internal::Arg;
using internal::CheckDevices;
using internal::CheckDType;
using internal::CheckFp32OrBf16;
using internal::CheckNumel;
using internal::F32;
using internal::IsBf16;
using internal::MutF32;
#ifdef FSDP_WITH_CUDA
using internal::Launched;
using internal::UseDevice;
#else
using internal::NoCuda;
#endif

// ---- MatMul helpers.

struct Stored {
  int64_t rows, cols, ld;
};

// The stored shape of an operand and its row stride (ld 0 means dense).
Stored StoredShape(bool trans, int64_t rows, int64_t cols, int64_t ld) {
  Stored s{trans ? cols : rows, trans ? rows : cols, ld};
  if (s.ld == 0) s.ld = std::max<int64_t>(s.cols, 1);
  return s;
}

// Number of elements from the operand's first element to one past its last, or an error
// when it does not lie inside its tensor.
absl::StatusOr<int64_t> CheckExtent(absl::string_view what, const char* name, const MatrixRef& r,
                                    const Stored& s, int64_t batch) {
  if (r.offset < 0 || r.batch_stride < 0 || s.ld < s.cols) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": GEMM operand ", name, " has offset ",
                                                   r.offset, ", row stride ", s.ld, " (< ", s.cols,
                                                   " columns?) and batch stride ", r.batch_stride));
  }
  if (batch == 0 || s.rows == 0 || s.cols == 0) return int64_t{0};
  const __int128 span = static_cast<__int128>(batch - 1) * r.batch_stride +
                        static_cast<__int128>(s.rows - 1) * s.ld + s.cols;
  if (static_cast<__int128>(r.offset) + span > r.tensor.numel()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": GEMM operand ", name, " (", batch, " x [", s.rows, ", ", s.cols,
                     "], row stride ", s.ld, ", batch stride ", r.batch_stride, ", offset ",
                     r.offset, ") reaches outside ", r.tensor.ToString()));
  }
  return static_cast<int64_t>(span);
}

// A widened fp32 copy of elements [offset, offset + span) of a bf16 CPU tensor.
std::vector<float> WidenSpan(const Tensor& t, int64_t offset, int64_t span) {
  std::vector<float> out(static_cast<size_t>(span));
  const uint16_t* p = static_cast<const uint16_t*>(t.raw_data()) + offset;
  for (int64_t i = 0; i < span; ++i) out[i] = core::Bf16BitsToFloat(p[i]);
  return out;
}

// cuBLASLt's bias has D's type ("Bias vector elements are the same type as the elements of
// output matrix", cublasLt.h): a bf16 bias of a bf16 GEMM (`bf16`: an operand is bf16) into
// an fp32 C, as a projection's under bf16 weights (a view of the gathered bf16 parameters),
// is widened into an fp32 copy first (exact), so the epilogue stays inside the GEMM.
bool WidensBias(const GemmArgs& g, bool bf16) {
  return bf16 && g.k > 0 && g.bias.defined() && IsBf16(g.bias) && !IsBf16(g.c.tensor);
}

// NOTE [Op accounting] of a GEMM as its CUDA path runs it: 2 m n k FLOPs per matrix, A and
// B read once, C written once (and read when beta != 0), on tensor cores when an operand
// is bf16 (a mixed pair first rounds the fp32 operand, core::OpCategory::kConvert), else
// fp32 without them. An epilogue (NOTE [GEMM epilogues]) adds its bias and aux bytes and
// its arithmetic to the GEMM's own cost: it runs inside the GEMM's kernel.
core::OpCost GemmCost(const GemmArgs& g, bool bf16, bool fused_sums) {
  const double c_size = IsBf16(g.c.tensor) ? 2.0 : 4.0;
  const double c_bytes = c_size * g.batch * g.m * g.n * (g.beta != 0.0f ? 2 : 1);
  const double in_bytes = bf16 ? 2.0 : 4.0;
  core::OpCost cost;
  cost.flops = 2.0 * g.batch * g.m * g.n * g.k;
  cost.bytes = in_bytes * g.batch * (g.m * g.k + g.k * g.n) + c_bytes;
  cost.engine = bf16 ? core::OpEngine::kTensorCoreBf16 : core::OpEngine::kSimtFp32;
  const double mn = static_cast<double>(g.m) * g.n;
  const double bias_size =
      !g.bias.defined() ? 0.0 : (WidensBias(g, bf16) ? 4.0 : core::DTypeSize(g.bias.dtype()));
  switch (g.epilogue) {
    case GemmEpilogue::kNone:
      break;
    case GemmEpilogue::kBias:
      cost.bytes += bias_size * g.n;
      cost.flops += mn;
      break;
    case GemmEpilogue::kBiasGelu:
      cost.bytes += bias_size * g.n + c_size * mn;
      cost.flops += 14.0 * mn;
      break;
    case GemmEpilogue::kDGelu:
      cost.bytes += c_size * mn;
      cost.flops += 20.0 * mn;
      break;
    case GemmEpilogue::kBiasResidual:
      cost.bytes += bias_size * g.n + c_size * mn;
      cost.flops += 2.0 * mn;
      break;
    case GemmEpilogue::kResidual:
      cost.bytes += c_size * mn;
      cost.flops += mn;
      break;
  }
  if (fused_sums) {  // the sums of op(A)'s rows, written fp32
    cost.bytes += 4.0 * g.m;
    cost.flops += static_cast<double>(g.m) * g.k;
  }
  return cost;
}

// A pass converting `span` elements between fp32 and bf16 (4 + 2 bytes each): the rounding
// of a mixed fp32 x bf16 GEMM's fp32 operand, or the widening of a bf16 bias.
core::OpCost ConvertCost(int64_t span) { return core::OpCost::Memory(6.0 * span); }

const char* EpilogueName(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::kNone:
      return "none";
    case GemmEpilogue::kBias:
      return "bias";
    case GemmEpilogue::kBiasGelu:
      return "bias + GELU";
    case GemmEpilogue::kDGelu:
      return "GELU gradient";
    case GemmEpilogue::kBiasResidual:
      return "bias + residual";
    case GemmEpilogue::kResidual:
      return "residual";
  }
  return "?";
}

static_assert(static_cast<int>(GemmEpilogue::kBias) == ::kernels::kGemmEpilogueBias &&
                  static_cast<int>(GemmEpilogue::kBiasGelu) == ::kernels::kGemmEpilogueBiasGelu &&
                  static_cast<int>(GemmEpilogue::kDGelu) == ::kernels::kGemmEpilogueDGelu &&
                  static_cast<int>(GemmEpilogue::kBiasResidual) ==
                      ::kernels::kGemmEpilogueBiasResidual &&
                  static_cast<int>(GemmEpilogue::kResidual) == ::kernels::kGemmEpilogueResidual,
              "nn::GemmEpilogue numbers kernels::GemmEpilogueKind");

// NOTE [GEMM epilogues]: the rules on C, bias and aux of GemmArgs.
absl::Status CheckEpilogue(absl::string_view what, const GemmArgs& g) {
  const bool c_bf16 = IsBf16(g.c.tensor);
  if (!c_bf16) RETURN_IF_ERROR(CheckDType(what, "GEMM output C", g.c.tensor, DType::kFloat32));
  if (c_bf16 && g.beta != 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": a bf16 GEMM output C needs beta 0, got ", g.beta));
  }
  if (g.k == 0 && (c_bf16 || g.epilogue != GemmEpilogue::kNone)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": a GEMM with k == 0 takes neither a bf16 C nor an epilogue"));
  }
  if (g.bias_grad.defined()) {
    RETURN_IF_ERROR(CheckDevices(what, {{"bias gradient", &g.bias_grad}, {"C", &g.c.tensor}}));
    RETURN_IF_ERROR(CheckDType(what, "bias gradient", g.bias_grad, DType::kFloat32));
    RETURN_IF_ERROR(CheckNumel(what, "bias gradient", g.bias_grad, g.m));
    if (!g.trans_a || g.batch != 1 || g.epilogue != GemmEpilogue::kNone || c_bf16 ||
        g.a.offset != 0 || (g.a.ld != 0 && g.a.ld != g.m) || g.a.tensor.numel() != g.k * g.m) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": a GEMM with a bias gradient needs a transposed, dense A of ", g.k,
                       " x ", g.m, " elements (", g.a.tensor.ToString(), ", offset ", g.a.offset,
                       ", row stride ", g.a.ld, "), batch 1, no epilogue and an fp32 C"));
    }
    if (g.bias_grad.raw_data() == g.c.tensor.raw_data()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": GEMM output C and the bias gradient must be distinct"));
    }
  }
  if (g.epilogue == GemmEpilogue::kNone && !c_bf16) return absl::OkStatus();
  const char* name = EpilogueName(g.epilogue);
  if (g.batch != 1 || g.beta != 0.0f || g.c.offset != 0 || (g.c.ld != 0 && g.c.ld != g.n) ||
      g.c.tensor.numel() != g.m * g.n) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": a GEMM with epilogue '", name,
        "' or a bf16 C needs batch 1, beta 0 and a "
        "dense C of ",
        g.m, " x ", g.n, " elements; got batch ", g.batch, ", beta ", g.beta, ", C offset ",
        g.c.offset, ", row stride ", g.c.ld, ", ", g.c.tensor.ToString()));
  }
  if (g.epilogue == GemmEpilogue::kNone) return absl::OkStatus();
  const bool has_bias = g.epilogue == GemmEpilogue::kBias ||
                        g.epilogue == GemmEpilogue::kBiasGelu ||
                        g.epilogue == GemmEpilogue::kBiasResidual;
  if (has_bias) {
    if (!g.bias.defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": the GEMM epilogue '", name, "' needs a bias"));
    }
    RETURN_IF_ERROR(CheckDevices(what, {{"bias", &g.bias}, {"C", &g.c.tensor}}));
    RETURN_IF_ERROR(CheckFp32OrBf16(what, "bias", g.bias));
    RETURN_IF_ERROR(CheckNumel(what, "bias", g.bias, g.n));
  }
  const bool residual =
      g.epilogue == GemmEpilogue::kBiasResidual || g.epilogue == GemmEpilogue::kResidual;
  if (residual && c_bf16) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": the GEMM epilogue '", name, "' needs an fp32 C, got ", g.c.tensor.ToString()));
  }
  if (g.epilogue == GemmEpilogue::kBiasGelu || g.epilogue == GemmEpilogue::kDGelu || residual) {
    if (!g.aux.defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": the GEMM epilogue '", name, "' needs aux, ",
                       residual ? "the residual" : "the pre-activation"));
    }
    const char* aux_name = residual ? "aux (residual)" : "aux (pre-activation)";
    RETURN_IF_ERROR(CheckDevices(what, {{aux_name, &g.aux}, {"C", &g.c.tensor}}));
    RETURN_IF_ERROR(CheckDType(what, aux_name, g.aux, g.c.tensor.dtype()));
    RETURN_IF_ERROR(CheckNumel(what, aux_name, g.aux, g.m * g.n));
    if (g.aux.raw_data() == g.c.tensor.raw_data()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": GEMM output C and ", aux_name, " must be distinct"));
    }
  }
  return absl::OkStatus();
}

// MatMul's CPU product and epilogue (its arguments checked): oneDNN sgemm per matrix of
// the batch, bf16 operands widened exactly.
absl::Status CpuMatMul(absl::string_view what, const GemmArgs& g, const Stored& sa,
                       const Stored& sb, const Stored& sc, int64_t span_a, int64_t span_b) {
  std::vector<float> wide_a, wide_b;
  const float* a = nullptr;
  const float* b = nullptr;
  if (IsBf16(g.a.tensor)) {
    wide_a = WidenSpan(g.a.tensor, g.a.offset, span_a);
    a = wide_a.data();
  } else {
    a = F32(g.a.tensor) + g.a.offset;
  }
  if (IsBf16(g.b.tensor)) {
    wide_b = WidenSpan(g.b.tensor, g.b.offset, span_b);
    b = wide_b.data();
  } else {
    b = F32(g.b.tensor) + g.b.offset;
  }
  // NOTE [GEMM epilogues]: the product goes to C when it is fp32, else to an fp32 scratch,
  // and the epilogue stores C from it.
  const bool c_bf16 = IsBf16(g.c.tensor);
  std::vector<float> product;
  if (c_bf16) product.resize(static_cast<size_t>(g.m * g.n));
  float* c = c_bf16 ? product.data() : MutF32(g.c.tensor) + g.c.offset;
  for (int64_t i = 0; i < g.batch; ++i) {
    const absl::Status status =
        Gemm(g.trans_a, g.trans_b, g.m, g.n, g.k, g.alpha, a + i * g.a.batch_stride, sa.ld,
             b + i * g.b.batch_stride, sb.ld, g.beta, c + i * g.c.batch_stride, sc.ld);
    if (!status.ok()) {
      return core::Annotate(status, absl::StrCat(what, ": matrix ", i, " of ", g.batch));
    }
  }
  if (c_bf16 || g.epilogue != GemmEpilogue::kNone) {
    ::kernels::cpu::GemmEpilogue(
        c, static_cast<int>(g.epilogue), g.bias.defined() ? g.bias.raw_data() : nullptr,
        g.bias.defined() && IsBf16(g.bias), g.aux.defined() ? g.aux.raw_data() : nullptr,
        g.c.tensor.raw_data(), c_bf16, g.m, g.n);
  }
  return absl::OkStatus();
}

}  // namespace

GemmArgs WeightGradientGemm(int64_t rows, int64_t out, int64_t in, const Tensor& g, const Tensor& x,
                            const Tensor& dw, const Tensor& bias_grad) {
  GemmArgs a;
  a.trans_a = true;
  a.m = out;
  a.n = in;
  a.k = rows;
  a.beta = 1.0f;
  a.a.tensor = g;
  a.b.tensor = x;
  a.c.tensor = dw;
  a.bias_grad = bias_grad;
  return a;
}

namespace {

// What MatMul derives from its checked arguments, for either device's path.
struct MatMulPlan {
  Stored sa, sb, sc;
  int64_t span_a = 0, span_b = 0;
  // Elements of the fp32 operand rounded to bf16 first (mixed fp32 x bf16 operands), or 0.
  int64_t round_span = 0;
  // NOTE [GEMM epilogues]: whether the GEMM itself sums op(A)'s rows for bias_grad (on CUDA).
  bool fused_sums = false;
  bool widen_bias = false;
  core::OpCost cost;
};

#ifdef FSDP_WITH_CUDA
// Mixed fp32 x bf16: the fp32 operand rounded to bf16 (same layout) into the returned
// scratch, which `a` or `b` then points to. The scratch must outlive the GEMM's launch; the
// caching allocator orders its reuse on this stream.
absl::StatusOr<Tensor> RoundOperandToBf16(absl::string_view what, const MatMulPlan& p,
                                          const core::Device& device, cuda::GemmOperand* a,
                                          cuda::GemmOperand* b) {
  core::ProfiledOp op(core::OpCategory::kConvert, "gemm.round_operand", device,
                      ConvertCost(p.round_span));
  cuda::GemmOperand& f32 = a->bf16 ? *b : *a;
  const int64_t span = a->bf16 ? p.span_b : p.span_a;
  ASSIGN_OR_RETURN(Tensor scratch, Tensor::Allocate({span}, DType::kBFloat16,
                                                    core::MemoryTag::kActivation, device));
  const absl::Status rounded = core::cuda::ConvertFloatToBf16(
      static_cast<const float*>(f32.ptr), static_cast<uint16_t*>(scratch.raw_data()), span);
  if (!rounded.ok()) {
    return core::Annotate(rounded, absl::StrCat(what, ": round GEMM operand to bf16"));
  }
  f32.ptr = scratch.raw_data();
  f32.bf16 = true;
  return scratch;
}

// The bf16 bias widened to fp32 for an epilogue into an fp32 C (NOTE [GEMM epilogues]), into
// the returned tensor, which `ep` then points to; it must outlive the GEMM's launch.
absl::StatusOr<Tensor> WidenBias(absl::string_view what, const GemmArgs& g,
                                 const core::Device& device, cuda::GemmEpilogueArgs* ep) {
  core::ProfiledOp op(core::OpCategory::kConvert, "gemm.widen_bias", device, ConvertCost(g.n));
  ASSIGN_OR_RETURN(Tensor wide,
                   Tensor::Allocate({g.n}, DType::kFloat32, core::MemoryTag::kActivation, device));
  const absl::Status widened = core::cuda::ConvertBf16ToFloat(
      static_cast<const uint16_t*>(g.bias.raw_data()), MutF32(wide), g.n);
  if (!widened.ok()) return core::Annotate(widened, absl::StrCat(what, ": widen the bf16 bias"));
  ep->bias = wide.raw_data();
  ep->bias_bf16 = false;
  return wide;
}

// The GEMM with its epilogue and bias-gradient sums (into *sums) on cuBLASLt, or, where
// cuBLASLt has no algorithm for them, the plain GEMM and then the epilogue kernel (the sums
// are then left to the caller: *sums is reset).
absl::Status LaunchGemm(absl::string_view what, const GemmArgs& g, const MatMulPlan& p,
                        const core::Device& device, const cuda::GemmOperand& a,
                        const cuda::GemmOperand& b, const cuda::GemmOperand& cc,
                        const cuda::GemmEpilogueArgs& ep, Tensor* sums) {
  core::ProfiledOp op(core::OpCategory::kGemmForward, "matmul", device, p.cost,
                      core::GemmShape{g.batch, g.m, g.n, g.k});
  absl::Status fused = cuda::Gemm(device.index, g.trans_a, g.trans_b, g.batch, g.m, g.n, g.k,
                                  g.alpha, a, b, g.beta, cc, what, ep);
  if (absl::IsUnimplemented(fused) && ep.bias_grad != nullptr) {
    // No cuBLASLt algorithm computes the sums: the plain GEMM, the column sums after.
    *sums = Tensor();
    return cuda::Gemm(device.index, g.trans_a, g.trans_b, g.batch, g.m, g.n, g.k, g.alpha, a, b,
                      g.beta, cc, what);
  }
  if (!absl::IsUnimplemented(fused)) return fused;
  // NOTE [GEMM epilogues]: cuBLASLt has no algorithm with this epilogue (or output type): the
  // plain product into fp32 (C itself when it is fp32), then the epilogue kernel.
  Tensor product;
  cuda::GemmOperand plain = cc;
  if (cc.bf16) {
    ASSIGN_OR_RETURN(product, Tensor::Allocate({g.m * g.n}, DType::kFloat32,
                                               core::MemoryTag::kActivation, device));
    plain = cuda::GemmOperand{product.raw_data(), false, p.sc.ld, 0};
  }
  RETURN_IF_ERROR(cuda::Gemm(device.index, g.trans_a, g.trans_b, g.batch, g.m, g.n, g.k, g.alpha, a,
                             b, g.beta, plain, what));
  return Launched(::kernels::cuda::GemmEpilogue(
                      static_cast<const float*>(plain.ptr), static_cast<int>(ep.kind), ep.bias,
                      ep.bias_bf16, ep.aux, const_cast<void*>(cc.ptr), cc.bf16, g.m, g.n),
                  what, "GEMM epilogue");
}

// MatMul on a CUDA device: cuBLASLt (nn/cuda/gemm.h) after any operand rounding or bias
// widening, then the bias gradient's sums.
absl::Status CudaMatMul(absl::string_view what, const GemmArgs& g, const MatMulPlan& p) {
  const core::Device device = g.c.tensor.device();
  RETURN_IF_ERROR(UseDevice(device, what));
  if (g.k == 0) {
    float* c = MutF32(g.c.tensor) + g.c.offset;
    core::ProfiledOp op(core::OpCategory::kElementwise, "gemm.scale_c", device, p.cost);
    return Launched(
        ::kernels::cuda::ScaleMatrices(c, g.batch, g.m, g.n, p.sc.ld, g.c.batch_stride, g.beta),
        what, "GEMM with k == 0 (scale C)");
  }
  const auto operand = [](const MatrixRef& o, int64_t ld) {
    const int64_t esize = core::DTypeSize(o.tensor.dtype());
    return cuda::GemmOperand{static_cast<const char*>(o.tensor.raw_data()) + o.offset * esize,
                             IsBf16(o.tensor), ld, o.batch_stride};
  };
  cuda::GemmOperand a = operand(g.a, p.sa.ld);
  cuda::GemmOperand b = operand(g.b, p.sb.ld);
  const cuda::GemmOperand cc = operand(g.c, p.sc.ld);
  Tensor scratch;
  if (p.round_span > 0) {
    ASSIGN_OR_RETURN(scratch, RoundOperandToBf16(what, p, device, &a, &b));
  }
  cuda::GemmEpilogueArgs ep;
  ep.kind = g.epilogue;
  if (g.bias.defined()) {
    ep.bias = g.bias.raw_data();
    ep.bias_bf16 = IsBf16(g.bias);
  }
  Tensor wide_bias;
  if (p.widen_bias) {
    ASSIGN_OR_RETURN(wide_bias, WidenBias(what, g, device, &ep));
  }
  if (g.aux.defined()) ep.aux = g.aux.raw_data();
  // NOTE [GEMM epilogues]: a bias gradient with bf16 operands is the GEMM's (into `sums`,
  // then added); otherwise the column sums of A after the plain GEMM.
  Tensor sums;
  if (p.fused_sums) {
    ASSIGN_OR_RETURN(sums,
                     Tensor::Allocate({g.m}, DType::kFloat32, core::MemoryTag::kGrad, device));
    ep.bias_grad = MutF32(sums);
  }
  RETURN_IF_ERROR(LaunchGemm(what, g, p, device, a, b, cc, ep, &sums));
  if (!g.bias_grad.defined()) return absl::OkStatus();
  if (sums.defined()) return AddTensors(what, g.bias_grad, sums, g.bias_grad);
  return AccumulateColumnSums(what, g.a.tensor, Tensor(), g.bias_grad);
}
#endif  // FSDP_WITH_CUDA

// MatMul on the CPU: oneDNN sgemm per matrix of the batch (bf16 operands widened exactly);
// the op list records the CUDA path's passes.
absl::Status CpuMatMulAndSums(absl::string_view what, const GemmArgs& g, const MatMulPlan& p) {
  const core::Device device = g.c.tensor.device();
  if (p.round_span > 0) {
    core::RecordOp(core::OpCategory::kConvert, "gemm.round_operand", ConvertCost(p.round_span));
  }
  if (p.widen_bias) {
    core::RecordOp(core::OpCategory::kConvert, "gemm.widen_bias", ConvertCost(g.n));
  }
  {
    core::ProfiledOp op(g.k == 0 ? core::OpCategory::kElementwise : core::OpCategory::kGemmForward,
                        g.k == 0 ? "gemm.scale_c" : "matmul", device, p.cost,
                        g.k == 0 ? core::GemmShape{} : core::GemmShape{g.batch, g.m, g.n, g.k});
    RETURN_IF_ERROR(CpuMatMul(what, g, p.sa, p.sb, p.sc, p.span_a, p.span_b));
  }
  if (!g.bias_grad.defined() || g.k == 0) return absl::OkStatus();
  if (!p.fused_sums) return AccumulateColumnSums(what, g.a.tensor, Tensor(), g.bias_grad);
  // The CUDA path's GEMM sums A's rows into a scratch it then adds to bias_grad.
  core::RecordOp(core::OpCategory::kElementwise, "add", internal::AddCost(g.m));
  ::kernels::cpu::ColumnSumsBf16(static_cast<const uint16_t*>(g.a.tensor.raw_data()),
                                 MutF32(g.bias_grad), g.k, g.m);
  return absl::OkStatus();
}

}  // namespace

absl::Status MatMul(absl::string_view what, const GemmArgs& g) {
  RETURN_IF_ERROR(CheckDevices(what, {{"A", &g.a.tensor}, {"B", &g.b.tensor}, {"C", &g.c.tensor}}));
  RETURN_IF_ERROR(CheckFp32OrBf16(what, "GEMM operand A", g.a.tensor));
  RETURN_IF_ERROR(CheckFp32OrBf16(what, "GEMM operand B", g.b.tensor));
  RETURN_IF_ERROR(CheckEpilogue(what, g));
  if (g.batch < 0 || g.m < 0 || g.n < 0 || g.k < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": GEMM sizes must be >= 0, got batch ",
                                                   g.batch, " m ", g.m, " n ", g.n, " k ", g.k));
  }
  MatMulPlan p;
  p.sa = StoredShape(g.trans_a, g.m, g.k, g.a.ld);
  p.sb = StoredShape(g.trans_b, g.k, g.n, g.b.ld);
  p.sc = StoredShape(false, g.m, g.n, g.c.ld);
  ASSIGN_OR_RETURN(p.span_a, CheckExtent(what, "A", g.a, p.sa, g.batch));
  ASSIGN_OR_RETURN(p.span_b, CheckExtent(what, "B", g.b, p.sb, g.batch));
  RETURN_IF_ERROR(CheckExtent(what, "C", g.c, p.sc, g.batch).status());
  if (g.batch == 0 || g.m == 0 || g.n == 0) {
    // An empty product; a bias gradient still sums A's k x m elements.
    if (g.bias_grad.defined() && g.m > 0 && g.k > 0) {
      return AccumulateColumnSums(what, g.a.tensor, Tensor(), g.bias_grad);
    }
    return absl::OkStatus();
  }
  const bool a_bf16 = IsBf16(g.a.tensor);
  const bool b_bf16 = IsBf16(g.b.tensor);
  p.round_span = a_bf16 == b_bf16 || g.k == 0 ? 0 : (a_bf16 ? p.span_b : p.span_a);
  p.fused_sums = g.bias_grad.defined() && a_bf16 && b_bf16 && g.k > 0;
  p.widen_bias = WidensBias(g, a_bf16 || b_bf16);
  p.cost = g.k == 0 ? core::OpCost::Memory(8.0 * g.batch * g.m * g.n)
                    : GemmCost(g, a_bf16 || b_bf16, p.fused_sums);
  const core::Device device = g.c.tensor.device();
  if (device.is_cuda()) {
#ifdef FSDP_WITH_CUDA
    return CudaMatMul(what, g, p);
#else
    return NoCuda(device, what);
#endif
  }
  return CpuMatMulAndSums(what, g, p);
}

}  // namespace nn
