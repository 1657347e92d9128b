#include "nn/functional/fused.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/module.h"
#include "core/op_profile.h"
#include "core/status_macros.h"
#include "nn/functional/internal/grad_sink.h"
#include "nn/functional/internal/tensor_args.h"
#include "nn/internal/attention_core.h"
#include "nn/internal/op_checks.h"
#include "nn/internal/validate.h"
#include "nn/ops.h"
#include "nn/tensor_ops.h"

namespace nn {
namespace functional {
namespace {

using core::DType;
using core::Tensor;
using internal::Bf16GradOutput;
using internal::ProducerTakesBf16Grad;
using ::nn::internal::CheckDevices;
using ::nn::internal::CheckFp32OrBf16;
using ::nn::internal::IsBf16;
using ::nn::internal::NewActivation;

// The tensor of `arg`: its error unchanged, or InvalidArgument "<op>: <name> is undefined" unless
// `optional`.
absl::StatusOr<Tensor> Input(const char* op, const char* name, const core::Arg& arg,
                             bool optional = false) {
  RETURN_IF_ERROR(arg.status());
  if (!optional && !arg.tensor().defined()) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " is undefined"));
  }
  return arg.tensor();
}

// `t` converted to `dtype` (itself when it is so already): a bf16 GEMM operand rounded once (NOTE
// [bf16 GEMMs] in nn/linear.h), or a bf16 tensor widened exactly.
absl::StatusOr<Tensor> AsDType(const char* op, const char* name, const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  absl::StatusOr<Tensor> r = t.ToDType(dtype, core::MemoryTag::kActivation);
  if (!r.ok()) {
    return core::Annotate(r.status(),
                          absl::StrCat(op, ": converting ", name, " to ", core::DTypeName(dtype)));
  }
  return r;
}

// ---- The Linear steps: nn::Linear's GEMMs (nn/linear.cc), with the epilogues of NOTE [GEMM
// epilogues] (nn/tensor_ops.h).

struct LinearSizes {
  int64_t rows = 0, in = 0, out = 0;
  core::Shape x_shape;
  bool w16 = false;
  // dL/dx stored bf16 by its GEMM: a bf16 weight and an input whose producer takes its gradient
  // in bf16. Set by the op that records the step.
  bool gx16 = false;
  core::Shape out_shape() const { return WithLastDim(x_shape, out); }
};

// A Linear step's arguments, checked: x [..., in] (fp32, or bf16 with a bf16 w), w [out, in] (fp32
// or bf16), b ([out], fp32 or bf16; required when `need_bias`) and a residual (fp32 [..., out];
// required when `need_residual`), on one device. Arg errors come first, unchanged. `x_name` names x
// in messages.
struct LinearArgs {
  Tensor x, w, b, residual;
  LinearSizes s;
};
absl::StatusOr<LinearArgs> CheckLinear(const char* op, const char* x_name, const core::Arg& x_arg,
                                       const core::Arg& w_arg, const core::Arg& b_arg,
                                       bool need_bias, const core::Arg& residual_arg,
                                       bool need_residual) {
  LinearArgs l;
  ASSIGN_OR_RETURN(l.x, Input(op, x_name, x_arg));
  ASSIGN_OR_RETURN(l.w, Input(op, "weight", w_arg));
  ASSIGN_OR_RETURN(l.b, Input(op, "bias", b_arg, /*optional=*/!need_bias));
  ASSIGN_OR_RETURN(l.residual, Input(op, "residual", residual_arg,
                                     /*optional=*/!need_residual));
  const Tensor &x = l.x, &w = l.w, &b = l.b, &residual = l.residual;
  RETURN_IF_ERROR(CheckDevices(op, {{x_name, &x}, {"weight", &w}}));
  if (b.defined()) RETURN_IF_ERROR(CheckDevices(op, {{x_name, &x}, {"bias", &b}}));
  if (residual.defined())
    RETURN_IF_ERROR(CheckDevices(op, {{x_name, &x}, {"residual", &residual}}));
  RETURN_IF_ERROR(CheckFp32OrBf16(op, "weight", w));
  if (w.dim() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": weight must be 2-D [out, in], got ", w.ToString()));
  }
  LinearSizes& s = l.s;
  s.out = w.size(0);
  s.in = w.size(1);
  s.w16 = IsBf16(w);
  if (x.dtype() != DType::kFloat32 && !(s.w16 && IsBf16(x))) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", x_name, " must be float32 (bfloat16 only with a bfloat16 weight), got ",
        x.ToString()));
  }
  if (x.dim() == 0 || x.size(-1) != s.in) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", x_name, " ", x.ToString(),
                                                   " must have last dimension ", s.in,
                                                   " (the in of weight ", w.ToString(), ")"));
  }
  s.rows = RowsOf(x.shape());
  s.x_shape = x.shape();
  if (b.defined()) {
    RETURN_IF_ERROR(CheckFp32OrBf16(op, "bias", b));
    if (b.shape() != core::Shape{s.out}) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": bias must be [", s.out, "] (the out of the weight), got ", b.ToString()));
    }
  }
  if (residual.defined() &&
      (residual.dtype() != DType::kFloat32 || residual.shape() != s.out_shape())) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": residual must be float32 ", core::ShapeToString(s.out_shape()),
                     " (the output's shape), got ", residual.ToString()));
  }
  return l;
}

