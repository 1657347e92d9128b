#include "nn/grouped_query_attention.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nn/functional/fused.h"
#include "nn/functional/llama_fused.h"
#include "nn/internal/validate.h"
#include "nn/ops.h"

namespace nn {

namespace F = ::nn::functional;

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

absl::StatusOr<core::Tensor> GroupedQueryAttention::Heads(const core::Tensor& x, bool y_bf16) {
  if (!config_error_.empty()) return internal::ModuleError(*this, config_error_);
  RETURN_IF_ERROR(internal::CheckSequence(*this, x, hidden_));
  RETURN_IF_ERROR(EnsureTables(x.size(1), x.device()));
  // NOTE [Grouped-query attention]: q and k turned and k and v repeated per group into the
  // attention's layout; NOTE [bf16 attention]: bf16 with bf16 weights, each rounded once.
  absl::StatusOr<core::Tensor> qkv;
  const core::DType q_dtype = q_proj_->weight()->data.dtype();
  if (internal::RunsInline(*q_proj_) && internal::RunsInline(*k_proj_) &&
      internal::RunsInline(*v_proj_) && k_proj_->weight()->data.dtype() == q_dtype &&
      v_proj_->weight()->data.dtype() == q_dtype) {
    qkv = F::RotaryQkv(x, q_proj_->weight(), k_proj_->weight(), v_proj_->weight(), *tables_,
                       n_head_, n_kv_head_);
  } else {
    qkv = F::PackRotaryQkv(ApplyLinear(*q_proj_, x), ApplyLinear(*k_proj_, x),
                           ApplyLinear(*v_proj_, x), *tables_, n_head_, n_kv_head_, q_dtype);
  }
  F::AttentionCoreOptions options;
  options.fused = fused_;
  options.y_bf16 = y_bf16;
  return internal::InModule(*this, F::CausalSelfAttentionCore(qkv, n_head_, options));
}

absl::StatusOr<core::Tensors> GroupedQueryAttention::ForwardGraph(const core::Tensors& in) {
  RETURN_IF_ERROR(internal::CheckInputCount(*this, in, 1));
  RETURN_IF_ERROR(internal::CheckMaterialized(*this));
  const bool y_bf16 =
      internal::RunsInline(*o_proj_) && o_proj_->weight()->data.dtype() == core::DType::kBFloat16;
  ASSIGN_OR_RETURN(core::Tensor y, ApplyLinear(*o_proj_, Heads(in[0], y_bf16)));
  return core::Tensors{std::move(y)};
}

}  // namespace nn
