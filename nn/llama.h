// Llama: a Llama-style decoder-only language model, Hugging Face's LlamaForCausalLM
// (attention and MLP without biases, no dropout, rope type "default") beside nn::Gpt, with
// the same interface.
//
//   nn::LlamaConfig config;          // vocab 64, width 64, 2 layers, 4 heads, 2 kv heads
//   config.num_hidden_layers = 4;
//   ASSIGN_OR_RETURN(std::shared_ptr<nn::Llama> llama, nn::Llama::Create(config));
//   namespace F = nn::functional;
//   ASSIGN_OR_RETURN(core::Tensor logits, llama->CallOne({tokens}));  // int32 [B, T] -> [B, T, V]
//   ASSIGN_OR_RETURN(core::Tensor loss, F::CrossEntropy(logits, targets));
//   RETURN_IF_ERROR(core::Backward(loss));                            // fills every grad
//
// Graph modules (NOTE [Graph modules] in core/module.h) written as forwards only; Forward and
// Backward work as well.
//
// Children, named as LlamaForCausalLM's modules without the "model." prefix:
// "embed_tokens" Embedding(V, C), "layers" Sequential of LlamaDecoderLayers, "norm"
// RmsNorm(C), "lm_head" Linear(C, V) without bias, or Linear::Tied(embed_tokens' weight)
// when tie_word_embeddings. Each LlamaDecoderLayer has "input_layernorm" RmsNorm,
// "self_attn" GroupedQueryAttention ("q_proj", "k_proj", "v_proj", "o_proj"),
// "post_attention_layernorm" RmsNorm and "mlp" SwiGluMlp ("gate_proj", "up_proj",
// "down_proj"), so NamedParameters() reads "embed_tokens.weight",
// "layers.0.input_layernorm.weight", "layers.0.self_attn.q_proj.weight", ...,
// "norm.weight", "lm_head.weight" (absent when tied). The layers share one set of rotary
// tables (GroupedQueryAttention::set_rotary_tables).
//
// Initialisation (LlamaPreTrainedModel._init_weights): every Linear and Embedding weight
// N(0, initializer_range), every RmsNorm weight 1, as recipes (NOTE [Deferred
// initialisation] in core/param_init.h). embed_tokens, an untied lm_head and layer l draw
// from seeds DeriveSeed(config.seed, 0), DeriveSeed(config.seed, 1) and
// DeriveSeed(config.seed, 2 + l), each Linear from its own seed below those.
#ifndef NN_LLAMA_H_
#define NN_LLAMA_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/module.h"
#include "core/tensor.h"
#include "nn/embedding.h"
#include "nn/grouped_query_attention.h"
#include "nn/linear.h"
#include "nn/rms_norm.h"
#include "nn/sequential.h"
#include "nn/swiglu.h"

namespace nn {

// The fields of transformers' LlamaConfig this model reads, with its defaults where a
// small model keeps them (rms_norm_eps, rope_theta, tie_word_embeddings,
// initializer_range).
struct LlamaConfig {
  int64_t vocab_size = 64;
  int64_t hidden_size = 64;
  int64_t intermediate_size = 176;
  int64_t num_hidden_layers = 2;
  int64_t num_attention_heads = 4;
  int64_t num_key_value_heads = 2;
  int64_t max_position_embeddings = 32;  // longest sequence
  float rms_norm_eps = 1e-6f;
  double rope_theta = 10000.0;
  bool tie_word_embeddings = false;
  float initializer_range = 0.02f;
  uint64_t seed = 0;

  // OK, or InvalidArgument naming the first bad field ("LlamaConfig.num_key_value_heads
  // (3) must divide LlamaConfig.num_attention_heads (4)"): every size positive,
  // hidden_size divisible by num_attention_heads into an even head width,
  // num_attention_heads divisible by num_key_value_heads, rms_norm_eps and
  // initializer_range finite and >= 0, rope_theta finite and > 0.
  absl::Status Validate() const;
};

// x + self_attn(input_layernorm(x)) = h, then h + mlp(post_attention_layernorm(h)).
class LlamaDecoderLayer : public core::Module {
 public:
  // Children as listed in the file comment; self_attn seeded DeriveSeed(seed, 0), mlp
  // DeriveSeed(seed, 1). An invalid `config` is reported by the children on Forward.
  LlamaDecoderLayer(const LlamaConfig& config, uint64_t seed);

  std::string TypeName() const override { return "LlamaDecoderLayer"; }

  const std::shared_ptr<RmsNorm>& input_layernorm() const { return input_layernorm_; }
  const std::shared_ptr<GroupedQueryAttention>& self_attn() const { return self_attn_; }
  const std::shared_ptr<RmsNorm>& post_attention_layernorm() const {
    return post_attention_layernorm_;
  }
  const std::shared_ptr<SwiGluMlp>& mlp() const { return mlp_; }

 protected:
  // {x}: fp32 [B, T, hidden_size] -> {y} [B, T, hidden_size] (NOTE [Block forwards] in
  // nn/transformer.h).
  absl::StatusOr<core::Tensors> ForwardGraph(const core::Tensors& in) override;

 private:
  std::shared_ptr<RmsNorm> input_layernorm_;
  std::shared_ptr<GroupedQueryAttention> self_attn_;
  std::shared_ptr<RmsNorm> post_attention_layernorm_;
  std::shared_ptr<SwiGluMlp> mlp_;
};

class Llama : public core::Module {
 public:
  // A freshly initialised model (deferred under a core::DeferredInitScope). The config's
  // InvalidArgument (LlamaConfig::Validate); the code of a parameter allocation that
  // failed, naming the module and parameter (Module::ConstructionStatus). Never aborts on
  // sizes.
  static absl::StatusOr<std::shared_ptr<Llama>> Create(const LlamaConfig& config);

  std::string TypeName() const override { return "Llama"; }

  const LlamaConfig& config() const { return config_; }
  const std::shared_ptr<Embedding>& embed_tokens() const { return embed_tokens_; }
  // The LlamaDecoderLayers, as children "0" .. "num_hidden_layers - 1".
  const std::shared_ptr<Sequential>& layers() const { return layers_; }
  const std::shared_ptr<RmsNorm>& norm() const { return norm_; }
  // Shares its weight Parameter with embed_tokens() when config().tie_word_embeddings.
  const std::shared_ptr<Linear>& lm_head() const { return lm_head_; }
  // The dtype the head's backward takes the logits' gradient in, as Gpt::logits_grad_dtype.
  core::DType logits_grad_dtype() const { return logits_grad_dtype_; }

 protected:
  // {tokens}: int32 [B, T] (on the CPU or the parameters' device) with T <=
  // max_position_embeddings and ids in [0, vocab_size) (otherwise InvalidArgument naming
  // this module, or "embed_tokens" for a bad id) -> {logits} [B, T, V] on the parameters'
  // device, fp32, or bf16 under bf16 weights (NOTE [bf16 logits] in nn/gpt.h). Position t
  // of each sequence is t. A tied weight receives lm_head's and embed_tokens' gradients.
  absl::StatusOr<core::Tensors> ForwardGraph(const core::Tensors& in) override;

 private:
  explicit Llama(const LlamaConfig& config);
  void InitializeWeights();

  LlamaConfig config_;
  std::shared_ptr<Embedding> embed_tokens_;
  std::shared_ptr<Sequential> layers_;
  std::shared_ptr<RmsNorm> norm_;
  std::shared_ptr<Linear> lm_head_;
  core::DType logits_grad_dtype_ = core::DType::kFloat32;  // of the last forward
};

}  // namespace nn

#endif  // NN_LLAMA_H_
