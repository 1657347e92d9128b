#include "nn/functional/norm.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nn/functional/internal/grad_sink.h"
#include "nn/internal/op_checks.h"
#include "nn/internal/validate.h"
#include "nn/ops.h"
#include "nn/tensor_ops.h"

namespace nn {
namespace functional {
namespace {

using core::DType;
using core::Tensor;
using ::nn::internal::NewActivation;

// The checks both norms make of x, w, b (LayerNorm's, `centered`) and eps; the number of rows.
absl::StatusOr<int64_t> CheckNorm(const char* op, bool centered, const Tensor& x, const Tensor& w,
                                  const Tensor& b, float eps) {
  RETURN_IF_ERROR(::nn::internal::CheckDevices(op, {{"input", &x}, {"weight", &w}}));
  if (centered) RETURN_IF_ERROR(::nn::internal::CheckDevices(op, {{"input", &x}, {"bias", &b}}));
  RETURN_IF_ERROR(::nn::internal::CheckDType(op, "input", x, DType::kFloat32));
  RETURN_IF_ERROR(::nn::internal::CheckFp32OrBf16(op, "weight", w));
  if (x.dim() == 0 || x.size(-1) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": input must be at least 1-D with a non-empty last dimension, got ", x.ToString()));
  }
  const int64_t c = x.size(-1);
  if (w.shape() != core::Shape{c}) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": weight must be [", c, "] (the input's last dimension), got ", w.ToString()));
  }
  if (centered && (b.dtype() != w.dtype() || b.shape() != w.shape())) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": bias must be like weight ", w.ToString(), ", got ", b.ToString()));
  }
  if (!(std::isfinite(eps) && eps >= 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": eps must be finite and >= 0, got ", eps));
  }
  return RowsOf(x.shape());
}

// LayerNorm (`centered`, with the bias b and each row's mean) or RmsNorm: NOTE [Functional
// norms]. The record keeps x, the rows' statistics and w.
absl::StatusOr<Tensor> Norm(const char* op, bool centered, core::Arg x_arg, core::Arg w_arg,
                            core::Arg b_arg, float eps, bool for_gemm) {
  RETURN_IF_ERROR(x_arg.status());
  RETURN_IF_ERROR(w_arg.status());
  RETURN_IF_ERROR(b_arg.status());
  const Tensor& x = x_arg.tensor();
  const Tensor& w = w_arg.tensor();
  const Tensor& b = b_arg.tensor();
  ASSIGN_OR_RETURN(const int64_t rows, CheckNorm(op, centered, x, w, b, eps));
  const core::Device device = x.device();
  const DType y_dtype =
      for_gemm && w.dtype() == DType::kBFloat16 ? DType::kBFloat16 : DType::kFloat32;
  ASSIGN_OR_RETURN(Tensor y, NewActivation(x.shape(), device, y_dtype));
  Tensor mean;
  if (centered) {
    ASSIGN_OR_RETURN(mean, NewActivation({rows}, device));
  }
  ASSIGN_OR_RETURN(Tensor rstd, NewActivation({rows}, device));
  RETURN_IF_ERROR(centered ? LayerNormForward(op, x, w, b, eps, y, mean, rstd)
                           : RmsNormForward(op, x, w, eps, y, rstd));
  std::vector<Tensor> inputs = {x, w};
  if (centered) inputs.push_back(b);
  RETURN_IF_ERROR(core::RecordFunction(
      op, inputs, {&y}, {x, mean, rstd, w},
      [op, centered](const core::BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
        const Tensor& g = ctx.grad(0);
        const Tensor& x = ctx.saved(0);
        const Tensor& w = ctx.saved(3);
        // The layers' order: dL/dx's tensor, the weight's and the bias's gradients, then the
        // one backward call that writes them all.
        ASSIGN_OR_RETURN(const Tensor gx, NewActivation(x.shape(), g.device()));
        ASSIGN_OR_RETURN(const internal::GradSink gw,
                         internal::GradSinkFor(ctx, 1, op, "weight", w.shape(), g.device()));
        internal::GradSink gb;
        if (centered) {
          ASSIGN_OR_RETURN(gb, internal::GradSinkFor(ctx, 2, op, "bias", w.shape(), g.device()));
          RETURN_IF_ERROR(
              LayerNormBackward(op, g, x, ctx.saved(1), ctx.saved(2), w, gx, gw.tensor, gb.tensor));
        } else {
          RETURN_IF_ERROR(RmsNormBackward(op, g, x, ctx.saved(2), w, gx, gw.tensor));
        }
        std::vector<Tensor> grads = {ctx.needs_grad(0) ? gx : Tensor(), gw.returned()};
        if (centered) grads.push_back(gb.returned());
        return grads;
      },
      {"input", "mean", "rstd", "weight"}));
  return y;
}

}  // namespace

absl::StatusOr<Tensor> LayerNorm(core::Arg x, core::Arg w, core::Arg b, float eps) {
  return Norm("LayerNorm", /*centered=*/true, x, w, b, eps, /*for_gemm=*/false);
}

absl::StatusOr<Tensor> LayerNormForGemm(core::Arg x, core::Arg w, core::Arg b, float eps) {
  return Norm("LayerNormForGemm", /*centered=*/true, x, w, b, eps, /*for_gemm=*/true);
}

absl::StatusOr<Tensor> RmsNorm(core::Arg x, core::Arg w, float eps) {
  return Norm("RmsNorm", /*centered=*/false, x, w, Tensor(), eps, /*for_gemm=*/false);
}

absl::StatusOr<Tensor> RmsNormForGemm(core::Arg x, core::Arg w, float eps) {
  return Norm("RmsNormForGemm", /*centered=*/false, x, w, Tensor(), eps, /*for_gemm=*/true);
}

}  // namespace functional
}  // namespace nn
