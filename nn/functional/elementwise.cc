#include "nn/functional/elementwise.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/tensor.h"
#include "nn/functional/internal/tensor_args.h"
#include "nn/functional/internal/tensor_dispatch.h"
#include "nn/functional/reduce.h"
#include "nn/internal/op_checks.h"
#include "nn/tensor_ops.h"

namespace nn {
namespace functional {
namespace {

using core::Shape;
using core::Tensor;
using internal::NewTensor;
using internal::RunBinary;
using internal::RunUnary;
using internal::RunUnaryGrad;

// ---- Arguments.

absl::StatusOr<Tensor> FloatInput(absl::string_view op, absl::string_view name,
                                  const core::Arg& arg) {
  ASSIGN_OR_RETURN(Tensor t, internal::Input(op, name, arg));
  RETURN_IF_ERROR(internal::CheckFloat(op, name, t));
  return t;
}

// NOTE [Broadcasting]: the shape of a op b, or InvalidArgument naming both.
absl::StatusOr<Shape> BroadcastShape(absl::string_view op, const Tensor& a, const Tensor& b) {
  const size_t rank = std::max(a.shape().size(), b.shape().size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {  // i counts from the right
    const int64_t sa = i < a.shape().size() ? a.shape()[a.shape().size() - 1 - i] : 1;
    const int64_t sb = i < b.shape().size() ? b.shape()[b.shape().size() - 1 - i] : 1;
    if (sa != sb && sa != 1 && sb != 1) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": a ", a.ToString(), " and b ",
                                                     b.ToString(), " do not broadcast (dim -",
                                                     i + 1, ": ", sa, " vs ", sb, ")"));
    }
    out[rank - 1 - i] = sa == 1 ? sb : sa;
  }
  return out;
}

// g summed to `shape` (itself when it has that shape already).
absl::StatusOr<Tensor> ReduceTo(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  return SumToShape(g, shape);
}

// The forward of a binary op `kind` named `op`: checked operands and the output.
struct BinaryForward {
  Tensor a, b, out;
};

absl::StatusOr<BinaryForward> RunBinaryOp(const char* op, int kind, const core::Arg& a_arg,
                                          const core::Arg& b_arg) {
  BinaryForward f;
  ASSIGN_OR_RETURN(f.a, FloatInput(op, "a", a_arg));
  ASSIGN_OR_RETURN(f.b, FloatInput(op, "b", b_arg));
  RETURN_IF_ERROR(internal::CheckSameDevice(op, "a", f.a, "b", f.b));
  ASSIGN_OR_RETURN(const Shape shape, BroadcastShape(op, f.a, f.b));
  ASSIGN_OR_RETURN(f.out, NewTensor(shape, f.a.device()));
  RETURN_IF_ERROR(RunBinary(op, kind, f.a, f.b, f.out));
  return f;
}

// a + b or a - b: the gradients are g and +-g, summed to the operands' shapes.
absl::StatusOr<Tensor> AddOrSub(const char* op, int kind, const core::Arg& a_arg,
                                const core::Arg& b_arg) {
  ASSIGN_OR_RETURN(BinaryForward f, RunBinaryOp(op, kind, a_arg, b_arg));
  RETURN_IF_ERROR(core::RecordFunction(
      op, {f.a, f.b}, {&f.out}, {},
      [a_shape = f.a.shape(), b_shape = f.b.shape(), negate = kind == kernels::kBinarySub](
          const core::BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
        std::vector<Tensor> grads(2);
        if (ctx.needs_grad(0)) {
          ASSIGN_OR_RETURN(grads[0], ReduceTo(ctx.grad(0), a_shape));
        }
        if (ctx.needs_grad(1)) {
          ASSIGN_OR_RETURN(grads[1], ReduceTo(ctx.grad(0), b_shape));
          if (negate) {
            ASSIGN_OR_RETURN(grads[1], Neg(grads[1]));
          }
        }
        return grads;
      }));
  return f.out;
}

// The checked input of a unary op and its fresh output.
absl::StatusOr<std::pair<Tensor, Tensor>> UnaryInOut(absl::string_view op, const core::Arg& arg) {
  ASSIGN_OR_RETURN(Tensor x, FloatInput(op, "input", arg));
  ASSIGN_OR_RETURN(Tensor y, NewTensor(x.shape(), x.device()));
  return std::make_pair(x, y);
}

// A unary op `op` with a derivative of its own: y = forward(x); the backward makes
// gx = backward(saved, g), saved being x, or y with save_output.
using UnaryForwardFn = std::function<absl::Status(const Tensor& x, const Tensor& y)>;
using UnaryBackwardFn =
    std::function<absl::Status(const Tensor& saved, const Tensor& g, const Tensor& gx)>;

absl::StatusOr<Tensor> UnaryWithGrad(const char* op, const core::Arg& arg,
                                     const UnaryForwardFn& forward, bool save_output,
                                     UnaryBackwardFn backward) {
  ASSIGN_OR_RETURN(auto xy, UnaryInOut(op, arg));
  RETURN_IF_ERROR(forward(xy.first, xy.second));
  RETURN_IF_ERROR(core::RecordFunction(
      op, {xy.first}, {&xy.second}, {save_output ? xy.second : xy.first},
      [backward = std::move(backward)](
          const core::BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor gx, NewTensor(ctx.grad(0).shape(), ctx.grad(0).device()));
        RETURN_IF_ERROR(backward(ctx.saved(0), ctx.grad(0), gx));
        return std::vector<Tensor>{gx};
      },
      {save_output ? "output" : "input"}));
  return xy.second;
}

}  // namespace

