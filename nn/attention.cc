#include "nn/attention.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nn/internal/validate.h"
#include "nn/ops.h"
#include "nn/tensor_ops.h"

namespace nn {

CausalSelfAttention::CausalSelfAttention(int64_t n_embd, int64_t n_head, uint64_t seed)
    : n_embd_(n_embd), n_head_(n_head) {
  config_error_ = internal::FirstError({internal::PositiveOrMessage("n_embd", n_embd),
                                        internal::PositiveOrMessage("n_head", n_head)});
  if (config_error_.empty() && n_embd % n_head != 0) {
    config_error_ =
        absl::StrCat("n_embd (", n_embd, ") must be divisible by n_head (", n_head, ")");
  }
  const int64_t c = std::max<int64_t>(n_embd, 1);
  qkv_ = RegisterModule("qkv", std::make_shared<Linear>(c, 3 * c, true, DeriveSeed(seed, 0)));
  proj_ = RegisterModule("proj", std::make_shared<Linear>(c, c, true, DeriveSeed(seed, 1)));
}

absl::StatusOr<core::Tensor> CausalSelfAttention::ForwardImpl(const core::Tensor& x) {
  if (!config_error_.empty()) return internal::ModuleError(*this, config_error_);
  // A bf16 input is one its producer stored for qkv's bf16 GEMM (NOTE [GEMM epilogues]).
  const bool bf16_in = x.defined() && x.dtype() == core::DType::kBFloat16 &&
                       qkv_->weight()->data.dtype() == core::DType::kBFloat16;
  RETURN_IF_ERROR(internal::CheckTensor(
      *this, x, bf16_in ? core::DType::kBFloat16 : core::DType::kFloat32, "input"));
  if (x.dim() != 3 || x.size(2) != n_embd_) {
    return internal::ModuleError(*this, absl::StrCat("input must be [B, T, ", n_embd_, "], got ",
                                                     core::ShapeToString(x.shape())));
  }
  // NOTE [bf16 attention] (attention.h): with a bf16 qkv weight, q, k, v and the
  // probabilities are bf16 GEMM operands, the scores fp32. qkv's GEMM stores them bf16
  // itself when it may (NOTE [GEMM epilogues]), else they are rounded here.
  core::Tensor qkv;
  if (internal::Fusable(*qkv_)) {
    ASSIGN_OR_RETURN(qkv, qkv_->ForwardForGemm(x));
  } else {
    ASSIGN_OR_RETURN(qkv, qkv_->Forward(x));
  }
  if (qkv_->weight()->data.dtype() == core::DType::kBFloat16) {
    ASSIGN_OR_RETURN(qkv, internal::RoundToBf16(*this, qkv, "q, k and v"));
  }
  // The fused kernel stores the heads' output bf16 for proj's bf16 GEMM when no hook on
  // proj could observe its input.
  ASSIGN_OR_RETURN(core::Tensor y, core_.Forward(*this, std::move(qkv), n_head_, fused_,
                                                 internal::CausalAttentionCore::YBf16For(*proj_)));
  return proj_->Forward(y);
}

core::DType CausalSelfAttention::GradOutputDType() const { return GradOutputDTypeFor(*proj_); }

absl::StatusOr<core::Tensor> CausalSelfAttention::BackwardImpl(const core::Tensor& grad_output) {
  const core::Tensor& qkv = core_.qkv();
  const bool have_cache = qkv.defined();
  RETURN_IF_ERROR(internal::CheckGradOutput(
      *this, have_cache,
      have_cache ? core::Shape{qkv.size(0), qkv.size(1), n_embd_} : core::Shape{}, grad_output,
      GradOutputDType() == core::DType::kBFloat16));
  RETURN_IF_ERROR(
      internal::CheckDevice(*this, grad_output, "grad_output", qkv.device(), "the input"));
  // The heads' gradient, bf16 from proj's GEMM where the core takes it so.
  ASSIGN_OR_RETURN(core::Tensor gy, core_.HeadsGradient(*proj_, grad_output));
  // The fused kernels store dL/dqkv bf16 for qkv's bf16 GEMMs (which round it so anyway)
  // when no hook on qkv could observe it.
  const bool gqkv_bf16 =
      internal::Fusable(*qkv_) && qkv_->weight()->data.dtype() == core::DType::kBFloat16;
  ASSIGN_OR_RETURN(core::Tensor gqkv, core_.Backward(*this, std::move(gy), gqkv_bf16));
  return qkv_->Backward(gqkv);
}

}  // namespace nn
