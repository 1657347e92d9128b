#include "checkpoint/hf_llama.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
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

// Transformers' name (without "model.") of one of our parameters: the same, per NOTE
// [Llama layout]. Empty when the name is not a Llama's.
HfName ToHf(const std::string& ours) {
  static const char* const kLayer[] = {
      "input_layernorm.weight",  "self_attn.q_proj.weight", "self_attn.k_proj.weight",
      "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
      "mlp.gate_proj.weight",    "mlp.up_proj.weight",      "mlp.down_proj.weight"};
  if (ours == "embed_tokens.weight" || ours == "norm.weight" || ours == "lm_head.weight") {
    return {ours, false};
  }
  absl::string_view rest = ours;
  if (!absl::ConsumePrefix(&rest, "layers.")) return {};
  const size_t dot = rest.find('.');
  int64_t index = 0;
  if (dot == absl::string_view::npos || !absl::SimpleAtoi(rest.substr(0, dot), &index)) return {};
  for (const char* name : kLayer) {
    if (rest.substr(dot + 1) == name) return {ours, false};
  }
  return {};
}

internal::HfArchitecture LlamaArchitecture(const nn::LlamaConfig& config) {
  internal::HfArchitecture arch;
  arch.family = "Llama";
  arch.model = "this Llama";
  arch.prefix = "model.";
  arch.unprefixed = {"lm_head.weight"};
  arch.to_hf = ToHf;
  arch.is_buffer = [](const std::string& name) {
    return absl::EndsWith(name, "rotary_emb.inv_freq");
  };
  if (config.tie_word_embeddings) {
    arch.tied_head = "lm_head.weight";
    arch.tied_embedding = "embed_tokens.weight";
  }
  return arch;
}

// The JSON number closest to `f` among the shortest decimals that read back as `f`
// (1e-05 for 1e-5f, not 9.99999974737875e-06), so an exported config reads as written.
double ShortestDecimal(float f) {
  char text[32];
  for (int digits = 1; digits <= 9; ++digits) {
    std::snprintf(text, sizeof(text), "%.*g", digits, static_cast<double>(f));
    if (static_cast<float>(std::strtod(text, nullptr)) == f) break;
  }
  return std::strtod(text, nullptr);
}

// The rotary fields: rope_theta (top level, or in rope_parameters, which transformers
// reads first), refusing every form of scaling.
absl::StatusOr<double> ReadRopeTheta(const Json& json, const std::string& path) {
  const char* const kDefault = "; this Llama computes the default rotary embedding only";
  if (json.contains("rope_scaling") && !json["rope_scaling"].is_null()) {
    return internal::ConfigError(
        path, "rope_scaling",
        absl::StrCat("is ", json["rope_scaling"].dump(), kDefault, " (null)"));
  }
  ASSIGN_OR_RETURN(const double partial,
                   internal::ReadNumber(json, path, "partial_rotary_factor", 1.0));
  if (partial != 1.0) {
    return internal::ConfigError(path, "partial_rotary_factor",
                                 absl::StrCat("is ", json["partial_rotary_factor"].dump(),
                                              "; this Llama rotates whole heads (1)"));
  }
  ASSIGN_OR_RETURN(double theta, internal::ReadNumber(json, path, "rope_theta", 10000.0));
  if (!json.contains("rope_parameters") || json["rope_parameters"].is_null()) return theta;
  const Json& rope = json["rope_parameters"];
  if (!rope.is_object()) {
    return internal::ConfigError(path, "rope_parameters",
                                 absl::StrCat("is ", rope.dump(), "; an object"));
  }
  for (const auto& [key, value] : rope.items()) {
    const std::string field = absl::StrCat("rope_parameters.", key);
    if (key == "rope_type" || key == "type") {
      if (value != "default") {
        return internal::ConfigError(path, field,
                                     absl::StrCat("is ", value.dump(), kDefault, " (\"default\")"));
      }
    } else if (key == "rope_theta") {
      if (!value.is_number() || !(value.get<double>() > 0)) {
        return internal::ConfigError(path, field,
                                     absl::StrCat("is ", value.dump(), "; a positive number"));
      }
      theta = value.get<double>();
    } else if (!(key == "partial_rotary_factor" && value == 1.0)) {
      return internal::ConfigError(path, field, absl::StrCat("is ", value.dump(), kDefault));
    }
  }
  return theta;
}

}  // namespace

