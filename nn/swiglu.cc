#include "nn/swiglu.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nn/internal/validate.h"
#include "nn/ops.h"
#include "nn/tensor_ops.h"

namespace nn {

SwiGluMlp::SwiGluMlp(int64_t hidden, int64_t intermediate, uint64_t seed) {
  config_error_ = internal::FirstError({internal::PositiveOrMessage("hidden", hidden),
                                        internal::PositiveOrMessage("intermediate", intermediate)});
  const int64_t c = std::max<int64_t>(hidden, 1), i = std::max<int64_t>(intermediate, 1);
  gate_proj_ =
      RegisterModule("gate_proj", std::make_shared<Linear>(c, i, false, DeriveSeed(seed, 0)));
  up_proj_ = RegisterModule("up_proj", std::make_shared<Linear>(c, i, false, DeriveSeed(seed, 1)));
  down_proj_ =
      RegisterModule("down_proj", std::make_shared<Linear>(i, c, false, DeriveSeed(seed, 2)));
}

bool SwiGluMlp::TakesBf16Input() const {
  return SharesBf16Input({gate_proj_.get(), up_proj_.get()});
}

absl::StatusOr<core::Tensor> SwiGluMlp::ForwardImpl(const core::Tensor& x) {
  if (!config_error_.empty()) return internal::ModuleError(*this, config_error_);
  RETURN_IF_ERROR(
      CheckSharedBf16Input(*this, x, {gate_proj_.get(), up_proj_.get()}, "gate_proj and up_proj"));
  // NOTE [bf16 GEMMs] (nn/linear.h): x rounded once for gate and up.
  ASSIGN_OR_RETURN(const core::Tensor in,
                   SharedGemmInput(*this, x, {gate_proj_.get(), up_proj_.get()}));
  ASSIGN_OR_RETURN(core::Tensor a, gate_proj_->Forward(in));
  ASSIGN_OR_RETURN(core::Tensor b, up_proj_->Forward(in));
  // NOTE [GEMM epilogues]: h stored bf16 for down_proj's bf16 GEMM when nothing could see
  // it there (no hooks, no activation checkpointing of its own): the bits down_proj would
  // round it to, without the fp32 copy and the rounding pass.
  const core::DType h_dtype =
      SharesBf16Input({down_proj_.get()}) ? core::DType::kBFloat16 : core::DType::kFloat32;
  ASSIGN_OR_RETURN(core::Tensor h, internal::NewActivation(a.shape(), a.device(), h_dtype));
  RETURN_IF_ERROR(SiluMulForward(internal::What(*this), a, b, h));
  gate_ = std::move(a);
  up_ = std::move(b);
  return down_proj_->Forward(h);
}

absl::StatusOr<core::Tensor> SwiGluMlp::BackwardImpl(const core::Tensor& grad_output) {
  if (!gate_.defined()) {
    return absl::FailedPreconditionError(
        absl::StrCat(Describe(), ": Backward called without a preceding Forward"));
  }
  ASSIGN_OR_RETURN(core::Tensor gh, down_proj_->Backward(grad_output));
  const std::string what = internal::What(*this);
  // Each gradient stored bf16 for its projection's bf16 GEMMs when they would round it so.
  ASSIGN_OR_RETURN(core::Tensor ga, internal::NewActivation(gate_.shape(), gate_.device(),
                                                            GradOutputDTypeFor(*gate_proj_)));
  ASSIGN_OR_RETURN(core::Tensor gb, internal::NewActivation(up_.shape(), up_.device(),
                                                            GradOutputDTypeFor(*up_proj_)));
  RETURN_IF_ERROR(SiluMulBackward(what, gate_, up_, gh, ga, gb));
  gate_ = core::Tensor();
  up_ = core::Tensor();
  // x feeds both projections: dL/dx is the sum of their input gradients.
  return SharedInputGradient(*this,
                             {{gate_proj_.get(), std::move(ga)}, {up_proj_.get(), std::move(gb)}});
}

}  // namespace nn
