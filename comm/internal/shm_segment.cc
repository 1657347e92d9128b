#include "comm/internal/shm_segment.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define FSDP_SHM_X86 1
#endif
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "comm/failure.h"
#include "core/errno_text.h"

// NOTE [Shm protocol]: the segment holds a header, one control block per rank and two
// data slots per rank. Every collective is a fixed number of *steps* (a function of its
// shapes only, so the same on every rank), numbered across the group's life: step s
// uses slot s % 2 of each rank. In step s a rank
//   1. if it writes data: waits until every peer's `consumed` counter is >= s - 1 (they
//      have finished step s - 2, the last one that used this slot), then fills its slot;
//   2. sets its `published` counter to s + 1 (with or without data);
//   3. waits for the `published` counter of each peer it reads (>= s + 1), reads their
//      slots (copying or reducing into its own tensors);
//   4. sets its `consumed` counter to s + 1.
// So a rank can fill one slot while its peers still read the other (double buffering),
// and never overwrites a slot a peer has not finished with. Counters are written only by
// their rank; every store is followed by a wake-up of the peers that sleep (below).
//
// NOTE [Waiting]: a waiting rank polls for ShmOptions.spin_time (5 us by default),
// pausing and yielding its core between polls, then sleeps on its futex word `wake`
// (FUTEX_WAIT on a MAP_SHARED page, so not the _PRIVATE variant: the waker may be
// another process). Race-free wake-ups, Dekker style with
// sequentially consistent atomics: the waiter reads `wake`, sets `sleeping`, re-checks
// its condition and only then sleeps on the value read; a publisher stores its counter,
// then reads the peer's `sleeping` and, when set, bumps the peer's `wake` and calls
// FUTEX_WAKE. Either the waiter sees the new counter, or the publisher sees `sleeping`
// and the bump makes the FUTEX_WAIT return at once. Sleeps are capped (kMaxSleep) so
// the deadline and the peers' liveness are re-checked regularly. Besides its counters a
// rank's control block has its pid and a state (active, failed, destroyed) that a rank
// sets when a collective of its fails or its group goes away, with a wake-up of every
// rank: a peer waiting on it then fails at once instead of at its deadline.