// y = a w^T with `epilogue` (NOTE [GEMM epilogues]), a the input as the GEMM takes it.
absl::Status ForwardGemm(const char* op, const LinearSizes& s, const Tensor& a, const Tensor& w,
                         const Tensor& y, GemmEpilogue epilogue, const Tensor& bias,
                         const Tensor& aux) {
  GemmArgs g;
  g.trans_b = true;
  g.m = s.rows;
  g.n = s.out;
  g.k = s.in;
  g.a.tensor = a;
  g.b.tensor = w;
  g.c.tensor = y;
  g.epilogue = epilogue;
  g.bias = bias;
  g.aux = aux;
  return ::nn::MatMul(op, g);
}

// x as a Linear step's GEMM takes it: rounded once to bf16 under a bf16 weight.
absl::StatusOr<Tensor> GemmInput(const char* op, const char* name, const LinearSizes& s,
                                 const Tensor& x) {
  return AsDType(op, name, x, s.w16 ? DType::kBFloat16 : x.dtype());
}

// The epilogue of a forward GEMM with an optional bias and residual.
GemmEpilogue BiasEpilogue(const Tensor& b, const Tensor& residual) {
  if (residual.defined())
    return b.defined() ? GemmEpilogue::kBiasResidual : GemmEpilogue::kResidual;
  return b.defined() ? GemmEpilogue::kBias : GemmEpilogue::kNone;
}

// What a Linear step's record saves: the input as the GEMM took it (for the weight's gradient) and
// the weight (for the input's).
std::vector<Tensor> SavedForLinear(const Tensor& x, const Tensor& a, const Tensor& w) {
  return {core::RequiresGrad(w) ? a : Tensor(), core::RequiresGrad(x) ? w : Tensor()};
}

// The input gradient and the weight and bias sinks of a Linear step's backward.
struct LinearGrads {
  Tensor gx;
  internal::GradSink gw, gb;
};

