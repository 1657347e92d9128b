#include "nn/activations.h"

#include "core/status_macros.h"
#include "nn/internal/validate.h"
#include "nn/tensor_ops.h"

namespace nn {

absl::StatusOr<core::Tensor> GELU::ForwardImpl(const core::Tensor& x) {
  RETURN_IF_ERROR(internal::CheckTensor(*this, x, core::DType::kFloat32, "input"));
  ASSIGN_OR_RETURN(core::Tensor y, internal::NewActivation(x.shape(), x.device()));
  RETURN_IF_ERROR(GeluForward(internal::What(*this), x, y));
  input_ = x;
  return y;
}

absl::StatusOr<core::Tensor> GELU::BackwardImpl(const core::Tensor& grad_output) {
  RETURN_IF_ERROR(internal::CheckGradOutput(*this, input_.defined(), input_.shape(), grad_output));
  RETURN_IF_ERROR(
      internal::CheckDevice(*this, grad_output, "grad_output", input_.device(), "the input"));
  ASSIGN_OR_RETURN(core::Tensor gx, internal::NewActivation(input_.shape(), input_.device()));
  RETURN_IF_ERROR(GeluBackward(internal::What(*this), input_, grad_output, gx));
  input_ = core::Tensor();
  return gx;
}

absl::StatusOr<core::Tensor> ReLU::ForwardImpl(const core::Tensor& x) {
  RETURN_IF_ERROR(internal::CheckTensor(*this, x, core::DType::kFloat32, "input"));
  ASSIGN_OR_RETURN(core::Tensor y, internal::NewActivation(x.shape(), x.device()));
  RETURN_IF_ERROR(ReluForward(internal::What(*this), x, y));
  output_ = y;
  return y;
}

absl::StatusOr<core::Tensor> ReLU::BackwardImpl(const core::Tensor& grad_output) {
  RETURN_IF_ERROR(
      internal::CheckGradOutput(*this, output_.defined(), output_.shape(), grad_output));
  RETURN_IF_ERROR(
      internal::CheckDevice(*this, grad_output, "grad_output", output_.device(), "the input"));
  ASSIGN_OR_RETURN(core::Tensor gx, internal::NewActivation(output_.shape(), output_.device()));
  RETURN_IF_ERROR(ReluBackward(internal::What(*this), output_, grad_output, gx));
  output_ = core::Tensor();
  return gx;
}

}  // namespace nn