absl::StatusOr<nn::LlamaConfig> ReadHfLlamaConfig(const std::string& dir) {
  const std::string path = dir + "/config.json";
  ASSIGN_OR_RETURN(Json json, internal::ReadJson(path, "transformers config"));
  auto bad = [&](const std::string& field, const std::string& why) {
    return internal::ConfigError(path, field, why);
  };
  if (json.contains("model_type") && json["model_type"] != "llama") {
    return bad("model_type", absl::StrCat(json["model_type"].dump(), ": only llama is read here"));
  }
  nn::LlamaConfig config;
  RETURN_IF_ERROR(internal::ReadPositiveInts(
      json, path,
      {// transformers' LlamaConfig defaults
       {"vocab_size", &config.vocab_size, 32000},
       {"hidden_size", &config.hidden_size, 4096},
       {"intermediate_size", &config.intermediate_size, 11008},
       {"num_hidden_layers", &config.num_hidden_layers, 32},
       {"num_attention_heads", &config.num_attention_heads, 32},
       {"max_position_embeddings", &config.max_position_embeddings, 2048}}));
  config.num_key_value_heads = config.num_attention_heads;  // absent or null
  if (json.contains("num_key_value_heads") && !json["num_key_value_heads"].is_null()) {
    RETURN_IF_ERROR(internal::ReadPositiveInts(
        json, path, {{"num_key_value_heads", &config.num_key_value_heads, 0}}));
  }
  if (json.contains("head_dim") && !json["head_dim"].is_null()) {
    int64_t head_dim = 0;
    RETURN_IF_ERROR(internal::ReadPositiveInts(json, path, {{"head_dim", &head_dim, 0}}));
    if (config.hidden_size % config.num_attention_heads != 0 ||
        head_dim != config.hidden_size / config.num_attention_heads) {
      return bad("head_dim", absl::StrCat("is ", head_dim, "; this Llama's heads are hidden_size (",
                                          config.hidden_size, ") / num_attention_heads (",
                                          config.num_attention_heads, ") wide"));
    }
  }
  ASSIGN_OR_RETURN(const std::string activation,
                   internal::ReadString(json, path, "hidden_act", "silu"));
  if (activation != "silu" && activation != "swish") {
    return bad("hidden_act", absl::StrCat("is \"", activation,
                                          "\"; this Llama's MLP computes SiLU (silu, swish)"));
  }
  for (const char* field : {"attention_bias", "mlp_bias"}) {
    ASSIGN_OR_RETURN(const bool bias, internal::ReadBool(json, path, field, false));
    if (bias) return bad(field, "is true; this Llama's projections have no bias (false)");
  }
  ASSIGN_OR_RETURN(config.rope_theta, ReadRopeTheta(json, path));
  ASSIGN_OR_RETURN(const double eps, internal::ReadNumber(json, path, "rms_norm_eps", 1e-6));
  config.rms_norm_eps = static_cast<float>(eps);
  ASSIGN_OR_RETURN(const double range, internal::ReadNumber(json, path, "initializer_range", 0.02));
  config.initializer_range = static_cast<float>(range);
  ASSIGN_OR_RETURN(config.tie_word_embeddings,
                   internal::ReadBool(json, path, "tie_word_embeddings", false));
  if (absl::Status valid = config.Validate(); !valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", valid.message()));
  }
  return config;
}

absl::Status LoadHfLlama(const std::string& dir, nn::Llama& model) {
  return internal::LoadHf(dir, model, /*registry=*/nullptr, LlamaArchitecture(model.config()),
                          absl::StrCat("LoadHfLlama(", dir, ")"));
}

absl::Status LoadHfLlama(const std::string& dir, nn::Llama& model,
                         fsdp::WrapperRegistry* registry) {
  const std::string where = absl::StrCat("LoadHfLlama(", dir, ")");
  if (registry == nullptr) return absl::InvalidArgumentError(where + ": the registry is null");
  return internal::LoadHf(dir, model, registry, LlamaArchitecture(model.config()), where);
}

absl::Status ExportHfLlama(const nn::Llama& model, const std::string& dir) {
  const std::string where = absl::StrCat("ExportHfLlama(", dir, ")");
  const nn::LlamaConfig& c = model.config();
  // The full shapes, from a deferred Llama of the same config (shapes only, no memory).
  std::map<std::string, core::Shape> full_shapes;
  {
    core::DeferredInitScope deferred;
    ASSIGN_OR_RETURN(std::shared_ptr<nn::Llama> shapes, nn::Llama::Create(c));
    full_shapes = ParameterShapes(*shapes);
  }
  ASSIGN_OR_RETURN(NamedTensors tensors,
                   internal::HfTensors(model, full_shapes, LlamaArchitecture(c), where));
  // safetensors' save_file order (all float32: by name), so the file is laid out as theirs.
  std::sort(tensors.begin(), tensors.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  Json config;
  config["architectures"] = {"LlamaForCausalLM"};
  config["model_type"] = "llama";
  config["vocab_size"] = c.vocab_size;
  config["hidden_size"] = c.hidden_size;
  config["intermediate_size"] = c.intermediate_size;
  config["num_hidden_layers"] = c.num_hidden_layers;
  config["num_attention_heads"] = c.num_attention_heads;
  config["num_key_value_heads"] = c.num_key_value_heads;
  config["head_dim"] = c.hidden_size / c.num_attention_heads;
  config["max_position_embeddings"] = c.max_position_embeddings;
  config["hidden_act"] = "silu";
  config["rms_norm_eps"] = ShortestDecimal(c.rms_norm_eps);
  config["rope_theta"] = c.rope_theta;
  config["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", c.rope_theta}};
  config["attention_bias"] = false;
  config["mlp_bias"] = false;
  config["attention_dropout"] = 0.0;
  config["tie_word_embeddings"] = c.tie_word_embeddings;
  config["initializer_range"] = ShortestDecimal(c.initializer_range);
  config["dtype"] = "float32";
  return internal::WriteHfCheckpoint(dir, config, tensors, where);
}

}  // namespace checkpoint
