#include "comm/internal/watchdog.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace comm {
namespace internal {

Watchdog::Watchdog(Options options) : options_(std::move(options)) {
  if (options_.start_thread) thread_ = std::thread([this] { Loop(); });
}

Watchdog::~Watchdog() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
  absl::MutexLock poll(&poll_mu_);
  std::deque<Entry> left;
  {
    absl::MutexLock lock(&mu_);
    left.swap(queue_);
  }
  for (Entry& e : left) {
    if (!e.completed && e.op.complete) {
      e.op.complete(
          absl::AbortedError(absl::StrCat(e.op.description,
                                          ": the watchdog stopped (its group was destroyed) "
                                          "before the operation finished")));
    }
    if (e.op.release) e.op.release();
  }
}

void Watchdog::Add(WatchedOp op) {
  Entry e;
  e.deadline = options_.now() + op.timeout;
  e.op = std::move(op);
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(e));
}

int Watchdog::PollOnce() {
  absl::MutexLock poll(&poll_mu_);
  std::deque<Entry> work;
  {
    absl::MutexLock lock(&mu_);
    work.swap(queue_);
  }
  int completed = 0;
  std::deque<Entry> keep;
  for (Entry& e : work) {
    if (!e.completed) {
      std::optional<absl::Status> outcome;
      if (e.op.poll) outcome = e.op.poll();
      if (!outcome.has_value() && options_.now() > e.deadline) {
        outcome = absl::DeadlineExceededError(
            absl::StrCat(e.op.description, " did not finish within its timeout of ",
                         absl::FormatDuration(e.op.timeout),
                         "; the watchdog aborted the communicator and broke the group"));
      }
      if (outcome.has_value()) {
        if (!outcome->ok() && options_.on_failure) options_.on_failure(*outcome);
        if (e.op.complete) e.op.complete(*outcome);
        e.completed = true;
        ++completed;
      }
    }
    if (e.completed && (!e.op.device_done || e.op.device_done())) {
      if (e.op.release) e.op.release();
      continue;
    }
    keep.push_back(std::move(e));
  }
  absl::MutexLock lock(&mu_);
  // Operations added meanwhile go after the older ones.
  for (Entry& e : queue_) keep.push_back(std::move(e));
  queue_.swap(keep);
  return completed;
}

int64_t Watchdog::running() const {
  absl::MutexLock poll(&poll_mu_);
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  for (const Entry& e : queue_) n += e.completed ? 0 : 1;
  return n;
}

int64_t Watchdog::draining() const {
  absl::MutexLock poll(&poll_mu_);
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  for (const Entry& e : queue_) n += e.completed ? 1 : 0;
  return n;
}

void Watchdog::Loop() {
  if (options_.thread_init) options_.thread_init();
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
    }
    PollOnce();
    absl::MutexLock lock(&mu_);
    // Sleep the poll interval, waking at once when asked to stop.
    mu_.AwaitWithTimeout(absl::Condition(&stop_), options_.poll_interval);
    if (stop_) return;
  }
}

}  // namespace internal
}  // namespace comm