// nn::Linear's backward GEMMs (Linear::BackwardGemms) from the gradient of its output `grad`
// (fp32, or bf16 under a bf16 weight): dL/dx = g w (times GELU'(gelu_pre) in the epilogue when
// gelu_pre is defined, in its dtype; else bf16 when s.gx16, else fp32), then dL/dw += g^T x with
// dL/db += the column sums of g in its GEMM (or the column sums alone), g rounded once to bf16
// under a bf16 weight. `a` is the input as the forward's GEMM took it; inputs x_i, w_i and b_i of
// the record are x, w and b. `grad16`, when defined, is grad's bf16 copy (NOTE [bf16 gradient
// copies]), taken instead of rounding grad.
absl::StatusOr<LinearGrads> LinearBackward(const core::BackwardContext& ctx, const char* op,
                                           const LinearSizes& s, const Tensor& grad,
                                           const Tensor& a, const Tensor& w, int x_i, int w_i,
                                           int b_i, const Tensor& gelu_pre = Tensor(),
                                           const Tensor& grad16 = Tensor()) {
  const core::Device device = grad.device();
  LinearGrads out;
  if (ctx.needs_grad(x_i)) {
    ASSIGN_OR_RETURN(out.gx, NewActivation(s.x_shape, device,
                                           gelu_pre.defined() ? gelu_pre.dtype()
                                           : s.gx16           ? DType::kBFloat16
                                                              : DType::kFloat32));
  }
  Tensor g = grad;
  if (s.w16 && grad16.defined()) {
    g = grad16;  // NOTE [bf16 gradient copies]: written by the consumer's pass
  } else if (s.w16) {
    ASSIGN_OR_RETURN(g, AsDType(op, "grad_output", grad, DType::kBFloat16));
  }
  if (out.gx.defined()) {
    GemmArgs dx;
    dx.m = s.rows;
    dx.n = s.in;
    dx.k = s.out;
    dx.a.tensor = g;
    dx.b.tensor = w;
    dx.c.tensor = out.gx;
    if (gelu_pre.defined()) {
      dx.epilogue = GemmEpilogue::kDGelu;
      dx.aux = gelu_pre;
    }
    core::ScopedOpCategory role(core::OpCategory::kGemmInputGrad);
    RETURN_IF_ERROR(::nn::MatMul(op, dx));
  }
  ASSIGN_OR_RETURN(out.gw, internal::GradSinkFor(ctx, w_i, op, "weight", {s.out, s.in}, device));
  ASSIGN_OR_RETURN(out.gb, internal::GradSinkFor(ctx, b_i, op, "bias", {s.out}, device));
  if (out.gw.tensor.defined()) {
    core::ScopedOpCategory role(core::OpCategory::kGemmWeightGrad);
    RETURN_IF_ERROR(::nn::MatMul(
        op, WeightGradientGemm(s.rows, s.out, s.in, g, a, out.gw.tensor, out.gb.tensor)));
  } else if (out.gb.tensor.defined()) {
    RETURN_IF_ERROR(AccumulateColumnSums(op, g, Tensor(), out.gb.tensor));
  }
  return out;
}

// The backward of a Linear step recorded over {x, w, b} (and a residual last when `residual`) with
// SavedForLinear: Linear's backward, and dy for the residual. `copy`: the record's NOTE [bf16
// gradient copies] box, or null.
core::BackwardFn LinearStepBackward(const char* op, const LinearSizes& s, bool residual,
                                    std::shared_ptr<core::Bf16GradCopy> copy = nullptr) {
  return [op, s, residual, copy = std::move(copy)](
             const core::BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
    const Tensor grad16 = core::TakeBf16GradCopy(copy, ctx.grad(0));
    ASSIGN_OR_RETURN(const LinearGrads g, LinearBackward(ctx, op, s, ctx.grad(0), ctx.saved(0),
                                                         ctx.saved(1), 0, 1, 2, Tensor(), grad16));
    std::vector<Tensor> grads = {g.gx, g.gw.returned(), g.gb.returned()};
    if (residual) grads.push_back(ctx.needs_grad(3) ? ctx.grad(0) : Tensor());
    return grads;
  };
}

// ---- The residual-stream LayerNorms (nn::LayerNorm's RunForward, ForwardAdd, RunBackward).

