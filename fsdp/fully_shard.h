// FullyShard: shards a module in place into FSDP units, and Release: gives the user the
// plain module back with its full trained weights.
//
//   fsdp::WrapperRegistry registry;                           // one per rank, kept by the trainer
//   fsdp::FullyShardOptions options;
//   options.policy = policy::ModuleTypes({"TransformerBlock"});
//   ASSIGN_OR_RETURN(auto handle, fsdp::FullyShard(gpt, group, options, &registry));
//   ASSIGN_OR_RETURN(auto adamw, optim::AdamW::Create(gpt->NamedParameters()));
//   ASSIGN_OR_RETURN(core::Tensor loss,                   // hooks all-gather
//                    nn::functional::CrossEntropy(gpt->CallOne({local.inputs}), local.targets));
//   RETURN_IF_ERROR(core::Backward(loss));                // grads reduce-scattered: final
//   RETURN_IF_ERROR(adamw->Step());                       // steps each rank's shard
//   RETURN_IF_ERROR(fsdp::Release(*gpt, &registry));      // plain module, full weights
//
// In place: no wrapper module enters the tree. The module, its children and its
// Parameter objects stay the same objects with the same names before, during and after
// wrapping; only what Parameter::data and ::grad point at changes. Outside forward and
// backward each managed parameter's data is its 1-D slice of the rank's shard (possibly
// empty) and its grad the 1-D slice of the reduced gradient shard, so an optimizer over
// module->Parameters(), built before or after wrapping, steps exactly the local shard
// (NOTE [Optimizer and shards] in optim/optimizer.h: one that stepped before wrapping
// refuses with FailedPrecondition naming the parameter). Inside a unit's forward and
// backward its parameters are full-shape views of the gathered buffer. (That holds after
// every backward; after a forward with no backward, as in evaluation, it holds for
// FULL_SHARD and HYBRID_SHARD, while SHARD_GRAD_OP and NO_SHARD keep the units unsharded
// for the backward they expect: FullyShardHandle::Reshard() restores the slices.) See
// NOTE [Unit states] (unit.h), NOTE [Root unit] (runtime.h), NOTE [Prefetch] and
// NOTE [Mixed precision] (options.h) and NOTE [Registry reuse] (registry.h).
//
// Both functions are collectives over `group` when they shard or gather: call them on
// every rank, in the same order, for the same model (NOTE [Same order on all ranks] in
// comm/store.h). Parameters of ignored modules stay plain and replicated, and their
// gradients are not synchronised.
#ifndef FSDP_FULLY_SHARD_H_
#define FSDP_FULLY_SHARD_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/process_group.h"
#include "core/module.h"
#include "fsdp/handle.h"
#include "fsdp/options.h"
#include "fsdp/registry.h"

namespace fsdp {

// Shards `module` in place over `group` and returns the wrap's handle.
//
// Plans the units (policy::Plan over the shard group size, with units already in the
// registry below `module` kept as they are), checks that every rank computed the same
// plan, then, bottom-up, flattens each new unit's parameters into a FlatParameter, keeps
// the rank's shard, installs the unit's hooks and records it in `registry`. Repeated
// wraps follow NOTE [Registry reuse]; a re-wrap answered from the registry communicates
// nothing, so every rank must re-wrap alike.
//
// Errors: InvalidArgument for a null argument or invalid options (naming the option),
// or what policy::Plan or flatten::FlatParameter::Flatten reject; FailedPrecondition
// for the registry rules and for ranks that disagree on the plan (naming the first
// differing unit); collective errors (DeadlineExceeded, Unavailable) as the group
// reports them. Every rank returns the same error (NOTE [Wrap rollback] in
// fully_shard.cc): a failure on some ranks only (a check, the plan, or any step of
// the sharding) reaches every rank as "rank <r>: <that rank's error>" (same code;
// comm::AgreeOnStatus), except a null `group`, which is returned at once. On error
// nothing is sharded, on any rank: the module's Parameter objects hold their original
// tensors (storage, values, gradients) again, no hook and no registry entry of this
// call remains, and a later FullyShard is a fresh wrap.
absl::StatusOr<std::shared_ptr<FullyShardHandle>> FullyShard(
    const std::shared_ptr<core::Module>& module, const std::shared_ptr<comm::ProcessGroup>& group,
    const FullyShardOptions& options, WrapperRegistry* registry);

// Releases every unit rooted in `module`'s subtree: gathers each unit's full weights
// into independent full-shape storage of its own Parameter objects (same objects, same
// names, trained values), drops gradients, removes the hooks and the registry entries.
// Afterwards the module needs no process group; wrapping it again is a fresh wrap.
// A collective over each unit's shard group. NotFound when no unit is rooted in the
// subtree; FailedPrecondition when `module` is inside a unit it is not the root of,
// while a forward or backward is in progress, inside SummonFullParams, or for a failed
// unit. The ranks agree on those checks before gathering (NOTE [Agree before acting] in
// fsdp/internal/unit_agreement.h): a check that fails on some ranks only fails every
// rank with "rank <r>: <its error>", and nothing is released.
absl::Status Release(core::Module& module, WrapperRegistry* registry);

}  // namespace fsdp

#endif  // FSDP_FULLY_SHARD_H_
