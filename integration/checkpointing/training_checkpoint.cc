#include "integration/checkpointing/training_checkpoint.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"
#include "fsdp/internal/unit_agreement.h"
#include "fsdp/state_dict.h"
#include "integration/checkpointing/model_structure.h"
#include "integration/checkpointing/training_checkpoint.pb.h"

namespace integration {
namespace {

constexpr char kOptimPrefix[] = "optim/";

std::string ModelKey(const std::string& param) { return absl::StrCat(kModelTensorPrefix, param); }
std::string OptimKey(const std::string& param, const std::string& state) {
  return absl::StrCat(kOptimPrefix, param, "/", state);
}

// Model parameter name by Parameter object.
std::map<const core::Parameter*, std::string> NamesByIdentity(const core::Module& model) {
  std::map<const core::Parameter*, std::string> out;
  for (const auto& [name, p] : model.NamedParameters()) out.emplace(p.get(), name);
  return out;
}

std::vector<std::pair<std::string, core::Shape>> FullShapes(
    const std::vector<fsdp::ShardedTensor>& parts) {
  std::vector<std::pair<std::string, core::Shape>> out;
  for (const fsdp::ShardedTensor& t : parts) out.emplace_back(t.name, t.full_shape);
  return out;
}

core::Shape ShapeOf(const ParameterRecord& p) {
  return core::Shape(p.shape().begin(), p.shape().end());
}

// Model parameter name by optimizer parameter name.
using ModelNames = std::map<std::string, std::string>;
// The state names saved for each optimizer parameter, by its name.
using SavedStates = std::map<std::string, std::set<std::string>>;
// A model structure's parameter records by name.
using ParameterRecords = std::map<std::string, const ParameterRecord*>;

// InvalidArgument, opening with `where`, for a user_metadata key with the reserved
// prefix "fsdp." or an empty data identity or position key.
absl::Status CheckSaveOptions(const TrainingCheckpointOptions& options, const std::string& where) {
  for (const auto& [key, value] : options.user_metadata) {
    if (absl::StartsWith(key, "fsdp.")) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": TrainingCheckpointOptions.user_metadata key '", key,
                       "' uses the reserved prefix \"fsdp.\""));
    }
  }
  for (const auto& [field, entries] : {std::pair{"data_identity", &options.data_identity},
                                       std::pair{"data_position", &options.data_position}}) {
    for (const auto& [key, value] : *entries) {
      if (key.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": TrainingCheckpointOptions.", field,
                                                       " has an empty key (value '", value, "')"));
      }
    }
  }
  return absl::OkStatus();
}

// The checkpoint::SaveOptions of `options`; the training record is added by the caller.
checkpoint::SaveOptions SaveOptionsOf(const TrainingCheckpointOptions& options) {
  checkpoint::SaveOptions save;
  save.step = options.step;
  save.user_metadata = options.user_metadata;
  save.timeout = options.timeout;
  save.simulate_crash = options.simulate_crash;
  save.simulate_write_error = options.simulate_write_error;
  if (options.block_bytes > 0) save.block_bytes = options.block_bytes;
  return save;
}

// Appends one ConfigEntry per entry of `entries`, in key order.
void AddConfigEntries(const std::map<std::string, std::string>& entries,
                      google::protobuf::RepeatedPtrField<ConfigEntry>* out) {
  for (const auto& [key, value] : entries) {
    ConfigEntry* e = out->Add();
    e->set_key(key);
    e->set_value(value);
  }
}

// The model name of each parameter `optimizer` manages, by its optimizer name;
// InvalidArgument for one that is not a parameter of `model`.
absl::StatusOr<ModelNames> ModelNamesOf(const optim::Optimizer& optimizer,
                                        const core::Module& model, const std::string& where) {
  const std::map<const core::Parameter*, std::string> names = NamesByIdentity(model);
  ModelNames model_name_of;
  for (const auto& [opt_name, p] : optimizer.named_parameters()) {
    auto it = names.find(p.get());
    if (it == names.end()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": the ", optimizer.TypeName(),
                                                     " parameter '", opt_name,
                                                     "' is not a parameter of ", model.Describe()));
    }
    model_name_of[opt_name] = it->second;
  }
  return model_name_of;
}

