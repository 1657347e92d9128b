// What a training checkpoint records of the model it was saved from, and how a model
// is compared with it: every module (path, TypeName(), the configuration the library
// can read from known module types), every parameter's name and full shape, and the
// caller's own configuration map, with a fingerprint of all of it.
//
//   integration::ModelStructure saved = record.model();
//   integration::ModelStructure now =
//       integration::DescribeModel(*model, {{"wte.weight", {64, 16}}, ...}, {{"n_head", "4"}});
//   std::vector<std::string> diffs = integration::StructureDifferences(saved, now, true);
//   // {"model_config n_head: checkpoint 4, model 2", ...}
#ifndef INTEGRATION_CHECKPOINTING_MODEL_STRUCTURE_H_
#define INTEGRATION_CHECKPOINTING_MODEL_STRUCTURE_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/module.h"
#include "core/tensor.h"
#include "integration/checkpointing/training_checkpoint.pb.h"

namespace integration {

// Checkpoint tensor name prefix of the model parameters ("model/wte.weight").
inline constexpr char kModelTensorPrefix[] = "model/";

// The configuration the library can read from `module` when it is one of the nn/ types
// (nn::Gpt: vocab_size, block_size, n_embd, n_layer, n_head; nn::CausalSelfAttention:
// n_embd, n_head; nn::LayerNorm: dim, eps; nn::Linear: in_features, out_features;
// nn::Embedding: num_embeddings, embedding_dim), sorted by key; empty for other types.
std::vector<ConfigEntry> KnownModuleConfig(const core::Module& module);

// `model`'s structure: its NamedModules() with KnownModuleConfig, `parameters` (name and
// full shape, in NamedParameters() order; a sharded model's own data has only its
// shard) and `config`, with the fingerprint filled in.
ModelStructure DescribeModel(core::Module& model,
                             const std::vector<std::pair<std::string, core::Shape>>& parameters,
                             const std::map<std::string, std::string>& config);

// 16 hex digits hashing every field of `structure` but the fingerprint itself.
std::string StructureFingerprint(const ModelStructure& structure);

// Every difference between a checkpoint's structure `saved` and a model's `current`,
// one message each, in this order: the caller's configuration (only when
// `compare_config`; keys on either side), then parameters (the checkpoint's in its
// order: "checkpoint has tensor model/X that the model lacks", or a shape that differs;
// then "model has parameter 'X' that the checkpoint lacks ..."), then modules (missing
// on either side, another type, a configuration value that differs: "module <root>
// (Gpt): n_head: checkpoint 4, model 2"). Empty when they agree.
std::vector<std::string> StructureDifferences(const ModelStructure& saved,
                                              const ModelStructure& current, bool compare_config);

}  // namespace integration

#endif  // INTEGRATION_CHECKPOINTING_MODEL_STRUCTURE_H_
