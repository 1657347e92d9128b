#include "nn/functional/llama_fused.h"

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/op_profile.h"
#include "core/status_macros.h"
#include "nn/functional/internal/grad_sink.h"
#include "nn/functional/internal/tensor_args.h"
#include "nn/internal/op_checks.h"
#include "nn/internal/validate.h"
#include "nn/ops.h"
#include "nn/tensor_ops.h"

namespace nn {
namespace functional {
namespace {

using core::DType;
using core::Tensor;
using ::nn::internal::CheckDevices;
using ::nn::internal::CheckFp32OrBf16;
using ::nn::internal::IsBf16;
using ::nn::internal::NewActivation;

// ---- Bias-free Linears that share their input (q, k and v; gate and up): x rounded once for
// all of them, each nn::Linear's forward GEMM, and in the backward their input gradients summed
// in the epilogues of their GEMMs (kResidual, NOTE [GEMM epilogues] in nn/tensor_ops.h).

struct Projections {
  Tensor x;                        // the input as given
  std::vector<Tensor> w;           // each [out_i, in]
  std::vector<const char*> names;  // the weights' names in messages
  int64_t rows = 0, in = 0;
  bool w16 = false;  // bf16 weights: bf16 GEMMs (NOTE [bf16 GEMMs])
};

// x [..., in] and the weights [out_i, in], checked: defined (Arg errors first, unchanged), on one
// device, the weights 2-D of one dtype (fp32 or bf16), x fp32 or, with bf16 weights, bf16.
absl::StatusOr<Projections> CheckProjections(
    const char* op, const core::Arg& x_arg,
    std::initializer_list<std::pair<const char*, const core::Arg*>> weights) {
  Projections p;
  ASSIGN_OR_RETURN(p.x, internal::Input(op, "input", x_arg));
  for (const auto& [name, arg] : weights) {
    ASSIGN_OR_RETURN(Tensor w, internal::Input(op, name, *arg));
    p.w.push_back(std::move(w));
    p.names.push_back(name);
  }
  const Tensor& x = p.x;
  for (size_t i = 0; i < p.w.size(); ++i) {
    const Tensor& w = p.w[i];
    const char* name = p.names[i];
    RETURN_IF_ERROR(CheckDevices(op, {{"input", &x}, {name, &w}}));
    RETURN_IF_ERROR(CheckFp32OrBf16(op, name, w));
    if (w.dtype() != p.w[0].dtype()) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " must have the dtype of ",
                                                     p.names[0], " ", p.w[0].ToString(), ", got ",
                                                     w.ToString()));
    }
    if (w.dim() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": ", name, " must be 2-D [out, in], got ", w.ToString()));
    }
    if (x.dim() == 0 || x.size(-1) != w.size(1)) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": input ", x.ToString(),
                                                     " must have last dimension ", w.size(1),
                                                     " (the in of ", name, " ", w.ToString(), ")"));
    }
  }
  p.w16 = IsBf16(p.w[0]);
  if (x.dtype() != DType::kFloat32 && !(p.w16 && IsBf16(x))) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": input must be float32 (bfloat16 only with bfloat16 weights), got ", x.ToString()));
  }
  p.in = x.size(-1);
  p.rows = RowsOf(x.shape());
  return p;
}

// x as the projections' GEMMs take it: rounded once to bf16 under bf16 weights (one copy, kept
// for every weight gradient), itself when it is so already.
absl::StatusOr<Tensor> GemmInput(const char* op, const Projections& p) {
  if (!p.w16 || IsBf16(p.x)) return p.x;
  absl::StatusOr<Tensor> r = p.x.ToDType(DType::kBFloat16, core::MemoryTag::kActivation);
  if (!r.ok()) {
    return core::Annotate(r.status(), absl::StrCat(op, ": converting input to bfloat16"));
  }
  return r;
}

