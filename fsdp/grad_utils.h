// Gradient utilities for wrapped modules: accumulation without synchronisation
// (NoSync) and global-norm clipping across shards (ClipGradNorm).
//
//   {
//     ASSIGN_OR_RETURN(std::unique_ptr<fsdp::NoSyncScope> no_sync,
//                      fsdp::NoSync(*model, &registry));
//     ... forward/backward of micro-batches 1 .. k-1: full gradients kept locally ...
//   }
//   ... forward/backward of micro-batch k: reduces the accumulated sum ...
//   ASSIGN_OR_RETURN(double norm, fsdp::ClipGradNorm(*model, &registry, /*max_norm=*/1.0));
//   RETURN_IF_ERROR(optimizer->Step());
#ifndef FSDP_GRAD_UTILS_H_
#define FSDP_GRAD_UTILS_H_

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/module.h"
#include "fsdp/registry.h"
#include "fsdp/unit.h"

namespace fsdp {

// While alive, backward through the scope's units skips gradient reduction: each unit
// keeps its unreduced full gradient buffer, Parameter::grad stays a full-shape view of
// it, and later backwards add into it (NOTE [Gradient reduction] in unit.h). The first
// backward after the scope ends reduces the accumulated sum into the gradient shards.
// Costs a full gradient buffer per unit until then (as PyTorch's no_sync). Stepping an
// optimizer before that reduction fails (the grads do not match the 1-D shards).
class NoSyncScope {
 public:
  explicit NoSyncScope(std::vector<std::shared_ptr<Unit>> units);
  // Restores each unit's previous setting (scopes nest).
  ~NoSyncScope();
  NoSyncScope(const NoSyncScope&) = delete;
  NoSyncScope& operator=(const NoSyncScope&) = delete;

 private:
  std::vector<std::shared_ptr<Unit>> units_;
  std::vector<bool> previous_;
};

// A NoSync scope over every unit rooted in `module`'s subtree (none: an empty scope).
// InvalidArgument for a null registry; FailedPrecondition while a forward or backward
// is in progress or when `module` is inside a unit it is not the root of.
absl::StatusOr<std::unique_ptr<NoSyncScope>> NoSync(core::Module& module,
                                                    WrapperRegistry* registry);

// Scales every gradient of `module` by min(1, max_norm / (total_norm + 1e-6)), as
// torch.nn.utils.clip_grad_norm_, where total_norm is the L2 norm of all gradients of
// the unsharded model: the squares of each rank's gradient slices are summed over each
// unit's shard group (replicas under NO_SHARD and HYBRID_SHARD are counted once;
// padding holds no gradient), plus the local squares of parameters no unit manages.
// Returns total_norm (before clipping), the same on every rank. A collective over each
// distinct shard group: call it on every rank. InvalidArgument for a null registry or a
// max_norm that is not positive and finite; FailedPrecondition while a forward or
// backward is in progress, inside NoSync before the accumulated gradients are reduced,
// or when `module` is inside a unit it is not the root of. Those checks run on each
// rank and the ranks agree on them first (NOTE [Agree before acting] in
// fsdp/internal/unit_agreement.h): a check that fails on some ranks only fails every
// rank with "rank <r>: <its error>". Parameters of ignored modules are not
// synchronised, so their local squares may differ between ranks.
absl::StatusOr<double> ClipGradNorm(core::Module& module, WrapperRegistry* registry,
                                    double max_norm);

// Multiplies every gradient of `module` on this rank by `factor` (each unit's gradient
// shards, once its pending reductions finish, and the gradients of parameters no unit
// manages): the mean of gradients accumulated over micro-batches. No collective.
// InvalidArgument for a null registry or a factor that is not finite; FailedPrecondition
// as ClipGradNorm's checks (during a forward or backward, inside NoSync before the
// gradients are reduced, or when `module` is inside a unit it is not the root of).
absl::Status ScaleGrads(core::Module& module, WrapperRegistry* registry, double factor);

}  // namespace fsdp

#endif  // FSDP_GRAD_UTILS_H_