// The checks of x [..., C] fp32 (C >= 1), w and b [C] both fp32 or both bf16, and eps.
absl::Status CheckNorm(const char* op, const char* x_name, const Tensor& x, const Tensor& w,
                       const Tensor& b, float eps) {
  RETURN_IF_ERROR(CheckDevices(op, {{x_name, &x}, {"weight", &w}, {"bias", &b}}));
  RETURN_IF_ERROR(::nn::internal::CheckDType(op, x_name, x, DType::kFloat32));
  RETURN_IF_ERROR(CheckFp32OrBf16(op, "weight", w));
  if (x.dim() == 0 || x.size(-1) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", x_name,
                                                   " must be at least 1-D with a non-empty last "
                                                   "dimension, got ",
                                                   x.ToString()));
  }
  if (w.shape() != core::Shape{x.size(-1)}) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": weight must be [", x.size(-1), "] (",
                                                   x_name, "'s last dimension), got ",
                                                   w.ToString()));
  }
  if (b.dtype() != w.dtype() || b.shape() != w.shape()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": bias must be like weight ", w.ToString(), ", got ", b.ToString()));
  }
  if (!(std::isfinite(eps) && eps >= 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": eps must be finite and >= 0, got ", eps));
  }
  return absl::OkStatus();
}

// The outputs of a LayerNorm pass over `like`: normed (bf16 per the options), each row's mean and
// rstd.
struct NormOutputs {
  Tensor normed, mean, rstd;
};
absl::StatusOr<NormOutputs> NewNormOutputs(const Tensor& like, const Tensor& w,
                                           const FusedNormOptions& options) {
  const core::Device device = like.device();
  const int64_t rows = RowsOf(like.shape());
  NormOutputs out;
  ASSIGN_OR_RETURN(
      out.normed,
      NewActivation(like.shape(), device,
                    options.normed_for_gemm && IsBf16(w) ? DType::kBFloat16 : DType::kFloat32));
  ASSIGN_OR_RETURN(out.mean, NewActivation({rows}, device));
  ASSIGN_OR_RETURN(out.rstd, NewActivation({rows}, device));
  return out;
}

// The backward of a record {stream, normed} over inputs (..., w, b) with w, b the last two and
// saved {input of the LayerNorm, mean, rstd, w}: dL/dstream = g_stream + LN'(g_normed) in the
// LayerNorm's pass (LayerNorm::BackwardAdd), given to each of the first `stream_inputs` inputs that
// needs it; w and b get their gradients. With `copy` (the stream input's producer's NOTE [bf16
// gradient copies] box) the pass also writes the bf16 copy of dL/dstream there.
absl::StatusOr<std::vector<Tensor>> StreamNormBackward(
    const core::BackwardContext& ctx, const char* op, int stream_inputs,
    const std::shared_ptr<core::Bf16GradCopy>& copy = nullptr) {
  const Tensor& g_stream = ctx.grad(0);
  const Tensor& g = ctx.grad(1);
  const Tensor& x = ctx.saved(0);
  const Tensor& w = ctx.saved(3);
  const core::Device device = g.device();
  ASSIGN_OR_RETURN(const Tensor gx, NewActivation(x.shape(), device));
  ASSIGN_OR_RETURN(const internal::GradSink gw,
                   internal::GradSinkFor(ctx, stream_inputs, op, "weight", w.shape(), device));
  ASSIGN_OR_RETURN(const internal::GradSink gb,
                   internal::GradSinkFor(ctx, stream_inputs + 1, op, "bias", w.shape(), device));
  Tensor gx16;  // NOTE [bf16 gradient copies]: for the stream's producer, in this pass
  if (copy != nullptr && ctx.needs_grad(0)) {
    ASSIGN_OR_RETURN(gx16, NewActivation(x.shape(), device, DType::kBFloat16));
  }
  RETURN_IF_ERROR(LayerNormBackwardAdd(op, g, x, ctx.saved(1), ctx.saved(2), w, g_stream, gx,
                                       gw.tensor, gb.tensor, gx16));
  if (gx16.defined()) {
    copy->sent = gx;
    copy->copy = gx16;
  }
  std::vector<Tensor> grads;
  for (int i = 0; i < stream_inputs; ++i) grads.push_back(ctx.needs_grad(i) ? gx : Tensor());
  grads.push_back(gw.returned());
  grads.push_back(gb.returned());
  return grads;
}

// ---- Attention.

