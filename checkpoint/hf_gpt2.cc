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

// The full shape of our parameter `name` in a Gpt of `c` (empty when unknown).
core::Shape FullShape(const std::string& name, const nn::GptConfig& c) {
  const int64_t C = c.n_embd;
  if (name == "wte.weight") return {c.vocab_size, C};
  if (name == "wpe.weight") return {c.block_size, C};
  if (absl::EndsWith(name, "qkv.weight")) return {3 * C, C};
  if (absl::EndsWith(name, "qkv.bias")) return {3 * C};
  if (absl::EndsWith(name, "attn.proj.weight")) return {C, C};
  if (absl::EndsWith(name, "fc.weight")) return {4 * C, C};
  if (absl::EndsWith(name, "fc.bias")) return {4 * C};
  if (absl::EndsWith(name, "mlp.proj.weight")) return {C, 4 * C};
  return {C};  // LayerNorm weights and biases, the projections' biases
}

// [rows, cols] -> [cols, rows], float32 on the CPU.
absl::StatusOr<core::Tensor> Transposed(const core::Tensor& t) {
  ASSIGN_OR_RETURN(core::Tensor in, t.ToDType(core::DType::kFloat32, core::MemoryTag::kOther));
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

// A tensor read from one of the checkpoint's files.
struct Stored {
  core::Tensor tensor;
  std::string file;
};

// Every tensor of the checkpoint in `dir`, by name without the "transformer." prefix.
absl::StatusOr<std::map<std::string, Stored>> ReadWeights(const std::string& dir) {
  std::vector<std::string> files;
  const std::string index = dir + "/model.safetensors.index.json";
  if (std::filesystem::exists(index)) {
    ASSIGN_OR_RETURN(Json json, ReadJson(index, "safetensors index"));
    if (!json.contains("weight_map") || !json["weight_map"].is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(index, ": no \"weight_map\" object"));
    }
    std::set<std::string> seen;
    for (const auto& [name, file] : json["weight_map"].items()) {
      if (!file.is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(index, ": weight_map[\"", name, "\"] is not a file name"));
      }
      const std::string f = file.get<std::string>();
      if (f.find('/') != std::string::npos || f.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(index, ": weight_map[\"", name, "\"] names '", f,
                         "', not a file in the checkpoint's directory"));
      }
      if (seen.insert(f).second) files.push_back(f);
    }
  } else {
    files.push_back("model.safetensors");
  }
  std::map<std::string, Stored> out;
  for (const std::string& f : files) {
    const std::string path = dir + "/" + f;
    ASSIGN_OR_RETURN(SafetensorsFile file, ImportSafetensors(path));
    for (auto& [name, tensor] : file.tensors) {
      absl::string_view short_name = name;
      absl::ConsumePrefix(&short_name, "transformer.");
      auto [it, inserted] = out.emplace(std::string(short_name), Stored{tensor, path});
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' of ", path,
                                                       " is also in ", it->second.file));
      }
    }
  }
  return out;
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
  using StoredMap = std::map<std::string, Stored>;
  ASSIGN_OR_RETURN(StoredMap stored, ReadWeights(dir));
  // Check everything and stage the values before touching a parameter.
  std::vector<std::pair<core::ParameterPtr, core::Tensor>> staged;
  std::set<std::string> used;
  for (const auto& [name, p] : model.NamedParameters()) {
    const HfName hf = ToHf(name);
    if (hf.name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": parameter '", name, "' has no GPT-2 counterpart"));
    }
    if (!p->data.defined()) {
      return absl::FailedPreconditionError(absl::StrCat(
          where, ": parameter '", name, "' ", p->data.ToString(),
          " has no values to load into (deferred: wrap it first, or build it plainly)"));
    }
    auto it = stored.find(hf.name);
    if (it == stored.end()) {
      return absl::NotFoundError(absl::StrCat(where, ": tensor '", hf.name, "' (for '", name,
                                              "') is in none of the checkpoint's files"));
    }
    const core::Tensor& t = it->second.tensor;
    core::Shape want = p->data.shape();
    if (hf.transpose && want.size() == 2) std::swap(want[0], want[1]);
    if (t.shape() != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": tensor '", hf.name, "' in ", it->second.file, " is ",
          core::ShapeToString(t.shape()), "; '", name, "' needs ", core::ShapeToString(want),
          hf.transpose ? " (Conv1D layout [in, out])" : ""));
    }
    absl::StatusOr<core::Tensor> value =
        hf.transpose ? Transposed(t) : t.ToDType(core::DType::kFloat32, core::MemoryTag::kOther);
    RETURN_IF_ERROR(value.status());
    staged.emplace_back(p, *std::move(value));
    used.insert(hf.name);
  }
  for (const auto& [name, s] : stored) {
    if (used.count(name)) continue;
    if (absl::EndsWith(name, ".attn.bias") || absl::EndsWith(name, ".attn.masked_bias")) {
      continue;  // the causal-mask buffers of older checkpoints
    }
    if (name == "lm_head.weight") {
      // Tied: it must be the embedding.
      const core::Tensor& wte = stored.at("wte.weight").tensor;
      if (s.tensor.shape() == wte.shape() && s.tensor.ToVector() == wte.ToVector()) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": lm_head.weight in ", s.file, " differs from wte.weight; this GPT ties them"));
    }
    return absl::InvalidArgumentError(absl::StrCat(where, ": tensor '", name, "' in ", s.file,
                                                   " belongs to no parameter of this GPT"));
  }
  for (auto& [p, value] : staged) RETURN_IF_ERROR(p->data.CopyFrom(value));
  return absl::OkStatus();
}

absl::Status ExportHfGpt2(const nn::Gpt& model, const std::string& dir) {
  const std::string where = absl::StrCat("ExportHfGpt2(", dir, ")");
  const nn::GptConfig& c = model.config();
  NamedTensors tensors;
  for (const auto& [name, p] : model.NamedParameters()) {
    const HfName hf = ToHf(name);
    if (hf.name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": parameter '", name, "' has no GPT-2 counterpart"));
    }
    const core::Shape full = FullShape(name, c);
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