absl::StatusOr<Tensor> Add(core::Arg a, core::Arg b) {
  return AddOrSub("Add", kernels::kBinaryAdd, a, b);
}

absl::StatusOr<Tensor> Sub(core::Arg a, core::Arg b) {
  return AddOrSub("Sub", kernels::kBinarySub, a, b);
}

absl::StatusOr<Tensor> Mul(core::Arg a_arg, core::Arg b_arg) {
  ASSIGN_OR_RETURN(BinaryForward f, RunBinaryOp("Mul", kernels::kBinaryMul, a_arg, b_arg));
  RETURN_IF_ERROR(core::RecordFunction(
      "Mul", {f.a, f.b}, {&f.out}, {f.a, f.b},
      [](const core::BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
        const Tensor &g = ctx.grad(0), &a = ctx.saved(0), &b = ctx.saved(1);
        std::vector<Tensor> grads(2);
        if (ctx.needs_grad(0)) {
          ASSIGN_OR_RETURN(const Tensor gb, Mul(g, b));
          ASSIGN_OR_RETURN(grads[0], ReduceTo(gb, a.shape()));
        }
        if (ctx.needs_grad(1)) {
          ASSIGN_OR_RETURN(const Tensor ga, Mul(g, a));
          ASSIGN_OR_RETURN(grads[1], ReduceTo(ga, b.shape()));
        }
        return grads;
      },
      {"a", "b"}));
  return f.out;
}

absl::StatusOr<Tensor> Div(core::Arg a_arg, core::Arg b_arg) {
  ASSIGN_OR_RETURN(BinaryForward f, RunBinaryOp("Div", kernels::kBinaryDiv, a_arg, b_arg));
  RETURN_IF_ERROR(core::RecordFunction(
      "Div", {f.a, f.b}, {&f.out}, {f.b, f.out},
      [a_shape =
           f.a.shape()](const core::BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
        const Tensor &g = ctx.grad(0), &b = ctx.saved(0), &q = ctx.saved(1);
        // g / b, then -(g / b) (a / b) = -g a / b^2.
        ASSIGN_OR_RETURN(const Tensor g_over_b, Div(g, b));
        std::vector<Tensor> grads(2);
        if (ctx.needs_grad(0)) {
          ASSIGN_OR_RETURN(grads[0], ReduceTo(g_over_b, a_shape));
        }
        if (ctx.needs_grad(1)) {
          ASSIGN_OR_RETURN(const Tensor t, Mul(g_over_b, q));
          ASSIGN_OR_RETURN(grads[1], Neg(ReduceTo(t, b.shape())));
        }
        return grads;
      },
      {"b", "quotient"}));
  return f.out;
}

absl::StatusOr<Tensor> AddScalar(core::Arg x_arg, float c) {
  ASSIGN_OR_RETURN(auto xy, UnaryInOut("AddScalar", x_arg));
  RETURN_IF_ERROR(RunUnary("AddScalar", kernels::kUnaryAddScalar, xy.first, c, xy.second));
  RETURN_IF_ERROR(
      internal::RecordGradFn("AddScalar", xy.first, &xy.second,
                             [](const Tensor& g) -> absl::StatusOr<Tensor> { return g; }));
  return xy.second;
}