// Appends a slice "optim/<model name>/<state name>" to `slices` for each of `state`'s
// tensors, this rank's part of its parameter. Returns the state names saved for each
// parameter, by optimizer name.
absl::StatusOr<SavedStates> AddStateSlices(const optim::OptimizerState& state,
                                           const std::vector<std::string>& state_names,
                                           const ModelNames& model_name_of,
                                           const std::vector<fsdp::ShardedTensor>& parts,
                                           const std::string& where,
                                           std::vector<checkpoint::TensorSlice>* slices) {
  std::map<std::string, const fsdp::ShardedTensor*> part_of;
  for (const fsdp::ShardedTensor& t : parts) part_of[t.name] = &t;
  SavedStates saved_states;
  // State keys are "<optimizer name>.<state name>".
  for (const auto& [key, tensor] : state.tensors) {
    bool matched = false;
    for (const std::string& state_name : state_names) {
      const std::string suffix = "." + state_name;
      if (!absl::EndsWith(key, suffix)) continue;
      const std::string opt_name = key.substr(0, key.size() - suffix.size());
      auto m = model_name_of.find(opt_name);
      if (m == model_name_of.end()) continue;
      const fsdp::ShardedTensor& part = *part_of.at(m->second);
      if (tensor.numel() != part.end - part.begin) {
        return absl::FailedPreconditionError(
            absl::StrCat(where, ": optimizer state '", key, "' has ", tensor.numel(),
                         " elements but parameter '", m->second, "' holds ", part.end - part.begin,
                         " on this rank (the optimizer stepped under another layout)"));
      }
      slices->push_back({OptimKey(m->second, state_name), part.full_shape, core::DType::kFloat32,
                         part.begin, part.end, tensor});
      saved_states[opt_name].insert(state_name);
      matched = true;
      break;
    }
    if (!matched) {
      return absl::InternalError(absl::StrCat(where, ": optimizer state key '", key,
                                              "' matches no parameter and state name"));
    }
  }
  return saved_states;
}

// Fills the optimizer record: its type, step count and state names, and one entry per
// managed parameter. InternalError for a parameter whose saved states are not all or
// nothing as its steps say.
absl::Status FillOptimizerRecord(const optim::Optimizer& optimizer,
                                 const optim::OptimizerState& state,
                                 const std::vector<std::string>& state_names,
                                 const ModelNames& model_name_of, const SavedStates& saved_states,
                                 const std::string& where, OptimizerRecord* o) {
  std::map<std::string, int64_t> steps;
  for (const auto& [opt_name, n] : state.param_steps) steps[opt_name] = n;
  o->set_type(optimizer.TypeName());
  o->set_step_count(state.step_count);
  for (const std::string& s : state_names) o->add_state_names(s);
  // One entry per managed parameter, never-stepped ones included (steps = 0), so a
  // load can tell "never stepped" from "missing".
  const std::set<std::string> none;
  for (const auto& [opt_name, p] : optimizer.named_parameters()) {
    ParameterOptimizerRecord* e = o->add_parameters();
    e->set_parameter(model_name_of.at(opt_name));
    auto it = steps.find(opt_name);
    e->set_steps(it == steps.end() ? 0 : it->second);
    auto saved = saved_states.find(opt_name);
    const std::set<std::string>& have = saved == saved_states.end() ? none : saved->second;
    const bool complete = e->steps() > 0 ? have.size() == state_names.size() : have.empty();
    if (!complete) {
      return absl::InternalError(absl::StrCat(
          where, ": the ", optimizer.TypeName(), " parameter '", opt_name, "' has taken ",
          e->steps(), " steps but has state tensors [", absl::StrJoin(have, ", "), "]"));
    }
    if (e->steps() > 0) {
      for (const std::string& s : state_names) e->add_state(s);
    }
  }
  return absl::OkStatus();
}