// Names the attention core's ops and errors (CausalAttentionCore takes the module it runs for):
// "<root> (CausalSelfAttentionCore)".
class AttentionCoreName final : public core::Module {
 public:
  std::string TypeName() const override { return "CausalSelfAttentionCore"; }
};
const core::Module& AttentionCoreNamer() {
  static const AttentionCoreName* const namer = new AttentionCoreName();
  return *namer;
}

}  // namespace

absl::StatusOr<Tensor> LinearForGemm(core::Arg x_arg, core::Arg w_arg, core::Arg b_arg) {
  constexpr const char* kOp = "LinearForGemm";
  ASSIGN_OR_RETURN(const LinearArgs l, CheckLinear(kOp, "input", x_arg, w_arg, b_arg,
                                                   /*need_bias=*/false, Tensor(), false));
  const Tensor &x = l.x, &w = l.w, &b = l.b;
  LinearSizes s = l.s;
  s.gx16 = s.w16 && ProducerTakesBf16Grad(x);
  ASSIGN_OR_RETURN(Tensor y, NewActivation(s.out_shape(), x.device(),
                                           s.w16 ? DType::kBFloat16 : DType::kFloat32));
  ASSIGN_OR_RETURN(const Tensor a, GemmInput(kOp, "input", s, x));
  RETURN_IF_ERROR(ForwardGemm(kOp, s, a, w, y, BiasEpilogue(b, Tensor()), b, Tensor()));
  // Under a bf16 weight dy is a bf16 GEMM operand: it may arrive bf16 (NOTE [Functional
  // fusions] (d)).
  RETURN_IF_ERROR(core::RecordFunction(kOp, {x, w, b}, {&y}, SavedForLinear(x, a, w),
                                       LinearStepBackward(kOp, s, /*residual=*/false),
                                       {"input", "weight"}, Bf16GradOutput(s.w16)));
  return y;
}

absl::StatusOr<std::vector<Tensor>> LinearGelu(core::Arg x_arg, core::Arg w_arg, core::Arg b_arg) {
  constexpr const char* kOp = "LinearGelu";
  ASSIGN_OR_RETURN(const LinearArgs l, CheckLinear(kOp, "input", x_arg, w_arg, b_arg,
                                                   /*need_bias=*/true, Tensor(), false));
  const Tensor &x = l.x, &w = l.w, &b = l.b;
  LinearSizes s = l.s;
  s.gx16 = s.w16 && ProducerTakesBf16Grad(x);
  // kBiasGelu: h and pre in the GEMM's dtype for proj (NOTE [GEMM epilogues]).
  const DType out_dtype = s.w16 ? DType::kBFloat16 : DType::kFloat32;
  ASSIGN_OR_RETURN(Tensor h, NewActivation(s.out_shape(), x.device(), out_dtype));
  ASSIGN_OR_RETURN(const Tensor a, GemmInput(kOp, "input", s, x));
  ASSIGN_OR_RETURN(Tensor pre, NewActivation(s.out_shape(), x.device(), out_dtype));
  RETURN_IF_ERROR(ForwardGemm(kOp, s, a, w, h, GemmEpilogue::kBiasGelu, b, pre));
  // pre's node: fc's backward from the gradient at the pre-activation, which GeluLinear passes
  // bf16 under a bf16 weight (NOTE [Functional fusions] (a)).
  RETURN_IF_ERROR(core::RecordFunction(kOp, {x, w, b}, {&pre}, SavedForLinear(x, a, w),
                                       LinearStepBackward(kOp, s, /*residual=*/false),
                                       {"input", "weight"}, Bf16GradOutput(s.w16)));
  // h's node, over pre: runs only when some consumer sends h a gradient (GeluLinear sends its own
  // to pre), which it turns into pre's as GELU's backward.
  RETURN_IF_ERROR(core::RecordFunction(
      "LinearGelu.h", {pre}, {&h}, {pre},
      [](const core::BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
        const Tensor& gh = ctx.grad(0);
        ASSIGN_OR_RETURN(const Tensor p,
                         AsDType("LinearGelu.h", "pre", ctx.saved(0), DType::kFloat32));
        ASSIGN_OR_RETURN(Tensor gpre, NewActivation(p.shape(), gh.device()));
        RETURN_IF_ERROR(GeluBackward("LinearGelu.h", p, gh, gpre));
        return std::vector<Tensor>{gpre};
      },
      {"pre"}));
  return std::vector<Tensor>{h, pre};
}

