#include "integration/checkpointing/training_checkpoint.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "fsdp/state_dict.h"
#include "nlohmann/json.hpp"

namespace integration {
namespace {

constexpr char kModelPrefix[] = "model/";
constexpr char kOptimPrefix[] = "optim/";
constexpr char kOptimizerKey[] = "fsdp.optimizer";

std::string ModelKey(const std::string& param) { return absl::StrCat(kModelPrefix, param); }
std::string OptimKey(const std::string& param, const std::string& state) {
  return absl::StrCat(kOptimPrefix, param, "/", state);
}

// Model parameter name by Parameter object.
std::map<const core::Parameter*, std::string> NamesByIdentity(const core::Module& model) {
  std::map<const core::Parameter*, std::string> out;
  for (const auto& [name, p] : model.NamedParameters()) out.emplace(p.get(), name);
  return out;
}

absl::Status Annotate(const absl::Status& status, const std::string& what) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(what, ": ", status.message()));
}

}  // namespace

absl::Status SaveTrainingCheckpoint(const std::string& dir, core::Module& model,
                                    fsdp::WrapperRegistry* registry,
                                    const optim::Optimizer* optimizer,
                                    comm::ProcessGroup* group,
                                    const TrainingCheckpointOptions& options) {
  const std::string where = absl::StrCat("SaveTrainingCheckpoint('", dir, "', ", model.Describe(), ")");
  for (const auto& [key, value] : options.user_metadata) {
    if (absl::StartsWith(key, "fsdp.")) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": TrainingCheckpointOptions.user_metadata key '", key,
          "' uses the reserved prefix \"fsdp.\""));
    }
  }
  fsdp::WrapperRegistry no_units;  // a plain module: every parameter whole
  if (registry == nullptr) registry = &no_units;
  ASSIGN_OR_RETURN(std::vector<fsdp::ShardedTensor> parts, fsdp::ShardedStateDict(model, registry));
  std::map<std::string, const fsdp::ShardedTensor*> part_of;
  std::vector<checkpoint::TensorSlice> slices;
  for (const fsdp::ShardedTensor& t : parts) {
    part_of[t.name] = &t;
    slices.push_back({ModelKey(t.name), t.full_shape, core::DType::kFloat32, t.begin, t.end, t.local});
  }
  checkpoint::SaveOptions save;
  save.step = options.step;
  save.user_metadata = options.user_metadata;
  save.timeout = options.timeout;
  save.simulate_crash = options.simulate_crash;
  if (options.block_bytes > 0) save.block_bytes = options.block_bytes;
  if (optimizer != nullptr) {
    const std::map<const core::Parameter*, std::string> names = NamesByIdentity(model);
    std::map<std::string, std::string> model_name_of;  // optimizer name -> model name
    for (const auto& [opt_name, p] : optimizer->named_parameters()) {
      auto it = names.find(p.get());
      if (it == names.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": the ", optimizer->TypeName(), " parameter '", opt_name, "' is not a parameter of ",
            model.Describe()));
      }
      model_name_of[opt_name] = it->second;
    }
    const optim::OptimizerState state = optimizer->State();
    // State keys are "<optimizer name>.<state name>".
    for (const auto& [key, tensor] : state.tensors) {
      bool matched = false;
      for (const std::string& state_name : optimizer->StateNames()) {
        const std::string suffix = "." + state_name;
        if (!absl::EndsWith(key, suffix)) continue;
        const std::string opt_name = key.substr(0, key.size() - suffix.size());
        auto m = model_name_of.find(opt_name);
        if (m == model_name_of.end()) continue;
        const fsdp::ShardedTensor& part = *part_of.at(m->second);
        if (tensor.numel() != part.end - part.begin) {
          return absl::FailedPreconditionError(absl::StrCat(
              where, ": optimizer state '", key, "' has ", tensor.numel(),
              " elements but parameter '", m->second, "' holds ", part.end - part.begin,
              " on this rank (the optimizer stepped under another layout)"));
        }
        slices.push_back({OptimKey(m->second, state_name), part.full_shape, core::DType::kFloat32,
                          part.begin, part.end, tensor});
        matched = true;
        break;
      }
      if (!matched) {
        return absl::InternalError(absl::StrCat(where, ": optimizer state key '", key,
                                                "' matches no parameter and state name"));
      }
    }
    nlohmann::json j;
    j["type"] = optimizer->TypeName();
    j["step_count"] = state.step_count;
    nlohmann::json steps = nlohmann::json::object();
    for (const auto& [opt_name, n] : state.param_steps) steps[model_name_of.at(opt_name)] = n;
    j["param_steps"] = steps;
    save.user_metadata[kOptimizerKey] = j.dump();
  }
  return Annotate(checkpoint::Save(dir, slices, save, group), where);
}

