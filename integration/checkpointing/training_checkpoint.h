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
// parameter, so both reshard the same way. The optimizer's step counts and type are in
// the metadata under "fsdp.optimizer" (JSON). Everything checkpoint::Save promises
// holds: the directory is committed atomically, and on failure the previous checkpoint
// stays intact.
#ifndef INTEGRATION_CHECKPOINTING_TRAINING_CHECKPOINT_H_
#define INTEGRATION_CHECKPOINTING_TRAINING_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "checkpoint/sharded.h"
#include "comm/process_group.h"
#include "core/module.h"
#include "fsdp/registry.h"
#include "optim/optimizer.h"

namespace integration {

struct TrainingCheckpointOptions {
  int64_t step = 0;                                   // training steps taken; stored
  std::map<std::string, std::string> user_metadata;   // stored as is (keys must not start with "fsdp.")
  absl::Duration timeout = absl::Minutes(5);          // of each collective step
  checkpoint::SimulatedCrash simulate_crash = checkpoint::SimulatedCrash::kNone;  // test hook, passed to Save
  int64_t block_bytes = 0;                            // checksum block (SaveOptions::block_bytes); 0: default
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
// is InvalidArgument naming it. step_count, per-parameter step counts and the optimizer's
// TypeName() go into the metadata (user_metadata keys "fsdp.*", e.g. JSON via nlohmann),
// as do `options.step` and `options.user_metadata`. Everything checkpoint::Save promises
// holds (atomic commit, previous checkpoint intact on failure).
absl::Status SaveTrainingCheckpoint(const std::string& dir, core::Module& model,
                                    fsdp::WrapperRegistry* registry,
                                    const optim::Optimizer* optimizer,
                                    comm::ProcessGroup* group,
                                    const TrainingCheckpointOptions& options = {});

struct LoadedCheckpoint {
  int64_t step = 0;                 // TrainingCheckpointOptions::step at save time
  int saved_world_size = 0;
  bool has_optimizer_state = false;
  std::string optimizer_type;       // "" when none saved
  std::map<std::string, std::string> user_metadata;  // the caller's (no "fsdp." keys)
  int64_t bytes_read = 0;           // checkpoint::LoadStats of this rank
};

// Reads what a checkpoint holds without loading tensors (ReadMetadata + the fsdp.* keys).
absl::StatusOr<LoadedCheckpoint> ReadTrainingCheckpointInfo(const std::string& dir);

// Loads `dir` into `model` as it is laid out now (wrapped at ANY world size and strategy,
// or plain: no units, or registry == nullptr), each rank reading only the element ranges
// it holds (checkpoint::Load with one LoadRequest per tensor range; take the current
// layout from fsdp::ShardedStateDict, fill the parts, then fsdp::LoadShardedStateDict).
// When `optimizer` is non-null, also its state (OptimizerState with this rank's slices;
// parameters with no saved state start fresh), and FailedPrecondition when the checkpoint
// has no optimizer state or one of another TypeName(). Not collective. Errors name the
// tensor/parameter: NotFound for a model parameter the checkpoint lacks, InvalidArgument
// for a shape mismatch (both before writing anything to the model), and checkpoint::Load's
// DataLoss (naming the data file and the tensor) for truncated/corrupted files.
absl::StatusOr<LoadedCheckpoint> LoadTrainingCheckpoint(const std::string& dir,
                                                        core::Module& model,
                                                        fsdp::WrapperRegistry* registry,
                                                        optim::Optimizer* optimizer = nullptr);
}  // namespace integration

#endif  // INTEGRATION_CHECKPOINTING_TRAINING_CHECKPOINT_H_