// The optimizer's part of a save: its state tensors appended to `slices` and its
// record written to `record`.
absl::Status AddOptimizerState(const optim::Optimizer& optimizer, const core::Module& model,
                               const std::vector<fsdp::ShardedTensor>& parts,
                               const std::string& where,
                               std::vector<checkpoint::TensorSlice>* slices,
                               OptimizerRecord* record) {
  ASSIGN_OR_RETURN(const ModelNames model_name_of, ModelNamesOf(optimizer, model, where));
  const optim::OptimizerState state = optimizer.State();
  const std::vector<std::string> state_names = optimizer.StateNames();
  ASSIGN_OR_RETURN(const SavedStates saved_states,
                   AddStateSlices(state, state_names, model_name_of, parts, where, slices));
  return FillOptimizerRecord(optimizer, state, state_names, model_name_of, saved_states, where,
                             record);
}

}  // namespace

absl::StatusOr<std::unique_ptr<checkpoint::PendingSave>> BeginTrainingCheckpoint(
    const std::string& dir, core::Module& model, fsdp::WrapperRegistry* registry,
    const optim::Optimizer* optimizer, comm::ProcessGroup* group,
    const TrainingCheckpointOptions& options, bool background) {
  const std::string where =
      absl::StrCat("SaveTrainingCheckpoint('", dir, "', ", model.Describe(), ")");
  RETURN_IF_ERROR(CheckSaveOptions(options, where));
  fsdp::WrapperRegistry no_units;  // a plain module: every parameter whole
  if (registry == nullptr) registry = &no_units;
  ASSIGN_OR_RETURN(std::vector<fsdp::ShardedTensor> parts, fsdp::ShardedStateDict(model, registry));
  std::vector<checkpoint::TensorSlice> slices;
  for (const fsdp::ShardedTensor& t : parts) {
    slices.push_back(
        {ModelKey(t.name), t.full_shape, core::DType::kFloat32, t.begin, t.end, t.local});
  }
  checkpoint::SaveOptions save = SaveOptionsOf(options);
  TrainingRecord record;
  record.set_version(kTrainingRecordVersion);
  *record.mutable_model() = DescribeModel(model, FullShapes(parts), options.model_config);
  AddConfigEntries(options.data_identity, record.mutable_data_identity());
  AddConfigEntries(options.data_position, record.mutable_data_position());
  if (optimizer != nullptr) {
    RETURN_IF_ERROR(
        AddOptimizerState(*optimizer, model, parts, where, &slices, record.mutable_optimizer()));
  }
  save.records[kTrainingRecordKey] = record.SerializeAsString();
  absl::StatusOr<std::unique_ptr<checkpoint::PendingSave>> pending =
      checkpoint::BeginSave(dir, slices, save, group, background);
  RETURN_IF_ERROR(core::Annotate(pending.status(), where));
  return pending;
}

absl::Status SaveTrainingCheckpoint(const std::string& dir, core::Module& model,
                                    fsdp::WrapperRegistry* registry,
                                    const optim::Optimizer* optimizer, comm::ProcessGroup* group,
                                    const TrainingCheckpointOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<checkpoint::PendingSave> pending,
                   BeginTrainingCheckpoint(dir, model, registry, optimizer, group, options,
                                           /*background=*/false));
  return core::Annotate(pending->Finish(), absl::StrCat("SaveTrainingCheckpoint('", dir, "', ",
                                                        model.Describe(), ")"));
}