// Projection i's output, fp32 [..., out_i] = a w_i^T (Linear::Forward), a the GEMM input.
absl::StatusOr<Tensor> Project(const char* op, const Projections& p, size_t i, const Tensor& a) {
  const Tensor& w = p.w[i];
  ASSIGN_OR_RETURN(Tensor y, NewActivation(WithLastDim(p.x.shape(), w.size(0)), p.x.device()));
  GemmArgs g;
  g.trans_b = true;
  g.m = p.rows;
  g.n = w.size(0);
  g.k = p.in;
  g.a.tensor = a;
  g.b.tensor = w;
  g.c.tensor = y;
  RETURN_IF_ERROR(::nn::MatMul(op, g));
  return y;
}

// What a projections record saves first: the GEMM input (for the weights' gradients, when one
// needs it), then each weight (for the input's gradient, when it needs one).
std::vector<Tensor> SavedForProjections(const Projections& p, const Tensor& a) {
  bool weight_grad = false;
  for (const Tensor& w : p.w) weight_grad = weight_grad || core::RequiresGrad(w);
  std::vector<Tensor> saved = {weight_grad ? a : Tensor()};
  for (const Tensor& w : p.w) saved.push_back(core::RequiresGrad(p.x) ? w : Tensor());
  return saved;
}

// The backward of the projections of a record over {x, w_0, .., w_{n-1}} that saved
// SavedForProjections first: from the gradients at their outputs (`grads`, in the dtype their
// GEMMs take: bf16 under bf16 weights), each projection's input gradient GEMM (the ones after the
// first adding the sum so far in its epilogue: Linear::BackwardAdd) and weight gradient GEMM, in
// order. Returns the record's gradients: dL/dx (fp32), then each weight's.
absl::StatusOr<std::vector<Tensor>> ProjectionsBackward(const core::BackwardContext& ctx,
                                                        const char* op,
                                                        const std::vector<const char*>& names,
                                                        const core::Shape& x_shape,
                                                        const std::vector<Tensor>& grads) {
  const int64_t rows = RowsOf(x_shape), in = x_shape.back();
  const Tensor& a = ctx.saved(0);
  Tensor gx;
  std::vector<Tensor> weight_grads;
  for (size_t i = 0; i < grads.size(); ++i) {
    const Tensor& g = grads[i];
    const int64_t out = g.size(-1);
    const int w_i = static_cast<int>(i) + 1;
    if (ctx.needs_grad(0)) {
      ASSIGN_OR_RETURN(Tensor sum, NewActivation(x_shape, g.device()));
      GemmArgs dx;
      dx.m = rows;
      dx.n = in;
      dx.k = out;
      dx.a.tensor = g;
      dx.b.tensor = ctx.saved(w_i);
      dx.c.tensor = sum;
      if (gx.defined()) {
        dx.epilogue = GemmEpilogue::kResidual;
        dx.aux = gx;
      }
      core::ScopedOpCategory role(core::OpCategory::kGemmInputGrad);
      RETURN_IF_ERROR(::nn::MatMul(op, dx));
      gx = std::move(sum);
    }
    ASSIGN_OR_RETURN(const internal::GradSink gw,
                     internal::GradSinkFor(ctx, w_i, op, names[i], {out, in}, g.device()));
    if (gw.tensor.defined()) {
      core::ScopedOpCategory role(core::OpCategory::kGemmWeightGrad);
      RETURN_IF_ERROR(
          ::nn::MatMul(op, WeightGradientGemm(rows, out, in, g, a, gw.tensor, Tensor())));
    }
    weight_grads.push_back(gw.returned());
  }
  std::vector<Tensor> result = {gx};
  for (Tensor& g : weight_grads) result.push_back(std::move(g));
  return result;
}

// OK when `tables` serve T positions of head width D on `device` (the input's), else
// InvalidArgument naming `op`.
absl::Status CheckTables(const char* op, const RotaryTables& tables, int64_t D, int64_t T,
                         const core::Device& device) {
  if (tables.head_dim == D && tables.positions() >= T && tables.cos.defined() &&
      tables.sin.defined() && tables.cos.device() == device && tables.sin.device() == device) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      op, ": the rotary tables (head width ", tables.head_dim, ", ", tables.positions(),
      " positions",
      tables.cos.defined() ? absl::StrCat(", on ", tables.cos.device().ToString()) : std::string(),
      ") must be of head width ", D, " with at least ", T, " positions, on ", device.ToString(),
      " (the input's)"));
}

