// The skeleton the ProcessGroup backends share (gloo, shm, nccl), so each backend's own
// code is only its transport:
// - the Create/Join argument checks and the group's store namespace;
// - BackendGroup: rank, size, name, the byte counters (Stats/ResetStats) and the
//   subgroup numbering, the same in every backend;
// - CollectiveWorker: the queue of issued collectives, the one worker thread that runs
//   them in issue order, and the broken-group state with its error (the CPU backends;
//   NCCL's stream and watchdog take that part there).
//
//   class MyGroup : public internal::BackendGroup {
//     MyGroup(...) : BackendGroup(store, rank, size, name),
//                    worker_(this, &stats(), internal::CollectiveWorker::Hooks{}) {}
//     ... AllReduce(...) {
//       RETURN_IF_ERROR(worker_.CheckUsable(kind));
//       return worker_.Enqueue(kind, timeout, traffic,
//                              [=](const internal::QueuedOp& op) { return Body(op); });
//     }
//     ~MyGroup() override { worker_.Stop(); ... }
//   };
//
// The rules of comm/process_group.h that these pieces keep for their backends: a
// collective's deadline is counted from its issue; one that has not started by then
// fails with DeadlineExceeded; the first failure breaks the group and every later
// collective fails with FailedPrecondition quoting it; destroying the group cancels
// the collectives not yet started (FailedPrecondition) and waits for the running one.
#ifndef COMM_INTERNAL_WORKER_GROUP_H_
#define COMM_INTERNAL_WORKER_GROUP_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "comm/process_group.h"
#include "comm/store.h"
#include "comm/work.h"
#include "core/allocator.h"

namespace comm {
namespace internal {

// "<backend> group '<name>' (rank <rank> of <size>)": how Join's messages name the
// group it is joining (the same text as ProcessGroup::Describe() once it exists).
std::string JoinWho(absl::string_view backend, absl::string_view name, int rank, int size);

// The namespace a new group's keys go in: `store` under "<name>/". InvalidArgument
// "<type>::Create('<name>'): store is null" for a null store.
absl::StatusOr<std::shared_ptr<Store>> GroupStore(std::shared_ptr<Store> store,
                                                  absl::string_view type, absl::string_view name);

// InvalidArgument "<who>: rank must be in [0, size) and size at least 1" unless
// 0 <= rank < size.
absl::Status CheckRankAndSize(absl::string_view who, int rank, int size);

// InvalidArgument "<who>: <option> must be positive" unless `value` > 0.
absl::Status CheckPositive(absl::string_view who, absl::string_view option, absl::Duration value);

// The ProcessGroup members that every backend implements the same way.
class BackendGroup : public ProcessGroup {
 public:
  int rank() const final { return rank_; }
  int size() const final { return size_; }
  std::string name() const final { return name_; }
  CommStats Stats() const final { return stats_.Snapshot(); }
  void ResetStats() final { stats_.Reset(); }

 protected:
  // `store` is the group's own namespace (GroupStore, SubgroupStore).
  BackendGroup(std::shared_ptr<Store> store, int rank, int size, std::string name);

  const std::shared_ptr<Store>& store() const { return store_; }
  // The counters Stats() reads; a backend records each collective that succeeded.
  StatsRecorder& stats() { return stats_; }

  // Where this rank stands in the next subgroup, numbered in NewSubgroup call order
  // (PlaceInSubgroup); every call counts, also one that fails.
  absl::StatusOr<SubgroupPlacement> PlaceNextSubgroup(const std::vector<int>& ranks);
  // SubgroupOptions.name, or "<name>/sub<k>" when it is empty.
  std::string SubgroupName(const SubgroupOptions& options, const SubgroupPlacement& place) const;
  // The subgroup's namespace: this group's store under "sub<k>/".
  std::shared_ptr<Store> SubgroupStore(const SubgroupPlacement& place) const;