namespace {

// DataLoss "<where>: training record: <what>", for a record that contradicts itself or
// its checkpoint.
absl::Status RecordLoss(const std::string& where, const std::string& what) {
  return absl::DataLossError(absl::StrCat(where, ": training record: ", what));
}

// Checks that the recorded model's parameters are exactly the checkpoint's model/
// tensors, with their shapes, and that its fingerprint matches its structure; returns
// the parameters by name.
absl::StatusOr<ParameterRecords> CheckModelRecord(const TrainingRecord& record,
                                                  const checkpoint::CheckpointInfo& info,
                                                  const std::string& where) {
  ParameterRecords params;
  for (const ParameterRecord& p : record.model().parameters()) {
    if (!params.emplace(p.name(), &p).second) {
      return RecordLoss(where, absl::StrCat("parameter '", p.name(), "' is listed twice"));
    }
    const checkpoint::TensorInfo* t = info.Find(ModelKey(p.name()));
    if (t == nullptr) {
      return RecordLoss(
          where, absl::StrCat("parameter '", p.name(), "' has no tensor ", ModelKey(p.name())));
    }
    if (t->shape != ShapeOf(p)) {
      return RecordLoss(
          where, absl::StrCat("parameter '", p.name(), "' is ", core::ShapeToString(ShapeOf(p)),
                              " but tensor ", t->name, " is ", core::ShapeToString(t->shape)));
    }
  }
  if (StructureFingerprint(record.model()) != record.model().fingerprint()) {
    return RecordLoss(
        where,
        absl::StrCat("the model structure's fingerprint ", record.model().fingerprint(),
                     " does not match the structure (", StructureFingerprint(record.model()), ")"));
  }
  for (const checkpoint::TensorInfo& t : info.tensors) {
    if (absl::StartsWith(t.name, kModelTensorPrefix)) {
      if (!params.count(t.name.substr(std::string(kModelTensorPrefix).size()))) {
        return RecordLoss(
            where, absl::StrCat("tensor ", t.name, " is not a parameter of the recorded model"));
      }
    } else if (!absl::StartsWith(t.name, kOptimPrefix)) {
      return RecordLoss(where, absl::StrCat("tensor '", t.name, "' is neither model/ nor optim/"));
    }
  }
  return params;
}

// Checks one optimizer entry of `o`: it names a parameter of `params`, its steps are in
// [0, step_count], and it lists exactly the state tensors its steps call for, each
// present with the parameter's shape. Adds those tensors' names to `listed`.
absl::Status CheckOptimizerEntry(const ParameterOptimizerRecord& e, const OptimizerRecord& o,
                                 const ParameterRecords& params,
                                 const checkpoint::CheckpointInfo& info, const std::string& where,
                                 std::set<std::string>* listed) {
  const std::string what = absl::StrCat("optimizer entry '", e.parameter(), "'");
  auto p = params.find(e.parameter());
  if (p == params.end()) {
    return RecordLoss(where, absl::StrCat(what, " names no parameter of the checkpoint (no tensor ",
                                          ModelKey(e.parameter()), ")"));
  }
  if (e.steps() < 0 || e.steps() > o.step_count()) {
    return RecordLoss(where, absl::StrCat(what, " has taken ", e.steps(),
                                          " steps, not in [0, step_count ", o.step_count(), "]"));
  }
  const std::vector<std::string> state(e.state().begin(), e.state().end());
  const std::vector<std::string> expected =
      e.steps() == 0 ? std::vector<std::string>{}
                     : std::vector<std::string>(o.state_names().begin(), o.state_names().end());
  if (state != expected) {
    return RecordLoss(where, absl::StrCat(what, " (", e.steps(), " steps) lists state [",
                                          absl::StrJoin(state, ", "), "], expected [",
                                          absl::StrJoin(expected, ", "), "]"));
  }
  for (const std::string& s : state) {
    const std::string key = OptimKey(e.parameter(), s);
    const checkpoint::TensorInfo* t = info.Find(key);
    if (t == nullptr) {
      return RecordLoss(where, absl::StrCat(what, ": its state tensor ", key, " is missing"));
    }
    if (t->shape != ShapeOf(*p->second)) {
      return RecordLoss(where, absl::StrCat(what, ": its state tensor ", key, " is ",
                                            core::ShapeToString(t->shape), ", not the parameter's ",
                                            core::ShapeToString(ShapeOf(*p->second))));
    }
    listed->insert(key);
  }
  return absl::OkStatus();
}

// Checks the optimizer record: a type, a step count >= 0, distinct state names without
// '/', and each parameter's entry once (CheckOptimizerEntry). Returns the names of the
// state tensors its entries list.
absl::StatusOr<std::set<std::string>> CheckOptimizerRecord(const OptimizerRecord& o,
                                                           const ParameterRecords& params,
                                                           const checkpoint::CheckpointInfo& info,
                                                           const std::string& where) {
  if (o.type().empty()) return RecordLoss(where, "the optimizer has no type");
  if (o.step_count() < 0) {
    return RecordLoss(where, absl::StrCat("the optimizer's step_count is ", o.step_count()));
  }
  std::set<std::string> names;
  for (const std::string& s : o.state_names()) {
    if (s.empty() || s.find('/') != std::string::npos || !names.insert(s).second) {
      return RecordLoss(where, absl::StrCat("the optimizer's state name '", s,
                                            "' is empty, has a '/' or is repeated"));
    }
  }
  std::set<std::string> listed;
  std::set<std::string> entries;
  for (const ParameterOptimizerRecord& e : o.parameters()) {
    if (!entries.insert(e.parameter()).second) {
      return RecordLoss(where,
                        absl::StrCat("optimizer entry '", e.parameter(), "' is listed twice"));
    }
    RETURN_IF_ERROR(CheckOptimizerEntry(e, o, params, info, where, &listed));
  }
  return listed;
}

// Checks that the data identity's and position's keys are sorted, each once, none empty.
absl::Status CheckDataEntries(const TrainingRecord& record, const std::string& where) {
  for (const auto& [what, entries] : {std::pair{"data identity", &record.data_identity()},
                                      std::pair{"data position", &record.data_position()}}) {
    for (int i = 0; i < entries->size(); ++i) {
      const std::string& key = entries->Get(i).key();
      if (key.empty() || (i > 0 && key <= entries->Get(i - 1).key())) {
        return RecordLoss(
            where, absl::StrCat(what, " key '", key, "' is empty, repeated or out of order"));
      }
    }
  }
  return absl::OkStatus();
}

// The training record of a checkpoint, checked against its tensors (see
// LoadTrainingCheckpoint for the errors).
absl::StatusOr<TrainingRecord> ReadRecord(const checkpoint::CheckpointInfo& info,
                                          const std::string& dir) {
  const std::string where = absl::StrCat("checkpoint '", dir, "'");
  auto it = info.records.find(kTrainingRecordKey);
  if (it == info.records.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, " has no training record (metadata record \"", kTrainingRecordKey,
                     "\"): it was not written by SaveTrainingCheckpoint"));
  }
  TrainingRecord record;
  if (!record.ParseFromString(it->second)) {
    return RecordLoss(where, "does not parse as a TrainingRecord");
  }
  if (record.version() != kTrainingRecordVersion) {
    return absl::FailedPreconditionError(absl::StrCat(where, ": training record version ",
                                                      record.version(), "; this build reads ",
                                                      kTrainingRecordVersion));
  }
  // The model's parameters are exactly the model/ tensors.
  ASSIGN_OR_RETURN(const ParameterRecords params, CheckModelRecord(record, info, where));
  // Optimizer entries: each names a parameter, lists exactly its state tensors, and
  // every optim/ tensor belongs to one.
  std::set<std::string> listed;
  if (record.has_optimizer()) {
    ASSIGN_OR_RETURN(listed, CheckOptimizerRecord(record.optimizer(), params, info, where));
  }
  RETURN_IF_ERROR(CheckDataEntries(record, where));
  for (const checkpoint::TensorInfo& t : info.tensors) {
    if (absl::StartsWith(t.name, kOptimPrefix) && !listed.count(t.name)) {
      return RecordLoss(
          where, absl::StrCat(
                     "tensor ", t.name, " belongs to no entry of the ",
                     record.has_optimizer() ? "optimizer record" : "record (it has no optimizer)"));
    }
  }
  return record;
}