absl::StatusOr<Tensor> GeluLinear(core::Arg h_arg, core::Arg pre_arg, core::Arg w_arg,
                                  core::Arg b_arg, core::Arg residual_arg) {
  constexpr const char* kOp = "GeluLinear";
  ASSIGN_OR_RETURN(const Tensor pre, Input(kOp, "pre", pre_arg));
  ASSIGN_OR_RETURN(const LinearArgs l, CheckLinear(kOp, "h", h_arg, w_arg, b_arg, false,
                                                   residual_arg, /*need_residual=*/false));
  const Tensor &h = l.x, &w = l.w, &b = l.b, &residual = l.residual;
  const LinearSizes& s = l.s;
  RETURN_IF_ERROR(CheckDevices(kOp, {{"h", &h}, {"pre", &pre}}));
  if (pre.shape() != h.shape() || pre.dtype() != h.dtype()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": pre must be like h ", h.ToString(), ", got ", pre.ToString()));
  }
  if (core::RequiresGrad(h) && !core::RequiresGrad(pre)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": h ", h.ToString(),
                     " requires gradients but pre does not; h's gradient goes to "
                     "pre (h must be GELU(pre), as LinearGelu makes them)"));
  }
  ASSIGN_OR_RETURN(Tensor y, NewActivation(s.out_shape(), h.device()));
  ASSIGN_OR_RETURN(const Tensor a, GemmInput(kOp, "h", s, h));
  RETURN_IF_ERROR(ForwardGemm(kOp, s, a, w, y, BiasEpilogue(b, residual), b, residual));
  const bool pre_grad = core::RequiresGrad(pre);
  RETURN_IF_ERROR(core::RecordFunction(
      kOp, {h, pre, w, b, residual}, {&y},
      {core::RequiresGrad(w) ? a : Tensor(), pre_grad ? pre : Tensor(), pre_grad ? w : Tensor()},
      [s](const core::BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
        // kDGelu: dL/dpre in pre's dtype from the GEMM's epilogue, passed
        // on as it is (NOTE [Functional fusions] (a)).
        ASSIGN_OR_RETURN(const LinearGrads g, LinearBackward(ctx, kOp, s, ctx.grad(0), ctx.saved(0),
                                                             ctx.saved(2), 1, 2, 3,
                                                             /*gelu_pre=*/ctx.saved(1)));
        return std::vector<Tensor>{Tensor(), g.gx, g.gw.returned(), g.gb.returned(),
                                   ctx.needs_grad(4) ? ctx.grad(0) : Tensor()};
      },
      {"h", "pre", "weight"}));
  return y;
}

absl::StatusOr<Tensor> BiasAdd(core::Arg x_arg, core::Arg b_arg) {
  constexpr const char* kOp = "BiasAdd";
  RETURN_IF_ERROR(x_arg.status());
  RETURN_IF_ERROR(b_arg.status());
  const Tensor& x = x_arg.tensor();
  const Tensor& b = b_arg.tensor();
  RETURN_IF_ERROR(CheckDevices(kOp, {{"input", &x}, {"bias", &b}}));
  RETURN_IF_ERROR(::nn::internal::CheckDType(kOp, "input", x, DType::kFloat32));
  RETURN_IF_ERROR(CheckFp32OrBf16(kOp, "bias", b));
  const bool trailing = b.dim() <= x.dim() &&
                        std::equal(b.shape().begin(), b.shape().end(), x.shape().end() - b.dim());
  if (!trailing || b.numel() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp, ": bias ", b.ToString(), " must be the trailing dimensions of input ", x.ToString()));
  }
  ASSIGN_OR_RETURN(Tensor y, NewActivation(x.shape(), x.device()));
  RETURN_IF_ERROR(::nn::BiasAdd(kOp, x, b, y));
  RETURN_IF_ERROR(core::RecordFunction(
      kOp, {x, b}, {&y}, {},
      [b_shape =
           b.shape()](const core::BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
        const Tensor& g = ctx.grad(0);
        ASSIGN_OR_RETURN(const internal::GradSink gb,
                         internal::GradSinkFor(ctx, 1, kOp, "bias", b_shape, g.device()));
        if (gb.tensor.defined()) {
          RETURN_IF_ERROR(AccumulateColumnSums(kOp, g, Tensor(), gb.tensor));
        }
        return std::vector<Tensor>{ctx.needs_grad(0) ? g : Tensor(), gb.returned()};
      }));
  return y;
}

