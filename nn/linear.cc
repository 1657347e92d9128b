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

absl::StatusOr<core::Tensor> Linear::ForwardGemm(const core::Tensor& x, bool with_bias,
                                                 bool gemm_out, core::Tensor* pre,
                                                 const core::Tensor& residual) {
  if (!config_error_.empty()) return internal::ModuleError(*this, config_error_);
  const bool w16 = weight_->data.defined() && weight_->data.dtype() == core::DType::kBFloat16;
  // A bf16 input is one a producer stored for this layer's bf16 GEMM (NOTE [GEMM epilogues]).
  const core::DType in_dtype =
      w16 && x.defined() && x.dtype() == core::DType::kBFloat16 ? core::DType::kBFloat16
                                                                 : core::DType::kFloat32;
  RETURN_IF_ERROR(internal::CheckLastDim(*this, x, in_, "input", in_dtype));
  const core::Device device = x.device();
  RETURN_IF_ERROR(internal::CheckParameter(*this, *weight_, "weight", {out_, in_}, device));
  if (bias_) RETURN_IF_ERROR(internal::CheckParameter(*this, *bias_, "bias", {out_}, device));
  if (pre != nullptr && !bias_) {
    return internal::ModuleError(*this, "the fused bias + GELU forward needs a bias");
  }
  if (residual.defined()) {
    if (residual.dtype() != core::DType::kFloat32 ||
        residual.shape() != WithLastDim(x.shape(), out_)) {
      return internal::ModuleError(
          *this, absl::StrCat("the residual must be fp32 of the output's shape ",
                              core::ShapeToString(WithLastDim(x.shape(), out_)), ", got ",
                              residual.ToString()));
    }
    RETURN_IF_ERROR(internal::CheckDevice(*this, residual, "residual", device, "the input"));
  }
  const core::DType out_dtype =
      gemm_out && w16 && !residual.defined() ? core::DType::kBFloat16 : core::DType::kFloat32;
  const int64_t rows = RowsOf(x.shape());
  const core::Shape out_shape = WithLastDim(x.shape(), out_);
  ASSIGN_OR_RETURN(core::Tensor y, internal::NewActivation(out_shape, device, out_dtype));
  ASSIGN_OR_RETURN(core::Tensor a, GemmOperand(x, "input"));
  // y = x W^T (+ b, GELU, the residual: NOTE [GEMM epilogues]).
  GemmArgs g;
  g.trans_b = true;
  g.m = rows;
  g.n = out_;
  g.k = in_;
  g.a.tensor = a;
  g.b.tensor = weight_->data;
  g.c.tensor = y;
  if (pre != nullptr) {
    ASSIGN_OR_RETURN(*pre, internal::NewActivation(out_shape, device, out_dtype));
    g.epilogue = GemmEpilogue::kBiasGelu;
    g.bias = bias_->data;
    g.aux = *pre;
  } else if (residual.defined()) {
    g.epilogue = bias_ ? GemmEpilogue::kBiasResidual : GemmEpilogue::kResidual;
    if (bias_) g.bias = bias_->data;
    g.aux = residual;
  } else if (with_bias && bias_) {
    g.epilogue = GemmEpilogue::kBias;
    g.bias = bias_->data;
  }
  RETURN_IF_ERROR(MatMul(internal::What(*this), g));
  input_ = std::move(a);
  return y;
}

absl::StatusOr<core::Tensor> Linear::ForwardWithoutBias(const core::Tensor& x) {
  return ForwardGemm(x, /*with_bias=*/false, /*gemm_out=*/false, nullptr);
}

absl::StatusOr<core::Tensor> Linear::ForwardResidual(const core::Tensor& x,
                                                     const core::Tensor& residual) {
  RETURN_IF_ERROR(internal::CheckResidualInGemm(*this, residual, /*adds=*/true, ""));
  return ForwardGemm(x, /*with_bias=*/true, /*gemm_out=*/false, nullptr, residual);
}

