// Unit: one FSDP unit on one rank: a FlatParameter over the parameters of a module
// subtree, the groups it talks over, and the state machine that moves its parameters
// between the sharded steady state and the unsharded compute state. FullyShard creates
// units and fsdp::Runtime drives them from module hooks; this header is what they share,
// and what tests read (state(), flat()).
//
//   // Inside a forward pre-hook (simplified):
//   RETURN_IF_ERROR(unit.IssueUnshard(/*full_precision=*/false));  // kSharded -> kUnsharding
//   RETURN_IF_ERROR(unit.FinishUnshard());                         // -> kUnsharded
//   ... ForwardImpl uses full-shape Parameter::data ...
//   RETURN_IF_ERROR(unit.Reshard());                               // -> kSharded
//
// NOTE [Unit states]: kSharded (each managed Parameter::data is its 1-D slice of the
// local shard; no full buffer) -> IssueUnshard -> kUnsharding (an all-gather into the
// full buffer is in flight) -> FinishUnshard -> kUnsharded (data are full-shape views of
// the full buffer) -> Reshard -> kSharded. Every transition checks its starting state
// and returns FailedPrecondition naming the unit and both states otherwise. A
// collective or buffer error moves the unit to kFailed, where every later call returns
// FailedPrecondition quoting the first error (the in-flight buffers are kept so a
// late-finishing collective never writes into freed memory). Release moves it to
// kReleased: the parameters are plain again and the unit manages nothing.
//
// NOTE [Gradient reduction]: PrepareGradients (backward pre-hook) points every trainable
// parameter's grad at a zeroed full-shape view of a float32 full gradient buffer that
// the layers accumulate into; ReduceGradients (backward post-hook) issues the average
// reduce-scatter of that buffer over the shard group (in reduce_dtype) and re-points the
// grads at their 1-D slices of the float32 gradient shard; FinishReduction waits, then
// (HYBRID_SHARD, NO_SHARD) all-reduces the result (average) over the replicate group,
// and adds it into the gradient shard (NOTE [Deterministic reduction] in options.h: each
// backward's full gradient joins a tree of the step's micro-batches instead, and the
// last one sums it across the ranks). Adding means gradients accumulate across
// backwards as they would without FSDP, until the optimizer zeroes them; a parameter
// whose grad was dropped (ZeroGrad(set_to_none)) restarts from zero. Under NoSync
// (no_sync()), ReduceGradients keeps the unreduced full gradient buffer instead, grads
// stay full-shape views of it and later backwards add into it; the first backward
// outside NoSync reduces the accumulated sum. A one-rank shard group reducing in fp32
// (no replicate group, no CPU offload, not deterministic) has nothing to scatter, round or
// add: its full gradient buffer is the gradient shard itself
// (FlatParameter::UseShardGradAsFullGrad), the layers add straight into it, and
// ReduceGradients only re-points the grads (no second buffer to zero, no add).
//
// NOTE [Mixed precision on the device]: the unit's buffers live on the FlatParameter's
// device (the module's). With param_dtype bf16, the all-gather casts the float32 shard
// itself (AllGatherOptions::stage_from: on NCCL's stream, not the compute stream; a
// one-rank shard group, with no collective, casts on the compute stream) and writes
// straight into a bf16 full buffer and Parameter::data are bf16 views of it during forward and
// backward (no float32 copy; the layers take bf16 weights on every device, the CPU ones widening
// them exactly inside each op), while gradients stay float32 (the full gradient buffer,
// the gradient shard) and the shard stays the float32 master. The CPU and CUDA paths
// hold the same buffers, so an op list recorded on the CPU is the GPU's
// (NOTE [Op accounting] in core/op_profile.h).
//
// NOTE [Device streams]: on a CUDA device the collectives' Wait is stream-ordered
// (comm/work.h): FinishUnshard and FinishReduction return without blocking the host
// and the kernels queued after them on the compute stream see the results. So an
// all-gather issued ahead (prefetch) overlaps the compute queued before its Wait, and
// a reduce-scatter issued by ReduceGradients overlaps whatever the compute stream does
// until FinishReduction. The NCCL group's watchdog keeps the collectives' buffers alive
// until the device is done with them, so dropping a Unit's references early is safe.
//
// Not thread-safe: a unit is used by its rank's thread only.
#ifndef FSDP_UNIT_H_
#define FSDP_UNIT_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/process_group.h"
#include "comm/tree_reduce.h"
#include "comm/work.h"
#include "core/module.h"
#include "core/tensor.h"
#include "flatten/flat_parameter.h"
#include "fsdp/options.h"

