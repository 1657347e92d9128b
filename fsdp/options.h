// Options of fsdp::FullyShard: sharding strategy, mixed precision, prefetch, the wrap
// policy, and the comparison the registry uses to decide whether a repeated wrap asks
// for the same thing.
//
//   fsdp::FullyShardOptions options;
//   options.policy = policy::ModuleTypes({"TransformerBlock"});
//   options.strategy = fsdp::ShardingStrategy::kHybridShard;
//   options.hybrid_shard_size = 2;                      // shard in pairs, replicate across
//   options.mixed_precision.param_dtype = core::DType::kBFloat16;
//   RETURN_IF_ERROR(options.Validate(group->size()));
//   std::string diff = fsdp::FirstDifferingOption(options, other);  // "" when equal
#ifndef FSDP_OPTIONS_H_
#define FSDP_OPTIONS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "core/dtype.h"
#include "policy/wrap_policy.h"

namespace fsdp {

// How a unit's parameters, gradients and optimizer state are split over the group.
enum class ShardingStrategy {
  // ZeRO-3: parameters sharded; all-gathered before forward and again before backward,
  // resharded after each; gradients reduce-scattered.
  kFullShard,
  // ZeRO-2: like kFullShard but the parameters stay unsharded from forward to the end of
  // backward (no second all-gather).
  kShardGradOp,
  // DDP: every rank holds everything; gradients all-reduced (average).
  kNoShard,
  // kFullShard within groups of FullyShardOptions::hybrid_shard_size consecutive ranks,
  // gradient shards all-reduced (average) across those groups.
  kHybridShard,
};

// "FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD" (PyTorch's names).
std::string ShardingStrategyName(ShardingStrategy strategy);

// NOTE [Mixed precision]: the local shard stays float32 and is the master copy the
// optimizer steps. With param_dtype bf16, an unshard rounds the shard to bf16 and
// all-gathers bf16 (half the bytes) into the bf16 full buffer the layers see (NOTE
// [Mixed precision on the device] in fsdp/unit.h). On the CPU each op widens the bf16
// weights exactly to float32 (its GEMM is oneDNN's fp32 dnnl_sgemm): "bf16 compute" there
// means bf16-rounded operands with float32 arithmetic and accumulation, which is what a
// bf16 GEMM with an fp32 accumulator computes as well, up to the rounding of its output. With
// reduce_dtype bf16, the float32 full gradient is rounded to bf16 and reduce-scattered in bf16 (the
// gloo backend accumulates bf16 reductions in float32 and rounds once), then widened
// and added into the float32 gradient shard.
struct MixedPrecision {
  // Dtype of the unsharded compute copy: kFloat32 (off) or kBFloat16.
  core::DType param_dtype = core::DType::kFloat32;
  // Dtype gradients are reduced in: kFloat32 (off) or kBFloat16.
  core::DType reduce_dtype = core::DType::kFloat32;