// The rotary packing's backward (NOTE [Grouped-query attention]): from dL/dqkv, dL/dq [B, T,
// n_head D] and dL/dk, dL/dv [B, T, n_kv_head D] in `dtypes` (each kv head's the sum over its
// group, q and k turned back).
absl::StatusOr<std::vector<Tensor>> UnpackRotaryGrad(const char* op, const Tensor& gqkv,
                                                     const Tensor& cos, const Tensor& sin,
                                                     int64_t n_head, int64_t n_kv_head, int64_t D,
                                                     const std::vector<DType>& dtypes) {
  const core::Device device = gqkv.device();
  const int64_t B = gqkv.size(0), T = gqkv.size(1);
  ASSIGN_OR_RETURN(const Tensor gq, NewActivation({B, T, n_head * D}, device, dtypes[0]));
  ASSIGN_OR_RETURN(const Tensor gk, NewActivation({B, T, n_kv_head * D}, device, dtypes[1]));
  ASSIGN_OR_RETURN(const Tensor gv, NewActivation({B, T, n_kv_head * D}, device, dtypes[2]));
  RETURN_IF_ERROR(RotaryPackQkvBackward(op, gqkv, cos, sin, n_head, n_kv_head, gq, gk, gv));
  return std::vector<Tensor>{gq, gk, gv};
}

// The dtype in which a backward hands each of `inputs` its gradient: bf16 where the producer takes
// it so (NOTE [Functional fusions] in fused.h: a bf16 GEMM's operand, the same bits as rounding
// there), else fp32.
std::vector<DType> GradDTypes(std::initializer_list<const Tensor*> inputs) {
  std::vector<DType> dtypes;
  for (const Tensor* t : inputs) {
    dtypes.push_back(internal::ProducerTakesBf16Grad(*t) ? DType::kBFloat16 : DType::kFloat32);
  }
  return dtypes;
}

}  // namespace

absl::StatusOr<std::vector<Tensor>> ResidualRmsNorm(core::Arg x_arg, core::Arg w_arg,
                                                    const FusedRmsNormOptions& options) {
  constexpr const char* kOp = "ResidualRmsNorm";
  ASSIGN_OR_RETURN(const Tensor x, internal::Input(kOp, "input", x_arg));
  ASSIGN_OR_RETURN(const Tensor w, internal::Input(kOp, "weight", w_arg));
  RETURN_IF_ERROR(CheckDevices(kOp, {{"input", &x}, {"weight", &w}}));
  RETURN_IF_ERROR(::nn::internal::CheckDType(kOp, "input", x, DType::kFloat32));
  RETURN_IF_ERROR(CheckFp32OrBf16(kOp, "weight", w));
  if (x.dim() == 0 || x.size(-1) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp, ": input must be at least 1-D with a non-empty last dimension, got ", x.ToString()));
  }
  if (w.shape() != core::Shape{x.size(-1)}) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": weight must be [", x.size(-1),
                                                   "] (the input's last dimension), got ",
                                                   w.ToString()));
  }
  if (!(std::isfinite(options.eps) && options.eps >= 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": eps must be finite and >= 0, got ", options.eps));
  }
  const core::Device device = x.device();
  // RmsNorm::ForwardForGemm (or Forward): normed bf16 for the bf16 GEMMs that take it.
  ASSIGN_OR_RETURN(
      Tensor normed,
      NewActivation(x.shape(), device,
                    options.normed_for_gemm && IsBf16(w) ? DType::kBFloat16 : DType::kFloat32));
  ASSIGN_OR_RETURN(const Tensor rstd, NewActivation({RowsOf(x.shape())}, device));
  RETURN_IF_ERROR(RmsNormForward(kOp, x, w, options.eps, normed, rstd));
  Tensor x_out = core::Detach(x);
  RETURN_IF_ERROR(core::RecordFunction(
      kOp, {x, w}, {&x_out, &normed}, {x, rstd, w},
      [copy = core::ProducerBf16GradCopy(x)](
          const core::BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
        // RmsNorm::BackwardAdd: dL/dx = g_x_out + RmsNorm'(g_normed) in the norm's pass, and
        // its bf16 copy for x's producer where that takes one (NOTE [bf16 gradient copies]).
        const Tensor& g_stream = ctx.grad(0);
        const Tensor& g = ctx.grad(1);
        const Tensor& x = ctx.saved(0);
        const Tensor& w = ctx.saved(2);
        ASSIGN_OR_RETURN(const Tensor gx, NewActivation(x.shape(), g.device()));
        ASSIGN_OR_RETURN(const internal::GradSink gw,
                         internal::GradSinkFor(ctx, 1, kOp, "weight", w.shape(), g.device()));
        Tensor gx16;
        if (copy != nullptr && ctx.needs_grad(0)) {
          ASSIGN_OR_RETURN(gx16, NewActivation(x.shape(), g.device(), DType::kBFloat16));
        }
        RETURN_IF_ERROR(
            RmsNormBackwardAdd(kOp, g, x, ctx.saved(1), w, g_stream, gx, gw.tensor, gx16));
        if (gx16.defined()) {
          copy->sent = gx;
          copy->copy = gx16;
        }
        return std::vector<Tensor>{ctx.needs_grad(0) ? gx : Tensor(), gw.returned()};
      },
      {"input", "rstd", "weight"}));
  return std::vector<Tensor>{x_out, normed};
}

