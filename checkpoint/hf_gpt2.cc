#include "checkpoint/hf_gpt2.h"

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "checkpoint/internal/hf_common.h"
#include "checkpoint/safetensors.h"
#include "core/param_init.h"
#include "core/status_macros.h"

namespace checkpoint {
namespace {

using internal::HfName;
using internal::Json;

// Transformers' name of one of our parameters, and whether its layout is the transpose
// of ours (Conv1D), per NOTE [GPT-2 layout]. Empty when the name is not a Gpt's.
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

// How transformers stores a Gpt (NOTE [GPT-2 layout]): lm_head tied to wte, the causal-mask
// buffers of older checkpoints skipped.
const internal::HfArchitecture& Gpt2Architecture() {
  static const internal::HfArchitecture* const kArch = [] {
    auto* arch = new internal::HfArchitecture;
    arch->family = "GPT-2";
    arch->model = "this GPT";
    arch->prefix = "transformer.";
    arch->to_hf = ToHf;
    arch->is_buffer = [](const std::string& name) {
      return absl::EndsWith(name, ".attn.bias") || absl::EndsWith(name, ".attn.masked_bias");
    };
    arch->tied_head = "lm_head.weight";
    arch->tied_embedding = "wte.weight";
    return arch;
  }();
  return *kArch;
}

}  // namespace

absl::StatusOr<nn::GptConfig> ReadHfGpt2Config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  ASSIGN_OR_RETURN(Json json, internal::ReadJson(path, "transformers config"));
  auto bad = [&](const std::string& field, const std::string& why) {
    return internal::ConfigError(path, field, why);
  };
  if (json.contains("model_type") && json["model_type"] != "gpt2") {
    return bad("model_type", absl::StrCat(json["model_type"].dump(), ": only gpt2 is read here"));
  }
  nn::GptConfig config;
  RETURN_IF_ERROR(internal::ReadPositiveInts(json, path,
                                             {// GPT2Config's defaults
                                              {"vocab_size", &config.vocab_size, 50257},
                                              {"n_positions", &config.block_size, 1024},
                                              {"n_embd", &config.n_embd, 768},
                                              {"n_layer", &config.n_layer, 12},
                                              {"n_head", &config.n_head, 12}}));
  ASSIGN_OR_RETURN(const std::string activation,
                   internal::ReadString(json, path, "activation_function", "gelu_new"));
  if (activation != "gelu_new" && activation != "gelu_pytorch_tanh") {
    return bad("activation_function", absl::StrCat("is \"", activation,
                                                   "\"; this GPT computes GELU's tanh form "
                                                   "(gelu_new, gelu_pytorch_tanh)"));
  }
  if (json.contains("layer_norm_epsilon") && (!json["layer_norm_epsilon"].is_number() ||
                                              json["layer_norm_epsilon"].get<double>() != 1e-5)) {
    return bad("layer_norm_epsilon",
               absl::StrCat("is ", json["layer_norm_epsilon"].dump(), "; this GPT uses 1e-5"));
  }
  if (json.contains("n_inner") && !json["n_inner"].is_null() &&
      json["n_inner"] != 4 * config.n_embd) {
    return bad("n_inner", absl::StrCat("is ", json["n_inner"].dump(),
                                       "; this GPT's MLP is 4 n_embd wide (null)"));
  }
  for (const auto& [field, want] :
       std::vector<std::pair<const char*, bool>>{{"tie_word_embeddings", true},
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
  return internal::LoadHf(dir, model, /*registry=*/nullptr, Gpt2Architecture(),
                          absl::StrCat("LoadHfGpt2(", dir, ")"));
}

absl::Status LoadHfGpt2(const std::string& dir, nn::Gpt& model, fsdp::WrapperRegistry* registry) {
  const std::string where = absl::StrCat("LoadHfGpt2(", dir, ")");
  if (registry == nullptr) return absl::InvalidArgumentError(where + ": the registry is null");
  return internal::LoadHf(dir, model, registry, Gpt2Architecture(), where);
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
  ASSIGN_OR_RETURN(NamedTensors tensors,
                   internal::HfTensors(model, full_shapes, Gpt2Architecture(), where));
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
  return internal::WriteHfCheckpoint(dir, config, tensors, where);
}

}  // namespace checkpoint
