#include "nn/llama.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/param_init.h"
#include "core/status_macros.h"
#include "nn/internal/validate.h"
#include "nn/ops.h"
#include "nn/tensor_ops.h"

namespace nn {

absl::Status LlamaConfig::Validate() const {
  const std::pair<const char*, int64_t> sizes[] = {
      {"vocab_size", vocab_size},
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"num_hidden_layers", num_hidden_layers},
      {"num_attention_heads", num_attention_heads},
      {"num_key_value_heads", num_key_value_heads},
      {"max_position_embeddings", max_position_embeddings}};
  for (const auto& [name, value] : sizes) {
    if (value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("LlamaConfig.", name, " must be positive, got ", value));
    }
  }
  if (hidden_size % num_attention_heads != 0 || (hidden_size / num_attention_heads) % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LlamaConfig.hidden_size (", hidden_size, ") must be LlamaConfig.num_attention_heads (",
        num_attention_heads, ") times an even head width (the rotary embedding turns pairs)"));
  }
  if (num_attention_heads % num_key_value_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LlamaConfig.num_key_value_heads (", num_key_value_heads,
        ") must divide LlamaConfig.num_attention_heads (", num_attention_heads, ")"));
  }
  if (!(std::isfinite(rms_norm_eps) && rms_norm_eps >= 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("LlamaConfig.rms_norm_eps must be finite and >= 0, got ", rms_norm_eps));
  }
  if (!(std::isfinite(rope_theta) && rope_theta > 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("LlamaConfig.rope_theta must be finite and > 0, got ", rope_theta));
  }
  if (!(std::isfinite(initializer_range) && initializer_range >= 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LlamaConfig.initializer_range must be finite and >= 0, got ", initializer_range));
  }
  return absl::OkStatus();
}

namespace {

// NOTE [GEMM epilogues] (nn/tensor_ops.h): `norm`'s output goes straight into `next`, whose
// GEMMs take it as a bf16 operand; stored bf16 by the norm itself when nothing can observe
// the difference (no hooks on either, nn::internal::Fusable) and `next` would round it so.
template <typename Next>
absl::StatusOr<core::Tensor> NormInto(RmsNorm& norm, const Next& next, const core::Tensor& x) {
  if (internal::Fusable(norm) && internal::Fusable(next) && next.TakesBf16Input()) {
    return norm.ForwardForGemm(x);
  }
  return norm.Forward(x);
}

// residual + sub(a), `sub` a child of `layer` (GroupedQueryAttention or SwiGluMlp): the add
// in the epilogue of sub's last GEMM when nothing can observe the two apart (NOTE [Fused
// layers] in nn/transformer.h: no hooks on sub or its last projection), else a pass of its
// own. The same bits either way.
template <typename Sub>
absl::StatusOr<core::Tensor> PlusResidual(const core::Module& layer, Sub& sub,
                                          const core::Tensor& a, const core::Tensor& residual) {
  if (internal::Fusable(sub) && sub.AddsResidualInGemm()) return sub.ForwardResidual(a, residual);
  ASSIGN_OR_RETURN(const core::Tensor out, sub.Forward(a));
  return internal::ResidualAdd(layer, residual, out);
}

}  // namespace

LlamaDecoderLayer::LlamaDecoderLayer(const LlamaConfig& config, uint64_t seed) {
  const int64_t C = config.hidden_size;
  input_layernorm_ =
      RegisterModule("input_layernorm", std::make_shared<RmsNorm>(C, config.rms_norm_eps));
  self_attn_ = RegisterModule(
      "self_attn", std::make_shared<GroupedQueryAttention>(
                       C, config.num_attention_heads, config.num_key_value_heads,
                       config.rope_theta, DeriveSeed(seed, 0)));
  post_attention_layernorm_ = RegisterModule("post_attention_layernorm",
                                             std::make_shared<RmsNorm>(C, config.rms_norm_eps));
  mlp_ = RegisterModule(
      "mlp", std::make_shared<SwiGluMlp>(C, config.intermediate_size, DeriveSeed(seed, 1)));
}

