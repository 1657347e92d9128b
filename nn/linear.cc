#include "nn/linear.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/op_profile.h"
#include "core/random.h"
#include "core/status_macros.h"
#include "nn/internal/validate.h"
#include "nn/ops.h"
#include "nn/tensor_ops.h"

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
  // PyTorch's default: U(-1/sqrt(in), 1/sqrt(in)), the bias drawing after the weight from
  // one stream (NOTE [Deferred initialisation] in core/param_init.h). fp32 CPU or
  // deferred, so the fills cannot fail.
  const float bound = in > 0 ? 1.0f / std::sqrt(static_cast<float>(in)) : 0.0f;
  (void)core::InitParameter(*weight_, core::ParamInit::Uniform(seed, 0, -bound, bound));
  if (bias_) {
    (void)core::InitParameter(*bias_, core::ParamInit::Uniform(seed, out * in, -bound, bound));
  }
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
    (void)core::InitParameter(*bias_, core::ParamInit::Constant(0.0f));
  }
}

std::shared_ptr<Linear> Linear::Tied(core::ParameterPtr weight, bool bias) {
  return std::shared_ptr<Linear>(new Linear(TiedTag{}, std::move(weight), bias));
}

absl::StatusOr<core::Tensor> Linear::ForwardWithoutBias(const core::Tensor& x) {
  if (!config_error_.empty()) return internal::ModuleError(*this, config_error_);
  RETURN_IF_ERROR(internal::CheckLastDim(*this, x, in_, "input"));
  const core::Device device = x.device();
  RETURN_IF_ERROR(internal::CheckParameter(*this, *weight_, "weight", {out_, in_}, device));
  if (bias_) RETURN_IF_ERROR(internal::CheckParameter(*this, *bias_, "bias", {out_}, device));
  const int64_t rows = RowsOf(x.shape());
  ASSIGN_OR_RETURN(core::Tensor y, internal::NewActivation(WithLastDim(x.shape(), out_), device));
  ASSIGN_OR_RETURN(core::Tensor a, GemmOperand(x, "input"));
  // y = x W^T.
  GemmArgs g;
  g.trans_b = true;
  g.m = rows;
  g.n = out_;
  g.k = in_;
  g.a.tensor = a;
  g.b.tensor = weight_->data;
  g.c.tensor = y;
  RETURN_IF_ERROR(MatMul(internal::What(*this), g));
  input_ = std::move(a);
  return y;
}

absl::StatusOr<core::Tensor> Linear::GemmOperand(const core::Tensor& t, const char* name) const {
  if (weight_->data.dtype() != core::DType::kBFloat16) return t;
  if (t.dtype() == core::DType::kBFloat16) return t;  // a grad_output already rounded
  // NOTE [bf16 GEMMs]: rounded once here, then used by every GEMM that needs it.
  return internal::RoundToBf16(*this, t, name);
}

absl::StatusOr<core::Tensor> Linear::ForwardImpl(const core::Tensor& x) {
  ASSIGN_OR_RETURN(core::Tensor y, ForwardWithoutBias(x));
  if (bias_) RETURN_IF_ERROR(BiasAdd(internal::What(*this), y, bias_->data, y));
  return y;
}

absl::StatusOr<core::Tensor> Linear::BackwardWithoutBias(const core::Tensor& grad_output) {
  RETURN_IF_ERROR(internal::CheckGradOutput(*this, input_.defined(),
                                            WithLastDim(input_.shape(), out_), grad_output,
                                            GradOutputDType() == core::DType::kBFloat16));
  const core::Device device = input_.device();
  RETURN_IF_ERROR(internal::CheckDevice(*this, grad_output, "grad_output", device, "the input"));
  RETURN_IF_ERROR(internal::CheckParameter(*this, *weight_, "weight", {out_, in_}, device));
  const int64_t rows = RowsOf(input_.shape());
  ASSIGN_OR_RETURN(core::Tensor gx, internal::NewActivation(input_.shape(), device));
  ASSIGN_OR_RETURN(const core::Tensor g, GemmOperand(grad_output, "grad_output"));
  // dL/dx = g W.
  GemmArgs dx;
  dx.m = rows;
  dx.n = in_;
  dx.k = out_;
  dx.a.tensor = g;
  dx.b.tensor = weight_->data;
  dx.c.tensor = gx;
  {
    core::ScopedOpCategory role(core::OpCategory::kGemmInputGrad);
    RETURN_IF_ERROR(MatMul(internal::What(*this), dx));
  }
  // dL/dW += g^T x.
  ASSIGN_OR_RETURN(core::Tensor gw, internal::GradTensor(*this, *weight_, "weight"));
  if (gw.defined()) {
    GemmArgs dw;
    dw.trans_a = true;
    dw.m = out_;
    dw.n = in_;
    dw.k = rows;
    dw.beta = 1.0f;
    dw.a.tensor = g;
    dw.b.tensor = input_;
    dw.c.tensor = gw;
    core::ScopedOpCategory role(core::OpCategory::kGemmWeightGrad);
    RETURN_IF_ERROR(MatMul(internal::What(*this), dw));
  }
  input_ = core::Tensor();
  return gx;
}

absl::StatusOr<core::Tensor> Linear::BackwardImpl(const core::Tensor& grad_output) {
  ASSIGN_OR_RETURN(core::Tensor gx, BackwardWithoutBias(grad_output));
  if (bias_) {
    // dL/db += sum over rows of g.
    ASSIGN_OR_RETURN(core::Tensor gb, internal::GradTensor(*this, *bias_, "bias"));
    if (gb.defined()) {
      core::Tensor g = grad_output;
      if (g.dtype() != core::DType::kFloat32) {
        ASSIGN_OR_RETURN(g, g.ToDType(core::DType::kFloat32, core::MemoryTag::kActivation));
      }
      RETURN_IF_ERROR(AccumulateColumnSums(internal::What(*this), g, core::Tensor(), gb));
    }
  }
  return gx;
}

}  // namespace nn
