#include "checkpoint/hf_gpt2.h"

#include <filesystem>
#include <map>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "checkpoint/safetensors.h"
#include "comm/agreement.h"
#include "fsdp/state_dict.h"
#include "core/param_init.h"
#include "core/status_macros.h"
#include "core/text_file.h"
#include "nlohmann/json.hpp"

namespace checkpoint {
namespace {

using Json = nlohmann::ordered_json;

// Transformers' name of one of our parameters, and whether its layout is the transpose
// of ours (Conv1D), per NOTE [GPT-2 layout]. Empty when the name is not a Gpt's.
struct HfName {
  std::string name;
  bool transpose = false;
};

HfName ToHf(const std::string& ours) {
  static const std::map<std::string, HfName>* const kBlock = new std::map<std::string, HfName>{
      {"ln_1.weight", {"ln_1.weight", false}},
      {"ln_1.bias", {"ln_1.bias", false}},
      {"ln_2.weight", {"ln_2.weight", false}},
      {"ln_2.bias", {"ln_2.bias", false}},
      {"attn.qkv.weight", {"attn.c_attn.weight", true}},
      {"attn.qkv.bias", {"attn.c_attn.bias", false}},
      {"attn.proj.weight", {"attn.c_proj.weight", true}},
      {"attn.proj.bias", {"attn.c_proj.bias", false}},
      {"mlp.fc.weight", {"mlp.c_fc.weight", true}},
      {"mlp.fc.bias", {"mlp.c_fc.bias", false}},
      {"mlp.proj.weight", {"mlp.c_proj.weight", true}},
      {"mlp.proj.bias", {"mlp.c_proj.bias", false}},
  };
  if (ours == "wte.weight" || ours == "wpe.weight" || ours == "ln_f.weight" ||
      ours == "ln_f.bias") {
    return {ours, false};
  }
  absl::string_view rest = ours;
  if (!absl::ConsumePrefix(&rest, "blocks.")) return {};
  const size_t dot = rest.find('.');
  int64_t index = 0;
  if (dot == absl::string_view::npos || !absl::SimpleAtoi(rest.substr(0, dot), &index)) return {};
  auto it = kBlock->find(std::string(rest.substr(dot + 1)));
  if (it == kBlock->end()) return {};
  return {absl::StrCat("h.", index, ".", it->second.name), it->second.transpose};
}

// [rows, cols] -> [cols, rows], float32 on the CPU.
absl::StatusOr<core::Tensor> Transposed(const core::Tensor& t) {
  core::Tensor in = t;
  if (t.dtype() != core::DType::kFloat32 || !t.device().is_cpu()) {
    ASSIGN_OR_RETURN(core::Tensor host, t.To(core::Device::Cpu(), core::MemoryTag::kOther));
    ASSIGN_OR_RETURN(in, host.ToDType(core::DType::kFloat32, core::MemoryTag::kOther));
  }
  const int64_t rows = in.size(0), cols = in.size(1);
  ASSIGN_OR_RETURN(core::Tensor out, core::Tensor::Allocate({cols, rows}, core::DType::kFloat32,
                                                            core::MemoryTag::kOther));
  const float* src = in.data<float>();
  float* dst = out.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
  }
  return out;
}

absl::StatusOr<Json> ReadJson(const std::string& path, absl::string_view what) {
  ASSIGN_OR_RETURN(std::string text, core::ReadTextFile(path, what));
  Json json = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  return json;
}

// The checkpoint's files, opened (layouts validated, nothing read), and where each
// tensor is, by name without the "transformer." prefix.
struct Weights {
  std::vector<SafetensorsReader> files;
  struct Place {
    size_t file = 0;
    std::string name;  // as stored
  };
  std::map<std::string, Place> where;