absl::StatusOr<Tensor> MulScalar(core::Arg x_arg, float c) {
  ASSIGN_OR_RETURN(auto xy, UnaryInOut("MulScalar", x_arg));
  RETURN_IF_ERROR(RunUnary("MulScalar", kernels::kUnaryMulScalar, xy.first, c, xy.second));
  RETURN_IF_ERROR(internal::RecordGradFn("MulScalar", xy.first, &xy.second,
                                         [c](const Tensor& g) { return MulScalar(g, c); }));
  return xy.second;
}

absl::StatusOr<Tensor> Neg(core::Arg x) { return MulScalar(x, -1.0f); }

absl::StatusOr<Tensor> Gelu(core::Arg x) {
  return UnaryWithGrad(
      "Gelu", x, [](const Tensor& in, const Tensor& out) { return GeluForward("Gelu", in, out); },
      /*save_output=*/false,
      [](const Tensor& in, const Tensor& g, const Tensor& gx) {
        return GeluBackward("Gelu backward", in, g, gx);
      });
}

absl::StatusOr<Tensor> Relu(core::Arg x) {
  return UnaryWithGrad(
      "Relu", x, [](const Tensor& in, const Tensor& out) { return ReluForward("Relu", in, out); },
      /*save_output=*/true,
      [](const Tensor& out, const Tensor& g, const Tensor& gx) {
        return ReluBackward("Relu backward", out, g, gx);
      });
}

absl::StatusOr<Tensor> Silu(core::Arg x) {
  return UnaryWithGrad(
      "Silu", x,
      [](const Tensor& in, const Tensor& out) {
        return RunUnary("Silu", kernels::kUnarySilu, in, 0.0f, out);
      },
      /*save_output=*/false,
      [](const Tensor& in, const Tensor& g, const Tensor& gx) {
        return RunUnaryGrad("Silu backward", kernels::kUnarySilu, in, g, gx);
      });
}

absl::StatusOr<Tensor> Softplus(core::Arg x) {
  return UnaryWithGrad(
      "Softplus", x,
      [](const Tensor& in, const Tensor& out) {
        return RunUnary("Softplus", kernels::kUnarySoftplus, in, 0.0f, out);
      },
      /*save_output=*/false,
      [](const Tensor& in, const Tensor& g, const Tensor& gx) {
        return RunUnaryGrad("Softplus backward", kernels::kUnarySoftplus, in, g, gx);
      });
}

absl::StatusOr<Tensor> Tanh(core::Arg x) {
  return UnaryWithGrad(
      "Tanh", x,
      [](const Tensor& in, const Tensor& out) {
        return RunUnary("Tanh", kernels::kUnaryTanh, in, 0.0f, out);
      },
      /*save_output=*/true,
      [](const Tensor& out, const Tensor& g, const Tensor& gx) {
        return RunUnaryGrad("Tanh backward", kernels::kUnaryTanh, out, g, gx);
      });
}

absl::StatusOr<Tensor> ToDType(core::Arg x_arg, core::DType dtype) {
  ASSIGN_OR_RETURN(const Tensor x, internal::Input("ToDType", "input", x_arg));
  RETURN_IF_ERROR(::nn::internal::CheckFp32OrBf16("ToDType", "input", x));
  if (dtype != core::DType::kFloat32 && dtype != core::DType::kBFloat16) {
    return absl::InvalidArgumentError(
        absl::StrCat("ToDType: dtype must be float32 or bfloat16, got ", core::DTypeName(dtype)));
  }
  if (x.dtype() == dtype) return x;
  absl::StatusOr<Tensor> converted = x.ToDType(dtype, core::MemoryTag::kActivation);
  if (!converted.ok()) return core::Annotate(converted.status(), "ToDType");
  Tensor y = *std::move(converted);
  RETURN_IF_ERROR(internal::RecordGradFn(
      "ToDType", x, &y, [](const Tensor& g) -> absl::StatusOr<Tensor> { return g; }));
  return y;
}

}  // namespace functional
}  // namespace nn