LoadedCheckpoint InfoFrom(const checkpoint::CheckpointInfo& info, const TrainingRecord& record) {
  LoadedCheckpoint out;
  out.step = info.step;
  out.saved_world_size = info.world_size;
  out.has_optimizer_state = record.has_optimizer();
  out.optimizer_type = record.has_optimizer() ? record.optimizer().type() : "";
  for (const auto& [key, value] : info.user_metadata) {
    if (!absl::StartsWith(key, "fsdp.")) out.user_metadata[key] = value;
  }
  for (const ConfigEntry& e : record.model().config()) out.model_config[e.key()] = e.value();
  out.structure_fingerprint = record.model().fingerprint();
  for (const ConfigEntry& e : record.data_identity()) out.data_identity[e.key()] = e.value();
  for (const ConfigEntry& e : record.data_position()) out.data_position[e.key()] = e.value();
  return out;
}

// FailedPrecondition unless the checkpoint holds state of `optimizer`'s type with its
// state tensors.
absl::Status CheckOptimizerMatches(const optim::Optimizer& optimizer, const TrainingRecord& record,
                                   const std::string& where) {
  if (!record.has_optimizer()) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, ": the checkpoint has no optimizer state (it was saved without an optimizer)"));
  }
  const std::string& type = record.optimizer().type();
  if (type != optimizer.TypeName()) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": the checkpoint holds ", type, " state, not ", optimizer.TypeName()));
  }
  const std::vector<std::string> names = optimizer.StateNames();
  const std::vector<std::string> saved(record.optimizer().state_names().begin(),
                                       record.optimizer().state_names().end());
  if (names != saved) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, ": the checkpoint's ", type, " state has tensors [", absl::StrJoin(saved, ", "),
        "] per parameter, this one keeps [", absl::StrJoin(names, ", "), "]"));
  }
  return absl::OkStatus();
}

