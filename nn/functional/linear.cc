#include "nn/functional/linear.h"

#include <cstdint>
#include <string>
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

// `t` rounded once to bf16 (itself when already bf16): the operand of a bf16 GEMM (NOTE
// [bf16 GEMMs] in nn/linear.h). `name` names it in an error.
absl::StatusOr<Tensor> Bf16Operand(const char* op, const char* name, const Tensor& t) {
  if (IsBf16(t)) return t;
  absl::StatusOr<Tensor> r = t.ToDType(DType::kBFloat16, core::MemoryTag::kActivation);
  if (!r.ok()) return core::Annotate(r.status(), absl::StrCat(op, ": rounding ", name, " to bf16"));
  return r;
}

// The GEMM c_i = op(a_i) op(b_i) for i < batch, each operand `stride` elements after the
// last (0: one matrix shared by all).
GemmArgs Product(bool trans_a, bool trans_b, int64_t batch, int64_t m, int64_t n, int64_t k,
                 const Tensor& a, int64_t a_stride, const Tensor& b, int64_t b_stride,
                 const Tensor& c) {
  GemmArgs g;
  g.trans_a = trans_a;
  g.trans_b = trans_b;
  g.batch = batch;
  g.m = m;
  g.n = n;
  g.k = k;
  g.a.tensor = a;
  g.a.batch_stride = a_stride;
  g.b.tensor = b;
  g.b.batch_stride = b_stride;
  g.c.tensor = c;
  g.c.batch_stride = m * n;
  return g;
}

// ---- MatMul.

// The sizes of a [..., m, k] x [..., k, n] product: `batch` matrices of a, and b shared by
// them when it is 2-D.
struct MatMulSizes {
  int64_t batch = 1, m = 0, k = 0, n = 0;
  bool shared_b = false;
};

absl::StatusOr<MatMulSizes> CheckMatMul(const Tensor& a, const Tensor& b) {
  RETURN_IF_ERROR(CheckDevices("MatMul", {{"a", &a}, {"b", &b}}));
  RETURN_IF_ERROR(CheckFp32OrBf16("MatMul", "a", a));
  RETURN_IF_ERROR(CheckFp32OrBf16("MatMul", "b", b));
  if (a.dim() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("MatMul: a must be at least 2-D [..., m, k], got ", a.ToString()));
  }
  if (b.dim() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("MatMul: b must be at least 2-D [..., k, n], got ", b.ToString()));
  }
  if (a.size(-1) != b.size(-2)) {
    return absl::InvalidArgumentError(absl::StrCat("MatMul: a ", a.ToString(), " has ", a.size(-1),
                                                   " columns but b ", b.ToString(), " has ",
                                                   b.size(-2), " rows"));
  }
  const core::Shape lead(a.shape().begin(), a.shape().end() - 2);
  if (b.dim() > 2 && core::Shape(b.shape().begin(), b.shape().end() - 2) != lead) {
    return absl::InvalidArgumentError(absl::StrCat("MatMul: b ", b.ToString(),
                                                   " must be 2-D or have a's leading dimensions ",
                                                   core::ShapeToString(lead)));
  }
  MatMulSizes s;
  for (int64_t d : lead) s.batch *= d;
  s.m = a.size(-2);
  s.k = a.size(-1);
  s.n = b.size(-1);
  s.shared_b = b.dim() == 2;
  return s;
}

// c = a b, or with trans: the products of MatMul's forward and backward. A shared b folds
// the batch into the rows of one GEMM.
GemmArgs MatMulForward(const MatMulSizes& s, const Tensor& a, const Tensor& b, const Tensor& c) {
  if (s.shared_b) return Product(false, false, 1, s.batch * s.m, s.n, s.k, a, 0, b, 0, c);
  return Product(false, false, s.batch, s.m, s.n, s.k, a, s.m * s.k, b, s.k * s.n, c);
}
// dA = dC B^T.
GemmArgs MatMulGradA(const MatMulSizes& s, const Tensor& gc, const Tensor& b, const Tensor& ga) {
  if (s.shared_b) return Product(false, true, 1, s.batch * s.m, s.k, s.n, gc, 0, b, 0, ga);
  return Product(false, true, s.batch, s.m, s.k, s.n, gc, s.m * s.n, b, s.k * s.n, ga);
}
// dB = A^T dC, summed over the batch for a shared b.
GemmArgs MatMulGradB(const MatMulSizes& s, const Tensor& a, const Tensor& gc, const Tensor& gb) {
  if (s.shared_b) return Product(true, false, 1, s.k, s.n, s.batch * s.m, a, 0, gc, 0, gb);
  return Product(true, false, s.batch, s.k, s.n, s.m, a, s.m * s.k, gc, s.m * s.n, gb);
}

