#include "nn/transformer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nn/internal/validate.h"
#include "nn/ops.h"
#include "nn/tensor_ops.h"

namespace nn {
Mlp::Mlp(int64_t n_embd, uint64_t seed) {
  config_error_ = internal::PositiveOrMessage("n_embd", n_embd);
  const int64_t c = std::max<int64_t>(n_embd, 1);
  fc_ = RegisterModule("fc", std::make_shared<Linear>(c, 4 * c, true, DeriveSeed(seed, 0)));
  gelu_ = RegisterModule("gelu", std::make_shared<GELU>());
  proj_ = RegisterModule("proj", std::make_shared<Linear>(4 * c, c, true, DeriveSeed(seed, 1)));
}

absl::StatusOr<core::Tensor> Mlp::ForwardImpl(const core::Tensor& x) {
  return ForwardPlus(x, core::Tensor());
}

bool Mlp::AddsResidualInGemm() const {
  return config_error_.empty() && fc_->bias() != nullptr && proj_->bias() != nullptr &&
         internal::Fusable(*fc_) && internal::Fusable(*gelu_) && internal::Fusable(*proj_);
}

absl::StatusOr<core::Tensor> Mlp::ForwardResidual(const core::Tensor& x,
                                                  const core::Tensor& residual) {
  RETURN_IF_ERROR(internal::CheckResidualInGemm(
      *this, residual, AddsResidualInGemm(),
      "fc, gelu and proj without hooks and fc and proj with biases"));
  return ForwardPlus(x, residual);
}

absl::StatusOr<core::Tensor> Mlp::ForwardPlus(const core::Tensor& x,
                                              const core::Tensor& residual) {
  if (!config_error_.empty()) return internal::ModuleError(*this, config_error_);
  pre_ = core::Tensor();
  if (fc_->bias() == nullptr || !internal::Fusable(*fc_) || !internal::Fusable(*gelu_) ||
      !internal::Fusable(*proj_)) {
    ASSIGN_OR_RETURN(core::Tensor h, fc_->Forward(x));
    ASSIGN_OR_RETURN(h, gelu_->Forward(h));
    return proj_->Forward(h);
  }
  // NOTE [Fused layers]: fc's GEMM adds the bias and applies the GELU in its epilogue,
  // storing h (and the pre-activation) bf16 for proj's bf16 GEMM (NOTE [GEMM epilogues]);
  // with a residual, proj's adds its bias and the residual.
  core::Tensor pre;
  ASSIGN_OR_RETURN(core::Tensor h, fc_->ForwardGelu(x, &pre));
  pre_ = std::move(pre);
  if (residual.defined()) return proj_->ForwardResidual(h, residual);
  return proj_->Forward(h);
}

absl::StatusOr<core::Tensor> Mlp::BackwardImpl(const core::Tensor& grad_output) {
  if (!pre_.defined()) {
    ASSIGN_OR_RETURN(core::Tensor g, proj_->Backward(grad_output));
    ASSIGN_OR_RETURN(g, gelu_->Backward(g));
    return fc_->Backward(g);
  }
  if (!internal::Fusable(*fc_) || !internal::Fusable(*gelu_) || !internal::Fusable(*proj_)) {
    return absl::FailedPreconditionError(absl::StrCat(
        FusedWhat(), ": hooks were registered between Forward and Backward; the Forward ran "
        "fused without them (NOTE [Fused layers]), so register hooks before Forward"));
  }
  // proj's input-gradient GEMM multiplies by GELU'(pre) in its epilogue: the gradient at
  // the pre-activation, in pre's dtype: fc's backward from there (its bias gradient in its
  // weight gradient's GEMM).
  ASSIGN_OR_RETURN(core::Tensor gpre, proj_->BackwardThroughGelu(grad_output, pre_));
  pre_ = core::Tensor();
  return fc_->BackwardFused(gpre);
}

std::string Mlp::FusedWhat() const {
  return absl::StrCat(fc_->Describe(), " + ", gelu_->Describe());
}

TransformerBlock::TransformerBlock(int64_t n_embd, int64_t n_head, uint64_t seed) {
  ln_1_ = RegisterModule("ln_1", std::make_shared<LayerNorm>(n_embd));
  attn_ = RegisterModule(
      "attn", std::make_shared<CausalSelfAttention>(n_embd, n_head, DeriveSeed(seed, 0)));
  ln_2_ = RegisterModule("ln_2", std::make_shared<LayerNorm>(n_embd));
  mlp_ = RegisterModule("mlp", std::make_shared<Mlp>(n_embd, DeriveSeed(seed, 1)));
}

absl::StatusOr<core::Tensor> TransformerBlock::ForwardImpl(const core::Tensor& x) {
  // NOTE [GEMM epilogues]: a LayerNorm whose output goes straight into attention's or the
  // MLP's first GEMM stores it bf16 under bf16 weights, when nothing can observe the
  // difference (no hooks on either side).
  core::Tensor a;
  if (internal::Fusable(*ln_1_) && internal::Fusable(*attn_)) {
    ASSIGN_OR_RETURN(a, ln_1_->ForwardForGemm(x));
  } else {
    ASSIGN_OR_RETURN(a, ln_1_->Forward(x));
  }
  core::Tensor h;
  core::Tensor m;
  if (internal::Fusable(*attn_) && attn_->AddsResidualInGemm()) {
    // NOTE [Fused layers]: h = x + attn(a), the add in the epilogue of attention's proj
    // GEMM.
    ASSIGN_OR_RETURN(h, attn_->ForwardResidual(a, x));
    if (internal::Fusable(*ln_2_) && internal::Fusable(*mlp_)) {
      ASSIGN_OR_RETURN(m, ln_2_->ForwardForGemm(h));
    } else {
      ASSIGN_OR_RETURN(m, ln_2_->Forward(h));
    }
  } else {
    ASSIGN_OR_RETURN(a, attn_->Forward(a));
    if (internal::Fusable(*ln_2_)) {
      // NOTE [Fused layers]: h = x + a and ln_2(h) in one pass.
      ASSIGN_OR_RETURN(m, ln_2_->ForwardAdd(x, a, &h, /*for_gemm=*/internal::Fusable(*mlp_)));
    } else {
      ASSIGN_OR_RETURN(h, internal::ResidualAdd(*this, x, a));
      ASSIGN_OR_RETURN(m, ln_2_->Forward(h));
    }
  }
  core::Tensor y;
  if (internal::Fusable(*mlp_) && mlp_->AddsResidualInGemm()) {
    // NOTE [Fused layers]: y = h + mlp(m), the add in the epilogue of the MLP's last GEMM.
    ASSIGN_OR_RETURN(y, mlp_->ForwardResidual(m, h));
  } else {
    ASSIGN_OR_RETURN(m, mlp_->Forward(m));
    ASSIGN_OR_RETURN(y, internal::ResidualAdd(*this, h, m));
  }
  input_shape_ = x.shape();
  return y;
}

absl::StatusOr<core::Tensor> TransformerBlock::BackwardImpl(const core::Tensor& grad_output) {
  RETURN_IF_ERROR(
      internal::CheckGradOutput(*this, !input_shape_.empty(), input_shape_, grad_output));
  // y = h + mlp(ln_2(h)): dL/dh = g + ln_2'(mlp'(g)).
  ASSIGN_OR_RETURN(core::Tensor gm, mlp_->Backward(grad_output));
  // NOTE [Fused layers]: attention's bf16 GEMMs round gh to bf16; when nothing can observe
  // the gradient attention receives (no hooks on it or its proj), ln_2's backward writes
  // that rounded copy in its pass and attention takes it: the same bits, one pass fewer.
  const bool attn16 = internal::Fusable(*attn_) &&
                      attn_->GradOutputDType() == core::DType::kBFloat16;
  core::Tensor gh16;
  ASSIGN_OR_RETURN(core::Tensor gh, internal::NormBackwardPlus(*this, *ln_2_, gm, grad_output,
                                                          attn16 ? &gh16 : nullptr));
  // h = x + attn(ln_1(x)): dL/dx = gh + ln_1'(attn'(gh)).
  ASSIGN_OR_RETURN(core::Tensor ga, attn_->Backward(gh16.defined() ? gh16 : gh));
  gh16 = core::Tensor();
  ASSIGN_OR_RETURN(core::Tensor gx, internal::NormBackwardPlus(*this, *ln_1_, ga, gh));
  input_shape_.clear();
  return gx;
}

}  // namespace nn