absl::StatusOr<Tensor> RotaryQkv(core::Arg x_arg, core::Arg q_w_arg, core::Arg k_w_arg,
                                 core::Arg v_w_arg, const RotaryTables& tables, int64_t n_head,
                                 int64_t n_kv_head) {
  constexpr const char* kOp = "RotaryQkv";
  ASSIGN_OR_RETURN(
      const Projections p,
      CheckProjections(kOp, x_arg,
                       {{"q weight", &q_w_arg}, {"k weight", &k_w_arg}, {"v weight", &v_w_arg}}));
  const Tensor& x = p.x;
  if (x.dim() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": input must be [B, T, C], got ", x.ToString()));
  }
  if (n_head <= 0 || n_kv_head <= 0 || n_head % n_kv_head != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp, ": n_head (", n_head, ") must be a positive multiple of n_kv_head (", n_kv_head, ")"));
  }
  const Tensor &q_w = p.w[0], &k_w = p.w[1], &v_w = p.w[2];
  const int64_t D = q_w.size(0) / n_head;
  if (q_w.size(0) % n_head != 0 || D == 0 || D % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": q weight ", q_w.ToString(),
                                                   " must be [n_head * D, C] with D even (n_head ",
                                                   n_head, ")"));
  }
  for (const Tensor* w : {&k_w, &v_w}) {
    if (w->size(0) != n_kv_head * D) {
      return absl::InvalidArgumentError(absl::StrCat(
          kOp, ": ", w == &k_w ? "k" : "v", " weight must be [", n_kv_head * D, ", ", p.in,
          "] (n_kv_head ", n_kv_head, " heads of width ", D, "), got ", w->ToString()));
    }
  }
  const int64_t B = x.size(0), T = x.size(1);
  RETURN_IF_ERROR(CheckTables(kOp, tables, D, T, x.device()));
  // GroupedQueryAttention::ForwardPlus: x rounded once for the three projections, their fp32
  // outputs packed, rotated and repeated per group into qkv (bf16 for bf16 attention).
  ASSIGN_OR_RETURN(const Tensor a, GemmInput(kOp, p));
  ASSIGN_OR_RETURN(const Tensor q, Project(kOp, p, 0, a));
  ASSIGN_OR_RETURN(const Tensor k, Project(kOp, p, 1, a));
  ASSIGN_OR_RETURN(const Tensor v, Project(kOp, p, 2, a));
  ASSIGN_OR_RETURN(Tensor qkv, NewActivation({B, T, 3 * n_head * D}, x.device(),
                                             p.w16 ? DType::kBFloat16 : DType::kFloat32));
  RETURN_IF_ERROR(RotaryPackQkv(kOp, q, k, v, tables.cos, tables.sin, n_head, n_kv_head, qkv));
  const DType grad_dtype = p.w16 ? DType::kBFloat16 : DType::kFloat32;
  RETURN_IF_ERROR(core::RecordFunction(
      kOp, {x, q_w, k_w, v_w}, {&qkv}, SavedForProjections(p, a),
      [names = p.names, x_shape = x.shape(), cos = tables.cos, sin = tables.sin, n_head, n_kv_head,
       grad_dtype, D](const core::BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
        // GroupedQueryAttention::BackwardImpl below the attention core: each projection's
        // gradient stored in its GEMMs' dtype by the packing's backward.
        ASSIGN_OR_RETURN(const std::vector<Tensor> g,
                         UnpackRotaryGrad(kOp, ctx.grad(0), cos, sin, n_head, n_kv_head, D,
                                          {grad_dtype, grad_dtype, grad_dtype}));
        return ProjectionsBackward(ctx, kOp, names, x_shape, g);
      },
      {"input", "q weight", "k weight", "v weight"}));
  return qkv;
}

