#include "nn/attention.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nn/functional/elementwise.h"
#include "nn/functional/fused.h"
#include "nn/internal/validate.h"
#include "nn/ops.h"

namespace nn {

namespace F = ::nn::functional;

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

absl::StatusOr<core::Tensor> CausalSelfAttention::Heads(const core::Tensor& x, bool y_bf16) {
  if (!config_error_.empty()) return internal::ModuleError(*this, config_error_);
  RETURN_IF_ERROR(internal::CheckSequence(*this, x, n_embd_));
  // NOTE [bf16 attention]: with a bf16 qkv weight, q, k and v are rounded once for the
  // attention's bf16 GEMMs, by qkv's own GEMM when it runs inline.
  core::Tensor qkv;
  if (internal::RunsInline(*qkv_)) {
    ASSIGN_OR_RETURN(
        qkv, internal::InModule(*qkv_, F::LinearForGemm(x, qkv_->weight(), BiasArg(*qkv_))));
  } else {
    ASSIGN_OR_RETURN(qkv, qkv_->CallOne({x}));
    if (qkv_->weight()->data.dtype() == core::DType::kBFloat16) {
      ASSIGN_OR_RETURN(qkv, internal::InModule(*this, F::ToDType(qkv, core::DType::kBFloat16)));
    }
  }
  F::AttentionCoreOptions options;
  options.fused = fused_;
  options.y_bf16 = y_bf16;
  return internal::InModule(*this, F::CausalSelfAttentionCore(qkv, n_head_, options));
}

absl::StatusOr<core::Tensors> CausalSelfAttention::ForwardGraph(const core::Tensors& in) {
  RETURN_IF_ERROR(internal::CheckInputCount(*this, in, 1));
  RETURN_IF_ERROR(internal::CheckMaterialized(*this));
  // The fused kernel stores the heads' output bf16 for proj's bf16 GEMM when proj runs inline.
  const bool y_bf16 =
      internal::RunsInline(*proj_) && proj_->weight()->data.dtype() == core::DType::kBFloat16;
  ASSIGN_OR_RETURN(core::Tensor y, ApplyLinear(*proj_, Heads(in[0], y_bf16)));
  return core::Tensors{std::move(y)};
}

}  // namespace nn
