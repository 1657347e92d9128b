// State dicts of wrapped modules: full (every parameter gathered to its full shape, on
// every rank or on rank 0 only) and sharded (each rank's local slices with the metadata
// to place them), and loading either into a wrapped module.
//
//   // Save on rank 0, at any world size:
//   ASSIGN_OR_RETURN(fsdp::StateDict full,
//                    fsdp::FullStateDict(*model, &registry, {/*rank0_only=*/true}));
//   // Later, wrapped over another number of ranks (every rank passes the full dict):
//   RETURN_IF_ERROR(fsdp::LoadFullStateDict(*other_model, &other_registry, full));
//
//   ASSIGN_OR_RETURN(std::vector<fsdp::ShardedTensor> mine,
//                    fsdp::ShardedStateDict(*model, &registry));   // no communication
//   RETURN_IF_ERROR(fsdp::LoadShardedStateDict(*model, &registry, mine));  // same layout
//
// Names are those of module.NamedParameters() (tied parameters once, under their first
// name); values are float32 copies in storage of their own (tag kOther). Loading moves
// no tensor between ranks: every rank copies the part of each value its shard holds.
// But whether a dict fits is decided on each rank, so a load is a collective over the
// groups of the module's units (call it on every rank): every rank validates its dict,
// then the ranks agree (NOTE [Agree before acting] in fsdp/internal/unit_agreement.h)
// before anything is written, and again after writing, so all ranks return the same
// outcome. All calls need the module idle (no forward or backward in progress, no
// SummonFullParams).
#ifndef FSDP_STATE_DICT_H_
#define FSDP_STATE_DICT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/module.h"
#include "core/tensor.h"
#include "fsdp/registry.h"

namespace fsdp {

// Parameter name -> full-shape tensor, in NamedParameters() order.
using StateDict = std::vector<std::pair<std::string, core::Tensor>>;

struct FullStateDictOptions {
  // Only rank 0 of the wrap's group gets the values; other ranks get an empty dict
  // (they still take part in the all-gathers).
  bool rank0_only = false;
};

// The full values of every parameter of `module`: one float32 all-gather per unit
// (SummonFullParams without writeback), then copies. A collective: call it on every
// rank. A module without units gives its plain parameters. Errors as SummonFullParams.
absl::StatusOr<StateDict> FullStateDict(core::Module& module, WrapperRegistry* registry,
                                        const FullStateDictOptions& options = {});

// One parameter's part on one rank.
struct ShardedTensor {
  std::string name;
  core::Shape full_shape;
  // The elements [begin, end) of the parameter, flattened row-major, that this rank
  // holds (possibly empty); [0, numel) for a replicated parameter.
  int64_t begin = 0;
  int64_t end = 0;
  // The unit holding it (its label) and where the part starts in the unit's padded
  // flat buffer; "" and 0 for a parameter no unit manages.
  std::string unit;
  int64_t flat_offset = 0;
  // This rank's index in the unit's shard group and that group's size (the number of
  // ranks among which the parameter is split); 0 and 1 when not split.
  int shard_rank = 0;
  int shard_size = 1;
  // True when every rank holds the same whole value (NO_SHARD, or unmanaged).
  bool replicated = false;
  // The part's values: a float32 1-D copy of end - begin elements.
  core::Tensor local;
};

// This rank's parts of every parameter of `module`, in NamedParameters() order. No
// communication.
absl::StatusOr<std::vector<ShardedTensor>> ShardedStateDict(core::Module& module,
                                                            WrapperRegistry* registry);

// Loads `dict` (from FullStateDict, at any world size, or any name -> full-shape tensor
// map of fp32 or bf16 values) into `module`: each rank copies its slice of every
// parameter into its shard, and unmanaged parameters whole. Every parameter must be
// present exactly once with its full shape; InvalidArgument naming the key for a
// missing, unexpected or repeated key or a wrong shape, before anything is written.
// An error on any rank is every rank's error, "rank <r>: <its error>" (same code), and
// then no rank writes anything. Units left unsharded after an evaluation forward are
// resharded first.
absl::Status LoadFullStateDict(core::Module& module, WrapperRegistry* registry,
                               const StateDict& dict);

// Loads this rank's parts saved by ShardedStateDict under the same layout (same wrap,
// world size and rank). InvalidArgument naming the key as LoadFullStateDict, and when
// a part's full shape, range or shard rank/size differ from this rank's (load a full
// state dict to change the layout). As LoadFullStateDict, an error on any rank is
// every rank's, and then nothing is written anywhere.
absl::Status LoadShardedStateDict(core::Module& module, WrapperRegistry* registry,
                                  const std::vector<ShardedTensor>& dict);

}  // namespace fsdp

#endif  // FSDP_STATE_DICT_H_