// Appends a request for each of `parts` the checkpoint has with the same full shape to
// `requests`, and the names of the others to `unloaded`. Returns the requested
// parameters' names.
std::set<std::string> RequestParameters(const std::vector<fsdp::ShardedTensor>& parts,
                                        const ModelStructure& saved,
                                        std::vector<checkpoint::LoadRequest>* requests,
                                        std::vector<std::string>* unloaded) {
  ParameterRecords saved_params;
  for (const ParameterRecord& p : saved.parameters()) saved_params[p.name()] = &p;
  std::set<std::string> loaded;
  for (const fsdp::ShardedTensor& t : parts) {
    auto it = saved_params.find(t.name);
    if (it == saved_params.end() || ShapeOf(*it->second) != t.full_shape) {
      unloaded->push_back(t.name);  // kPartial only: strict refused before
      continue;
    }
    requests->push_back({ModelKey(t.name), t.begin, t.end, t.local});
    loaded.insert(t.name);
  }
  return loaded;
}

// The checkpoint's entries for parameters that `optimizer` does not manage: under
// `strict` FailedPrecondition for the first, otherwise each noted in `differences`.
absl::Status NoteUnmanagedEntries(const OptimizerRecord& o, const optim::Optimizer& optimizer,
                                  const std::set<std::string>& managed, bool strict,
                                  const std::string& where, std::vector<std::string>* differences) {
  for (const ParameterOptimizerRecord& e : o.parameters()) {
    if (managed.count(e.parameter())) continue;
    const std::string message =
        absl::StrCat("the checkpoint has ", o.type(), " state for parameter '", e.parameter(),
                     "', which this ", optimizer.TypeName(), " does not manage");
    if (strict) return absl::FailedPreconditionError(absl::StrCat(where, ": ", message));
    differences->push_back(message);
  }
  return absl::OkStatus();
}