absl::StatusOr<core::Tensor> Linear::ForwardForGemm(const core::Tensor& x) {
  return ForwardGemm(x, /*with_bias=*/true, /*gemm_out=*/true, nullptr);
}

absl::StatusOr<core::Tensor> Linear::ForwardGelu(const core::Tensor& x, core::Tensor* pre) {
  if (pre == nullptr) return internal::ModuleError(*this, "ForwardGelu: pre is null");
  return ForwardGemm(x, /*with_bias=*/true, /*gemm_out=*/true, pre);
}

absl::StatusOr<core::Tensor> Linear::ForwardImpl(const core::Tensor& x) {
  return ForwardGemm(x, /*with_bias=*/true, /*gemm_out=*/false, nullptr);
}

absl::StatusOr<core::Tensor> Linear::GemmOperand(const core::Tensor& t, const char* name) const {
  if (weight_->data.dtype() != core::DType::kBFloat16) return t;
  // NOTE [bf16 GEMMs]: rounded once here (unless its producer stored it bf16), then used by
  // every GEMM that needs it.
  return internal::RoundToBf16(*this, t, name);
}

bool SharesBf16Input(std::initializer_list<const Linear*> takers) {
  for (const Linear* l : takers) {
    if (l == nullptr || !internal::Fusable(*l) || !l->weight()->data.defined() ||
        l->weight()->data.dtype() != core::DType::kBFloat16) {
      return false;
    }
  }
  return true;
}

absl::Status CheckSharedBf16Input(const core::Module& owner, const core::Tensor& x,
                                  std::initializer_list<const Linear*> takers,
                                  absl::string_view names) {
  if (!x.defined() || x.dtype() != core::DType::kBFloat16 || SharesBf16Input(takers)) {
    return absl::OkStatus();
  }
  return internal::ModuleError(
      owner, absl::StrCat("input must be float32 unless ", names,
                          " all have bf16 weights, no hooks and no activation checkpointing of "
                          "their own (then they take it as their bf16 GEMM operand), got ",
                          x.ToString()));
}

absl::StatusOr<core::Tensor> SharedGemmInput(const core::Module& owner, const core::Tensor& x,
                                             std::initializer_list<const Linear*> takers) {
  if (!x.defined() || !SharesBf16Input(takers)) return x;  // each Linear takes it alone
  return internal::RoundToBf16(owner, x, "input");
}

core::DType GradOutputDTypeFor(const Linear& taker) {
  return internal::Fusable(taker) && taker.GradOutputDType() == core::DType::kBFloat16
             ? core::DType::kBFloat16
             : core::DType::kFloat32;
}

absl::StatusOr<core::Tensor> SharedInputGradient(
    const core::Module& owner, std::initializer_list<std::pair<Linear*, core::Tensor>> takers) {
  core::Tensor sum;
  for (const auto& [linear, grad_output] : takers) {
    if (!sum.defined()) {
      ASSIGN_OR_RETURN(sum, linear->Backward(grad_output));
    } else if (internal::Fusable(*linear)) {
      ASSIGN_OR_RETURN(sum, linear->BackwardAdd(grad_output, sum));
    } else {
      ASSIGN_OR_RETURN(const core::Tensor g, linear->Backward(grad_output));
      RETURN_IF_ERROR(AddTensors(internal::What(owner), sum, g, sum));
    }
  }
  return sum;
}