absl::StatusOr<Tensor> LinearResidual(core::Arg x_arg, core::Arg w_arg, core::Arg b_arg,
                                      core::Arg residual_arg) {
  constexpr const char* kOp = "LinearResidual";
  ASSIGN_OR_RETURN(const LinearArgs l, CheckLinear(kOp, "input", x_arg, w_arg, b_arg, false,
                                                   residual_arg, /*need_residual=*/true));
  const Tensor &x = l.x, &w = l.w, &b = l.b, &residual = l.residual;
  LinearSizes s = l.s;
  // dL/dx stored bf16 where x's producer takes bf16 (NOTE [Functional fusions] (c)). dy
  // stays fp32: the residual gets it as it is.
  s.gx16 = s.w16 && ProducerTakesBf16Grad(x);
  ASSIGN_OR_RETURN(Tensor y, NewActivation(s.out_shape(), x.device()));
  ASSIGN_OR_RETURN(const Tensor a, GemmInput(kOp, "input", s, x));
  RETURN_IF_ERROR(ForwardGemm(kOp, s, a, w, y, BiasEpilogue(b, residual), b, residual));
  // Under a bf16 weight dy is rounded for the GEMMs and kept fp32 for the residual: the consumer
  // may write the bf16 copy (NOTE [bf16 gradient copies]).
  core::FunctionOptions options;
  if (s.w16) options.bf16_grad_copy = std::make_shared<core::Bf16GradCopy>();
  RETURN_IF_ERROR(
      core::RecordFunction(kOp, {x, w, b, residual}, {&y}, SavedForLinear(x, a, w),
                           LinearStepBackward(kOp, s, /*residual=*/true, options.bf16_grad_copy),
                           {"input", "weight"}, options));
  return y;
}

absl::StatusOr<std::vector<Tensor>> ResidualLayerNorm(core::Arg x_arg, core::Arg w_arg,
                                                      core::Arg b_arg,
                                                      const FusedNormOptions& options) {
  constexpr const char* kOp = "ResidualLayerNorm";
  ASSIGN_OR_RETURN(const Tensor x, Input(kOp, "input", x_arg));
  ASSIGN_OR_RETURN(const Tensor w, Input(kOp, "weight", w_arg));
  ASSIGN_OR_RETURN(const Tensor b, Input(kOp, "bias", b_arg));
  RETURN_IF_ERROR(CheckNorm(kOp, "input", x, w, b, options.eps));
  ASSIGN_OR_RETURN(NormOutputs n, NewNormOutputs(x, w, options));
  RETURN_IF_ERROR(LayerNormForward(kOp, x, w, b, options.eps, n.normed, n.mean, n.rstd));
  Tensor x_out = core::Detach(x);
  RETURN_IF_ERROR(core::RecordFunction(
      kOp, {x, w, b}, {&x_out, &n.normed}, {x, n.mean, n.rstd, w},
      [copy = core::ProducerBf16GradCopy(x)](const core::BackwardContext& ctx) {
        return StreamNormBackward(ctx, kOp, 1, copy);
      },
      {"input", "mean", "rstd", "weight"}));
  return std::vector<Tensor>{x_out, n.normed};
}