namespace comm {
namespace internal {
namespace {

constexpr int64_t kPageBytes = 4096;
constexpr int kSpins = 64;
constexpr absl::Duration kMaxSleep = absl::Milliseconds(20);

int64_t RoundUp(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

void FutexWake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout) {
  timespec ts = absl::ToTimespec(std::max(timeout, absl::Microseconds(50)));
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

inline void CpuRelax() {
#ifdef FSDP_SHM_X86
  _mm_pause();
#endif
}

}  // namespace

Layout LayoutFor(int size, int64_t slot_bytes) {
  Layout l;
  l.data_offset =
      RoundUp(kShmHeaderBytes + size * static_cast<int64_t>(sizeof(RankControl)), kPageBytes);
  l.total_bytes = l.data_offset + 2 * static_cast<int64_t>(size) * slot_bytes;
  return l;
}

alignas(64) const uint64_t kProbeWord = 0x45424f5250414d43ull;  // "CMAPROBE"

int ProbeRead(int32_t pid, uint64_t addr) {
  uint64_t got = 0;
  iovec local{&got, sizeof(got)};
  iovec remote{reinterpret_cast<void*>(static_cast<uintptr_t>(addr)), sizeof(got)};
  const ssize_t r = process_vm_readv(pid, &local, 1, &remote, 1, 0);
  if (r < 0) return errno;
  if (r != static_cast<ssize_t>(sizeof(got)) || got != kProbeWord) return EIO;
  return 0;
}

// Whether process `pid` has exited (gone, or a zombie not yet reaped).
bool ProcessDead(int32_t pid) {
  if (pid <= 0 || pid == getpid()) return false;
  if (kill(pid, 0) == -1 && errno == ESRCH) return true;
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return false;
  const char state = line[paren + 2];
  return state == 'Z' || state == 'X';
}

ShmSegment::~ShmSegment() {
  if (base != MAP_FAILED) munmap(base, bytes);
}

void ShmSegment::NotifyPeers(int self) const {
  std::atomic_thread_fence(std::memory_order_seq_cst);  // the counter before `sleeping`
  for (int p = 0; p < size; ++p) {
    if (p == self) continue;
    if (ctl[p].sleeping.load(std::memory_order_seq_cst) != 0) {
      ctl[p].wake.fetch_add(1, std::memory_order_seq_cst);
      FutexWake(&ctl[p].wake);
    }
  }
}

void ShmSegment::WakeAll() const {
  for (int p = 0; p < size; ++p) {
    ctl[p].wake.fetch_add(1, std::memory_order_seq_cst);
    FutexWake(&ctl[p].wake);
  }
}

void ShmSegment::MarkFailed(int self) const {
  ctl[self].state.store(kFailed, std::memory_order_seq_cst);
  WakeAll();
}

void ShmSegment::MarkDestroyed(int self) const {
  uint32_t expected = kActive;
  ctl[self].state.compare_exchange_strong(expected, kDestroyed);
  WakeAll();
}

ShmStepper::ShmStepper(const ShmSegment& segment, int self, const QueuedOp& op,
                       const ShmOptions& options)
    : seg_(segment),
      self_(self),
      n_(segment.size),
      what_(op.what),
      deadline_(op.deadline),
      timeout_(op.timeout),
      spin_time_(options.spin_time),
      liveness_interval_(options.liveness_interval),
      next_liveness_(absl::Now() + options.liveness_interval) {}

absl::Status ShmStepper::BeginWrite(uint64_t s) {
  if (s < 2) return absl::OkStatus();
  return WaitFor(&RankControl::consumed, s - 1, -1, "finish reading the slot of step", s - 2);
}

void ShmStepper::Publish(uint64_t s) {
  seg_.ctl[self_].published.store(s + 1, std::memory_order_seq_cst);
  seg_.NotifyPeers(self_);
}

absl::Status ShmStepper::WaitPublished(uint64_t s, int peer) {
  return WaitFor(&RankControl::published, s + 1, peer, "publish step", s);
}

void ShmStepper::Consumed(uint64_t s) {
  seg_.ctl[self_].consumed.store(s + 1, std::memory_order_seq_cst);
  seg_.NotifyPeers(self_);
}

void ShmStepper::PublishBuffer(uint64_t s, const void* buffer, int64_t bytes) {
  seg_.ctl[self_].buffer.store(reinterpret_cast<uintptr_t>(buffer), std::memory_order_relaxed);
  seg_.ctl[self_].buffer_bytes.store(bytes, std::memory_order_relaxed);
  Publish(s);  // seq_cst: a peer that sees the step sees the buffer
}

absl::Status ShmStepper::WaitConsumed(uint64_t s) {
  return WaitFor(&RankControl::consumed, s + 1, -1, "finish reading this rank's buffer at step", s);
}

absl::Status ShmStepper::ReadPeer(int p, int64_t expect_bytes, int64_t off, void* dst,
                                  int64_t len) {
  const RankControl& c = seg_.ctl[p];
  const uint64_t base = c.buffer.load(std::memory_order_relaxed);
  const int64_t bytes = c.buffer_bytes.load(std::memory_order_relaxed);
  if (bytes != expect_bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        what_, ": ", RankName(p), " published a buffer of ", bytes, " bytes, this rank expects ",
        expect_bytes, " (do all ranks pass the same shapes?)"));
  }
  const int32_t pid = c.pid.load(std::memory_order_relaxed);
  int64_t done = 0;
  while (done < len) {
    iovec local{static_cast<uint8_t*>(dst) + done, static_cast<size_t>(len - done)};
    iovec remote{reinterpret_cast<void*>(static_cast<uintptr_t>(base + off + done)),
                 static_cast<size_t>(len - done)};
    const ssize_t r = process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (r > 0) {
      done += r;  // a partial count: read the rest
      continue;
    }
    const int err = r < 0 ? errno : EIO;
    if (err == EINTR) continue;
    if (err == ESRCH) return PeerGone(p, "exited (process_vm_readv: no such process)");
    return absl::InternalError(
        absl::StrCat(what_, ": process_vm_readv of ", len - done, " bytes at offset ", off + done,
                     " of the buffer of ", RankName(p), " (", bytes, " bytes at 0x",
                     absl::Hex(base), ") failed: ", r < 0 ? core::ErrnoText(err) : "no progress"));
  }
  return absl::OkStatus();
}

absl::Status ShmStepper::WaitFor(std::atomic<uint64_t> RankControl::*field, uint64_t target,
                                 int peer, const char* action, uint64_t step) {
  const auto lagging = [&](std::vector<int>* out) {
    bool any = false;
    for (int p = 0; p < n_; ++p) {
      if (p == self_ || (peer >= 0 && p != peer)) continue;
      if ((seg_.ctl[p].*field).load(std::memory_order_acquire) < target) {
        if (out == nullptr) return true;
        out->push_back(p);
        any = true;
      }
    }
    return any;
  };
  for (int i = 0; i < kSpins; ++i) {
    if (!lagging(nullptr)) return absl::OkStatus();
    CpuRelax();
  }
  // Then yield for up to spin_time (NOTE [Waiting]): a peer on this core gets it.
  if (spin_time_ > absl::ZeroDuration()) {
    const absl::Time until = absl::Now() + spin_time_;
    while (true) {
      for (int i = 0; i < kSpins; ++i) {
        if (!lagging(nullptr)) return absl::OkStatus();
        CpuRelax();
      }
      if (absl::Now() >= until) break;
      sched_yield();
    }
  }
  RankControl& me = seg_.ctl[self_];
  while (true) {
    const uint32_t wake = me.wake.load(std::memory_order_seq_cst);
    me.sleeping.store(1, std::memory_order_seq_cst);
    // The store above before the counter loads below (NOTE [Waiting]).
    std::atomic_thread_fence(std::memory_order_seq_cst);
    std::vector<int> late;
    if (!lagging(&late)) {
      me.sleeping.store(0, std::memory_order_relaxed);
      return absl::OkStatus();
    }
    const absl::Time now = absl::Now();
    for (int p : late) {
      const uint32_t state = seg_.ctl[p].state.load(std::memory_order_acquire);
      if (state != kActive && lagging(nullptr)) {
        me.sleeping.store(0, std::memory_order_relaxed);
        return PeerGone(
            p, state == kFailed ? "failed a collective of the group" : "destroyed its group");
      }
    }
    if (now >= next_liveness_) {
      next_liveness_ = now + liveness_interval_;
      for (int p : late) {
        if (ProcessDead(seg_.ctl[p].pid.load(std::memory_order_acquire)) && lagging(nullptr)) {
          me.sleeping.store(0, std::memory_order_relaxed);
          return PeerGone(p, "exited");
        }
      }
    }
    if (now >= deadline_) {
      me.sleeping.store(0, std::memory_order_relaxed);
      return TimedOut(late, action, step);
    }
    FutexWait(&me.wake, wake, std::min(kMaxSleep, deadline_ - now));
    me.sleeping.store(0, std::memory_order_relaxed);
  }
}

std::string ShmStepper::RankName(int p) const {
  return absl::StrCat("rank ", p, " (pid ", seg_.ctl[p].pid.load(std::memory_order_relaxed), ")");
}

absl::Status ShmStepper::PeerGone(int p, const std::string& how) const {
  return MarkSecondary(absl::UnavailableError(absl::StrCat(what_, ": ", RankName(p), " ", how,
                                                           " while this rank waited on it")),
                       {p});
}

absl::Status ShmStepper::TimedOut(const std::vector<int>& late, const char* action,
                                  uint64_t step) const {
  std::vector<std::string> names;
  for (int p : late) {
    names.push_back(absl::StrCat(RankName(p), ", at step ",
                                 seg_.ctl[p].published.load(std::memory_order_relaxed)));
  }
  return MarkSecondary(absl::DeadlineExceededError(absl::StrCat(
                           what_, " timed out after ", absl::FormatDuration(timeout_),
                           ": waited for ", absl::StrJoin(names, ", "), " to ", action, " ", step,
                           " (it did not arrive at this collective, or is too slow)")),
                       late);
}

}  // namespace internal
}  // namespace comm