  bool enabled() const {
    return param_dtype != core::DType::kFloat32 || reduce_dtype != core::DType::kFloat32;
  }
};

struct FullyShardOptions {
  // Which modules below the wrapped one become units (NOTE [Bottom-up application] in
  // policy/plan.h); the wrapped module itself is always one. Null means
  // policy::Never(): one unit for the whole module.
  policy::WrapPolicyPtr policy;
  // NOTE [Activation checkpointing] (core/module.h): the modules below the wrapped one
  // (outside units that existed before the wrap) for which this policy's ShouldWrap
  // answers true get set_checkpoint_activations(true): their activations are dropped
  // after the forward and recomputed in the backward, from the all-gather the backward
  // makes anyway (NOTE [Recompute] in runtime.h). The plan lists them
  // (WrapPlan.checkpointed); Release turns them off again. Null: none. Compared like
  // `policy` on a re-wrap, so a changed choice is FailedPrecondition naming it.
  policy::WrapPolicyPtr checkpoint_policy;
  ShardingStrategy strategy = ShardingStrategy::kFullShard;
  // kHybridShard only: ranks per shard group; must divide the group size. Ranks
  // [k h, (k + 1) h) form shard group k; ranks with the same index in their shard group
  // form a replicate group.
  int hybrid_shard_size = 0;
  MixedPrecision mixed_precision;
  // NOTE [Prefetch]: with backward_prefetch, a unit's backward pre-hook, after issuing
  // its own all-gather, issues the all-gathers of the units that follow it in backward
  // order (the reverse of the order their forwards finished in); with forward_prefetch,
  // a unit's forward pre-hook does the same for the units that followed it in the
  // previous forward. Either stops once `limit_all_gathers` units (of the registry) are
  // unsharded or unsharding ahead, that is, not currently computing (0 disables
  // prefetching). The memory this costs is spelled out in comm_memory_test.cc
  // (NOTE [FULL_SHARD memory bound]).
  bool backward_prefetch = true;
  bool forward_prefetch = false;
  int limit_all_gathers = 2;
  // Dotted paths (from the wrapped module) of modules whose parameters FSDP leaves
  // alone: not flattened, not sharded, and their gradients are NOT synchronised across
  // ranks (as PyTorch's ignored_modules). Their descendants are ignored too.
  std::vector<std::string> ignored_paths;
  // Deadline of every collective FSDP issues and of every wait on one.
  absl::Duration timeout = absl::Minutes(5);
  // PyTorch's sync_module_states: while wrapping, each new unit's parameters are
  // broadcast from rank 0 of the group (unit by unit, before each is sharded), so ranks
  // whose initialisation differs (not deterministic, or loaded on rank 0 only) all start
  // from rank 0's values. Deferred units (NOTE [Deferred initialisation] in
  // core/param_init.h) are filled from their recipes, the same on every rank, and need
  // no broadcast.
  bool sync_module_states = false;
  // NOTE [CPU offload] (PyTorch FSDP2's CPUOffloadPolicy): each unit's float32 shard and
  // gradient shard live in page-locked host memory (NOTE [Shard on the host] in
  // flatten/flat_parameter.h), so between steps Parameter::data and grad are host
  // tensors and an optimizer made after the wrap keeps its state on the host and steps
  // there (optim's vectorised CPU kernels). On the device a unit holds only what it
  // computes with. The all-gather copies the host shard to the device and casts it to
  // param_dtype on its own stream before gathering, and the reduction (the replicate
  // all-reduce under HYBRID_SHARD and NO_SHARD) copies its reduced chunk back into a pinned
  // staging buffer of the unit's on its stream (NOTE [Staged collectives] in
  // comm/process_group.h), so both overlap the compute; with a one-rank shard group there
  // is no collective and those copies are queued on the compute stream (NOTE [Asynchronous
  // host copies] in core/tensor.h). The backward's end waits for the chunks and adds them
  // into the host gradient shards. Host writes to a shard (the optimizer step, loading)
  // come after that; Unit::WriteShard synchronises the device first. Requires the parameters on a
  // CUDA device: FullyShard refuses it for CPU parameters (InvalidArgument naming this
  // option), where there is nothing to offload.
  bool cpu_offload = false;
  // NOTE [Deterministic reduction]: gradients are summed in the binary tree of NOTE [Tree
  // reduction] (comm/tree_reduce.h) instead of the backend's order, so that N ranks give,
  // bit for bit, what one rank gives accumulating the same micro-batches: a unit adds the
  // gradients of the backwards it runs under no_sync() and of the one that ends them in
  // that tree (comm::TreeAccumulator; their count must be a power of two), then sums the
  // ranks' partial sums across the group in the same tree, scattered as the strategy
  // shards (HYBRID_SHARD: within the shard group, all-reduced across groups). Gradients
  // are SUMMED, not averaged: the caller scales the loss (or the gradients) by 1 / the
  // global number of micro-batches, the same factor at every world size (StageRunner
  // does). Requires a power-of-two group size, float32 reduction (reduce_dtype) and CPU
  // parameters (the gloo and shm backends); each reduction blocks until done.
  bool deterministic = false;

  // OK when the options are usable on a group of `group_size` ranks; InvalidArgument
  // naming the option ("FullyShardOptions.hybrid_shard_size", ...) otherwise.
  absl::Status Validate(int group_size) const;
};

// The number of ranks each unit's parameters are split over (UnitGroups::shard_size)
// when `options` wrap over a group of `group_size` ranks: the whole group for
// FULL_SHARD and SHARD_GRAD_OP, 1 for NO_SHARD, hybrid_shard_size for HYBRID_SHARD.
// Meaningful once options.Validate(group_size) is OK.
int ShardGroupSize(const FullyShardOptions& options, int group_size);

// "" when `a` and `b` ask for the same wrap; otherwise the name of the first option that
// differs and both values, e.g. "strategy: FULL_SHARD vs NO_SHARD". Policies compare by
// WrapPolicy::Identity() (what they decide: two Lambda() policies never compare equal,
// whatever their names), a null policy as Never(); the message names them by Name().
std::string FirstDifferingOption(const FullyShardOptions& a, const FullyShardOptions& b);

}  // namespace fsdp

#endif  // FSDP_OPTIONS_H_