absl::StatusOr<Tensor> SwiGlu(core::Arg x_arg, core::Arg gate_w_arg, core::Arg up_w_arg,
                              const SwiGluOptions& options) {
  constexpr const char* kOp = "SwiGlu";
  ASSIGN_OR_RETURN(
      const Projections p,
      CheckProjections(kOp, x_arg, {{"gate weight", &gate_w_arg}, {"up weight", &up_w_arg}}));
  const Tensor &x = p.x, &gate_w = p.w[0], &up_w = p.w[1];
  if (up_w.size(0) != gate_w.size(0)) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": up weight must be like gate weight ",
                                                   gate_w.ToString(), ", got ", up_w.ToString()));
  }
  // SwiGluMlp::ForwardPlus up to down_proj: x rounded once for gate and up, their fp32 outputs,
  // h = silu(gate) * up stored bf16 for down_proj's bf16 GEMM.
  ASSIGN_OR_RETURN(const Tensor a, GemmInput(kOp, p));
  ASSIGN_OR_RETURN(const Tensor gate, Project(kOp, p, 0, a));
  ASSIGN_OR_RETURN(const Tensor up, Project(kOp, p, 1, a));
  ASSIGN_OR_RETURN(Tensor h,
                   NewActivation(gate.shape(), x.device(),
                                 options.h_for_gemm && p.w16 ? DType::kBFloat16 : DType::kFloat32));
  RETURN_IF_ERROR(SiluMulForward(kOp, gate, up, h));
  std::vector<Tensor> saved = SavedForProjections(p, a);
  saved.push_back(gate);
  saved.push_back(up);
  const DType grad_dtype = p.w16 ? DType::kBFloat16 : DType::kFloat32;
  RETURN_IF_ERROR(core::RecordFunction(
      kOp, {x, gate_w, up_w}, {&h}, std::move(saved),
      [names = p.names, x_shape = x.shape(),
       grad_dtype](const core::BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
        // SwiGluMlp::BackwardImpl below down_proj: the gradients of gate and up stored in their
        // GEMMs' dtype by SiluMulBackward.
        const Tensor& gh = ctx.grad(0);
        const Tensor& gate = ctx.saved(3);
        const Tensor& up = ctx.saved(4);
        ASSIGN_OR_RETURN(const Tensor ga, NewActivation(gate.shape(), gh.device(), grad_dtype));
        ASSIGN_OR_RETURN(const Tensor gb, NewActivation(up.shape(), gh.device(), grad_dtype));
        RETURN_IF_ERROR(SiluMulBackward(kOp, gate, up, gh, ga, gb));
        return ProjectionsBackward(ctx, kOp, names, x_shape, {ga, gb});
      },
      {"input", "gate weight", "up weight", "gate", "up"}));
  return h;
}

