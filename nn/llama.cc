#include "nn/llama.h"

#include <cmath>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/param_init.h"
#include "core/status_macros.h"
#include "nn/functional/elementwise.h"
#include "nn/functional/embedding.h"
#include "nn/functional/fused.h"
#include "nn/functional/llama_fused.h"
#include "nn/functional/norm.h"
#include "nn/internal/decoder_head.h"
#include "nn/internal/validate.h"
#include "nn/ops.h"

namespace nn {

namespace F = ::nn::functional;

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
    return absl::InvalidArgumentError(
        absl::StrCat("LlamaConfig.num_key_value_heads (", num_key_value_heads,
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

LlamaDecoderLayer::LlamaDecoderLayer(const LlamaConfig& config, uint64_t seed) {
  const int64_t C = config.hidden_size;
  input_layernorm_ =
      RegisterModule("input_layernorm", std::make_shared<RmsNorm>(C, config.rms_norm_eps));
  self_attn_ =
      RegisterModule("self_attn", std::make_shared<GroupedQueryAttention>(
                                      C, config.num_attention_heads, config.num_key_value_heads,
                                      config.rope_theta, DeriveSeed(seed, 0)));
  post_attention_layernorm_ =
      RegisterModule("post_attention_layernorm", std::make_shared<RmsNorm>(C, config.rms_norm_eps));
  mlp_ = RegisterModule(
      "mlp", std::make_shared<SwiGluMlp>(C, config.intermediate_size, DeriveSeed(seed, 1)));
}

absl::StatusOr<core::Tensors> LlamaDecoderLayer::ForwardGraph(const core::Tensors& in) {
  RETURN_IF_ERROR(internal::CheckInputCount(*this, in, 1));
  RETURN_IF_ERROR(internal::CheckMaterialized(*this));
  // NOTE [Block forwards] (nn/transformer.h), with RmsNorm, rotary q/k and SwiGLU.
  const bool attn_inline = internal::RunsInline(*self_attn_);
  const bool mlp_inline = internal::RunsInline(*mlp_);
  // h = x + self_attn(input_layernorm(x)).
  core::Tensor residual = in[0];
  core::Tensor n1;
  if (internal::RunsInline(*input_layernorm_)) {
    ASSIGN_OR_RETURN(
        const std::vector<core::Tensor> r,
        internal::InModule(*input_layernorm_,
                           F::ResidualRmsNorm(residual, input_layernorm_->weight(),
                                              {input_layernorm_->eps(), attn_inline})));
    residual = r[0];
    n1 = r[1];
  } else {
    ASSIGN_OR_RETURN(n1, input_layernorm_->CallOne({residual}));
  }
  core::Tensor h;
  if (attn_inline) {
    // q and k turned and packed with v for attention's bf16 GEMMs; o_proj's GEMM adds the
    // residual.
    GroupedQueryAttention& attn = *self_attn_;
    const bool y_bf16 = attn.o_proj()->weight()->data.dtype() == core::DType::kBFloat16;
    ASSIGN_OR_RETURN(h, internal::InModule(
                            attn, F::LinearResidual(attn.Heads(n1, y_bf16), attn.o_proj()->weight(),
                                                    core::Tensor(), residual)));
  } else {
    ASSIGN_OR_RETURN(h, internal::InModule(*this, F::Add(residual, self_attn_->CallOne({n1}))));
  }
  // y = h + mlp(post_attention_layernorm(h)).
  core::Tensor n2;
  if (internal::RunsInline(*post_attention_layernorm_)) {
    ASSIGN_OR_RETURN(
        const std::vector<core::Tensor> r,
        internal::InModule(*post_attention_layernorm_,
                           F::ResidualRmsNorm(h, post_attention_layernorm_->weight(),
                                              {post_attention_layernorm_->eps(), mlp_inline})));
    h = r[0];
    n2 = r[1];
  } else {
    ASSIGN_OR_RETURN(n2, post_attention_layernorm_->CallOne({h}));
  }
  core::Tensor y;
  if (mlp_inline) {
    // gate and up from one pass, h stored for down_proj's bf16 GEMM, which adds the residual.
    ASSIGN_OR_RETURN(
        y, internal::InModule(*mlp_,
                              F::LinearResidual(mlp_->Hidden(n2, /*h_for_gemm=*/true),
                                                mlp_->down_proj()->weight(), core::Tensor(), h)));
  } else {
    ASSIGN_OR_RETURN(y, internal::InModule(*this, F::Add(h, mlp_->CallOne({n2}))));
  }
  return core::Tensors{std::move(y)};
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
  RETURN_IF_ERROR(core::Annotate(llama->ConstructionStatus(), "Llama"));
  llama->InitializeWeights();
  return llama;
}

Llama::Llama(const LlamaConfig& config) : config_(config) {
  const int64_t C = config.hidden_size;
  embed_tokens_ =
      RegisterModule("embed_tokens",
                     std::make_shared<Embedding>(config.vocab_size, C, DeriveSeed(config.seed, 0)));
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
  lm_head_ =
      RegisterModule("lm_head", config.tie_word_embeddings
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

absl::StatusOr<core::Tensors> Llama::ForwardGraph(const core::Tensors& in) {
  RETURN_IF_ERROR(internal::CheckInputCount(*this, in, 1));
  // The modules this forward runs inline (the layers check their own).
  for (const core::Module* m : std::initializer_list<const core::Module*>{
           embed_tokens_.get(), norm_.get(), lm_head_.get()}) {
    RETURN_IF_ERROR(internal::CheckMaterialized(*m));
  }
  const core::Tensor& tokens = in[0];
  RETURN_IF_ERROR(internal::CheckTensor(*this, tokens, core::DType::kInt32, "input tokens"));
  if (tokens.dim() != 2) {
    return internal::ModuleError(*this, absl::StrCat("input tokens must be [B, T], got ",
                                                     core::ShapeToString(tokens.shape())));
  }
  if (tokens.size(1) > config_.max_position_embeddings) {
    return internal::ModuleError(*this,
                                 absl::StrCat("sequence length ", tokens.size(1), " of input ",
                                              core::ShapeToString(tokens.shape()),
                                              " exceeds LlamaConfig.max_position_embeddings ",
                                              config_.max_position_embeddings));
  }
  absl::StatusOr<core::Tensor> x =
      internal::RunsInline(*embed_tokens_)
          ? internal::InModule(*embed_tokens_, F::Embedding(tokens, embed_tokens_->weight()))
          : embed_tokens_->CallOne({tokens});
  x = layers_->CallOne({x});
  // NOTE [bf16 logits] (nn/gpt.h), as the GPT: under bf16 weights the final norm stores its
  // output bf16 for the head's GEMM, which stores the logits bf16.
  const bool head_inline = internal::RunsInline(*lm_head_);
  absl::StatusOr<core::Tensor> normed = !internal::RunsInline(*norm_) ? norm_->CallOne({x})
                                        : head_inline
                                            ? F::RmsNormForGemm(x, norm_->weight(), norm_->eps())
                                            : F::RmsNorm(x, norm_->weight(), norm_->eps());
  return internal::DecoderLogits(*this, *lm_head_, head_inline, std::move(normed),
                                 &logits_grad_dtype_);
}

}  // namespace nn
