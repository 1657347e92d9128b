// Training checkpoints: an FSDP-wrapped model's shards and its optimizer's state in one
// checkpoint directory (checkpoint/sharded.h), loaded back into a model wrapped at any
// world size and strategy, or into a plain module, each rank reading only the element
// ranges it holds.
//
//   // Every rank, collective:
//   RETURN_IF_ERROR(integration::SaveTrainingCheckpoint("/ckpt/run", *model, &registry,
//                                                       adamw.get(), group.get(), {/*step=*/300}));
//   // Later, any world size (each rank for itself; no communication):
//   ASSIGN_OR_RETURN(integration::LoadedCheckpoint loaded,
//                    integration::LoadTrainingCheckpoint("/ckpt/run", *model, &registry,
//                                                        adamw.get()));   // nullptr: model only
//
// Tensors in the directory: "model/<NamedParameters() name>" with the parameter's full
// shape, and for every optimizer state tensor "optim/<NamedParameters() name>/<state
// name>" ("optim/wte.weight/exp_avg") with the same full shape and range as its
// parameter, so both reshard the same way. Beside them, under the metadata checksum, a
// TrainingRecord (training_checkpoint.proto, metadata record "fsdp.training"): the
// model's structure (modules with their known configuration, parameters and shapes,
// the caller's model_config, a fingerprint), the optimizer's type, step count and
// per-parameter steps and state names, and the training data's identity and position (NOTE
// [Data identity] and NOTE [Data position] in integration/train_module.h). Loading checks
// the record in full and compares the structure with the model's: nothing is dropped,
// reset or loaded into another model silently. Everything checkpoint::Save promises holds:
// the directory is committed atomically, and on failure the previous checkpoint stays
// intact.
//
//   // Loading only what a changed model shares with the checkpoint, explicitly:
//   integration::TrainingLoadOptions partial;
//   partial.mode = integration::LoadMode::kPartial;
//   ASSIGN_OR_RETURN(auto loaded, integration::LoadTrainingCheckpoint(dir, *model, &registry,
//                                                                     nullptr, partial));
//   for (const std::string& t : loaded.skipped_tensors) ...
#ifndef INTEGRATION_CHECKPOINTING_TRAINING_CHECKPOINT_H_
#define INTEGRATION_CHECKPOINTING_TRAINING_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "checkpoint/sharded.h"
#include "comm/process_group.h"
#include "core/module.h"
#include "fsdp/registry.h"
#include "integration/checkpointing/data_identity.h"
#include "optim/optimizer.h"

