// Runtime: the per-rank execution state that FSDP's module hooks share: which units are
// computing, the order units ran in, prefetching, the reductions still in flight, and a
// test-visible event log. A WrapperRegistry owns one; FullyShard attaches every unit it
// creates to it.
//
//   fsdp::Runtime& runtime = registry.runtime();
//   runtime.set_record_events(true);
//   ... model->Forward(x), model->Backward(g) ...
//   for (const std::string& e : runtime.events()) LOG(INFO) << e;
//   // "allgather_issued <root> (Gpt)", "forward_compute_begin <root> (Gpt)", ...
//
// NOTE [Root unit]: a unit whose forward pre-hook runs while no unit is computing is the
// root of that forward; it starts a new iteration (the order lists restart). The unit
// whose backward pre-hook runs while none is computing starts the backward, whose order
// is the reverse of the order the forward's units finished in. When that unit's
// backward post-hook ends the backward, it waits for every pending reduction, so when
// the root module's Backward returns every managed grad is final, and it reshards any
// unit still unsharded (prefetched but unused, or SHARD_GRAD_OP units whose backward
// did not run). Every unit, the root included, reshards after its forward under
// FULL_SHARD and HYBRID_SHARD (PyTorch keeps the root unsharded instead; resharding it
// costs one more all-gather of the root unit per step and keeps its memory at the
// sharded size between forward and backward).
//
// Overlap (NOTE [Device streams] in unit.h): the next unit's all-gather is issued (in
// the pre-hook, per the recorded order) before the current unit's FinishUnshard, so on
// a CUDA device it runs on the NCCL stream while the compute stream works; a unit's
// reduce-scatter is issued when its backward ends and finished when the next unit's
// backward ends (at most one reduction in flight, which bounds the full gradient
// buffers alive) or at the end of the backward. On CUDA those finishes are stream-ordered
// waits, so the host never blocks on them and the reduce-scatter overlaps the next
// unit's backward compute.
//
// NOTE [Recompute]: under activation checkpointing (NOTE [Activation checkpointing] in
// core/module.h) a checkpointed module recomputes its forward inside its Backward,
// after its backward pre-hook gathered its unit: the recompute uses that all-gather and
// needs none of its own. A unit nested inside the checkpointed module sees its forward
// hooks run again there (fsdp registers them with HookOptions::run_in_recompute): its
// pre-hook gathers it (issuing the all-gather its backward pre-hook would otherwise
// issue, or finishing a prefetched one) and its post-hook leaves it gathered for that
// backward. Neither records the unit in the forward order, prefetches or reshards, so
// the order that backward prefetch follows and every unit's number of all-gathers are
// those of the run without checkpointing (prefetch_test checks both).
//
// Events (recorded only while set_record_events(true)), each "<event> <unit label>":
//   allgather_issued, forward_compute_begin, recompute_begin, reshard,
//   backward_compute_begin, reduce_issued, reduce_done, plus "backward_end" (no label) when a
//   backward ends and "aborted_pass" when a pass that an error interrupted is cleaned up.
//
// A forward or backward interrupted by an error leaves units on the computing stack.
// The next forward or backward that reaches one of them cleans up: it waits for pending
// reductions, drops full gradients, reshards, and starts afresh; a unit that had failed
// keeps failing (NOTE [Unit states]).
//
// Not thread-safe: one Runtime per rank, used by that rank's thread.
#ifndef FSDP_RUNTIME_H_
#define FSDP_RUNTIME_H_

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "fsdp/unit.h"

namespace fsdp {

class Runtime : public std::enable_shared_from_this<Runtime> {
 public:
  Runtime() = default;
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // Registers forward pre/post and backward pre/post hooks on the unit's root module
  // and keeps their handles in the unit (Unit::RemoveHooks removes them). The hooks hold
  // weak references to the unit and this runtime. FailedPrecondition if the module is
  // gone.
  absl::Status Attach(const std::shared_ptr<Unit>& unit);

  // True when no forward or backward through an attached unit is in progress.
  bool idle() const { return active_.empty(); }
  // OK when idle(); FailedPrecondition "<what>: a forward or backward is in progress
  // (unit ...)" otherwise.
  absl::Status CheckIdle(const std::string& what) const;

  // Waits for every pending reduction and, unless `host_gradients` is false, adds what
  // NOTE [CPU offload] left waiting into the units' host gradient shards (each unit waits
  // for its chunk's copy: its reduction's WaitHost, or with a one-rank shard group a device
  // synchronisation, which after the first finds the device idle), so every gradient shard
  // is final; the first error is returned after trying all.
  absl::Status FinishAllReductions(bool host_gradients = true);

  // NOTE [Comm overlap] (unit.h): the sum over the attached units still alive.
  CommTiming comm_timing() const;
  void ResetCommTiming();

  // The event log (see the header comment).
  void set_record_events(bool record) { record_events_ = record; }
  bool record_events() const { return record_events_; }
  const std::vector<std::string>& events() const { return events_; }
  void ClearEvents() { events_.clear(); }
  void Record(const std::string& event, const Unit* unit);

 private:
  absl::Status ForwardPre(const std::shared_ptr<Unit>& unit);
  absl::Status ForwardPost(const std::shared_ptr<Unit>& unit);
  absl::Status BackwardPre(const std::shared_ptr<Unit>& unit);
  absl::Status BackwardPost(const std::shared_ptr<Unit>& unit);

  // Issues the unshard of `unit` if it is sharded, recording the event.
  absl::Status IssueUnshard(Unit& unit);
  // NOTE [Prefetch] in options.h: issues all-gathers of the units after position
  // `*cursor` in `order` while fewer than current.options().limit_all_gathers units
  // are unsharded or unsharding ahead; `*cursor` moves past `current`'s entry.
  absl::Status Prefetch(const Unit& current, const std::vector<std::weak_ptr<Unit>>& order,
                        size_t* cursor);
  // Attached units in states kUnsharding/kUnsharded that are not computing.
  int NumAhead() const;
  bool IsActive(const Unit* unit) const;
  // Cleans up a pass an error interrupted (see the header comment).
  void Abort();
  // Ends a backward: waits for reductions and reshards whatever is left unsharded.
  absl::Status EndBackward();

  std::vector<std::weak_ptr<Unit>> attached_;  // every unit Attach()ed
  std::vector<std::shared_ptr<Unit>> active_;  // computing now, outermost first
  bool in_backward_ = false;
  // Units in the order their forward pre-hooks ran this iteration and the last one.
  std::vector<std::weak_ptr<Unit>> forward_order_;
  std::vector<std::weak_ptr<Unit>> previous_forward_order_;
  size_t forward_cursor_ = 0;
  // Units in the order their forward post-hooks ran, and its reverse for backward.
  std::vector<std::weak_ptr<Unit>> post_order_;
  std::vector<std::weak_ptr<Unit>> backward_order_;
  size_t backward_cursor_ = 0;
  std::deque<std::weak_ptr<Unit>> pending_reductions_;

  bool record_events_ = false;
  std::vector<std::string> events_;
};

}  // namespace fsdp

#endif  // FSDP_RUNTIME_H_
