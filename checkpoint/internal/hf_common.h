// What the Hugging Face interop files (checkpoint/hf_gpt2.h, checkpoint/hf_llama.h) share:
// config.json reading, a checkpoint's safetensors files (model.safetensors, or the shards
// model.safetensors.index.json lists) opened and indexed by tensor name, the mapping of a
// model's parameters onto those tensors with every check, the load into a plain model or
// straight into the FSDP shards of a wrapped one, and the export writer. An architecture
// is described once, as an HfArchitecture:
//
//   internal::HfArchitecture arch;       // names, prefix "model.", buffers, tied head
//   arch.family = "Llama";
//   ...
//   RETURN_IF_ERROR(internal::LoadHf(dir, model, registry, arch, "LoadHfLlama(dir)"));
//   ASSIGN_OR_RETURN(NamedTensors tensors, internal::HfTensors(model, shapes, arch, where));
//   RETURN_IF_ERROR(internal::WriteHfCheckpoint(dir, config_json, tensors, where));
//
// NOTE [Hugging Face loading]: every check comes before any parameter changes. A plain
// model: all tensors are read and converted (fp32 or bf16 sources, as SafetensorsReader
// reads them, to float32), then copied in. A wrapped model (fsdp::WrapperRegistry with
// units for it): each rank reads the files one tensor at a time and keeps only its part of
// each (fsdp::ShardedStateDict's parts: its shards, or the whole of a parameter no unit
// manages), so no rank ever holds the full model; the ranks agree on every rank's outcome
// (NOTE [Agree before acting]), then fsdp::LoadShardedStateDict writes the parts.
#ifndef CHECKPOINT_INTERNAL_HF_COMMON_H_
#define CHECKPOINT_INTERNAL_HF_COMMON_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/safetensors.h"
#include "core/module.h"
#include "core/tensor.h"
#include "fsdp/registry.h"
#include "nlohmann/json.hpp"

namespace checkpoint {
namespace internal {

using Json = nlohmann::ordered_json;

// The JSON object in `path` (`what` names it in a NotFound). InvalidArgument naming the
// file when it is not a JSON object.
absl::StatusOr<Json> ReadJson(const std::string& path, absl::string_view what);

// InvalidArgument "<path>: <field> <why>", the config readers' error.
absl::Status ConfigError(const std::string& path, absl::string_view field, absl::string_view why);

// Each (field, target, fallback): *target = json[field], or `fallback` (the transformers
// config class's default) when the field is absent. ConfigError naming the first field
// that is there but not a positive integer.
absl::Status ReadPositiveInts(
    const Json& json, const std::string& path,
    const std::vector<std::tuple<const char*, int64_t*, int64_t>>& fields);

// json[field] when it is there (ConfigError naming the field when it is not a string,
// a number, a boolean), else `fallback`.
absl::StatusOr<std::string> ReadString(const Json& json, const std::string& path, const char* field,
                                       const std::string& fallback);
absl::StatusOr<double> ReadNumber(const Json& json, const std::string& path, const char* field,
                                  double fallback);
absl::StatusOr<bool> ReadBool(const Json& json, const std::string& path, const char* field,
                              bool fallback);

// Transformers' name of one of our parameters (without the architecture's prefix) and
// whether it is stored as the transpose of ours ([in, out] against [out, in]).
struct HfName {
  std::string name;  // empty: the parameter has no counterpart
  bool transpose = false;
};

// How one transformers architecture stores a model of ours.
struct HfArchitecture {
  // In messages: "parameter 'x' has no <family> counterpart", "belongs to no parameter of
  // <model>".
  std::string family;
  std::string model;
  // The base model's prefix of stored names ("transformer.", "model."): optional on load
  // (stripped where present), added on export to every name but those in `unprefixed`.
  std::string prefix;
  std::vector<std::string> unprefixed;
  // Our parameter name -> transformers' name without the prefix.
  std::function<HfName(const std::string& ours)> to_hf;
  // Names (without the prefix) of stored tensors that are buffers, not parameters, and
  // are skipped on load (causal masks, rotary frequencies of older checkpoints). May be
  // null: none.
  std::function<bool(const std::string& name)> is_buffer;
  // When the model ties its output projection to the embedding: the head's and the
  // embedding's names. A stored head no parameter takes must then equal the embedding.
  // Empty: untied.
  std::string tied_head;
  std::string tied_embedding;
};

// Loads the checkpoint in `dir` into `module` per NOTE [Hugging Face loading]: plainly
// when `registry` is null or has no unit for `module`, into its shards otherwise (then a
// collective over the module's group; each rank returns the same outcome, "rank <r>: ..."
// of the first error). `where` starts every message. Errors: FailedPrecondition naming the
// parameter when a plain module has a parameter without values (deferred); NotFound
// naming the tensor and the parameter for one `module` needs and no file has;
// InvalidArgument naming it for a tensor of the wrong shape, one no parameter takes, a
// tied head that differs from the embedding, a tensor in two files or a malformed index;
// the readers' errors naming the file (an unsupported dtype is Unimplemented).
absl::Status LoadHf(const std::string& dir, core::Module& module, fsdp::WrapperRegistry* registry,
                    const HfArchitecture& arch, const std::string& where);

// `module`'s parameters (tied ones once) under their stored names (prefix included), as
// transformers' layout wants them: on the CPU, float32, transposed where HfName says, in
// NamedParameters() order. FailedPrecondition naming the parameter when its data is not
// the shape `full_shapes` gives it (sharded or deferred); InvalidArgument naming a
// parameter without counterpart.
absl::StatusOr<NamedTensors> HfTensors(const core::Module& module,
                                       const std::map<std::string, core::Shape>& full_shapes,
                                       const HfArchitecture& arch, const std::string& where);

// Creates `dir` and writes `dir`/config.json (`config`, indented) and
// `dir`/model.safetensors (`tensors` in the order given, metadata format "pt"), each
// atomically. PermissionDenied naming `where` when the directory cannot be made; the
// writers' errors.
absl::Status WriteHfCheckpoint(const std::string& dir, const Json& config,
                               const NamedTensors& tensors, const std::string& where);

}  // namespace internal
}  // namespace checkpoint

#endif  // CHECKPOINT_INTERNAL_HF_COMMON_H_
