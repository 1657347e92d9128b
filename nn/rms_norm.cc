#include "nn/rms_norm.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nn/internal/validate.h"
#include "nn/ops.h"
#include "nn/tensor_ops.h"

namespace nn {

RmsNorm::RmsNorm(int64_t dim, float eps) : dim_(dim), eps_(eps) {
  config_error_ = internal::PositiveOrMessage("dim", dim);
  if (config_error_.empty() && !(std::isfinite(eps) && eps >= 0.0f)) {
    config_error_ = absl::StrCat("eps must be finite and >= 0, got ", eps);
  }
  weight_ =
      AllocateParameter("weight", {std::max<int64_t>(dim, 0)}, core::ParamInit::Constant(1.0f));
}

absl::StatusOr<core::Tensor> RmsNorm::ForwardImpl(const core::Tensor& x) {
  return RunForward(x, /*for_gemm=*/false);
}

absl::StatusOr<core::Tensor> RmsNorm::ForwardForGemm(const core::Tensor& x) {
  return RunForward(x, /*for_gemm=*/true);
}

absl::StatusOr<core::Tensor> RmsNorm::RunForward(const core::Tensor& x, bool for_gemm) {
  if (!config_error_.empty()) return internal::ModuleError(*this, config_error_);
  RETURN_IF_ERROR(internal::CheckLastDim(*this, x, dim_, "input"));
  const core::Device device = x.device();
  RETURN_IF_ERROR(internal::CheckParameter(*this, *weight_, "weight", {dim_}, device));
  const core::DType y_dtype = for_gemm && weight_->data.dtype() == core::DType::kBFloat16
                                  ? core::DType::kBFloat16
                                  : core::DType::kFloat32;
  ASSIGN_OR_RETURN(core::Tensor y, internal::NewActivation(x.shape(), device, y_dtype));
  ASSIGN_OR_RETURN(core::Tensor rstd, internal::NewActivation({RowsOf(x.shape())}, device));
  RETURN_IF_ERROR(RmsNormForward(internal::What(*this), x, weight_->data, eps_, y, rstd));
  input_ = x;
  rstd_ = std::move(rstd);
  return y;
}

absl::StatusOr<core::Tensor> RmsNorm::BackwardImpl(const core::Tensor& grad_output) {
  return RunBackward(grad_output, core::Tensor());
}

absl::StatusOr<core::Tensor> RmsNorm::BackwardAdd(const core::Tensor& grad_output,
                                                  const core::Tensor& residual,
                                                  core::Tensor* sum16) {
  if (!residual.defined()) return internal::ModuleError(*this, "residual is undefined");
  return RunBackward(grad_output, residual, sum16);
}

absl::StatusOr<core::Tensor> RmsNorm::RunBackward(const core::Tensor& grad_output,
                                                  const core::Tensor& residual,
                                                  core::Tensor* sum16) {
  ASSIGN_OR_RETURN(internal::NormInputGrads out,
                   internal::NewNormInputGrads(*this, input_, *weight_, dim_, grad_output, residual,
                                               sum16 != nullptr));
  ASSIGN_OR_RETURN(core::Tensor gw, internal::GradTensor(*this, *weight_, "weight"));
  const std::string what = internal::What(*this);
  // dL/dx = rstd * (g w - xhat * mean(g w xhat)) (+ residual) and dL/dw += sum over rows of
  // g * xhat, xhat = x * rstd made again from the kept input.
  if (residual.defined()) {
    RETURN_IF_ERROR(RmsNormBackwardAdd(what, grad_output, input_, rstd_, weight_->data, residual,
                                       out.gx, gw, out.gx16));
  } else {
    RETURN_IF_ERROR(RmsNormBackward(what, grad_output, input_, rstd_, weight_->data, out.gx, gw));
  }
  ReleaseActivations();
  if (sum16 != nullptr) *sum16 = std::move(out.gx16);
  return std::move(out.gx);
}

}  // namespace nn