 private:
  const std::shared_ptr<Store> store_;
  const int rank_;
  const int size_;
  const std::string name_;
  StatsRecorder stats_;
  std::atomic<int> next_subgroup_{0};
};

// What a queued collective's body learns when the worker runs it.
struct QueuedOp {
  CollectiveKind kind = CollectiveKind::kBarrier;
  // The collective's number in its group: 0, 1, ... in issue order.
  uint64_t seq = 0;
  // "AllGather #3 on gloo group 'world' (rank 0 of 2)", also its Work's Describe().
  std::string what;
  // When it was issued plus `timeout`.
  absl::Time deadline;
  absl::Duration timeout;
};

// The queue and the worker thread of a CPU backend: collectives run one at a time, in
// issue order, each before its deadline; the first that fails breaks the group.
class CollectiveWorker {
 public:
  // A collective's body, run on the worker thread before op.deadline; the Work
  // completes with what it returns.
  using RunFn = std::function<absl::Status(const QueuedOp& op)>;

  // What a backend adds to the skeleton; each may be empty.
  struct Hooks {
    // On the worker thread, before anything else.
    std::function<void()> thread_init;
    // In Enqueue, under the queue's lock, for the new Work (e.g. its timeout diagnosis).
    std::function<void(CompletionWork& work, const QueuedOp& op)> on_enqueue;
    // On the worker thread, when `op` is about to run (the group is usable).
    std::function<void(const QueuedOp& op)> on_start;
    // On the worker thread, once: the collective that broke the group failed with
    // `failure` (already the group's broken state), before its Work completes. Here a
    // backend makes the peers that wait on this rank fail fast.
    std::function<void(const absl::Status& failure)> on_break;
  };

  // `group` (for Describe() in messages) and `stats` (counts what succeeds) must
  // outlive the worker. Nothing runs before Start().
  CollectiveWorker(const ProcessGroup* group, StatsRecorder* stats, Hooks hooks);
  // Stop().
  ~CollectiveWorker();
  CollectiveWorker(const CollectiveWorker&) = delete;
  CollectiveWorker& operator=(const CollectiveWorker&) = delete;

  // Starts the worker thread; it counts its allocations under the CPU allocator that
  // is current on the calling thread. Call once, when the group is ready.
  void Start();
  // Completes every collective not yet started with FailedPrecondition ("... the group
  // was destroyed first"), waits for the running one and ends the thread. Idempotent;
  // a backend calls it first in its destructor, before what the bodies use goes away.
  void Stop();

  // FailedPrecondition "<Kind> on <group>: the group is broken by an earlier failure:
  // <first error>" once the group is broken, else OK. Never blocks for long.
  absl::Status CheckUsable(CollectiveKind kind) const;
  // Whether a collective has failed (the group is broken).
  bool broken() const;

  // Queues `run` as the next collective of `kind`, due within `timeout` from now.
  // Its Work completes with run's status; with DeadlineExceeded ("<what> did not start
  // within its timeout ...") when earlier collectives used up its time; with the
  // CheckUsable error when the group broke before it ran. `traffic` is counted in the
  // stats when it succeeds. `run` (and what it holds) is dropped before waiters wake.
  std::shared_ptr<Work> Enqueue(CollectiveKind kind, absl::Duration timeout, Traffic traffic,
                                RunFn run);

 private:
  struct Entry {
    QueuedOp op;
    std::shared_ptr<CompletionWork> work;
    Traffic traffic;
    RunFn run;
  };

  void Loop();
  // Completes every queued collective with FailedPrecondition and empties the queue.
  void CancelQueued() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs one collective and completes its Work.
  void RunOne(Entry& entry);

  const ProcessGroup* const group_;
  StatsRecorder* const stats_;
  const Hooks hooks_;
  std::shared_ptr<core::Allocator> allocator_;

  mutable absl::Mutex mu_;
  std::deque<Entry> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The first failure; once set, the group is broken.
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace internal
}  // namespace comm

#endif  // COMM_INTERNAL_WORKER_GROUP_H_