// ---- Linear.

struct LinearSizes {
  int64_t rows = 0, in = 0, out = 0;
  core::Shape x_shape;
  bool w16 = false;
};

absl::StatusOr<LinearSizes> CheckLinear(const Tensor& x, const Tensor& w, const Tensor& b) {
  RETURN_IF_ERROR(CheckDevices("Linear", {{"input", &x}, {"weight", &w}}));
  if (b.defined()) RETURN_IF_ERROR(CheckDevices("Linear", {{"input", &x}, {"bias", &b}}));
  RETURN_IF_ERROR(CheckFp32OrBf16("Linear", "weight", w));
  if (w.dim() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("Linear: weight must be 2-D [out, in], got ", w.ToString()));
  }
  LinearSizes s;
  s.out = w.size(0);
  s.in = w.size(1);
  s.w16 = IsBf16(w);
  if (x.dtype() != DType::kFloat32 && !(s.w16 && IsBf16(x))) {
    return absl::InvalidArgumentError(
        absl::StrCat("Linear: input must be float32 (bfloat16 only with a bfloat16 weight), got ",
                     x.ToString()));
  }
  if (x.dim() == 0 || x.size(-1) != s.in) {
    return absl::InvalidArgumentError(absl::StrCat("Linear: input ", x.ToString(),
                                                   " must have last dimension ", s.in,
                                                   " (the in of weight ", w.ToString(), ")"));
  }
  if (b.defined()) {
    RETURN_IF_ERROR(CheckFp32OrBf16("Linear", "bias", b));
    if (b.shape() != core::Shape{s.out}) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Linear: bias must be [", s.out, "] (the out of the weight), got ", b.ToString()));
    }
  }
  s.rows = RowsOf(x.shape());
  s.x_shape = x.shape();
  return s;
}

// nn::Linear's backward (NOTE [Functional Linear]): dL/dx = g w, then dL/dw += g^T x with
// dL/db += the column sums of g in its GEMM (or the column sums alone without dL/dw); g
// rounded to bf16 first under a bf16 weight. `x` is the input as the forward's GEMM took it.
absl::StatusOr<std::vector<Tensor>> LinearBackward(const core::BackwardContext& ctx,
                                                   const LinearSizes& s, const Tensor& x,
                                                   const Tensor& w, bool gx16) {
  const Tensor& grad = ctx.grad(0);
  const core::Device device = grad.device();
  Tensor g = grad;
  if (s.w16) {
    ASSIGN_OR_RETURN(g, Bf16Operand("Linear", "grad_output", grad));
  }
  Tensor gx;
  if (ctx.needs_grad(0)) {
    ASSIGN_OR_RETURN(gx,
                     NewActivation(s.x_shape, device, gx16 ? DType::kBFloat16 : DType::kFloat32));
    core::ScopedOpCategory role(core::OpCategory::kGemmInputGrad);
    RETURN_IF_ERROR(
        ::nn::MatMul("Linear", Product(false, false, 1, s.rows, s.in, s.out, g, 0, w, 0, gx)));
  }
  ASSIGN_OR_RETURN(const internal::GradSink gw,
                   internal::GradSinkFor(ctx, 1, "Linear", "weight", {s.out, s.in}, device));
  ASSIGN_OR_RETURN(const internal::GradSink gb,
                   internal::GradSinkFor(ctx, 2, "Linear", "bias", {s.out}, device));
  if (gw.tensor.defined()) {
    core::ScopedOpCategory role(core::OpCategory::kGemmWeightGrad);
    RETURN_IF_ERROR(::nn::MatMul(
        "Linear", WeightGradientGemm(s.rows, s.out, s.in, g, x, gw.tensor, gb.tensor)));
  } else if (gb.tensor.defined()) {
    RETURN_IF_ERROR(AccumulateColumnSums("Linear", g, Tensor(), gb.tensor));
  }
  return std::vector<Tensor>{gx, gw.returned(), gb.returned()};
}

}  // namespace