namespace integration {

// Version of the TrainingRecord written; loads refuse others.
inline constexpr int kTrainingRecordVersion = 1;
// Metadata record key of the TrainingRecord.
inline constexpr char kTrainingRecordKey[] = "fsdp.training";

struct TrainingCheckpointOptions {
  int64_t step = 0;  // training steps taken; stored
  std::map<std::string, std::string>
      user_metadata;                          // stored as is (keys must not start with "fsdp.")
  absl::Duration timeout = absl::Minutes(5);  // of each collective step
  checkpoint::SimulatedCrash simulate_crash =
      checkpoint::SimulatedCrash::kNone;  // test hook, passed to Save
  absl::Status simulate_write_error;      // test hook: SaveOptions::simulate_write_error
  int64_t block_bytes = 0;                // checksum block (SaveOptions::block_bytes); 0: default
  // The model's configuration as the caller knows it ({"n_layer", "2"}, {"n_head", "4"},
  // ...), recorded in the structure; a load given TrainingLoadOptions::model_config
  // compares the two.
  std::map<std::string, std::string> model_config;
  // NOTE [Data identity] (integration/train_module.h): the training data stream's
  // identity (TrainModule::DataIdentity), recorded as is; keys must not be empty.
  // StageRunner::SaveCheckpoint fills it and StageRunner::LoadCheckpoint compares it.
  std::map<std::string, std::string> data_identity;
  // NOTE [Data position] (integration/train_module.h): where in the data the training
  // stands (TrainModule::DataPosition), recorded as is; keys must not be empty.
  std::map<std::string, std::string> data_position;
};

// Writes a checkpoint directory `dir` of `model` (wrapped through `registry`, or plain: a
// module with no units, or registry == nullptr, saves its full parameters) and, when
// `optimizer` is non-null, its state. Collective over `group` (nullptr: a world of one);
// every rank passes its own model/optimizer. Tensor names: "model/<NamedParameters()
// name>" with the parameter's full shape, each rank writing the range it holds
// (fsdp::ShardedStateDict); for every optimizer state tensor "optim/<NamedParameters()
// name>/<state name>" (exp_avg, ...) with the same full shape and range as its parameter.
// Optimizer parameters are matched to model parameters by Parameter object identity (the
// optimizer's own names may differ); an optimizer parameter that is not one of the model's
// is InvalidArgument naming it. The TrainingRecord (model structure with
// options.model_config; optimizer TypeName(), StateNames(), step_count and an entry per
// optimizer parameter, steps = 0 for one that never stepped; options.data_identity and
// options.data_position) goes into the metadata record "fsdp.training", `options.step` and
// `options.user_metadata` beside it. InvalidArgument for a user_metadata key starting with
// "fsdp." or an empty data_identity or data_position key.
// Everything checkpoint::Save promises holds (atomic commit, previous checkpoint intact
// on failure).
absl::Status SaveTrainingCheckpoint(const std::string& dir, core::Module& model,
                                    fsdp::WrapperRegistry* registry,
                                    const optim::Optimizer* optimizer, comm::ProcessGroup* group,
                                    const TrainingCheckpointOptions& options = {});

// SaveTrainingCheckpoint in two calls (NOTE [Asynchronous save] in checkpoint/sharded.h): with
// `background`, the model's and the optimizer's slices are snapshotted and written on a thread
// while the caller trains on; PendingSave::Finish commits. Errors as SaveTrainingCheckpoint's.
absl::StatusOr<std::unique_ptr<checkpoint::PendingSave>> BeginTrainingCheckpoint(
    const std::string& dir, core::Module& model, fsdp::WrapperRegistry* registry,
    const optim::Optimizer* optimizer, comm::ProcessGroup* group,
    const TrainingCheckpointOptions& options, bool background);

struct LoadedCheckpoint {
  int64_t step = 0;  // TrainingCheckpointOptions::step at save time
  int saved_world_size = 0;
  bool has_optimizer_state = false;
  std::string optimizer_type;                        // "" when none saved
  std::map<std::string, std::string> user_metadata;  // the caller's (no "fsdp." keys)
  int64_t bytes_read = 0;                            // checkpoint::LoadStats of this rank
  // TrainingCheckpointOptions::model_config at save time, and the fingerprint of the
  // saved model's structure (ModelStructure.fingerprint).
  std::map<std::string, std::string> model_config;
  std::string structure_fingerprint;
  // TrainingCheckpointOptions::data_identity at save time; empty when the checkpoint
  // records none (saved before checkpoints kept one, or given none).
  std::map<std::string, std::string> data_identity;
  // TrainingCheckpointOptions::data_position at save time; empty when the checkpoint
  // records none (saved before checkpoints kept one, or given none).
  std::map<std::string, std::string> data_position;
  // StageRunner::LoadCheckpoint of a resume (with the optimizer) only, else empty: the
  // keys whose values differ from the module's DataIdentity() and then from its
  // DataPosition() at the checkpoint's step, when it was asked to load anyway
  // (LoadCheckpointOptions::allow_data_change), and, when the checkpoint or the module has
  // no identity or position, why that was not compared (CompareDataIdentity's and
  // CompareDataPosition's notes, joined by "; ").
  std::vector<DataIdentityChange> data_identity_changes;
  std::string data_identity_note;
  // LoadMode::kPartial only (empty after a strict load): every difference found
  // (StructureDifferences' messages, and optimizer parameters without a record entry or
  // entries for parameters the optimizer does not manage), the checkpoint tensors not
  // loaded (optim/ ones only when an optimizer was given), and the model parameters left
  // as they were (their optimizer state, if any, starts fresh).
  std::vector<std::string> structure_differences;
  std::vector<std::string> skipped_tensors;
  std::vector<std::string> unloaded_parameters;
};

// Reads what a checkpoint holds without loading tensors (ReadMetadata + the training
// record, validated against the checkpoint's tensors as a load would: DataLoss naming
// the entry for an inconsistent or missing record).
absl::StatusOr<LoadedCheckpoint> ReadTrainingCheckpointInfo(const std::string& dir);

enum class LoadMode {
  // The model must have exactly the checkpoint's structure (and the optimizer exactly
  // its parameters): any difference is an error.
  kStrict,
  // Loads the parameters (and their optimizer state) that the model and the checkpoint
  // both have with the same shape, and reports everything else in LoadedCheckpoint.
  kPartial,
};

struct TrainingLoadOptions {
  LoadMode mode = LoadMode::kStrict;
  // When non-empty, the caller's expectation of the recorded model_config
  // (TrainingCheckpointOptions::model_config): every key is compared, both ways.
  std::map<std::string, std::string> model_config;
};

// Loads `dir` into `model` as it is laid out now (wrapped at ANY world size and strategy,
// or plain: no units, or registry == nullptr), each rank reading only the element ranges
// it holds (checkpoint::Load with one LoadRequest per tensor range; take the current
// layout from fsdp::ShardedStateDict, fill the parts, then fsdp::LoadShardedStateDict).
// When `optimizer` is non-null, also its state (OptimizerState with this rank's slices;
// a parameter starts fresh only when the record says it never stepped), and
// FailedPrecondition when the checkpoint has no optimizer state or one of another
// TypeName() or StateNames(). Not collective. Everything is checked before anything is
// written to the model or the optimizer:
// - DataLoss naming the entry when the training record is missing, of another version,
//   or disagrees with the checkpoint's tensors (an optimizer entry naming no parameter,
//   a parameter with state tensors but no entry, an entry whose state tensors are
//   missing, steps above step_count, a tensor neither model/ nor optim/, a fingerprint
//   that does not match the recorded structure, a data identity or position key empty or
//   repeated);
// - in LoadMode::kStrict, FailedPrecondition naming the first difference between the
//   checkpoint and the model (StructureDifferences: "checkpoint has tensor
//   model/blocks.1.attn.qkv.weight that the model lacks", a shape that differs,
//   "module <root> (Gpt): n_head: checkpoint 4, model 2", the options' model_config)
//   or the optimizer (a parameter it manages that the record has no entry for, or an
//   entry for one it does not manage); in kPartial these are reported instead;
// - checkpoint::Load's DataLoss (naming the data file and the tensor) for truncated or
//   corrupted files.
absl::StatusOr<LoadedCheckpoint> LoadTrainingCheckpoint(const std::string& dir, core::Module& model,
                                                        fsdp::WrapperRegistry* registry,
                                                        optim::Optimizer* optimizer,
                                                        const TrainingLoadOptions& options);

// The same with default TrainingLoadOptions (strict, no model_config expectation).
absl::StatusOr<LoadedCheckpoint> LoadTrainingCheckpoint(const std::string& dir, core::Module& model,
                                                        fsdp::WrapperRegistry* registry,
                                                        optim::Optimizer* optimizer = nullptr);
}  // namespace integration

#endif  // INTEGRATION_CHECKPOINTING_TRAINING_CHECKPOINT_H_
