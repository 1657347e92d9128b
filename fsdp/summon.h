// SummonFullParams: a scope in which a wrapped module's parameters are full-shape
// tensors holding the full values, for inspection, evaluation code that must not go
// through the hooks, or in-place edits written back into the shards.
//
//   {
//     ASSIGN_OR_RETURN(std::unique_ptr<fsdp::FullParamsScope> full,
//                      fsdp::SummonFullParams(*model, &registry, {/*writeback=*/true}));
//     model->NamedParameters()[0].second->data.Fill(0.0f);    // a full-shape tensor
//     RETURN_IF_ERROR(full->Close());   // writes the change into the shards, reshards
//   }
//
// A collective over each unit's shard group on open (an all-gather per unit in float32,
// whatever the mixed precision): call it on every rank. While the scope is open, the
// units' hooks refuse to run (forward or backward through them is FailedPrecondition
// naming the unit), and gradients are left as they were.
#ifndef FSDP_SUMMON_H_
#define FSDP_SUMMON_H_

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/module.h"
#include "fsdp/registry.h"
#include "fsdp/unit.h"

namespace fsdp {

struct SummonOptions {
  // On close, copy each rank's own chunk of the (possibly edited) full values back into
  // its shard. Edits must then be the same on every rank, since each rank writes back
  // only the chunk it owns.
  bool writeback = true;
  // Only rank 0 of the wrap's group keeps the full values; other ranks gather (the
  // collective is the same) and go back to their shards at once. Incompatible with
  // writeback.
  bool rank0_only = false;
};

// The open scope. Closing (Close() or destruction) writes back if asked and reshards.
class FullParamsScope {
 public:
  FullParamsScope(std::vector<std::shared_ptr<Unit>> units, bool writeback, bool holds_full);
  // Closes if still open; an error is logged (call Close() to see it).
  ~FullParamsScope();
  FullParamsScope(const FullParamsScope&) = delete;
  FullParamsScope& operator=(const FullParamsScope&) = delete;

  // Writes back (when asked) and reshards every unit; the first error is returned after
  // trying all. A second call is a no-op returning OK.
  absl::Status Close();
  bool open() const { return open_; }
  // Whether this rank's parameters are full while the scope is open (false on ranks
  // other than 0 under rank0_only).
  bool holds_full() const { return holds_full_; }

 private:
  std::vector<std::shared_ptr<Unit>> units_;
  bool writeback_;
  bool holds_full_;
  bool open_ = true;
};

// Opens a scope over every unit rooted in `module`'s subtree (none: an empty scope;
// the module's parameters are plain already). InvalidArgument for a null registry or
// writeback with rank0_only; FailedPrecondition while a forward or backward is in
// progress, when `module` is inside a unit it is not the root of, when a unit is
// already summoned or failed; collective errors as the group reports them. Those
// checks run on each rank and the ranks agree on them before gathering (NOTE [Agree
// before acting] in fsdp/internal/unit_agreement.h): a check that fails on some ranks
// only fails every rank with "rank <r>: <its error>", and nothing is gathered.
absl::StatusOr<std::unique_ptr<FullParamsScope>> SummonFullParams(
    core::Module& module, WrapperRegistry* registry, const SummonOptions& options = {});

}  // namespace fsdp

#endif  // FSDP_SUMMON_H_
