#include "nn/layer_norm.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nn/internal/validate.h"
#include "nn/ops.h"

namespace nn {

LayerNorm::LayerNorm(int64_t dim, float eps) : dim_(dim), eps_(eps) {
  config_error_ = internal::PositiveOrMessage("dim", dim);
  if (config_error_.empty() && !(std::isfinite(eps) && eps >= 0.0f)) {
    config_error_ = absl::StrCat("eps must be finite and >= 0, got ", eps);
  }
  const int64_t n = std::max<int64_t>(dim, 0);
  weight_ = AllocateParameter("weight", {n});
  weight_->data.Fill(1.0f);
  bias_ = AllocateParameter("bias", {n});
  bias_->data.Zero();
}

absl::StatusOr<core::Tensor> LayerNorm::ForwardImpl(const core::Tensor& x) {
  if (!config_error_.empty()) return internal::ModuleError(*this, config_error_);
  RETURN_IF_ERROR(internal::CheckLastDim(*this, x, dim_, "input"));
  RETURN_IF_ERROR(internal::CheckParameter(*this, *weight_, "weight", {dim_}));
  RETURN_IF_ERROR(internal::CheckParameter(*this, *bias_, "bias", {dim_}));
  const int64_t rows = RowsOf(x.shape());
  ASSIGN_OR_RETURN(core::Tensor y, internal::NewActivation(x.shape()));
  ASSIGN_OR_RETURN(core::Tensor xhat, internal::NewActivation(x.shape()));
  std::vector<float> rstd(static_cast<size_t>(rows));
  const float* w = weight_->data.data<float>();
  const float* b = bias_->data.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x.data<float>() + r * dim_;
    double sum = 0.0;
    for (int64_t j = 0; j < dim_; ++j) sum += xr[j];
    const double mean = sum / dim_;
    double sq = 0.0;
    for (int64_t j = 0; j < dim_; ++j) sq += (xr[j] - mean) * (xr[j] - mean);
    const double inv = 1.0 / std::sqrt(sq / dim_ + static_cast<double>(eps_));
    rstd[r] = static_cast<float>(inv);
    float* hr = xhat.data<float>() + r * dim_;
    float* yr = y.data<float>() + r * dim_;
    for (int64_t j = 0; j < dim_; ++j) {
      hr[j] = static_cast<float>((xr[j] - mean) * inv);
      yr[j] = hr[j] * w[j] + b[j];
    }
  }
  xhat_ = std::move(xhat);
  rstd_ = std::move(rstd);
  return y;
}

absl::StatusOr<core::Tensor> LayerNorm::BackwardImpl(const core::Tensor& grad_output) {
  RETURN_IF_ERROR(internal::CheckGradOutput(*this, xhat_.defined(), xhat_.shape(), grad_output));
  RETURN_IF_ERROR(internal::CheckParameter(*this, *weight_, "weight", {dim_}));
  const int64_t rows = RowsOf(xhat_.shape());
  const float* g = grad_output.data<float>();
  const float* xhat = xhat_.data<float>();
  const float* w = weight_->data.data<float>();
  ASSIGN_OR_RETURN(core::Tensor gx, internal::NewActivation(xhat_.shape()));
  // With gh = g * weight: dL/dx = rstd * (gh - mean(gh) - xhat * mean(gh * xhat)).
  for (int64_t r = 0; r < rows; ++r) {
    const float* gr = g + r * dim_;
    const float* hr = xhat + r * dim_;
    double sum_gh = 0.0, sum_gh_h = 0.0;
    for (int64_t j = 0; j < dim_; ++j) {
      const double gh = static_cast<double>(gr[j]) * w[j];
      sum_gh += gh;
      sum_gh_h += gh * hr[j];
    }
    const double mean_gh = sum_gh / dim_;
    const double mean_gh_h = sum_gh_h / dim_;
    float* out = gx.data<float>() + r * dim_;
    for (int64_t j = 0; j < dim_; ++j) {
      const double gh = static_cast<double>(gr[j]) * w[j];
      out[j] = static_cast<float>(rstd_[r] * (gh - mean_gh - hr[j] * mean_gh_h));
    }
  }
  ASSIGN_OR_RETURN(float* gw, internal::GradBuffer(*this, *weight_, "weight"));
  ASSIGN_OR_RETURN(float* gb, internal::GradBuffer(*this, *bias_, "bias"));
  if (gw != nullptr || gb != nullptr) {
    std::vector<double> sw(static_cast<size_t>(dim_), 0.0), sb(static_cast<size_t>(dim_), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      const float* gr = g + r * dim_;
      const float* hr = xhat + r * dim_;
      for (int64_t j = 0; j < dim_; ++j) {
        sw[j] += static_cast<double>(gr[j]) * hr[j];
        sb[j] += gr[j];
      }
    }
    for (int64_t j = 0; j < dim_; ++j) {
      if (gw != nullptr) gw[j] = static_cast<float>(gw[j] + sw[j]);
      if (gb != nullptr) gb[j] = static_cast<float>(gb[j] + sb[j]);
    }
  }
  xhat_ = core::Tensor();
  rstd_.clear();
  return gx;
}

}  // namespace nn