absl::StatusOr<std::vector<Tensor>> AddLayerNorm(core::Arg a_arg, core::Arg b_arg, core::Arg w_arg,
                                                 core::Arg bias_arg,
                                                 const FusedNormOptions& options) {
  constexpr const char* kOp = "AddLayerNorm";
  ASSIGN_OR_RETURN(const Tensor a, Input(kOp, "a", a_arg));
  ASSIGN_OR_RETURN(const Tensor b, Input(kOp, "b", b_arg));
  ASSIGN_OR_RETURN(const Tensor w, Input(kOp, "weight", w_arg));
  ASSIGN_OR_RETURN(const Tensor bias, Input(kOp, "bias", bias_arg));
  RETURN_IF_ERROR(CheckDevices(kOp, {{"a", &a}, {"b", &b}}));
  RETURN_IF_ERROR(::nn::internal::CheckDType(kOp, "b", b, DType::kFloat32));
  if (b.shape() != a.shape()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": b must be like a ", a.ToString(), ", got ", b.ToString()));
  }
  RETURN_IF_ERROR(CheckNorm(kOp, "a", a, w, bias, options.eps));
  ASSIGN_OR_RETURN(Tensor sum, NewActivation(a.shape(), a.device()));
  ASSIGN_OR_RETURN(NormOutputs n, NewNormOutputs(a, w, options));
  RETURN_IF_ERROR(
      AddLayerNormForward(kOp, a, b, w, bias, options.eps, sum, n.normed, n.mean, n.rstd));
  RETURN_IF_ERROR(core::RecordFunction(
      kOp, {a, b, w, bias}, {&sum, &n.normed}, {sum, n.mean, n.rstd, w},
      [](const core::BackwardContext& ctx) { return StreamNormBackward(ctx, kOp, 2); },
      {"sum", "mean", "rstd", "weight"}));
  return std::vector<Tensor>{sum, n.normed};
}

absl::StatusOr<Tensor> CausalSelfAttentionCore(core::Arg qkv_arg, int64_t n_head,
                                               const AttentionCoreOptions& options) {
  constexpr const char* kOp = "CausalSelfAttentionCore";
  ASSIGN_OR_RETURN(const Tensor qkv, Input(kOp, "qkv", qkv_arg));
  RETURN_IF_ERROR(CheckFp32OrBf16(kOp, "qkv", qkv));
  if (qkv.dim() != 3 || qkv.size(2) % 3 != 0 || qkv.size(2) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": qkv must be [B, T, 3C] with C >= 1, got ", qkv.ToString()));
  }
  if (n_head <= 0 || qkv.size(2) / 3 % n_head != 0) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": n_head (", n_head,
                                                   ") must be positive and divide C (",
                                                   qkv.size(2) / 3, ") of qkv ", qkv.ToString()));
  }
  // The core keeps what its backward needs (qkv and the probabilities, or the fused path's y and
  // row statistics) until the record is freed; each backward runs on a copy of it, so a retained
  // graph can run again.
  auto state = std::make_shared<::nn::internal::CausalAttentionCore>();
  ASSIGN_OR_RETURN(
      Tensor y, state->Forward(AttentionCoreNamer(), qkv, n_head, options.fused, options.y_bf16));
  // NOTE [Functional fusions]: with bf16 q, k, v both paths take dy as a bf16 GEMM operand, so it
  // may arrive bf16 ((c)); the fused path writes dL/dqkv bf16 where qkv's producer takes it so
  // ((d)).
  const bool qkv16 = IsBf16(qkv);
  const bool gqkv16 = qkv16 && ProducerTakesBf16Grad(qkv);
  RETURN_IF_ERROR(core::RecordFunction(
      kOp, {qkv}, {&y}, {qkv},
      [state, gqkv16](const core::BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
        ::nn::internal::CausalAttentionCore run = *state;
        ASSIGN_OR_RETURN(Tensor gqkv, run.Backward(AttentionCoreNamer(), ctx.grad(0), gqkv16));
        return std::vector<Tensor>{gqkv};
      },
      {"qkv"}, Bf16GradOutput(qkv16)));
  return y;
}

}  // namespace functional
}  // namespace nn