absl::StatusOr<core::Tensor> Linear::BackwardGemms(const core::Tensor& grad_output,
                                                   bool gemm_out,
                                                   const core::Tensor& gelu_pre,
                                                   const core::Tensor& addend) {
  RETURN_IF_ERROR(internal::CheckGradOutput(*this, input_.defined(),
                                            WithLastDim(input_.shape(), out_), grad_output,
                                            GradOutputDType() == core::DType::kBFloat16));
  const core::Device device = input_.device();
  RETURN_IF_ERROR(internal::CheckDevice(*this, grad_output, "grad_output", device, "the input"));
  RETURN_IF_ERROR(internal::CheckParameter(*this, *weight_, "weight", {out_, in_}, device));
  const bool forward16 = input_.dtype() == core::DType::kBFloat16;
  core::DType gx_dtype = gemm_out && forward16 ? core::DType::kBFloat16 : core::DType::kFloat32;
  if (gelu_pre.defined()) {
    if (gelu_pre.shape() != input_.shape() ||
        (gelu_pre.dtype() != core::DType::kFloat32 && gelu_pre.dtype() != core::DType::kBFloat16)) {
      return internal::ModuleError(
          *this, absl::StrCat("the GELU pre-activation must be fp32 or bf16 of the input's shape ",
                              core::ShapeToString(input_.shape()), ", got ", gelu_pre.ToString()));
    }
    RETURN_IF_ERROR(internal::CheckDevice(*this, gelu_pre, "GELU pre-activation", device, "the input"));
    gx_dtype = gelu_pre.dtype();
  }
  if (addend.defined()) {
    if (addend.shape() != input_.shape() || addend.dtype() != core::DType::kFloat32) {
      return internal::ModuleError(
          *this, absl::StrCat("the gradient to add must be fp32 of the input's shape ",
                              core::ShapeToString(input_.shape()), ", got ", addend.ToString()));
    }
    RETURN_IF_ERROR(internal::CheckDevice(*this, addend, "gradient to add", device, "the input"));
    gx_dtype = core::DType::kFloat32;
  }
  const int64_t rows = RowsOf(input_.shape());
  ASSIGN_OR_RETURN(core::Tensor gx, internal::NewActivation(input_.shape(), device, gx_dtype));
  ASSIGN_OR_RETURN(const core::Tensor g, GemmOperand(grad_output, "grad_output"));
  // dL/dx = g W (times GELU'(pre), or plus the addend: NOTE [GEMM epilogues]).
  GemmArgs dx;
  dx.m = rows;
  dx.n = in_;
  dx.k = out_;
  dx.a.tensor = g;
  dx.b.tensor = weight_->data;
  dx.c.tensor = gx;
  if (gelu_pre.defined()) {
    dx.epilogue = GemmEpilogue::kDGelu;
    dx.aux = gelu_pre;
  } else if (addend.defined()) {
    dx.epilogue = GemmEpilogue::kResidual;
    dx.aux = addend;
  }
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

absl::StatusOr<core::Tensor> Linear::BackwardFused(const core::Tensor& grad_output) {
  return BackwardGemms(grad_output, /*gemm_out=*/false, core::Tensor());
}

absl::StatusOr<core::Tensor> Linear::BackwardAdd(const core::Tensor& grad_output,
                                                 const core::Tensor& addend) {
  if (!addend.defined()) {
    return internal::ModuleError(*this, "BackwardAdd: the addend is undefined");
  }
  return BackwardGemms(grad_output, /*gemm_out=*/false, core::Tensor(), addend);
}

absl::StatusOr<core::Tensor> Linear::BackwardForGemm(const core::Tensor& grad_output) {
  return BackwardGemms(grad_output, /*gemm_out=*/true, core::Tensor());
}

absl::StatusOr<core::Tensor> Linear::BackwardThroughGelu(const core::Tensor& grad_output,
                                                         const core::Tensor& pre) {
  if (!pre.defined()) {
    return internal::ModuleError(*this, "BackwardThroughGelu: the pre-activation is undefined");
  }
  return BackwardGemms(grad_output, /*gemm_out=*/false, pre);
}

absl::StatusOr<core::Tensor> Linear::BackwardImpl(const core::Tensor& grad_output) {
  return BackwardGemms(grad_output, /*gemm_out=*/false, core::Tensor());
}

}  // namespace nn