absl::StatusOr<Tensor> MatMul(core::Arg a_arg, core::Arg b_arg) {
  RETURN_IF_ERROR(a_arg.status());
  RETURN_IF_ERROR(b_arg.status());
  const Tensor& a = a_arg.tensor();
  const Tensor& b = b_arg.tensor();
  ASSIGN_OR_RETURN(const MatMulSizes s, CheckMatMul(a, b));
  core::Shape out_shape = a.shape();
  out_shape.back() = s.n;
  ASSIGN_OR_RETURN(Tensor c, NewActivation(out_shape, a.device()));
  RETURN_IF_ERROR(::nn::MatMul("MatMul", MatMulForward(s, a, b, c)));
  // a is needed only for b's gradient, b only for a's.
  RETURN_IF_ERROR(core::RecordFunction(
      "MatMul", {a, b}, {&c},
      {core::RequiresGrad(b) ? a : Tensor(), core::RequiresGrad(a) ? b : Tensor()},
      [s, a_shape = a.shape(), b_shape = b.shape()](
          const core::BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
        const Tensor& gc = ctx.grad(0);
        std::vector<Tensor> grads(2);
        core::ScopedOpCategory role(core::OpCategory::kGemmInputGrad);
        if (ctx.needs_grad(0)) {
          ASSIGN_OR_RETURN(grads[0], NewActivation(a_shape, gc.device()));
          RETURN_IF_ERROR(::nn::MatMul("MatMul", MatMulGradA(s, gc, ctx.saved(1), grads[0])));
        }
        if (ctx.needs_grad(1)) {
          ASSIGN_OR_RETURN(grads[1], NewActivation(b_shape, gc.device()));
          RETURN_IF_ERROR(::nn::MatMul("MatMul", MatMulGradB(s, ctx.saved(0), gc, grads[1])));
        }
        return grads;
      },
      {"a", "b"}));
  return c;
}

absl::StatusOr<Tensor> Linear(core::Arg x_arg, core::Arg w_arg, core::Arg b_arg) {
  RETURN_IF_ERROR(x_arg.status());
  RETURN_IF_ERROR(w_arg.status());
  RETURN_IF_ERROR(b_arg.status());
  const Tensor& x = x_arg.tensor();
  const Tensor& w = w_arg.tensor();
  const Tensor& b = b_arg.tensor();
  ASSIGN_OR_RETURN(const LinearSizes s, CheckLinear(x, w, b));
  ASSIGN_OR_RETURN(Tensor y, NewActivation(WithLastDim(x.shape(), s.out), x.device()));
  // NOTE [bf16 GEMMs]: the input rounded once, kept so for the weight gradient.
  Tensor a = x;
  if (s.w16) {
    ASSIGN_OR_RETURN(a, Bf16Operand("Linear", "input", x));
  }
  GemmArgs g = Product(false, true, 1, s.rows, s.out, s.in, a, 0, w, 0, y);
  if (b.defined()) {
    g.epilogue = GemmEpilogue::kBias;
    g.bias = b;
  }
  RETURN_IF_ERROR(::nn::MatMul("Linear", g));
  // The input is needed only for the weight's gradient, the weight only for the input's.
  // NOTE [Functional fusions] (fused.h): under a bf16 weight the GEMMs round the output's
  // gradient to bf16, so it may arrive so, and dL/dx is stored bf16 for a producer that takes it
  // so (the bits of rounding it there, one pass fewer).
  const bool gx16 = s.w16 && internal::ProducerTakesBf16Grad(x);
  RETURN_IF_ERROR(core::RecordFunction(
      "Linear", {x, w, b}, {&y},
      {core::RequiresGrad(w) ? a : Tensor(), core::RequiresGrad(x) ? w : Tensor()},
      [s, gx16](const core::BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
        return LinearBackward(ctx, s, ctx.saved(0), ctx.saved(1), gx16);
      },
      {"input", "weight"}, internal::Bf16GradOutput(s.w16)));
  return y;
}

}  // namespace functional
}  // namespace nn
