// Work: the handle an asynchronous collective returns. The collective runs in the
// background (on the group's worker thread for gloo, on the group's CUDA stream for
// NCCL); the caller checks or waits on the handle.
//
//   ASSIGN_OR_RETURN(std::shared_ptr<comm::Work> work,
//                    group->AllReduce(grad, comm::AllReduceOptions{}));
//   ... overlap other work ...
//   RETURN_IF_ERROR(work->Wait(absl::Seconds(60)));
//
// Contract (after c10d's Work.hpp):
// - IsCompleted() never blocks; true once the collective finished, with or without error.
// - Wait(timeout) makes the collective's results ready for what the caller does next,
//   and returns its status:
//   * host backends (gloo): blocks until the collective finishes or `timeout` passes;
//   * CUDA backends (NCCL): orders the compute stream (the legacy default stream, where
//     core/nn kernels and device copies run) after the collective and returns at once,
//     without blocking the host, unless the work has already failed (then its error).
//     Results are ready for any later work on the compute stream; host reads of them
//     (Tensor::ToVector, CopyFrom into a CPU tensor) synchronise with that stream and
//     so see them. A failure found later (the watchdog's deadline, a peer's error)
//     breaks the group: the next collective fails with it.
//   If it is still running at the timeout, a blocking Wait returns DeadlineExceeded and
//   the collective carries on (it has its own deadline from its options); Wait may be
//   called again.
// - WaitHost(timeout) always blocks the host until the collective finishes (or
//   `timeout`), and returns its final status; byte counters include it afterwards.
// - Tensors passed to the collective must stay untouched until it completes.
// Collectives must be issued in the same order on all ranks (NOTE [Same order on all
// ranks] in comm/store.h); Work handles may be waited on in any order.
#ifndef COMM_WORK_H_
#define COMM_WORK_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace comm {

class Work {
 public:
  virtual ~Work() = default;

  // Whether the collective has finished (successfully or not). Never blocks.
  virtual bool IsCompleted() const = 0;

  // See the contract above: blocking on host backends, stream-ordered on CUDA ones.
  // DeadlineExceeded naming the collective if a blocking wait outlasts `timeout`.
  virtual absl::Status Wait(absl::Duration timeout) = 0;

  // Blocks the host until the collective finished (or `timeout`: DeadlineExceeded
  // naming it) and returns its final status. Host backends: the same as Wait.
  virtual absl::Status WaitHost(absl::Duration timeout) { return Wait(timeout); }

  // What the work is, for messages: "AllGather #3 on gloo group 'world' (rank 1 of 4)".
  virtual std::string Describe() const = 0;
  // How long the collective itself ran (from its start on the backend to its end, not
  // counting time queued behind earlier collectives), once it has completed; nullopt
  // while it runs or when the backend's waits are stream-ordered (NCCL: StreamWaitTiming
  // below). With the host time a caller spent blocked in Wait, it tells how much of the
  // collective overlapped the caller's work (fsdp::CommTiming).
  virtual std::optional<absl::Duration> RunTime() const { return std::nullopt; }

  // What a stream-ordered Wait cost the device (CUDA backends), from CUDA events: `run`,
  // the collective's time on its stream from its start (after what it waited for) to its
  // end; `wait`, how long the compute stream stood at the point where Wait ordered it
  // after the collective (zero when the collective had ended before the compute stream
  // got there).
  struct StreamTiming {
    absl::Duration run;
    absl::Duration wait;
  };
  // Never blocks. nullopt until the collective has succeeded and the compute stream has
  // passed the point of the first Wait; nullopt for good when Wait was never called or
  // the collective failed, and on host backends (whose blocking Wait the caller times,
  // with RunTime()).
  virtual std::optional<StreamTiming> StreamWaitTiming() const { return std::nullopt; }
};

// A Work finished by someone calling Complete(status), typically a worker thread.
// Backends that run collectives on host threads use it, and so can fakes in tests.
class CompletionWork : public Work {
 public:
  explicit CompletionWork(std::string description) : description_(std::move(description)) {}

  // A Work that is already complete with `status`.
  static std::shared_ptr<CompletionWork> Done(absl::Status status, std::string description);

  // Finishes the work; only the first call counts. Wakes every waiter.
  void Complete(absl::Status status);

  // What Wait returns when its timeout passes first: `diagnose("Wait(<timeout>) on
  // <description>")`, e.g. an error naming the ranks that did not arrive (which may take
  // the diagnosis a moment longer than the timeout). Without one, DeadlineExceeded
  // "...: still running when the wait ended". Set it before handing the work out.
  void SetTimeoutDiagnosis(std::function<absl::Status(const std::string& what)> diagnose);

  bool IsCompleted() const override;
  absl::Status Wait(absl::Duration timeout) override;
  std::string Describe() const override { return description_; }
  // Set by the backend before Complete(); RunTime() returns it once completed.
  void SetRunTime(absl::Duration run_time);
  std::optional<absl::Duration> RunTime() const override;

 private:
  const std::string description_;
  mutable absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::function<absl::Status(const std::string&)> diagnose_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Duration> run_time_ ABSL_GUARDED_BY(mu_);
};

}  // namespace comm

#endif  // COMM_WORK_H_
