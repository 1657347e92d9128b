#include "nn/layer_norm.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nn/internal/validate.h"
#include "nn/ops.h"
#include "nn/tensor_ops.h"

namespace nn {

LayerNorm::LayerNorm(int64_t dim, float eps) : dim_(dim), eps_(eps) {
  config_error_ = internal::PositiveOrMessage("dim", dim);
  if (config_error_.empty() && !(std::isfinite(eps) && eps >= 0.0f)) {
    config_error_ = absl::StrCat("eps must be finite and >= 0, got ", eps);
  }
  const int64_t n = std::max<int64_t>(dim, 0);
  weight_ = AllocateParameter("weight", {n}, core::ParamInit::Constant(1.0f));
  bias_ = AllocateParameter("bias", {n}, core::ParamInit::Constant(0.0f));
}

absl::Status LayerNorm::CheckForward(const core::Tensor& x) const {
  if (!config_error_.empty()) return internal::ModuleError(*this, config_error_);
  RETURN_IF_ERROR(internal::CheckLastDim(*this, x, dim_, "input"));
  const core::Device device = x.device();
  RETURN_IF_ERROR(internal::CheckParameter(*this, *weight_, "weight", {dim_}, device));
  RETURN_IF_ERROR(internal::CheckParameter(*this, *bias_, "bias", {dim_}, device));
  if (weight_->data.dtype() != bias_->data.dtype()) {
    return internal::ModuleError(*this,
                                 absl::StrCat("weight ", weight_->data.ToString(), " and bias ",
                                              bias_->data.ToString(), " must have one dtype"));
  }
  return absl::OkStatus();
}

core::DType LayerNorm::OutputDType(bool for_gemm) const {
  return for_gemm && weight_->data.defined() && weight_->data.dtype() == core::DType::kBFloat16
             ? core::DType::kBFloat16
             : core::DType::kFloat32;
}

absl::StatusOr<core::Tensor> LayerNorm::ForwardImpl(const core::Tensor& x) {
  return RunForward(x, /*for_gemm=*/false);
}

absl::StatusOr<core::Tensor> LayerNorm::ForwardForGemm(const core::Tensor& x) {
  return RunForward(x, /*for_gemm=*/true);
}

absl::StatusOr<core::Tensor> LayerNorm::RunForward(const core::Tensor& x, bool for_gemm) {
  RETURN_IF_ERROR(CheckForward(x));
  const core::Device device = x.device();
  const int64_t rows = RowsOf(x.shape());
  ASSIGN_OR_RETURN(core::Tensor y,
                   internal::NewActivation(x.shape(), device, OutputDType(for_gemm)));
  ASSIGN_OR_RETURN(core::Tensor mean, internal::NewActivation({rows}, device));
  ASSIGN_OR_RETURN(core::Tensor rstd, internal::NewActivation({rows}, device));
  RETURN_IF_ERROR(
      LayerNormForward(internal::What(*this), x, weight_->data, bias_->data, eps_, y, mean, rstd));
  input_ = x;
  mean_ = std::move(mean);
  rstd_ = std::move(rstd);
  return y;
}

absl::StatusOr<core::Tensor> LayerNorm::ForwardAdd(const core::Tensor& a, const core::Tensor& b,
                                                   core::Tensor* sum, bool for_gemm) {
  if (a.shape() != b.shape() || a.dtype() != core::DType::kFloat32 ||
      b.dtype() != core::DType::kFloat32) {
    return internal::ModuleError(
        *this, absl::StrCat("residual operands differ: ", a.ToString(), " and ", b.ToString()));
  }
  RETURN_IF_ERROR(internal::CheckDevice(*this, b, "residual operand", a.device(), "the other"));
  RETURN_IF_ERROR(CheckForward(a));
  const core::Device device = a.device();
  const int64_t rows = RowsOf(a.shape());
  ASSIGN_OR_RETURN(core::Tensor h, internal::NewActivation(a.shape(), device));
  ASSIGN_OR_RETURN(core::Tensor y,
                   internal::NewActivation(a.shape(), device, OutputDType(for_gemm)));
  ASSIGN_OR_RETURN(core::Tensor mean, internal::NewActivation({rows}, device));
  ASSIGN_OR_RETURN(core::Tensor rstd, internal::NewActivation({rows}, device));
  RETURN_IF_ERROR(AddLayerNormForward(internal::What(*this), a, b, weight_->data, bias_->data, eps_,
                                      h, y, mean, rstd));
  input_ = h;
  mean_ = std::move(mean);
  rstd_ = std::move(rstd);
  *sum = std::move(h);
  return y;
}

absl::StatusOr<core::Tensor> LayerNorm::BackwardImpl(const core::Tensor& grad_output) {
  return RunBackward(grad_output, core::Tensor());
}

absl::StatusOr<core::Tensor> LayerNorm::BackwardAdd(const core::Tensor& grad_output,
                                                    const core::Tensor& residual,
                                                    core::Tensor* sum16) {
  if (!residual.defined()) return internal::ModuleError(*this, "residual is undefined");
  return RunBackward(grad_output, residual, sum16);
}

absl::StatusOr<core::Tensor> LayerNorm::RunBackward(const core::Tensor& grad_output,
                                                    const core::Tensor& residual,
                                                    core::Tensor* sum16) {
  ASSIGN_OR_RETURN(internal::NormInputGrads out,
                   internal::NewNormInputGrads(*this, input_, *weight_, dim_, grad_output, residual,
                                               sum16 != nullptr));
  ASSIGN_OR_RETURN(core::Tensor gw, internal::GradTensor(*this, *weight_, "weight"));
  ASSIGN_OR_RETURN(core::Tensor gb, internal::GradTensor(*this, *bias_, "bias"));
  // With gh = g * weight: dL/dx = rstd * (gh - mean(gh) - xhat * mean(gh * xhat)).
  if (residual.defined()) {
    RETURN_IF_ERROR(LayerNormBackwardAdd(internal::What(*this), grad_output, input_, mean_, rstd_,
                                         weight_->data, residual, out.gx, gw, gb, out.gx16));
  } else {
    RETURN_IF_ERROR(LayerNormBackward(internal::What(*this), grad_output, input_, mean_, rstd_,
                                      weight_->data, out.gx, gw, gb));
  }
  ReleaseActivations();
  if (sum16 != nullptr) *sum16 = std::move(out.gx16);
  return std::move(out.gx);
}

}  // namespace nn