namespace fsdp {

enum class UnitState { kSharded, kUnsharding, kUnsharded, kFailed, kReleased };

// "sharded", "unsharding", "unsharded", "failed", "released".
std::string UnitStateName(UnitState state);

// The groups a unit communicates over. For FULL_SHARD and SHARD_GRAD_OP the shard group
// is the whole group; for NO_SHARD each rank is its own shard group and the replicate
// group is the whole group; HYBRID_SHARD has both. A group of one rank is null: nothing
// to exchange.
struct UnitGroups {
  // The group FullyShard was given.
  std::shared_ptr<comm::ProcessGroup> world;
  std::shared_ptr<comm::ProcessGroup> shard;      // null when shard_size == 1
  std::shared_ptr<comm::ProcessGroup> replicate;  // null when there is one replica
  int shard_size = 1;
  int shard_rank = 0;
  // NOTE [Deterministic reduction]: the tree over `world` that reduces instead of
  // `shard` and `replicate`; null unless FullyShardOptions::deterministic on > 1 rank.
  std::shared_ptr<comm::TreeReducer> tree;
};

// NOTE [Comm overlap]: how much of a unit's collectives ran while its rank computed. For
// each all-gather and reduce-scatter it waited on, a unit adds the collective's own run
// time (comm::Work::RunTime) and the host time its Wait blocked; hidden = 1 - wait / run
// is the part that overlapped other work (prefetch, NOTE [Prefetch] in options.h;
// reductions finished one unit later). On NCCL, whose waits are stream-ordered, both come
// from CUDA events (comm::Work::StreamWaitTiming): the collective's time on its stream,
// and how long the compute stream stood at the Wait; such a collective is counted once
// those events are complete (by the next collective the unit waits for, or comm_timing()).
// A reduction NOTE [CPU offload] waits for with WaitHost (its chunk copied to the host) is
// counted only where the backend gives its run time (comm::Work::RunTime: the CPU
// backends; NCCL gives none for a host wait).
struct CommTiming {
  int64_t all_gathers = 0;
  absl::Duration all_gather_run;
  absl::Duration all_gather_wait;
  int64_t reductions = 0;
  absl::Duration reduce_run;
  absl::Duration reduce_wait;

  CommTiming& operator+=(const CommTiming& other);
  // Counts one collective (an all-gather when `all_gather`, else a reduction).
  void Count(bool all_gather, absl::Duration run, absl::Duration wait);
  // 1 - wait / run clamped to [0, 1]; 0 when nothing was measured.
  static double Hidden(absl::Duration run, absl::Duration wait);
};

class Unit {
 public:
  // Takes `flat` as Flatten left it (every parameter viewing the filled full buffer) and
  // moves it to kSharded (ShardViews, FreeFull). `module` is the unit's root; the unit
  // keeps a weak reference only. FailedPrecondition if the FlatParameter's world size
  // or rank disagree with the groups.
  static absl::StatusOr<std::shared_ptr<Unit>> Create(const std::shared_ptr<core::Module>& module,
                                                      std::unique_ptr<flatten::FlatParameter> flat,
                                                      UnitGroups groups,
                                                      const FullyShardOptions& options);
  ~Unit();
  Unit(const Unit&) = delete;
  Unit& operator=(const Unit&) = delete;

