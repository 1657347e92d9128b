// Watchdog: enforces the deadlines of in-flight asynchronous operations (the NCCL
// group's collectives) even when nobody waits on them, completes them when they finish,
// and keeps their resources alive until the device is done with them. Device
// independent: an operation is a set of callbacks (poll, release), so the deadline and
// queue logic is unit-tested on the CPU with fake operations and an injected clock,
// and the NCCL group (comm/nccl_process_group.cc) plugs CUDA events into it.
//
//   comm::internal::Watchdog::Options options;
//   options.on_failure = [&](const absl::Status& s) { BreakGroup(s); };
//   comm::internal::Watchdog dog(options);        // starts its thread
//   comm::internal::WatchedOp op;
//   op.description = "AllReduce #3 on nccl group 'world' (rank 0 of 2)";
//   op.timeout = absl::Seconds(60);
//   op.poll = [event] { return QueryEvent(event); };          // nullopt: still running
//   op.device_done = [event] { return EventFired(event); };
//   op.complete = [work](const absl::Status& s) { work->Complete(s); };
//   op.release = [keep]() mutable { keep.clear(); };          // frees the tensors
//   dog.Add(std::move(op));
//
// NOTE [Watchdog]: every PollOnce (the thread runs one each poll_interval) walks the
// operations in the order they were added:
// - a running operation whose poll() returns a status is complete: complete(status);
//   an error also calls options.on_failure(status) (the group breaks);
// - a running operation still pending after its deadline (added + timeout, on the
//   injected clock) completes with DeadlineExceeded "<description> did not finish within
//   its timeout of <timeout>; the watchdog aborted the communicator and broke the group",
//   and options.on_failure gets the same status first (so the group aborts the
//   communicator before the work reports);
// - a complete operation stays queued until device_done() says the device no longer
//   reads or writes its buffers; then release() runs and the operation is dropped. So a
//   buffer is never handed back to the allocator while a kernel still uses it, even
//   when the work failed or its handle is gone.
// complete() runs exactly once per operation, release() at most once, both on the
// thread calling PollOnce (the watchdog thread) and without the watchdog's lock held,
// so they may take their own locks. The destructor stops the thread; operations still
// running complete with Aborted ("the watchdog stopped"), and every queued operation is
// released (the owner aborts the communicator first, so no kernel is left running).
#ifndef COMM_INTERNAL_WATCHDOG_H_
#define COMM_INTERNAL_WATCHDOG_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace comm {
namespace internal {

// One asynchronous operation under watch.
struct WatchedOp {
  // Names the operation in messages ("AllGather #3 on nccl group 'world' (rank 0 of 2)").
  std::string description;
  // Counted from Add(); past it, the watchdog fails the operation.
  absl::Duration timeout = absl::Minutes(5);
  // Never blocks: nullopt while the operation runs, its outcome once it finished.
  std::function<std::optional<absl::Status>()> poll;
  // Never blocks: true once the device no longer uses the operation's buffers. Unset:
  // as soon as the operation is complete.
  std::function<bool()> device_done;
  // Receives the outcome, once.
  std::function<void(const absl::Status&)> complete;
  // Drops what kept the buffers alive; called once device_done() (may be unset).
  std::function<void()> release;
};

class Watchdog {
 public:
  struct Options {
    // The clock deadlines are measured on (tests inject a fake one).
    std::function<absl::Time()> now = [] { return absl::Now(); };
    // How often the thread polls.
    absl::Duration poll_interval = absl::Microseconds(200);
    // False: no thread; the owner calls PollOnce (tests).
    bool start_thread = true;
    // Called (before the operation's complete()) with the error of an operation that
    // failed or ran past its deadline.
    std::function<void(const absl::Status&)> on_failure;
    // Runs once on the watchdog thread before its first poll (e.g. cudaSetDevice).
    std::function<void()> thread_init;
  };

  explicit Watchdog(Options options);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Queues `op`; its deadline is now() + op.timeout.
  void Add(WatchedOp op);

  // One pass over the queue (NOTE [Watchdog]). Returns how many operations completed
  // in this pass.
  int PollOnce();

  // Operations not yet complete (waits for a pass in progress to end).
  int64_t running() const;
  // Operations complete but not yet released (the device still uses their buffers).
  int64_t draining() const;

 private:
  struct Entry {
    WatchedOp op;
    absl::Time deadline;
    bool completed = false;
  };

  void Loop();

  const Options options_;
  mutable absl::Mutex mu_;
  std::deque<Entry> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  mutable absl::Mutex poll_mu_;  // one PollOnce at a time; taken before mu_
  std::thread thread_;
};

}  // namespace internal
}  // namespace comm

#endif  // COMM_INTERNAL_WATCHDOG_H_
