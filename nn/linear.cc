#include "nn/linear.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/op_profile.h"
#include "core/random.h"
#include "core/status_macros.h"
#include "nn/functional/linear.h"
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
  // PyTorch's default: U(-1/sqrt(in), 1/sqrt(in)), the bias drawing after the weight from
  // one stream (NOTE [Deferred initialisation] in core/param_init.h).
  weight_ = AllocateParameter("weight", {out, in}, core::ParamInit::FanIn(seed, 0, in));
  if (bias) bias_ = AllocateParameter("bias", {out}, core::ParamInit::FanIn(seed, out * in, in));
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

absl::StatusOr<core::Tensor> Linear::ForwardImpl(const core::Tensor& x) {
  if (!config_error_.empty()) return internal::ModuleError(*this, config_error_);
  const bool w16 = weight_->data.defined() && weight_->data.dtype() == core::DType::kBFloat16;
  // A bf16 input is one its producer stored for this layer's bf16 GEMM (NOTE [GEMM epilogues]).
  const core::DType in_dtype = w16 && x.defined() && x.dtype() == core::DType::kBFloat16
                                   ? core::DType::kBFloat16
                                   : core::DType::kFloat32;
  RETURN_IF_ERROR(internal::CheckLastDim(*this, x, in_, "input", in_dtype));
  const core::Device device = x.device();
  RETURN_IF_ERROR(internal::CheckParameter(*this, *weight_, "weight", {out_, in_}, device));
  if (bias_) RETURN_IF_ERROR(internal::CheckParameter(*this, *bias_, "bias", {out_}, device));
  const int64_t rows = RowsOf(x.shape());
  ASSIGN_OR_RETURN(core::Tensor y, internal::NewActivation(WithLastDim(x.shape(), out_), device));
  ASSIGN_OR_RETURN(core::Tensor a, GemmOperand(x, "input"));
  // y = x W^T (+ b in the GEMM's epilogue: NOTE [GEMM epilogues]).
  GemmArgs g;
  g.trans_b = true;
  g.m = rows;
  g.n = out_;
  g.k = in_;
  g.a.tensor = a;
  g.b.tensor = weight_->data;
  g.c.tensor = y;
  if (bias_) {
    g.epilogue = GemmEpilogue::kBias;
    g.bias = bias_->data;
  }
  RETURN_IF_ERROR(MatMul(internal::What(*this), g));
  input_ = std::move(a);
  return y;
}

absl::StatusOr<core::Tensor> Linear::GemmOperand(const core::Tensor& t, const char* name) const {
  if (weight_->data.dtype() != core::DType::kBFloat16) return t;
  // NOTE [bf16 GEMMs]: rounded once here (unless its producer stored it bf16), then used by
  // every GEMM that needs it.
  return internal::RoundToBf16(*this, t, name);
}

absl::StatusOr<core::Tensor> ApplyLinear(Linear& linear, core::Arg x) {
  if (!internal::RunsInline(linear)) return linear.CallOne({std::move(x)});
  return internal::InModule(linear,
                            functional::Linear(std::move(x), linear.weight(), BiasArg(linear)));
}

core::Arg BiasArg(const Linear& linear) {
  return linear.bias() ? core::Arg(linear.bias()) : core::Arg(core::Tensor());
}

absl::StatusOr<core::Tensor> Linear::BackwardImpl(const core::Tensor& grad_output) {
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
  // dL/dW += g^T x, and dL/db += the column sums of g, the gradient as the GEMMs use it
  // (bf16 under a bf16 weight, as PyTorch's bf16 Linear sums its bf16 gradient): in dL/dW's
  // GEMM when there is one (NOTE [GEMM epilogues]: its bias gradient).
  ASSIGN_OR_RETURN(core::Tensor gw, internal::GradTensor(*this, *weight_, "weight"));
  core::Tensor gb;
  if (bias_) {
    ASSIGN_OR_RETURN(gb, internal::GradTensor(*this, *bias_, "bias"));
  }
  if (gw.defined()) {
    core::ScopedOpCategory role(core::OpCategory::kGemmWeightGrad);
    RETURN_IF_ERROR(
        MatMul(internal::What(*this), WeightGradientGemm(rows, out_, in_, g, input_, gw, gb)));
  } else if (gb.defined()) {
    RETURN_IF_ERROR(AccumulateColumnSums(internal::What(*this), g, core::Tensor(), gb));
  }
  input_ = core::Tensor();
  return gx;
}

}  // namespace nn