  std::string FileOf(const Place& p) const { return paths[p.file]; }
  std::vector<std::string> paths;
};

absl::StatusOr<Weights> OpenWeights(const std::string& dir) {
  std::vector<std::string> files;
  const std::string index = dir + "/model.safetensors.index.json";
  if (std::filesystem::exists(index)) {
    ASSIGN_OR_RETURN(Json json, ReadJson(index, "safetensors index"));
    if (!json.contains("weight_map") || !json["weight_map"].is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(index, ": no \"weight_map\" object"));
    }
    std::set<std::string> seen;
    for (const auto& [name, file] : json["weight_map"].items()) {
      if (!file.is_string() || file.get<std::string>().empty() ||
          file.get<std::string>().find('/') != std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat(index, ": weight_map[\"", name, "\"] is ", file.dump(),
                         ", not the name of a file in the checkpoint's directory"));
      }
      if (seen.insert(file.get<std::string>()).second) files.push_back(file.get<std::string>());
    }
  } else {
    files.push_back("model.safetensors");
  }
  Weights out;
  for (const std::string& f : files) {
    const std::string path = dir + "/" + f;
    ASSIGN_OR_RETURN(SafetensorsReader reader, SafetensorsReader::Open(path));
    for (const std::string& name : reader.Names()) {
      absl::string_view short_name = name;
      absl::ConsumePrefix(&short_name, "transformer.");
      auto [it, inserted] =
          out.where.emplace(std::string(short_name), Weights::Place{out.files.size(), name});
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' of ", path,
                                                       " is also in ", out.FileOf(it->second)));
      }
    }
    out.files.push_back(std::move(reader));
    out.paths.push_back(path);
  }
  return out;
}

// Where one of our parameters comes from (MapWeights gives them in the order asked).
struct Mapping {
  HfName hf;
  Weights::Place place;
};

// Maps every parameter of `full_shapes` (ours, by name) to its tensor in `weights`,
// checking shapes, and that every other tensor is one this GPT may skip; reads nothing
// but lm_head and wte (to check they are tied).
absl::StatusOr<std::vector<Mapping>> MapWeights(
    const Weights& weights, const std::vector<std::pair<std::string, core::Shape>>& full_shapes,
    const std::string& where) {
  std::vector<Mapping> out;
  std::set<std::string> used;
  for (const auto& [name, shape] : full_shapes) {
    const HfName hf = ToHf(name);
    if (hf.name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": parameter '", name, "' has no GPT-2 counterpart"));
    }
    auto it = weights.where.find(hf.name);
    if (it == weights.where.end()) {
      return absl::NotFoundError(absl::StrCat(where, ": tensor '", hf.name, "' (for '", name,
                                              "') is in none of the checkpoint's files"));
    }
    ASSIGN_OR_RETURN(core::Shape stored, weights.files[it->second.file].ShapeOf(it->second.name));
    core::Shape want = shape;
    if (hf.transpose && want.size() == 2) std::swap(want[0], want[1]);
    if (stored != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": tensor '", hf.name, "' in ", weights.FileOf(it->second), " is ",
          core::ShapeToString(stored), "; '", name, "' needs ", core::ShapeToString(want),
          hf.transpose ? " (Conv1D layout [in, out])" : ""));
    }
    out.push_back({hf, it->second});
    used.insert(hf.name);
  }
  for (const auto& [name, place] : weights.where) {
    if (used.count(name)) continue;
    if (absl::EndsWith(name, ".attn.bias") || absl::EndsWith(name, ".attn.masked_bias")) {
      continue;  // the causal-mask buffers of older checkpoints
    }
    if (name == "lm_head.weight" && weights.where.count("wte.weight")) {
      // Tied: it must be the embedding.
      const Weights::Place& wte = weights.where.at("wte.weight");
      ASSIGN_OR_RETURN(core::Tensor head, weights.files[place.file].Read(place.name));
      ASSIGN_OR_RETURN(core::Tensor emb, weights.files[wte.file].Read(wte.name));
      if (head.shape() == emb.shape() && head.ToVector() == emb.ToVector()) continue;
      return absl::InvalidArgumentError(absl::StrCat(where, ": lm_head.weight in ",
                                                     weights.FileOf(place),
                                                     " differs from wte.weight; this GPT ties them"));
    }
    return absl::InvalidArgumentError(absl::StrCat(where, ": tensor '", name, "' in ",
                                                   weights.FileOf(place),
                                                   " belongs to no parameter of this GPT"));
  }
  return out;
}

// The tensor `m` maps to, in our layout, float32.
absl::StatusOr<core::Tensor> ReadOurs(const Weights& weights, const Mapping& m) {
  ASSIGN_OR_RETURN(core::Tensor t, weights.files[m.place.file].Read(m.place.name));
  if (m.hf.transpose) return Transposed(t);
  if (t.dtype() == core::DType::kFloat32) return t;
  return t.ToDType(core::DType::kFloat32, core::MemoryTag::kOther);
}

}  // namespace