namespace {

absl::StatusOr<LoadedCheckpoint> InfoFrom(const checkpoint::CheckpointInfo& info,
                                          nlohmann::json* optimizer_json, const std::string& dir) {
  LoadedCheckpoint out;
  out.step = info.step;
  out.saved_world_size = info.world_size;
  for (const auto& [key, value] : info.user_metadata) {
    if (key == kOptimizerKey) {
      nlohmann::json j = nlohmann::json::parse(value, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object() || !j.contains("type") || !j["type"].is_string() ||
          !j.contains("step_count") || !j["step_count"].is_number_integer() ||
          !j.contains("param_steps") || !j["param_steps"].is_object() ||
          std::any_of(j["param_steps"].begin(), j["param_steps"].end(),
                      [](const nlohmann::json& n) { return !n.is_number_integer(); })) {
        return absl::DataLossError(absl::StrCat("checkpoint '", dir, "': metadata key ", kOptimizerKey,
                                                " is not a valid optimizer record"));
      }
      out.has_optimizer_state = true;
      out.optimizer_type = j["type"].get<std::string>();
      if (optimizer_json != nullptr) *optimizer_json = std::move(j);
    } else if (!absl::StartsWith(key, "fsdp.")) {
      out.user_metadata[key] = value;
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<LoadedCheckpoint> ReadTrainingCheckpointInfo(const std::string& dir) {
  ASSIGN_OR_RETURN(checkpoint::CheckpointInfo info, checkpoint::ReadMetadata(dir));
  return InfoFrom(info, nullptr, dir);
}

absl::StatusOr<LoadedCheckpoint> LoadTrainingCheckpoint(const std::string& dir,
                                                        core::Module& model,
                                                        fsdp::WrapperRegistry* registry,
                                                        optim::Optimizer* optimizer) {
  const std::string where = absl::StrCat("LoadTrainingCheckpoint('", dir, "', ", model.Describe(), ")");
  ASSIGN_OR_RETURN(checkpoint::CheckpointInfo info, checkpoint::ReadMetadata(dir));
  nlohmann::json optimizer_json;
  ASSIGN_OR_RETURN(LoadedCheckpoint out, InfoFrom(info, &optimizer_json, dir));
  if (optimizer != nullptr) {
    if (!out.has_optimizer_state) {
      return absl::FailedPreconditionError(absl::StrCat(
          where, ": the checkpoint has no optimizer state (it was saved without an optimizer)"));
    }
    if (out.optimizer_type != optimizer->TypeName()) {
      return absl::FailedPreconditionError(absl::StrCat(
          where, ": the checkpoint holds ", out.optimizer_type, " state, not ", optimizer->TypeName()));
    }
  }
  // The current layout, and a check of every parameter before anything is read.
  fsdp::WrapperRegistry no_units;  // a plain module: every parameter whole
  if (registry == nullptr) registry = &no_units;
  ASSIGN_OR_RETURN(std::vector<fsdp::ShardedTensor> parts, fsdp::ShardedStateDict(model, registry));
  std::vector<checkpoint::LoadRequest> requests;
  for (fsdp::ShardedTensor& t : parts) {
    const checkpoint::TensorInfo* saved = info.Find(ModelKey(t.name));
    if (saved == nullptr) {
      return absl::NotFoundError(absl::StrCat(where, ": parameter '", t.name,
                                              "' is not in the checkpoint (no tensor '",
                                              ModelKey(t.name), "')"));
    }
    if (saved->shape != t.full_shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": parameter '", t.name, "' is ", core::ShapeToString(t.full_shape),
          " but the checkpoint's '", saved->name, "' is ", core::ShapeToString(saved->shape)));
    }
    requests.push_back({saved->name, t.begin, t.end, t.local});
  }
  // Optimizer state: this rank's slice of every saved state tensor of each parameter.
  optim::OptimizerState state;
  if (optimizer != nullptr) {
    std::map<const core::Parameter*, const fsdp::ShardedTensor*> part_by_param;
    {
      size_t i = 0;
      for (const auto& [name, p] : model.NamedParameters()) part_by_param[p.get()] = &parts[i++];
    }
    state.step_count = optimizer_json["step_count"].get<int64_t>();
    const nlohmann::json& steps = optimizer_json["param_steps"];
    for (const auto& [opt_name, p] : optimizer->named_parameters()) {
      auto it = part_by_param.find(p.get());
      if (it == part_by_param.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": the ", optimizer->TypeName(), " parameter '", opt_name,
            "' is not a parameter of ", model.Describe()));
      }
      const fsdp::ShardedTensor& part = *it->second;
      if (!steps.contains(part.name)) continue;  // never stepped: starts fresh
      state.param_steps.push_back({opt_name, steps[part.name].get<int64_t>()});
      for (const std::string& state_name : optimizer->StateNames()) {
        const std::string key = OptimKey(part.name, state_name);
        const checkpoint::TensorInfo* saved = info.Find(key);
        if (saved == nullptr || saved->shape != part.full_shape) {
          return absl::DataLossError(absl::StrCat(where, ": optimizer state '", key,
                                                  saved ? "' has the wrong shape" : "' is missing"));
        }
        ASSIGN_OR_RETURN(core::Tensor slice, core::Tensor::Allocate({part.end - part.begin},
                                                                    core::DType::kFloat32,
                                                                    core::MemoryTag::kOptim));
        requests.push_back({key, part.begin, part.end, slice});
        state.tensors.push_back({absl::StrCat(opt_name, ".", state_name), slice});
      }
    }
  }
  ASSIGN_OR_RETURN(checkpoint::LoadStats stats, checkpoint::Load(dir, requests));
  out.bytes_read = stats.bytes_read;
  RETURN_IF_ERROR(Annotate(fsdp::LoadShardedStateDict(model, registry, parts), where));
  if (optimizer != nullptr) RETURN_IF_ERROR(Annotate(optimizer->LoadState(state), where));
  return out;
}

}  // namespace integration