  // The root module's Describe() at wrap time, e.g. "blocks.0 (TransformerBlock)".
  const std::string& label() const { return label_; }
  // The root module, or null once it is destroyed.
  std::shared_ptr<core::Module> module() const { return module_.lock(); }
  // The root module's address, for identity comparisons (may dangle once destroyed).
  const core::Module* module_ptr() const { return module_ptr_; }
  UnitState state() const { return state_; }
  // The first error when state() is kFailed.
  const absl::Status& failure() const { return failure_; }
  const FullyShardOptions& options() const { return options_; }
  const UnitGroups& groups() const { return groups_; }
  const flatten::FlatParameter& flat() const { return *flat_; }
  // True when the unit reshards after its forward (FULL_SHARD, HYBRID_SHARD).
  bool reshard_after_forward() const;
  // True when the full buffer holds the exact float32 values of the shards (an
  // unshard with full_precision, or without mixed precision).
  bool full_is_exact() const { return state_ == UnitState::kUnsharded && full_exact_; }
  // True while a reduction issued by ReduceGradients has not been finished.
  bool reduction_pending() const { return reduce_pending_; }
  // NOTE [Comm overlap]: this unit's collectives since it was created (or the last reset),
  // with the stream-ordered waits whose events are complete by now.
  CommTiming comm_timing();
  void ResetCommTiming();

  // --- Parameters (NOTE [Unit states]) ---
  // kSharded -> kUnsharding: allocates the full buffer and issues the all-gather of the
  // shards (in param_dtype, or float32 when `full_precision`); with a one-rank shard
  // group, copies the shard instead.
  absl::Status IssueUnshard(bool full_precision);
  // kUnsharding -> kUnsharded: waits for the all-gather (options().timeout; on CUDA a
  // stream-ordered wait) and points every Parameter::data at its full-shape view (bf16
  // under mixed precision: NOTE [Mixed precision on the device]).
  absl::Status FinishUnshard();
  // kUnsharded -> kSharded (finishing an in-flight unshard first): points every
  // Parameter::data at its 1-D shard slice and frees the full buffer.
  absl::Status Reshard();
  // Copies the local chunk of the (exact) full buffer into the shard, keeping changes
  // made to the full-shape views. FailedPrecondition unless full_is_exact().
  absl::Status WriteBackLocalChunk();

  // Copies `values` (fp32 or bf16, converted) into the shard from element
  // `shard_offset` on (state dict loading). Requires kSharded (so no full copy goes
  // stale); InvalidArgument if it would reach outside the shard.
  absl::Status WriteShard(int64_t shard_offset, const core::Tensor& values);

  // --- Gradients (NOTE [Gradient reduction]) ---
  // Requires kUnsharded. Points trainable grads at the full gradient buffer (allocated
  // zeroed unless NoSync kept one).
  absl::Status PrepareGradients();
  // Requires kUnsharded and a full gradient buffer. Issues the reduction (or, under
  // no_sync(), keeps the buffer) and points grads at the gradient shard.
  absl::Status ReduceGradients();
  // Completes a pending reduction into the gradient shard; OK when none is pending.
  // Under NOTE [CPU offload] the reduced chunk only starts its way to the host (carried
  // by the collective, NOTE [Staged collectives] in comm/process_group.h, or queued on
  // the compute stream without one): FinishHostGradients adds it in.
  absl::Status FinishReduction();
  // NOTE [CPU offload]: waits for the reduced chunk to reach the host (the collective's
  // WaitHost, or a device synchronisation) and adds it into the host gradient shard; OK
  // when nothing is waiting (always without offload). The runtime calls it at the end
  // of a backward.
  absl::Status FinishHostGradients();
  // True while FinishHostGradients has a chunk to add.
  bool host_gradients_pending() const { return host_add_pending_; }
  // Drops the full gradient buffer and every grad view (Release, error recovery).
  absl::Status DropGradients();

  // Under NoSync: backward keeps unreduced full gradients (NOTE [Gradient reduction]).
  bool no_sync() const { return no_sync_; }
  void set_no_sync(bool no_sync) { no_sync_ = no_sync; }