absl::StatusOr<nn::GptConfig> ReadHfGpt2Config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  ASSIGN_OR_RETURN(Json json, ReadJson(path, "transformers config"));
  auto bad = [&](const std::string& field, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", field, " ", why));
  };
  if (json.contains("model_type") && json["model_type"] != "gpt2") {
    return bad("model_type", absl::StrCat(json["model_type"].dump(), ": only gpt2 is read here"));
  }
  nn::GptConfig config;
  for (auto& [field, target, fallback] :
       std::vector<std::tuple<const char*, int64_t*, int64_t>>{
           {"vocab_size", &config.vocab_size, 50257},
           {"n_positions", &config.block_size, 1024},
           {"n_embd", &config.n_embd, 768},
           {"n_layer", &config.n_layer, 12},
           {"n_head", &config.n_head, 12}}) {
    if (!json.contains(field)) {
      *target = fallback;  // GPT2Config's default
    } else if (!json[field].is_number_integer() || json[field].get<int64_t>() <= 0) {
      return bad(field, absl::StrCat("is ", json[field].dump(), "; a positive integer"));
    } else {
      *target = json[field].get<int64_t>();
    }
  }
  const std::string activation = json.value("activation_function", std::string("gelu_new"));
  if (activation != "gelu_new" && activation != "gelu_pytorch_tanh") {
    return bad("activation_function",
               absl::StrCat("is \"", activation, "\"; this GPT computes GELU's tanh form "
                            "(gelu_new, gelu_pytorch_tanh)"));
  }
  if (json.contains("layer_norm_epsilon") &&
      (!json["layer_norm_epsilon"].is_number() || json["layer_norm_epsilon"].get<double>() != 1e-5)) {
    return bad("layer_norm_epsilon",
               absl::StrCat("is ", json["layer_norm_epsilon"].dump(), "; this GPT uses 1e-5"));
  }
  if (json.contains("n_inner") && !json["n_inner"].is_null() &&
      json["n_inner"] != 4 * config.n_embd) {
    return bad("n_inner", absl::StrCat("is ", json["n_inner"].dump(),
                                       "; this GPT's MLP is 4 n_embd wide (null)"));
  }
  for (const auto& [field, want] : std::vector<std::pair<const char*, bool>>{
           {"tie_word_embeddings", true},
           {"scale_attn_weights", true},
           {"scale_attn_by_inverse_layer_idx", false},
           {"reorder_and_upcast_attn", false}}) {
    if (json.contains(field) && json[field] != want) {
      return bad(field, absl::StrCat("is ", json[field].dump(), "; this GPT computes it as ",
                                     want ? "true" : "false"));
    }
  }
  return config;
}

absl::Status LoadHfGpt2(const std::string& dir, nn::Gpt& model) {
  const std::string where = absl::StrCat("LoadHfGpt2(", dir, ")");
  std::vector<std::pair<std::string, core::Shape>> shapes;
  std::vector<core::ParameterPtr> params;  // parallel to `shapes`, and so to the mappings
  for (const auto& [name, p] : model.NamedParameters()) {
    params.push_back(p);
    if (!p->data.defined()) {
      return absl::FailedPreconditionError(absl::StrCat(
          where, ": parameter '", name, "' ", p->data.ToString(),
          " has no values to load into (deferred: wrap it and load with the registry)"));
    }
    shapes.emplace_back(name, p->data.shape());
  }
  ASSIGN_OR_RETURN(Weights weights, OpenWeights(dir));
  ASSIGN_OR_RETURN(std::vector<Mapping> mappings, MapWeights(weights, shapes, where));
  // Every value read and converted before any parameter changes.
  std::vector<std::pair<core::ParameterPtr, core::Tensor>> staged;
  for (size_t i = 0; i < mappings.size(); ++i) {
    ASSIGN_OR_RETURN(core::Tensor value, ReadOurs(weights, mappings[i]));
    staged.emplace_back(params[i], std::move(value));
  }
  for (auto& [p, value] : staged) RETURN_IF_ERROR(p->data.CopyFrom(value));
  return absl::OkStatus();
}

