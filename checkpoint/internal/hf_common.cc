#include "checkpoint/internal/hf_common.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "comm/agreement.h"
#include "core/status_macros.h"
#include "core/text_file.h"
#include "fsdp/state_dict.h"

namespace checkpoint {
namespace internal {
namespace {

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

// The checkpoint's files, opened (layouts validated, nothing read), and where each
// tensor is, by name without the architecture's prefix.
struct Weights {
  struct Place {
    size_t file = 0;
    std::string name;  // as stored
  };
  std::vector<SafetensorsReader> files;
  std::vector<std::string> paths;  // parallel to `files`
  std::map<std::string, Place> where;

  const std::string& FileOf(const Place& p) const { return paths[p.file]; }
};

absl::StatusOr<Weights> OpenWeights(const std::string& dir, const std::string& prefix) {
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
      absl::ConsumePrefix(&short_name, prefix);
      auto [it, inserted] =
          out.where.emplace(std::string(short_name), Weights::Place{out.files.size(), name});
      if (!inserted) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", name, "' of ", path, " is also in ", out.FileOf(it->second)));
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
// checking shapes, and that every other tensor is one the architecture may skip; reads
// nothing but a tied head and its embedding (to check they are equal).
absl::StatusOr<std::vector<Mapping>> MapWeights(
    const Weights& weights, const std::vector<std::pair<std::string, core::Shape>>& full_shapes,
    const HfArchitecture& arch, const std::string& where) {
  std::vector<Mapping> out;
  std::set<std::string> used;
  for (const auto& [name, shape] : full_shapes) {
    const HfName hf = arch.to_hf(name);
    if (hf.name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": parameter '", name, "' has no ", arch.family, " counterpart"));
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
    if (arch.is_buffer && arch.is_buffer(name)) continue;
    if (!arch.tied_head.empty() && name == arch.tied_head &&
        weights.where.count(arch.tied_embedding)) {
      // Tied: it must be the embedding.
      const Weights::Place& embedding = weights.where.at(arch.tied_embedding);
      ASSIGN_OR_RETURN(core::Tensor head, weights.files[place.file].Read(place.name));
      ASSIGN_OR_RETURN(core::Tensor emb, weights.files[embedding.file].Read(embedding.name));
      if (head.shape() == emb.shape() && head.ToVector() == emb.ToVector()) continue;
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", name, " in ", weights.FileOf(place), " differs from ",
                       arch.tied_embedding, "; ", arch.model, " ties them"));
    }
    return absl::InvalidArgumentError(absl::StrCat(where, ": tensor '", name, "' in ",
                                                   weights.FileOf(place),
                                                   " belongs to no parameter of ", arch.model));
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

absl::Status LoadPlain(const std::string& dir, core::Module& module, const HfArchitecture& arch,
                       const std::string& where) {
  std::vector<std::pair<std::string, core::Shape>> shapes;
  std::vector<core::ParameterPtr> params;  // parallel to `shapes`, and so to the mappings
  for (const auto& [name, p] : module.NamedParameters()) {
    params.push_back(p);
    if (!p->data.defined()) {
      return absl::FailedPreconditionError(absl::StrCat(
          where, ": parameter '", name, "' ", p->data.ToString(),
          " has no values to load into (deferred: wrap it and load with the registry)"));
    }
    shapes.emplace_back(name, p->data.shape());
  }
  ASSIGN_OR_RETURN(Weights weights, OpenWeights(dir, arch.prefix));
  ASSIGN_OR_RETURN(std::vector<Mapping> mappings, MapWeights(weights, shapes, arch, where));
  // Every value read and converted before any parameter changes.
  std::vector<std::pair<core::ParameterPtr, core::Tensor>> staged;
  for (size_t i = 0; i < mappings.size(); ++i) {
    ASSIGN_OR_RETURN(core::Tensor value, ReadOurs(weights, mappings[i]));
    staged.emplace_back(params[i], std::move(value));
  }
  for (auto& [p, value] : staged) RETURN_IF_ERROR(p->data.CopyFrom(value));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Json> ReadJson(const std::string& path, absl::string_view what) {
  ASSIGN_OR_RETURN(std::string text, core::ReadTextFile(path, what));
  Json json = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  return json;
}

absl::Status ConfigError(const std::string& path, absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", field, " ", why));
}

absl::Status ReadPositiveInts(
    const Json& json, const std::string& path,
    const std::vector<std::tuple<const char*, int64_t*, int64_t>>& fields) {
  for (const auto& [field, target, fallback] : fields) {
    if (!json.contains(field)) {
      *target = fallback;
    } else if (!json[field].is_number_integer() || json[field].get<int64_t>() <= 0) {
      return ConfigError(path, field,
                         absl::StrCat("is ", json[field].dump(), "; a positive integer"));
    } else {
      *target = json[field].get<int64_t>();
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadString(const Json& json, const std::string& path, const char* field,
                                       const std::string& fallback) {
  if (!json.contains(field)) return fallback;
  if (!json[field].is_string()) {
    return ConfigError(path, field, absl::StrCat("is ", json[field].dump(), "; a string"));
  }
  return json[field].get<std::string>();
}

absl::StatusOr<double> ReadNumber(const Json& json, const std::string& path, const char* field,
                                  double fallback) {
  if (!json.contains(field)) return fallback;
  if (!json[field].is_number()) {
    return ConfigError(path, field, absl::StrCat("is ", json[field].dump(), "; a number"));
  }
  return json[field].get<double>();
}

absl::StatusOr<bool> ReadBool(const Json& json, const std::string& path, const char* field,
                              bool fallback) {
  if (!json.contains(field)) return fallback;
  if (!json[field].is_boolean()) {
    return ConfigError(path, field, absl::StrCat("is ", json[field].dump(), "; true or false"));
  }
  return json[field].get<bool>();
}

absl::Status LoadHf(const std::string& dir, core::Module& module, fsdp::WrapperRegistry* registry,
                    const HfArchitecture& arch, const std::string& where) {
  const std::vector<std::shared_ptr<fsdp::Unit>> units =
      registry == nullptr ? std::vector<std::shared_ptr<fsdp::Unit>>() : registry->UnitsIn(module);
  if (units.empty()) return LoadPlain(dir, module, arch, where);
  // This rank's part of every parameter, filled from the files one tensor at a time.
  absl::StatusOr<std::vector<fsdp::ShardedTensor>> parts = fsdp::ShardedStateDict(module, registry);
  absl::Status local = parts.status();
  if (local.ok()) {
    local = [&]() -> absl::Status {
      std::vector<std::pair<std::string, core::Shape>> shapes;
      for (const fsdp::ShardedTensor& t : *parts) shapes.emplace_back(t.name, t.full_shape);
      ASSIGN_OR_RETURN(Weights weights, OpenWeights(dir, arch.prefix));
      ASSIGN_OR_RETURN(std::vector<Mapping> mappings, MapWeights(weights, shapes, arch, where));
      for (size_t i = 0; i < mappings.size(); ++i) {
        fsdp::ShardedTensor& part = (*parts)[i];
        if (part.end == part.begin) continue;
        ASSIGN_OR_RETURN(core::Tensor value, ReadOurs(weights, mappings[i]));
        ASSIGN_OR_RETURN(core::Tensor slice,
                         value.Flat().View(part.begin, {part.end - part.begin}));
        RETURN_IF_ERROR(part.local.CopyFrom(slice));
      }
      return absl::OkStatus();
    }();
  }
  // Every rank's outcome before the collective load (NOTE [Agree before acting]).
  const std::shared_ptr<comm::ProcessGroup>& group = units.front()->groups().world;
  RETURN_IF_ERROR(comm::AgreeOnStatus(group.get(), local, where, units.front()->options().timeout));
  return fsdp::LoadShardedStateDict(module, registry, *parts);
}

absl::StatusOr<NamedTensors> HfTensors(const core::Module& module,
                                       const std::map<std::string, core::Shape>& full_shapes,
                                       const HfArchitecture& arch, const std::string& where) {
  NamedTensors tensors;
  for (const auto& [name, p] : module.NamedParameters()) {
    const HfName hf = arch.to_hf(name);
    if (hf.name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": parameter '", name, "' has no ", arch.family, " counterpart"));
    }
    auto full = full_shapes.find(name);
    if (full == full_shapes.end() || !p->data.defined() || p->data.shape() != full->second) {
      return absl::FailedPreconditionError(absl::StrCat(
          where, ": parameter '", name, "' is ", p->data.ToString(), ", not its full shape ",
          full == full_shapes.end() ? "(unknown)" : core::ShapeToString(full->second),
          " (sharded or deferred: Release the model first)"));
    }
    ASSIGN_OR_RETURN(core::Tensor host, p->data.To(core::Device::Cpu(), core::MemoryTag::kOther));
    absl::StatusOr<core::Tensor> value =
        hf.transpose ? Transposed(host)
                     : host.ToDType(core::DType::kFloat32, core::MemoryTag::kOther);
    RETURN_IF_ERROR(value.status());
    const bool bare =
        std::find(arch.unprefixed.begin(), arch.unprefixed.end(), hf.name) != arch.unprefixed.end();
    tensors.emplace_back(bare ? hf.name : absl::StrCat(arch.prefix, hf.name), *std::move(value));
  }
  return tensors;
}

absl::Status WriteHfCheckpoint(const std::string& dir, const Json& config,
                               const NamedTensors& tensors, const std::string& where) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::PermissionDeniedError(
        absl::StrCat(where, ": cannot create the directory: ", error.message()));
  }
  RETURN_IF_ERROR(core::WriteFileAtomically(dir + "/config.json", config.dump(2) + "\n"));
  return ExportSafetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}});
}

}  // namespace internal
}  // namespace checkpoint
