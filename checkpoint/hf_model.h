// Hugging Face checkpoints of either family this library computes, picked by config.json's
// model_type: "gpt2" (nn::Gpt, checkpoint/hf_gpt2.h) or "llama" (nn::Llama,
// checkpoint/hf_llama.h). What a program that starts from, or exports to, any such
// directory needs beside the family's config reader.
//
//   ASSIGN_OR_RETURN(checkpoint::HfModelType type, checkpoint::ReadHfModelType(dir));
//   ... build the model from ReadHfGpt2Config(dir) or ReadHfLlamaConfig(dir), wrap it ...
//   RETURN_IF_ERROR(checkpoint::LoadHfModel(dir, *model, &registry));   // into the shards
//   ... train, release ...
//   RETURN_IF_ERROR(checkpoint::ExportHfModel(*model, "/out/tuned"));
#ifndef CHECKPOINT_HF_MODEL_H_
#define CHECKPOINT_HF_MODEL_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/module.h"
#include "fsdp/registry.h"

namespace checkpoint {

enum class HfModelType { kGpt2, kLlama };

// "gpt2" or "llama", as config.json spells it.
const char* HfModelTypeName(HfModelType type);

// config.json's model_type in `dir`. NotFound naming the file when it is missing;
// InvalidArgument naming the file when it is not a JSON object, and naming the file and
// model_type when that is absent or another family ("<dir>/config.json: model_type
// \"bert\": ...").
absl::StatusOr<HfModelType> ReadHfModelType(const std::string& dir);

// LoadHfGpt2 or LoadHfLlama (with `registry`: into the shards of a wrapped model; null:
// into a plain one), whichever `model` is. InvalidArgument when `model` is neither an
// nn::Gpt nor an nn::Llama, or when `dir`'s model_type is the other family; the loader's
// errors otherwise. With a registry, a collective over the model's group.
absl::Status LoadHfModel(const std::string& dir, core::Module& model,
                         fsdp::WrapperRegistry* registry);

// ExportHfGpt2 or ExportHfLlama, whichever `model` is (a plain, released model).
// InvalidArgument when it is neither; the exporter's errors otherwise.
absl::Status ExportHfModel(const core::Module& model, const std::string& dir);

}  // namespace checkpoint

#endif  // CHECKPOINT_HF_MODEL_H_