absl::Status LoadHfGpt2(const std::string& dir, nn::Gpt& model, fsdp::WrapperRegistry* registry) {
  const std::string where = absl::StrCat("LoadHfGpt2(", dir, ")");
  if (registry == nullptr) return absl::InvalidArgumentError(where + ": the registry is null");
  const std::vector<std::shared_ptr<fsdp::Unit>> units = registry->UnitsIn(model);
  if (units.empty()) return LoadHfGpt2(dir, model);
  // This rank's part of every parameter, filled from the files one tensor at a time.
  absl::StatusOr<std::vector<fsdp::ShardedTensor>> parts = fsdp::ShardedStateDict(model, registry);
  absl::Status local = parts.status();
  if (local.ok()) {
    local = [&]() -> absl::Status {
      std::vector<std::pair<std::string, core::Shape>> shapes;
      for (const fsdp::ShardedTensor& t : *parts) shapes.emplace_back(t.name, t.full_shape);
      ASSIGN_OR_RETURN(Weights weights, OpenWeights(dir));
      ASSIGN_OR_RETURN(std::vector<Mapping> mappings, MapWeights(weights, shapes, where));
      for (size_t i = 0; i < mappings.size(); ++i) {
        fsdp::ShardedTensor& part = (*parts)[i];
        if (part.end == part.begin) continue;
        ASSIGN_OR_RETURN(core::Tensor value, ReadOurs(weights, mappings[i]));
        ASSIGN_OR_RETURN(core::Tensor slice, value.Flat().View(part.begin, {part.end - part.begin}));
        RETURN_IF_ERROR(part.local.CopyFrom(slice));
      }
      return absl::OkStatus();
    }();
  }
  // Every rank's outcome before the collective load (NOTE [Agree before acting]).
  const std::shared_ptr<comm::ProcessGroup>& group = units.front()->groups().world;
  RETURN_IF_ERROR(comm::AgreeOnStatus(group.get(), local, where, units.front()->options().timeout));
  return fsdp::LoadShardedStateDict(model, registry, *parts);
}

absl::Status ExportHfGpt2(const nn::Gpt& model, const std::string& dir) {
  const std::string where = absl::StrCat("ExportHfGpt2(", dir, ")");
  const nn::GptConfig& c = model.config();
  // The full shapes, from a deferred Gpt of the same config (shapes only, no memory).
  std::map<std::string, core::Shape> full_shapes;
  {
    core::DeferredInitScope deferred;
    ASSIGN_OR_RETURN(std::shared_ptr<nn::Gpt> shapes, nn::Gpt::Create(c));
    full_shapes = ParameterShapes(*shapes);
  }
  NamedTensors tensors;
  for (const auto& [name, p] : model.NamedParameters()) {
    const HfName hf = ToHf(name);
    if (hf.name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": parameter '", name, "' has no GPT-2 counterpart"));
    }
    const core::Shape& full = full_shapes[name];
    if (!p->data.defined() || p->data.shape() != full) {
      return absl::FailedPreconditionError(absl::StrCat(
          where, ": parameter '", name, "' is ", p->data.ToString(), ", not its full shape ",
          core::ShapeToString(full), " (sharded or deferred: Release the model first)"));
    }
    ASSIGN_OR_RETURN(core::Tensor host, p->data.To(core::Device::Cpu(), core::MemoryTag::kOther));
    absl::StatusOr<core::Tensor> value =
        hf.transpose ? Transposed(host) : host.ToDType(core::DType::kFloat32, core::MemoryTag::kOther);
    RETURN_IF_ERROR(value.status());
    tensors.emplace_back(absl::StrCat("transformer.", hf.name), *std::move(value));
  }
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::PermissionDeniedError(
        absl::StrCat(where, ": cannot create the directory: ", error.message()));
  }
  Json config;
  config["architectures"] = {"GPT2LMHeadModel"};
  config["model_type"] = "gpt2";
  config["vocab_size"] = c.vocab_size;
  config["n_positions"] = c.block_size;
  config["n_embd"] = c.n_embd;
  config["n_layer"] = c.n_layer;
  config["n_head"] = c.n_head;
  config["n_inner"] = nullptr;
  config["activation_function"] = "gelu_new";
  config["layer_norm_epsilon"] = 1e-5;
  config["resid_pdrop"] = 0.0;
  config["embd_pdrop"] = 0.0;
  config["attn_pdrop"] = 0.0;
  config["initializer_range"] = 0.02;
  config["tie_word_embeddings"] = true;
  config["scale_attn_weights"] = true;
  config["bos_token_id"] = c.vocab_size - 1;
  config["eos_token_id"] = c.vocab_size - 1;
  RETURN_IF_ERROR(core::WriteFileAtomically(dir + "/config.json", config.dump(2) + "\n"));
  return ExportSafetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}});
}

}  // namespace checkpoint