absl::StatusOr<core::Tensor> LlamaDecoderLayer::ForwardImpl(const core::Tensor& x) {
  ASSIGN_OR_RETURN(const core::Tensor a, NormInto(*input_layernorm_, *self_attn_, x));
  ASSIGN_OR_RETURN(core::Tensor h, PlusResidual(*this, *self_attn_, a, x));
  ASSIGN_OR_RETURN(const core::Tensor m, NormInto(*post_attention_layernorm_, *mlp_, h));
  ASSIGN_OR_RETURN(core::Tensor y, PlusResidual(*this, *mlp_, m, h));
  input_shape_ = x.shape();
  return y;
}

absl::StatusOr<core::Tensor> LlamaDecoderLayer::BackwardImpl(const core::Tensor& grad_output) {
  RETURN_IF_ERROR(
      internal::CheckGradOutput(*this, !input_shape_.empty(), input_shape_, grad_output));
  // y = h + mlp(norm(h)): dL/dh = g + norm'(mlp'(g)).
  ASSIGN_OR_RETURN(core::Tensor gm, mlp_->Backward(grad_output));
  // NOTE [Fused layers]: self_attn's o_proj rounds gh to bf16 for its GEMMs; when nothing
  // can observe the gradient self_attn receives (no hooks on it or o_proj), the norm's
  // backward writes that rounded copy in its pass and self_attn takes it: the same bits,
  // one pass fewer.
  const bool attn16 = internal::Fusable(*self_attn_) &&
                      self_attn_->GradOutputDType() == core::DType::kBFloat16;
  core::Tensor gh16;
  ASSIGN_OR_RETURN(core::Tensor gh,
                   internal::NormBackwardPlus(*this, *post_attention_layernorm_, gm, grad_output,
                                    attn16 ? &gh16 : nullptr));
  // h = x + attn(norm(x)): dL/dx = gh + norm'(attn'(gh)).
  ASSIGN_OR_RETURN(core::Tensor ga, self_attn_->Backward(gh16.defined() ? gh16 : gh));
  gh16 = core::Tensor();
  ASSIGN_OR_RETURN(core::Tensor gx, internal::NormBackwardPlus(*this, *input_layernorm_, ga, gh));
  input_shape_.clear();
  return gx;
}

absl::StatusOr<std::shared_ptr<Llama>> Llama::Create(const LlamaConfig& config) {
  RETURN_IF_ERROR(config.Validate());
  // The largest weights' element counts must be int64s (sizes come from user configs); an
  // allocation that fails beyond that is reported by ConstructionStatus below.
  int64_t numel;
  if (__builtin_mul_overflow(config.vocab_size, config.hidden_size, &numel) ||
      __builtin_mul_overflow(config.intermediate_size, config.hidden_size, &numel) ||
      __builtin_mul_overflow(config.hidden_size, config.hidden_size, &numel)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "LlamaConfig (vocab_size=", config.vocab_size, ", hidden_size=", config.hidden_size,
        ", intermediate_size=", config.intermediate_size,
        "): a weight's element count overflows int64"));
  }
  std::shared_ptr<Llama> llama(new Llama(config));
  absl::Status allocated = llama->ConstructionStatus();
  if (!allocated.ok()) {
    return absl::Status(allocated.code(), absl::StrCat("Llama: ", allocated.message()));
  }
  llama->InitializeWeights();
  return llama;
}

Llama::Llama(const LlamaConfig& config) : config_(config) {
  const int64_t C = config.hidden_size;
  embed_tokens_ = RegisterModule(
      "embed_tokens", std::make_shared<Embedding>(config.vocab_size, C, DeriveSeed(config.seed, 0)));
  std::vector<std::shared_ptr<core::Module>> layers;
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    layers.push_back(std::make_shared<LlamaDecoderLayer>(
        config, DeriveSeed(config.seed, 2 + static_cast<uint64_t>(l))));
  }
  layers_ = RegisterModule("layers", Sequential::Make(std::move(layers)));
  // Every layer reads one set of rotary tables (they depend on T, the head width and theta).
  auto rotary = std::make_shared<RotaryTables>();
  for (const auto& layer : layers_->modules()) {
    static_cast<LlamaDecoderLayer&>(*layer).self_attn()->set_rotary_tables(rotary);
  }
  norm_ = RegisterModule("norm", std::make_shared<RmsNorm>(C, config.rms_norm_eps));
  lm_head_ = RegisterModule(
      "lm_head", config.tie_word_embeddings
                     ? Linear::Tied(embed_tokens_->weight(), /*bias=*/false)
                     : std::make_shared<Linear>(C, config.vocab_size, /*bias=*/false,
                                                DeriveSeed(config.seed, 1)));
}