// The optimizer state to load: this rank's slice of every state tensor of each managed
// parameter in `loaded` that has stepped, each with its request appended to `requests`.
// A managed parameter without an entry in `o` starts fresh (FailedPrecondition under
// `strict`), as does an entry without a managed parameter (NoteUnmanagedEntries); both
// are noted in `differences`.
absl::StatusOr<optim::OptimizerState> RequestOptimizerState(
    const optim::Optimizer& optimizer, const core::Module& model,
    const std::vector<fsdp::ShardedTensor>& parts, const OptimizerRecord& o,
    const std::set<std::string>& loaded, bool strict, const std::string& where,
    std::vector<checkpoint::LoadRequest>* requests, std::vector<std::string>* differences) {
  std::map<const core::Parameter*, const fsdp::ShardedTensor*> part_by_param;
  {
    size_t i = 0;
    for (const auto& [name, p] : model.NamedParameters()) part_by_param[p.get()] = &parts[i++];
  }
  std::map<std::string, const ParameterOptimizerRecord*> entries;
  for (const ParameterOptimizerRecord& e : o.parameters()) entries[e.parameter()] = &e;
  std::set<std::string> managed;  // model names of the parameters the optimizer manages
  optim::OptimizerState state;
  state.step_count = o.step_count();
  for (const auto& [opt_name, p] : optimizer.named_parameters()) {
    auto it = part_by_param.find(p.get());
    if (it == part_by_param.end()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": the ", optimizer.TypeName(),
                                                     " parameter '", opt_name,
                                                     "' is not a parameter of ", model.Describe()));
    }
    const fsdp::ShardedTensor& part = *it->second;
    managed.insert(part.name);
    auto e = entries.find(part.name);
    if (e == entries.end()) {
      const std::string message = absl::StrCat("the ", optimizer.TypeName(), " parameter '",
                                               opt_name, "' (model parameter '", part.name,
                                               "') has no entry in the checkpoint's optimizer "
                                               "record (the saved optimizer did not manage it)");
      if (strict) {
        return absl::FailedPreconditionError(
            absl::StrCat(where, ": ", message, "; refusing to start its state fresh"));
      }
      differences->push_back(absl::StrCat(message, "; its state starts fresh"));
      continue;
    }
    if (!loaded.count(part.name)) continue;  // kPartial: the parameter itself was not loaded
    if (e->second->steps() == 0) continue;   // recorded as never stepped: starts fresh
    state.param_steps.push_back({opt_name, e->second->steps()});
    for (const std::string& state_name : e->second->state()) {
      ASSIGN_OR_RETURN(core::Tensor slice,
                       core::Tensor::Allocate({part.end - part.begin}, core::DType::kFloat32,
                                              core::MemoryTag::kOptim));
      requests->push_back({OptimKey(part.name, state_name), part.begin, part.end, slice});
      state.tensors.push_back({absl::StrCat(opt_name, ".", state_name), slice});
    }
  }
  RETURN_IF_ERROR(NoteUnmanagedEntries(o, optimizer, managed, strict, where, differences));
  return state;
}

// The checkpoint's tensors that `requests` leave out; its optimizer state only when
// `with_optimizer`.
std::vector<std::string> SkippedTensors(const checkpoint::CheckpointInfo& info,
                                        const std::vector<checkpoint::LoadRequest>& requests,
                                        bool with_optimizer) {
  std::set<std::string> requested;  // checkpoint tensors read
  for (const checkpoint::LoadRequest& r : requests) requested.insert(r.name);
  std::vector<std::string> skipped;
  for (const checkpoint::TensorInfo& t : info.tensors) {
    const bool optim = absl::StartsWith(t.name, kOptimPrefix);
    if (!requested.count(t.name) && (!optim || with_optimizer)) skipped.push_back(t.name);
  }
  return skipped;
}

}  // namespace

