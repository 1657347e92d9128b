#include "integration/checkpointing/model_structure.h"

#include <algorithm>
#include <cstdint>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nn/attention.h"
#include "nn/embedding.h"
#include "nn/gpt.h"
#include "nn/layer_norm.h"
#include "nn/linear.h"

namespace integration {
namespace {

ConfigEntry Entry(const std::string& key, const std::string& value) {
  ConfigEntry e;
  e.set_key(key);
  e.set_value(value);
  return e;
}

std::string ShapeText(const google::protobuf::RepeatedField<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string ModuleName(const ModuleRecord& m) {
  return absl::StrCat(m.path().empty() ? "<root>" : absl::StrCat("'", m.path(), "'"), " (",
                      m.type_name(), ")");
}

// `a` and `b` as key -> value maps, compared key by key; `what` opens each message.
void CompareConfig(const google::protobuf::RepeatedPtrField<ConfigEntry>& saved,
                   const google::protobuf::RepeatedPtrField<ConfigEntry>& current,
                   const std::string& what, std::vector<std::string>* out) {
  std::map<std::string, std::string> s, c;
  for (const ConfigEntry& e : saved) s[e.key()] = e.value();
  for (const ConfigEntry& e : current) c[e.key()] = e.value();
  std::set<std::string> keys;
  for (const auto& [k, v] : s) keys.insert(k);
  for (const auto& [k, v] : c) keys.insert(k);
  for (const std::string& k : keys) {
    auto si = s.find(k);
    auto ci = c.find(k);
    const std::string sv = si == s.end() ? "none" : si->second;
    const std::string cv = ci == c.end() ? "none" : ci->second;
    if (si == s.end() || ci == c.end() || si->second != ci->second) {
      out->push_back(absl::StrCat(what, k, ": checkpoint ", sv, ", model ", cv));
    }
  }
}

}  // namespace

std::vector<ConfigEntry> KnownModuleConfig(const core::Module& module) {
  std::vector<ConfigEntry> out;
  auto add = [&](const std::string& key, int64_t v) { out.push_back(Entry(key, absl::StrCat(v))); };
  if (const auto* gpt = dynamic_cast<const nn::Gpt*>(&module)) {
    const nn::GptConfig& c = gpt->config();
    add("vocab_size", c.vocab_size);
    add("block_size", c.block_size);
    add("n_embd", c.n_embd);
    add("n_layer", c.n_layer);
    add("n_head", c.n_head);
  } else if (const auto* attn = dynamic_cast<const nn::CausalSelfAttention*>(&module)) {
    add("n_embd", attn->n_embd());
    add("n_head", attn->n_head());
  } else if (const auto* ln = dynamic_cast<const nn::LayerNorm*>(&module)) {
    add("dim", ln->dim());
    out.push_back(Entry("eps", absl::StrFormat("%.9g", ln->eps())));
  } else if (const auto* linear = dynamic_cast<const nn::Linear*>(&module)) {
    add("in_features", linear->in_features());
    add("out_features", linear->out_features());
  } else if (const auto* emb = dynamic_cast<const nn::Embedding*>(&module)) {
    add("num_embeddings", emb->num_embeddings());
    add("embedding_dim", emb->embedding_dim());
  }
  std::sort(out.begin(), out.end(),
            [](const ConfigEntry& a, const ConfigEntry& b) { return a.key() < b.key(); });
  return out;
}

ModelStructure DescribeModel(core::Module& model,
                             const std::vector<std::pair<std::string, core::Shape>>& parameters,
                             const std::map<std::string, std::string>& config) {
  ModelStructure s;
  for (const auto& [path, module] : model.NamedModules()) {
    ModuleRecord* m = s.add_modules();
    m->set_path(path);
    m->set_type_name(module->TypeName());
    for (ConfigEntry& e : KnownModuleConfig(*module)) *m->add_config() = std::move(e);
  }
  for (const auto& [name, shape] : parameters) {
    ParameterRecord* p = s.add_parameters();
    p->set_name(name);
    for (int64_t d : shape) p->add_shape(d);
  }
  for (const auto& [k, v] : config) *s.add_config() = Entry(k, v);  // std::map: sorted
  s.set_fingerprint(StructureFingerprint(s));
  return s;
}

std::string StructureFingerprint(const ModelStructure& structure) {
  // FNV-1a over a canonical text with length-prefixed fields (so no two structures
  // share a text).
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const std::string& field) {
    const std::string framed = absl::StrCat(field.size(), ":", field, ";");
    for (unsigned char c : framed) h = (h ^ c) * 1099511628211ull;
  };
  for (const ModuleRecord& m : structure.modules()) {
    mix("module");
    mix(m.path());
    mix(m.type_name());
    for (const ConfigEntry& e : m.config()) {
      mix(e.key());
      mix(e.value());
    }
  }
  for (const ParameterRecord& p : structure.parameters()) {
    mix("parameter");
    mix(p.name());
    mix(ShapeText(p.shape()));
  }
  for (const ConfigEntry& e : structure.config()) {
    mix("config");
    mix(e.key());
    mix(e.value());
  }
  return absl::StrFormat("%016x", h);
}

std::vector<std::string> StructureDifferences(const ModelStructure& saved,
                                              const ModelStructure& current, bool compare_config) {
  std::vector<std::string> out;
  if (compare_config) CompareConfig(saved.config(), current.config(), "model_config ", &out);

  std::map<std::string, const ParameterRecord*> now;
  for (const ParameterRecord& p : current.parameters()) now[p.name()] = &p;
  std::set<std::string> seen;
  for (const ParameterRecord& p : saved.parameters()) {
    seen.insert(p.name());
    auto it = now.find(p.name());
    if (it == now.end()) {
      out.push_back(absl::StrCat("checkpoint has tensor ", kModelTensorPrefix, p.name(),
                                 " that the model lacks"));
    } else if (ShapeText(it->second->shape()) != ShapeText(p.shape())) {
      out.push_back(absl::StrCat("parameter '", p.name(), "': checkpoint shape ",
                                 ShapeText(p.shape()), ", model ", ShapeText(it->second->shape())));
    }
  }
  for (const ParameterRecord& p : current.parameters()) {
    if (!seen.count(p.name())) {
      out.push_back(absl::StrCat("model has parameter '", p.name(),
                                 "' that the checkpoint lacks (no tensor ", kModelTensorPrefix,
                                 p.name(), ")"));
    }
  }

  std::map<std::string, const ModuleRecord*> modules_now;
  for (const ModuleRecord& m : current.modules()) modules_now[m.path()] = &m;
  std::set<std::string> modules_seen;
  for (const ModuleRecord& m : saved.modules()) {
    modules_seen.insert(m.path());
    auto it = modules_now.find(m.path());
    if (it == modules_now.end()) {
      out.push_back(absl::StrCat("checkpoint has module ", ModuleName(m), " that the model lacks"));
    } else if (it->second->type_name() != m.type_name()) {
      out.push_back(absl::StrCat("module ", ModuleName(m), ": checkpoint type ", m.type_name(),
                                 ", model type ", it->second->type_name()));
    } else {
      CompareConfig(m.config(), it->second->config(), absl::StrCat("module ", ModuleName(m), ": "),
                    &out);
    }
  }
  for (const ModuleRecord& m : current.modules()) {
    if (!modules_seen.count(m.path())) {
      out.push_back(absl::StrCat("model has module ", ModuleName(m), " that the checkpoint lacks"));
    }
  }
  return out;
}

}  // namespace integration
