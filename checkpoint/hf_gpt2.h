// Hugging Face GPT-2 interop: a `transformers` GPT2LMHeadModel directory (config.json and
// model.safetensors, or model.safetensors.index.json with its shards) into an nn::Gpt,
// and an nn::Gpt out in that layout, so `transformers` loads it with from_pretrained.
//
//   ASSIGN_OR_RETURN(nn::GptConfig config, checkpoint::ReadHfGpt2Config("/models/gpt2"));
//   ASSIGN_OR_RETURN(std::shared_ptr<nn::Gpt> gpt, nn::Gpt::Create(config));
//   RETURN_IF_ERROR(checkpoint::LoadHfGpt2("/models/gpt2", *gpt));
//   ... train ...
//   RETURN_IF_ERROR(checkpoint::ExportHfGpt2(*gpt, "/out/gpt2-tuned"));
//
// NOTE [GPT-2 layout]: transformers' GPT-2 is our Gpt (nn/gpt.h: pre-LN blocks, GELU in its
// tanh form, LayerNorm eps 1e-5, learned positions, lm_head tied to wte) with other names
// and one other layout: its attention and MLP projections are Conv1D modules whose weight is
// [in, out], the transpose of our Linear's [out, in]; the fused c_attn splits its output
// into q, k, v as our qkv does. Names, ours <- theirs (an optional "transformer." prefix
// on theirs):
//   wte.weight <- wte.weight           wpe.weight <- wpe.weight
//   blocks.i.ln_1.{weight,bias} <- h.i.ln_1.*      blocks.i.ln_2.* <- h.i.ln_2.*
//   blocks.i.attn.qkv.weight <- h.i.attn.c_attn.weight^T   (.bias as is)
//   blocks.i.attn.proj.weight <- h.i.attn.c_proj.weight^T
//   blocks.i.mlp.fc.weight <- h.i.mlp.c_fc.weight^T
//   blocks.i.mlp.proj.weight <- h.i.mlp.c_proj.weight^T
//   ln_f.* <- ln_f.*                   (lm_head.weight, when present, must equal wte.weight)
// The attention's causal-mask buffers of older checkpoints (h.i.attn.bias,
// h.i.attn.masked_bias) are not parameters and are skipped.
#ifndef CHECKPOINT_HF_GPT2_H_
#define CHECKPOINT_HF_GPT2_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fsdp/registry.h"
#include "nn/gpt.h"

namespace checkpoint {

// Our GptConfig from `dir`/config.json. InvalidArgument naming the file and the field
// for a model this library does not compute the same way (model_type other than gpt2, an
// activation other than gelu_new / gelu_pytorch_tanh, layer_norm_epsilon other than 1e-5,
// n_inner other than null or 4 n_embd, untied embeddings, scaled or reordered attention
// options); NotFound when the file is missing.
absl::StatusOr<nn::GptConfig> ReadHfGpt2Config(const std::string& dir);

// Loads the weights of `dir` (model.safetensors, or the shards model.safetensors.index.json
// lists) into `model`, a plain Gpt of the matching config (full parameters; fp32 or bf16,
// converted). Everything is checked before any parameter changes: NotFound naming the
// tensor and file for one `model` needs and the files lack, InvalidArgument naming it for a
// tensor of the wrong shape or one no parameter takes (an extra tensor), or an lm_head that
// differs from wte.
absl::Status LoadHfGpt2(const std::string& dir, nn::Gpt& model);

// The same into `model` wrapped through `registry` (a plain model: as above): each rank
// reads the files one tensor at a time and keeps only its part of each (its shards; the
// whole of a parameter no unit manages), never the full model, then loads them
// (fsdp::LoadShardedStateDict). A deferred model (NOTE [Deferred initialisation]) wrapped
// first thus goes from a checkpoint to its shards without being whole anywhere. Errors as
// above, agreed by every rank (each returns "rank <r>: ..." of the first) before anything
// is written; a collective over the model's group.
absl::Status LoadHfGpt2(const std::string& dir, nn::Gpt& model, fsdp::WrapperRegistry* registry);

// Writes `dir`/config.json (GPT2Config fields, model_type gpt2, architectures
// GPT2LMHeadModel) and `dir`/model.safetensors (transformers' names with the "transformer."
// prefix, Conv1D weights [in, out], float32, lm_head tied and not written), creating `dir`.
// FailedPrecondition naming the parameter when `model` is sharded (Release it first).
absl::Status ExportHfGpt2(const nn::Gpt& model, const std::string& dir);

}  // namespace checkpoint

#endif  // CHECKPOINT_HF_GPT2_H_