absl::StatusOr<LoadedCheckpoint> ReadTrainingCheckpointInfo(const std::string& dir) {
  ASSIGN_OR_RETURN(checkpoint::CheckpointInfo info, checkpoint::ReadMetadata(dir));
  ASSIGN_OR_RETURN(TrainingRecord record, ReadRecord(info, dir));
  return InfoFrom(info, record);
}

absl::StatusOr<LoadedCheckpoint> LoadTrainingCheckpoint(const std::string& dir, core::Module& model,
                                                        fsdp::WrapperRegistry* registry,
                                                        optim::Optimizer* optimizer) {
  return LoadTrainingCheckpoint(dir, model, registry, optimizer, TrainingLoadOptions());
}

absl::StatusOr<LoadedCheckpoint> LoadTrainingCheckpoint(const std::string& dir, core::Module& model,
                                                        fsdp::WrapperRegistry* registry,
                                                        optim::Optimizer* optimizer,
                                                        const TrainingLoadOptions& options) {
  const std::string where =
      absl::StrCat("LoadTrainingCheckpoint('", dir, "', ", model.Describe(), ")");
  const bool strict = options.mode == LoadMode::kStrict;
  ASSIGN_OR_RETURN(checkpoint::CheckpointInfo info, checkpoint::ReadMetadata(dir));
  absl::StatusOr<TrainingRecord> read = ReadRecord(info, dir);
  if (!read.ok()) return core::Annotate(read.status(), where);
  const TrainingRecord& record = *read;
  LoadedCheckpoint out = InfoFrom(info, record);
  if (optimizer != nullptr) RETURN_IF_ERROR(CheckOptimizerMatches(*optimizer, record, where));
  // The current layout and structure, compared with the checkpoint's before anything is read.
  fsdp::WrapperRegistry no_units;  // a plain module: every parameter whole
  if (registry == nullptr) registry = &no_units;
  ASSIGN_OR_RETURN(std::vector<fsdp::ShardedTensor> parts, fsdp::ShardedStateDict(model, registry));
  const ModelStructure current = DescribeModel(model, FullShapes(parts), options.model_config);
  std::vector<std::string> differences =
      StructureDifferences(record.model(), current, !options.model_config.empty());
  if (strict && !differences.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": the checkpoint's model differs from this one: ", differences.front(),
                     differences.size() > 1
                         ? absl::StrCat(" (and ", differences.size() - 1, " more differences)")
                         : "",
                     "; LoadMode::kPartial loads only what both have"));
  }
  std::vector<checkpoint::LoadRequest> requests;
  const std::set<std::string> loaded =
      RequestParameters(parts, record.model(), &requests, &out.unloaded_parameters);
  // Optimizer state: this rank's slice of every state tensor of each parameter.
  optim::OptimizerState state;
  if (optimizer != nullptr) {
    ASSIGN_OR_RETURN(state, RequestOptimizerState(*optimizer, model, parts, record.optimizer(),
                                                  loaded, strict, where, &requests, &differences));
  }
  if (!strict) {
    out.structure_differences = std::move(differences);
    out.skipped_tensors = SkippedTensors(info, requests, optimizer != nullptr);
  }
  // Reading fails on the ranks whose bytes are damaged only; LoadShardedStateDict is
  // collective over the units' groups, so every rank learns the outcome first
  // (fsdp NOTE [Agree before acting]).
  absl::StatusOr<checkpoint::LoadStats> stats = checkpoint::Load(dir, requests);
  RETURN_IF_ERROR(fsdp::internal::AgreeAcrossUnitGroups(model, registry, stats.status(), where));
  out.bytes_read = stats->bytes_read;
  RETURN_IF_ERROR(core::Annotate(fsdp::LoadShardedStateDict(model, registry, parts), where));
  if (optimizer != nullptr) RETURN_IF_ERROR(core::Annotate(optimizer->LoadState(state), where));
  return out;
}

}  // namespace integration