void Llama::InitializeWeights() {
  const float stddev = config_.initializer_range;
  for (const core::NamedModule& named : NamedModules()) {
    core::Module* module = named.second.get();
    // Recipes (NOTE [Deferred initialisation] in core/param_init.h): filled now, or when a
    // deferred model's shards are made. fp32 CPU or deferred: cannot fail. RmsNorm weights
    // keep their constructor's recipe, 1.
    if (auto* emb = dynamic_cast<Embedding*>(module)) {
      (void)core::InitParameter(*emb->weight(),
                                core::ParamInit::Normal(emb->seed(), 0, 0.0f, stddev));
    } else if (auto* linear = dynamic_cast<Linear*>(module)) {
      if (linear->weight() == embed_tokens_->weight()) continue;  // tied: initialised as it
      (void)core::InitParameter(*linear->weight(),
                                core::ParamInit::Normal(linear->seed(), 0, 0.0f, stddev));
    }
  }
}

absl::StatusOr<core::Tensor> Llama::ForwardImpl(const core::Tensor& tokens) {
  RETURN_IF_ERROR(internal::CheckTensor(*this, tokens, core::DType::kInt32, "input tokens"));
  if (tokens.dim() != 2) {
    return internal::ModuleError(*this, absl::StrCat("input tokens must be [B, T], got ",
                                                     core::ShapeToString(tokens.shape())));
  }
  if (tokens.size(1) > config_.max_position_embeddings) {
    return internal::ModuleError(
        *this, absl::StrCat("sequence length ", tokens.size(1), " of input ",
                            core::ShapeToString(tokens.shape()),
                            " exceeds LlamaConfig.max_position_embeddings ",
                            config_.max_position_embeddings));
  }
  ASSIGN_OR_RETURN(core::Tensor x, embed_tokens_->Forward(tokens));
  ASSIGN_OR_RETURN(x, layers_->Forward(x));
  // NOTE [GEMM epilogues]: the final norm's output is the head's bf16 GEMM operand under
  // bf16 weights.
  if (internal::Fusable(*norm_) && SharesBf16Input({lm_head_.get()})) {
    ASSIGN_OR_RETURN(x, norm_->ForwardForGemm(x));
  } else {
    ASSIGN_OR_RETURN(x, norm_->Forward(x));
  }
  // NOTE [bf16 logits] (nn/gpt.h), as the GPT: under bf16 weights the head stores the
  // logits bf16.
  ASSIGN_OR_RETURN(core::Tensor logits, internal::Fusable(*lm_head_)
                                            ? lm_head_->ForwardForGemm(x)
                                            : lm_head_->Forward(x));
  token_shape_ = tokens.shape();
  return logits;
}

absl::StatusOr<core::Tensor> Llama::BackwardImpl(const core::Tensor& grad_output) {
  const bool have_cache = !token_shape_.empty();
  RETURN_IF_ERROR(internal::CheckGradOutput(
      *this, have_cache,
      have_cache ? core::Shape{token_shape_[0], token_shape_[1], config_.vocab_size}
                 : core::Shape{},
      grad_output, logits_grad_dtype() == core::DType::kBFloat16));
  ASSIGN_OR_RETURN(core::Tensor g, lm_head_->Backward(grad_output));
  ASSIGN_OR_RETURN(g, norm_->Backward(g));
  ASSIGN_OR_RETURN(g, layers_->Backward(g));
  RETURN_IF_ERROR(embed_tokens_->Backward(g).status());
  token_shape_.clear();
  return core::Tensor();
}

}  // namespace nn