absl::StatusOr<Tensor> PackRotaryQkv(core::Arg q_arg, core::Arg k_arg, core::Arg v_arg,
                                     const RotaryTables& tables, int64_t n_head, int64_t n_kv_head,
                                     DType dtype) {
  constexpr const char* kOp = "PackRotaryQkv";
  ASSIGN_OR_RETURN(const Tensor q, internal::Input(kOp, "q", q_arg));
  ASSIGN_OR_RETURN(const Tensor k, internal::Input(kOp, "k", k_arg));
  ASSIGN_OR_RETURN(const Tensor v, internal::Input(kOp, "v", v_arg));
  if (dtype != DType::kFloat32 && dtype != DType::kBFloat16) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": dtype must be float32 or bfloat16, got ", core::DTypeName(dtype)));
  }
  if (n_head <= 0 || n_kv_head <= 0 || n_head % n_kv_head != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp, ": n_head (", n_head, ") must be a positive multiple of n_kv_head (", n_kv_head, ")"));
  }
  const int64_t D = q.dim() == 3 ? q.size(2) / n_head : 0;
  if (q.dim() != 3 || q.size(2) % n_head != 0 || D == 0 || D % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": q must be [B, T, n_head * D] with D even (n_head ", n_head, "), got ",
                     q.ToString()));
  }
  // nn::RotaryPackQkv checks the rest (dtypes, devices, k's and v's shapes).
  const int64_t B = q.size(0), T = q.size(1);
  RETURN_IF_ERROR(CheckTables(kOp, tables, D, T, q.device()));
  ASSIGN_OR_RETURN(Tensor qkv, NewActivation({B, T, 3 * n_head * D}, q.device(), dtype));
  RETURN_IF_ERROR(RotaryPackQkv(kOp, q, k, v, tables.cos, tables.sin, n_head, n_kv_head, qkv));
  RETURN_IF_ERROR(core::RecordFunction(
      kOp, {q, k, v}, {&qkv}, {},
      [cos = tables.cos, sin = tables.sin, n_head, n_kv_head, D, dtypes = GradDTypes({&q, &k, &v})](
          const core::BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
        return UnpackRotaryGrad(kOp, ctx.grad(0), cos, sin, n_head, n_kv_head, D, dtypes);
      }));
  return qkv;
}

absl::StatusOr<Tensor> SiluMul(core::Arg gate_arg, core::Arg up_arg, DType dtype) {
  constexpr const char* kOp = "SiluMul";
  ASSIGN_OR_RETURN(const Tensor gate, internal::Input(kOp, "gate", gate_arg));
  ASSIGN_OR_RETURN(const Tensor up, internal::Input(kOp, "up", up_arg));
  // nn::SiluMulForward checks the dtypes and devices.
  if (gate.shape() != up.shape()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": up must be like gate ", gate.ToString(), ", got ", up.ToString()));
  }
  if (dtype != DType::kFloat32 && dtype != DType::kBFloat16) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": dtype must be float32 or bfloat16, got ", core::DTypeName(dtype)));
  }
  ASSIGN_OR_RETURN(Tensor h, NewActivation(gate.shape(), gate.device(), dtype));
  RETURN_IF_ERROR(SiluMulForward(kOp, gate, up, h));
  RETURN_IF_ERROR(core::RecordFunction(
      kOp, {gate, up}, {&h}, {gate, up},
      [dtypes = GradDTypes({&gate, &up})](
          const core::BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
        const Tensor &gate = ctx.saved(0), &up = ctx.saved(1);
        ASSIGN_OR_RETURN(const Tensor ga, NewActivation(gate.shape(), gate.device(), dtypes[0]));
        ASSIGN_OR_RETURN(const Tensor gb, NewActivation(up.shape(), up.device(), dtypes[1]));
        RETURN_IF_ERROR(SiluMulBackward(kOp, gate, up, ctx.grad(0), ga, gb));
        return std::vector<Tensor>{ga, gb};
      },
      {"gate", "up"}));
  return h;
}

}  // namespace functional
}  // namespace nn
