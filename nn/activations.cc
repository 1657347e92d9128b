#include "nn/activations.h"

#include "core/status_macros.h"
#include "nn/internal/validate.h"
#include "nn/ops.h"

namespace nn {

absl::StatusOr<core::Tensor> GELU::ForwardImpl(const core::Tensor& x) {
  RETURN_IF_ERROR(internal::CheckTensor(*this, x, core::DType::kFloat32, "input"));
  ASSIGN_OR_RETURN(core::Tensor y, internal::NewActivation(x.shape()));
  const float* in = x.data<float>();
  float* out = y.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) out[i] = GeluTanh(in[i]);
  input_ = x;
  return y;
}

absl::StatusOr<core::Tensor> GELU::BackwardImpl(const core::Tensor& grad_output) {
  RETURN_IF_ERROR(internal::CheckGradOutput(*this, input_.defined(), input_.shape(), grad_output));
  ASSIGN_OR_RETURN(core::Tensor gx, internal::NewActivation(input_.shape()));
  const float* in = input_.data<float>();
  const float* g = grad_output.data<float>();
  float* out = gx.data<float>();
  for (int64_t i = 0; i < gx.numel(); ++i) out[i] = g[i] * GeluTanhGrad(in[i]);
  input_ = core::Tensor();
  return gx;
}

absl::StatusOr<core::Tensor> ReLU::ForwardImpl(const core::Tensor& x) {
  RETURN_IF_ERROR(internal::CheckTensor(*this, x, core::DType::kFloat32, "input"));
  ASSIGN_OR_RETURN(core::Tensor y, internal::NewActivation(x.shape()));
  const float* in = x.data<float>();
  float* out = y.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) out[i] = in[i] > 0.0f ? in[i] : 0.0f;
  output_ = y;
  return y;
}

absl::StatusOr<core::Tensor> ReLU::BackwardImpl(const core::Tensor& grad_output) {
  RETURN_IF_ERROR(
      internal::CheckGradOutput(*this, output_.defined(), output_.shape(), grad_output));
  ASSIGN_OR_RETURN(core::Tensor gx, internal::NewActivation(output_.shape()));
  const float* y = output_.data<float>();
  const float* g = grad_output.data<float>();
  float* out = gx.data<float>();
  for (int64_t i = 0; i < gx.numel(); ++i) out[i] = y[i] > 0.0f ? g[i] : 0.0f;
  output_ = core::Tensor();
  return gx;
}

}  // namespace nn
