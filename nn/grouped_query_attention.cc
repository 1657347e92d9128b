#include "nn/grouped_query_attention.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nn/internal/validate.h"
#include "nn/ops.h"
#include "nn/tensor_ops.h"

namespace nn {

GroupedQueryAttention::GroupedQueryAttention(int64_t hidden, int64_t n_head, int64_t n_kv_head,
                                             double rope_theta, uint64_t seed)
    : hidden_(hidden), n_head_(n_head), n_kv_head_(n_kv_head), rope_theta_(rope_theta) {
  config_error_ = internal::FirstError({internal::PositiveOrMessage("hidden", hidden),
                                        internal::PositiveOrMessage("n_head", n_head),
                                        internal::PositiveOrMessage("n_kv_head", n_kv_head)});
  if (config_error_.empty() && hidden % n_head != 0) {
    config_error_ =
        absl::StrCat("hidden (", hidden, ") must be divisible by n_head (", n_head, ")");
  } else if (config_error_.empty() && n_head % n_kv_head != 0) {
    config_error_ =
        absl::StrCat("n_head (", n_head, ") must be divisible by n_kv_head (", n_kv_head, ")");
  } else if (config_error_.empty() && (hidden / n_head) % 2 != 0) {
    config_error_ = absl::StrCat("the head width hidden / n_head (", hidden / n_head,
                                 ") must be even for the rotary embedding");
  } else if (config_error_.empty() && !(std::isfinite(rope_theta) && rope_theta > 0.0)) {
    config_error_ = absl::StrCat("rope_theta must be finite and > 0, got ", rope_theta);
  }
  // Invalid sizes still get (small) children so the object is well formed.
  const int64_t c = std::max<int64_t>(hidden, 1);
  const int64_t d = config_error_.empty() ? hidden / n_head : 1;
  const int64_t h = std::max<int64_t>(n_head, 1), kv = std::max<int64_t>(n_kv_head, 1);
  q_proj_ =
      RegisterModule("q_proj", std::make_shared<Linear>(c, h * d, false, DeriveSeed(seed, 0)));
  k_proj_ =
      RegisterModule("k_proj", std::make_shared<Linear>(c, kv * d, false, DeriveSeed(seed, 1)));
  v_proj_ =
      RegisterModule("v_proj", std::make_shared<Linear>(c, kv * d, false, DeriveSeed(seed, 2)));
  o_proj_ =
      RegisterModule("o_proj", std::make_shared<Linear>(h * d, c, false, DeriveSeed(seed, 3)));
}

absl::Status GroupedQueryAttention::EnsureTables(int64_t T, const core::Device& device) {
  RotaryTables& t = *tables_;
  const int64_t D = hidden_ / n_head_;
  if (t.positions() >= T && t.head_dim == D && t.theta == rope_theta_ && t.cos.device() == device) {
    return absl::OkStatus();
  }
  absl::StatusOr<RotaryTables> tables = MakeRotaryTables(T, D, rope_theta_, device);
  if (!tables.ok()) return internal::ModuleError(*this, tables.status().message());
  t = *std::move(tables);
  return absl::OkStatus();
}

bool GroupedQueryAttention::TakesBf16Input() const {
  return SharesBf16Input({q_proj_.get(), k_proj_.get(), v_proj_.get()});
}

absl::StatusOr<core::Tensor> GroupedQueryAttention::ForwardImpl(const core::Tensor& x) {
  if (!config_error_.empty()) return internal::ModuleError(*this, config_error_);
  RETURN_IF_ERROR(CheckSharedBf16Input(*this, x, {q_proj_.get(), k_proj_.get(), v_proj_.get()},
                                       "q_proj, k_proj and v_proj"));
  const bool bf16_in = x.defined() && x.dtype() == core::DType::kBFloat16;
  RETURN_IF_ERROR(internal::CheckTensor(
      *this, x, bf16_in ? core::DType::kBFloat16 : core::DType::kFloat32, "input"));
  if (x.dim() != 3 || x.size(2) != hidden_) {
    return internal::ModuleError(*this, absl::StrCat("input must be [B, T, ", hidden_, "], got ",
                                                     core::ShapeToString(x.shape())));
  }
  const int64_t B = x.size(0), T = x.size(1), C = hidden_;
  const core::Device device = x.device();
  // NOTE [bf16 GEMMs] (nn/linear.h): x rounded once for the three projections.
  ASSIGN_OR_RETURN(const core::Tensor in,
                   SharedGemmInput(*this, x, {q_proj_.get(), k_proj_.get(), v_proj_.get()}));
  ASSIGN_OR_RETURN(core::Tensor q, q_proj_->Forward(in));
  ASSIGN_OR_RETURN(core::Tensor k, k_proj_->Forward(in));
  ASSIGN_OR_RETURN(core::Tensor v, v_proj_->Forward(in));
  RETURN_IF_ERROR(EnsureTables(T, device));
  // NOTE [Grouped-query attention]: q and k rotated, k and v repeated per group, into the
  // layout of the attention core.
  // NOTE [bf16 attention] (nn/attention.h): with bf16 weights the packed q, k, v are bf16
  // GEMM operands, each rounded once as the packing stores it (NOTE [GEMM epilogues]).
  const core::DType qkv_dtype = q_proj_->weight()->data.dtype() == core::DType::kBFloat16
                                    ? core::DType::kBFloat16
                                    : core::DType::kFloat32;
  ASSIGN_OR_RETURN(core::Tensor qkv, internal::NewActivation({B, T, 3 * C}, device, qkv_dtype));
  RETURN_IF_ERROR(RotaryPackQkv(internal::What(*this), q, k, v, tables_->cos, tables_->sin, n_head_,
                                n_kv_head_, qkv));
  // The fused kernel stores the heads' output bf16 for o_proj's bf16 GEMM when no hook on
  // o_proj could observe its input (as CausalSelfAttention does for proj).
  ASSIGN_OR_RETURN(core::Tensor y,
                   core_.Forward(*this, std::move(qkv), n_head_, fused_,
                                 internal::CausalAttentionCore::YBf16For(*o_proj_)));
  return o_proj_->Forward(y);
}

core::DType GroupedQueryAttention::GradOutputDType() const { return GradOutputDTypeFor(*o_proj_); }

absl::StatusOr<core::Tensor> GroupedQueryAttention::BackwardImpl(const core::Tensor& grad_output) {
  const core::Tensor& qkv = core_.qkv();
  const bool have_cache = qkv.defined();
  if (have_cache && grad_output.defined() && grad_output.dtype() == core::DType::kBFloat16 &&
      GradOutputDType() != core::DType::kBFloat16) {
    return internal::ModuleError(
        *this, absl::StrCat("grad_output must be float32 unless o_proj has a bf16 weight, no "
                            "hooks and no activation checkpointing of its own (then its GEMMs "
                            "take it in bf16), got ",
                            grad_output.ToString()));
  }
  RETURN_IF_ERROR(internal::CheckGradOutput(
      *this, have_cache,
      have_cache ? core::Shape{qkv.size(0), qkv.size(1), hidden_} : core::Shape{}, grad_output,
      GradOutputDType() == core::DType::kBFloat16));
  const core::Device device = qkv.device();
  RETURN_IF_ERROR(internal::CheckDevice(*this, grad_output, "grad_output", device, "the input"));
  const int64_t B = qkv.size(0), T = qkv.size(1), KW = n_kv_head_ * (hidden_ / n_head_);
  const std::string what = internal::What(*this);
  // The heads' gradient, bf16 from o_proj's GEMM where the core takes it so.
  ASSIGN_OR_RETURN(core::Tensor gy, core_.HeadsGradient(*o_proj_, grad_output));
  ASSIGN_OR_RETURN(core::Tensor gqkv, core_.Backward(*this, std::move(gy)));
  // Each projection's gradient stored bf16 for its bf16 GEMMs when they would round it so.
  ASSIGN_OR_RETURN(core::Tensor gq,
                   internal::NewActivation({B, T, hidden_}, device, GradOutputDTypeFor(*q_proj_)));
  ASSIGN_OR_RETURN(core::Tensor gk,
                   internal::NewActivation({B, T, KW}, device, GradOutputDTypeFor(*k_proj_)));
  ASSIGN_OR_RETURN(core::Tensor gv,
                   internal::NewActivation({B, T, KW}, device, GradOutputDTypeFor(*v_proj_)));
  RETURN_IF_ERROR(EnsureTables(T, device));  // shared: another layer may have rebuilt them
  RETURN_IF_ERROR(RotaryPackQkvBackward(what, gqkv, tables_->cos, tables_->sin, n_head_, n_kv_head_,
                                        gq, gk, gv));
  gqkv = core::Tensor();
  // x feeds the three projections: dL/dx is the sum of their input gradients.
  return SharedInputGradient(*this, {{q_proj_.get(), std::move(gq)},
                                     {k_proj_.get(), std::move(gk)},
                                     {v_proj_.get(), std::move(gv)}});
}

}  // namespace nn
