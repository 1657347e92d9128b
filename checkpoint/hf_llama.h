// Hugging Face Llama interop: a `transformers` LlamaForCausalLM directory (config.json and
// model.safetensors, or model.safetensors.index.json with its shards) into an nn::Llama,
// and an nn::Llama out in that layout, so `transformers` loads it with from_pretrained.
//
//   ASSIGN_OR_RETURN(nn::LlamaConfig config, checkpoint::ReadHfLlamaConfig("/models/llama"));
//   ASSIGN_OR_RETURN(std::shared_ptr<nn::Llama> llama, nn::Llama::Create(config));
//   RETURN_IF_ERROR(checkpoint::LoadHfLlama("/models/llama", *llama));
//   ... train ...
//   RETURN_IF_ERROR(checkpoint::ExportHfLlama(*llama, "/out/llama-tuned"));
//
// NOTE [Llama layout]: transformers' LlamaForCausalLM is our Llama (nn/llama.h) with the
// same module names under a "model." prefix, lm_head excepted, and the same layouts: every
// projection an nn.Linear weight [out, in] as ours, and the rotary embedding in the same
// rotate_half convention (pairs i and i + head_dim / 2 of each head: modeling_llama.py's
// rotate_half and apply_rotary_pos_emb), so q_proj and k_proj load unpermuted (checkpoints
// converted from Meta's interleaved layout were permuted by transformers' converter). Names,
// ours <- theirs:
//   embed_tokens.weight <- model.embed_tokens.weight    norm.weight <- model.norm.weight
//   layers.i.<rest> <- model.layers.i.<rest>            lm_head.weight <- lm_head.weight
// The "model." prefix is optional on load (a bare LlamaModel's names). Tied
// (tie_word_embeddings): we have no lm_head.weight and transformers saves none; one that is
// stored must equal embed_tokens.weight. The rotary inverse frequencies older checkpoints
// stored (*.rotary_emb.inv_freq) are buffers, skipped.
#ifndef CHECKPOINT_HF_LLAMA_H_
#define CHECKPOINT_HF_LLAMA_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fsdp/registry.h"
#include "nn/llama.h"

namespace checkpoint {

// Our LlamaConfig from `dir`/config.json: vocab_size, hidden_size, intermediate_size,
// num_hidden_layers, num_attention_heads, num_key_value_heads (null or absent: as
// num_attention_heads), max_position_embeddings, rms_norm_eps, rope_theta (or
// rope_parameters.rope_theta, as transformers >= 5 writes it), tie_word_embeddings and
// initializer_range, LlamaConfig's defaults for absent fields. InvalidArgument naming the
// file and the field for a model this library does not compute the same way: model_type
// other than llama, hidden_act other than silu (or its alias swish), attention_bias or
// mlp_bias true, a non-null rope_scaling, rope_parameters of a type other than "default"
// or with scaling fields, partial_rotary_factor other than 1, head_dim other than
// hidden_size / num_attention_heads; for a field of the wrong JSON type, and for sizes
// LlamaConfig::Validate refuses (its message). NotFound when the file is missing.
absl::StatusOr<nn::LlamaConfig> ReadHfLlamaConfig(const std::string& dir);

// Loads the weights of `dir` (model.safetensors, or the shards model.safetensors.index.json
// lists) into `model`, a plain Llama of the matching config (full parameters; fp32, bf16 or
// fp16 sources, converted; other dtypes are Unimplemented, naming the file). Everything
// is checked before any parameter changes: NotFound naming the tensor and file for one
// `model` needs and the files lack (lm_head.weight of an untied model included),
// InvalidArgument naming it for a tensor of the wrong shape or one no parameter takes (an
// extra tensor), or a stored lm_head that differs from embed_tokens in a tied model.
absl::Status LoadHfLlama(const std::string& dir, nn::Llama& model);

// The same into `model` wrapped through `registry` (a plain model: as above): each rank
// reads the files one tensor at a time and keeps only its part of each (its shards; the
// whole of a parameter no unit manages), never the full model, then loads them
// (fsdp::LoadShardedStateDict). A deferred model (NOTE [Deferred initialisation]) wrapped
// first thus goes from a checkpoint to its shards without being whole anywhere. Errors as
// above, agreed by every rank (each returns "rank <r>: ..." of the first) before anything
// is written; a collective over the model's group. InvalidArgument for a null registry.
absl::Status LoadHfLlama(const std::string& dir, nn::Llama& model, fsdp::WrapperRegistry* registry);

// Writes `dir`/config.json (LlamaConfig fields, model_type llama, architectures
// LlamaForCausalLM, rope_theta both at the top level and in rope_parameters, so that
// transformers 4 and 5 read it) and `dir`/model.safetensors (transformers' names, sorted
// as safetensors' save_file sorts them; float32; no lm_head.weight when tied), creating
// `dir`. FailedPrecondition naming the parameter when `model` is sharded (Release it
// first).
absl::Status ExportHfLlama(const nn::Llama& model, const std::string& dir);

}  // namespace checkpoint

#endif  // CHECKPOINT_HF_LLAMA_H_
