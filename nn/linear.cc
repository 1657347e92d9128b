#include "nn/linear.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/random.h"
#include "core/status_macros.h"
#include "nn/internal/validate.h"
#include "nn/ops.h"

namespace nn {

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, uint64_t seed)
    : in_(in_features), out_(out_features), seed_(seed) {
  config_error_ = internal::FirstError({internal::PositiveOrMessage("in_features", in_features),
                                        internal::PositiveOrMessage("out_features", out_features)});
  // Invalid sizes still get (empty) parameters so the object is well formed.
  const int64_t in = std::max<int64_t>(in_features, 0);
  const int64_t out = std::max<int64_t>(out_features, 0);
  // Sized from user input: an allocation failure is recorded, not fatal
  // (core::Module::AllocateParameter, ConstructionStatus()).
  weight_ = AllocateParameter("weight", {out, in});
  if (bias) bias_ = AllocateParameter("bias", {out});
  core::Rng rng(seed);
  const float bound = in > 0 ? 1.0f / std::sqrt(static_cast<float>(in)) : 0.0f;
  FillUniform(weight_->data, -bound, bound, &rng);
  if (bias_) FillUniform(bias_->data, -bound, bound, &rng);
}

Linear::Linear(TiedTag, core::ParameterPtr weight, bool bias) {
  if (weight == nullptr) {
    config_error_ = "tied weight is null";
    weight = core::Parameter::Make(
        core::Tensor::Zeros({0, 0}, core::DType::kFloat32, core::MemoryTag::kParam));
  } else if (weight->data.dim() != 2) {
    config_error_ = absl::StrCat("tied weight must be 2-D [out, in], got ",
                                 core::ShapeToString(weight->data.shape()));
  } else {
    out_ = weight->data.size(0);
    in_ = weight->data.size(1);
  }
  weight_ = RegisterParameter("weight", std::move(weight));
  if (bias) {
    bias_ = AllocateParameter("bias", {out_});
    bias_->data.Zero();
  }
}

std::shared_ptr<Linear> Linear::Tied(core::ParameterPtr weight, bool bias) {
  return std::shared_ptr<Linear>(new Linear(TiedTag{}, std::move(weight), bias));
}

absl::StatusOr<core::Tensor> Linear::ForwardImpl(const core::Tensor& x) {
  if (!config_error_.empty()) return internal::ModuleError(*this, config_error_);
  RETURN_IF_ERROR(internal::CheckLastDim(*this, x, in_, "input"));
  RETURN_IF_ERROR(internal::CheckParameter(*this, *weight_, "weight", {out_, in_}));
  if (bias_) RETURN_IF_ERROR(internal::CheckParameter(*this, *bias_, "bias", {out_}));
  const int64_t rows = RowsOf(x.shape());
  ASSIGN_OR_RETURN(core::Tensor y, internal::NewActivation(WithLastDim(x.shape(), out_)));
  Gemm(false, true, rows, out_, in_, 1.0f, x.data<float>(), weight_->data.data<float>(), 0.0f,
       y.data<float>());
  if (bias_) AddRowVector(rows, out_, bias_->data.data<float>(), y.data<float>());
  input_ = x;
  return y;
}

absl::StatusOr<core::Tensor> Linear::BackwardImpl(const core::Tensor& grad_output) {
  RETURN_IF_ERROR(internal::CheckGradOutput(*this, input_.defined(),
                                            WithLastDim(input_.shape(), out_), grad_output));
  RETURN_IF_ERROR(internal::CheckParameter(*this, *weight_, "weight", {out_, in_}));
  const int64_t rows = RowsOf(input_.shape());
  const float* g = grad_output.data<float>();
  ASSIGN_OR_RETURN(core::Tensor gx, internal::NewActivation(input_.shape()));
  // dL/dx = g W.
  Gemm(false, false, rows, in_, out_, 1.0f, g, weight_->data.data<float>(), 0.0f, gx.data<float>());
  // dL/dW += g^T x.
  ASSIGN_OR_RETURN(float* gw, internal::GradBuffer(*this, *weight_, "weight"));
  if (gw != nullptr) Gemm(true, false, out_, in_, rows, 1.0f, g, input_.data<float>(), 1.0f, gw);
  if (bias_) {
    // dL/db += sum over rows of g.
    ASSIGN_OR_RETURN(float* gb, internal::GradBuffer(*this, *bias_, "bias"));
    if (gb != nullptr) AccumulateColumnSums(rows, out_, g, gb);
  }
  input_ = core::Tensor();
  return gx;
}

}  // namespace nn