  // SummonFullParams marks the units it holds unsharded; hooks refuse to run meanwhile.
  bool summoned() const { return summoned_; }
  void set_summoned(bool summoned) { summoned_ = summoned; }

  // Keeps the module hooks the runtime registered; destroyed with the unit.
  void set_hooks(std::vector<core::HookHandle> hooks) { hooks_ = std::move(hooks); }
  void RemoveHooks() { hooks_.clear(); }
  size_t num_hooks() const { return hooks_.size(); }

  // Gives every parameter its own full-shape storage with the current values (one
  // all-gather when sharded), drops gradients, removes the hooks and moves to
  // kReleased. Requires kSharded or kUnsharded and no pending reduction.
  absl::Status Release();

  // OK unless kFailed or kReleased; otherwise FailedPrecondition naming the unit and
  // `what` was attempted.
  absl::Status CheckUsable(const std::string& what) const;

 private:
  Unit() = default;
  // Moves to kFailed with `status` (annotated with the label) and returns it.
  absl::Status Fail(const absl::Status& status);
  absl::Status CheckState(UnitState expected, const std::string& what) const;
  // reduce_host_, (re)allocated in pinned host memory for `dtype`.
  absl::StatusOr<core::Tensor> HostStaging(core::DType dtype);
  // ReduceGradients under NOTE [Deterministic reduction].
  absl::Status ReduceDeterministic();
  // Waits for `work` (on the host when `host`; otherwise stream-ordered where the backend
  // is), counts it under NOTE [Comm overlap] (an all-gather when `gather`) now or, for a
  // stream-ordered wait, once its events are complete, and drops the handle.
  absl::Status WaitCounted(std::shared_ptr<comm::Work>& work, bool host, bool gather);
  // Counts the stream-ordered waits whose timing is known by now.
  void CountStreamTimings();

  std::string label_;
  std::weak_ptr<core::Module> module_;
  const core::Module* module_ptr_ = nullptr;
  std::unique_ptr<flatten::FlatParameter> flat_;
  UnitGroups groups_;
  FullyShardOptions options_;
  UnitState state_ = UnitState::kSharded;
  absl::Status failure_;

  CommTiming comm_timing_;
  // Collectives waited on stream-ordered whose timing is not known yet (oldest first; at
  // most kMaxStreamTimed, the oldest dropped past that), and whether each is an all-gather.
  static constexpr size_t kMaxStreamTimed = 1024;
  std::deque<std::pair<std::shared_ptr<comm::Work>, bool>> stream_timed_;
  // In-flight all-gather: its work and the tensors it reads and writes.
  std::shared_ptr<comm::Work> gather_work_;
  core::Tensor gather_input_;
  core::Tensor gather_output_;
  bool full_exact_ = false;

  // Pending reduction: its work, its input (which keeps the full gradient alive) and
  // output (the reduced gradient chunk).
  bool reduce_pending_ = false;
  // The pending reduce-scatter adds its chunk into the gradient shard itself, on its
  // stream (comm::ReduceScatterOptions::accumulate_into), so FinishReduction only waits.
  bool reduce_accumulates_ = false;
  std::shared_ptr<comm::Work> reduce_work_;
  core::Tensor reduce_input_;
  core::Tensor reduce_output_;
  // NOTE [CPU offload]: the pinned host buffer the reduced chunk is copied into (kept
  // across steps: pinned allocations are slow), whether it awaits its add, and the
  // collective that copies it there (null when the compute stream does).
  core::Tensor reduce_host_;
  bool host_add_pending_ = false;
  std::shared_ptr<comm::Work> host_work_;
  // NOTE [Deterministic reduction]: the gradients of this step's backwards, in tree order.
  comm::TreeAccumulator micro_batches_{core::MemoryTag::kGrad};

  bool no_sync_ = false;
  bool summoned_ = false;
  std::vector<core::HookHandle> hooks_;
};

}  // namespace fsdp

#endif  // FSDP_UNIT_H_
