#include "comm/shm_process_group.h"

#include <fcntl.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define FSDP_SHM_X86 1
#endif
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <random>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "comm/failure.h"
#include "comm/internal/reduce.h"
#include "comm/prefix_store.h"
#include "glog/logging.h"

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
//
// NOTE [CMA transport]: with cross-memory attach a collective's bulk data does not go
// through the slots: a rank stores, in its control block, the address (in its own
// process) and byte length of the buffer its peers read (`buffer`, `buffer_bytes`), then
// publishes the step; a peer that sees the step reads the address and copies straight
// from the owner's process with process_vm_readv (retrying partial counts). Each CMA
// collective is one step (all-reduce: two), and every owner waits at its end until each
// peer's `consumed` counter says it has finished reading (WaitConsumed): only then may
// its caller reuse the tensor, and only then does it overwrite `buffer` for the next
// collective. The counters keep counting steps, so slot and CMA collectives mix freely
// (the choice is a function of the sizes, the same on every rank).
//   all-gather: publish the input; copy it to the own block of the output; read each
//     peer's input into its block of the output.
//   reduce-scatter: publish the input; for each piece of the own chunk (cma_piece_bytes_
//     per peer, so the pieces of all peers stay in L2) read it from each peer into
//     scratch, then reduce all ranks' pieces in rank order into the output (the same
//     code, so the same bits, as the slots).
//   all-reduce: publish the tensor; reduce-scatter the own chunk in place as above; then
//     publish step s + 1 (the own chunk is final) and read each peer's chunk from it
//     once it published s + 1 (it has then also finished reading this rank's chunks).
//   broadcast: the root publishes the tensor, the others read it.
// A probe at Create (ChooseTransport) reads a word of every peer; the store carries
// every rank's result so all ranks choose the same transport.

namespace comm {
namespace internal {
namespace {

constexpr uint64_t kMagic = 0x314d485350445346ull;  // "FSDPSHM1"
constexpr uint32_t kVersion = 1;
constexpr int64_t kHeaderBytes = 64;
constexpr int64_t kPageBytes = 4096;
constexpr int kSpins = 64;
constexpr absl::Duration kMaxSleep = absl::Milliseconds(20);

enum RankState : uint32_t { kActive = 0, kFailed = 1, kDestroyed = 2 };

struct SegmentHeader {
  uint64_t magic;
  uint32_t version;
  int32_t size;
  int64_t slot_bytes;
  int64_t total_bytes;
  int64_t data_offset;
  int32_t creator_pid;
};
static_assert(sizeof(SegmentHeader) <= kHeaderBytes, "header must fit its 64 bytes");

// One rank's control block: the first cache line is written only by its rank, the
// second by its peers (wake-ups).
struct alignas(64) RankControl {
  std::atomic<uint64_t> published;
  std::atomic<uint64_t> consumed;
  std::atomic<int32_t> pid;
  std::atomic<uint32_t> state;
  // The buffer peers read in a CMA step (NOTE [CMA transport]): address, bytes.
  std::atomic<uint64_t> buffer;
  std::atomic<int64_t> buffer_bytes;
  char pad0[64 - 40];
  std::atomic<uint32_t> wake;
  std::atomic<uint32_t> sleeping;
  char pad1[64 - 8];
};
static_assert(sizeof(RankControl) == 128, "two cache lines per rank");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "counters must be lock-free");

int64_t RoundUp(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

struct Layout {
  int64_t data_offset;
  int64_t total_bytes;
};

Layout LayoutFor(int size, int64_t slot_bytes) {
  Layout l;
  l.data_offset = RoundUp(kHeaderBytes + size * static_cast<int64_t>(sizeof(RankControl)),
                          kPageBytes);
  l.total_bytes = l.data_offset + 2 * static_cast<int64_t>(size) * slot_bytes;
  return l;
}

void FutexWake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout) {
  timespec ts = absl::ToTimespec(std::max(timeout, absl::Microseconds(50)));
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

std::string ErrnoText(int err) { return std::strerror(err); }

inline void CpuRelax() {
#ifdef FSDP_SHM_X86
  _mm_pause();
#endif
}

// The word every process publishes for the peers' process_vm_readv probe.
alignas(64) const uint64_t kProbeWord = 0x45424f5250414d43ull;  // "CMAPROBE"

// Reads rank `pid`'s probe word at `addr`: 0, or the errno (EIO for a wrong value).
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

}  // namespace

// The mapped segment of one group on one rank.
struct ShmSegment {
  std::string name;
  void* base = MAP_FAILED;
  size_t bytes = 0;
  int size = 0;
  int64_t slot_bytes = 0;
  SegmentHeader* header = nullptr;
  RankControl* ctl = nullptr;
  uint8_t* data = nullptr;

  ~ShmSegment() {
    if (base != MAP_FAILED) munmap(base, bytes);
  }
  uint8_t* slot(int rank, uint64_t step) const {
    return data + (static_cast<size_t>(rank) * 2 + step % 2) * static_cast<size_t>(slot_bytes);
  }
  // Wakes peers of `self` that sleep (NOTE [Waiting]).
  void NotifyPeers(int self) const {
    std::atomic_thread_fence(std::memory_order_seq_cst);  // the counter before `sleeping`
    for (int p = 0; p < size; ++p) {
      if (p == self) continue;
      if (ctl[p].sleeping.load(std::memory_order_seq_cst) != 0) {
        ctl[p].wake.fetch_add(1, std::memory_order_seq_cst);
        FutexWake(&ctl[p].wake);
      }
    }
  }
  // Wakes every rank, sleeping or about to: after a state change they must notice.
  void WakeAll() const {
    for (int p = 0; p < size; ++p) {
      ctl[p].wake.fetch_add(1, std::memory_order_seq_cst);
      FutexWake(&ctl[p].wake);
    }
  }
};

}  // namespace internal

using internal::RankControl;
using internal::ShmSegment;

namespace {

uint8_t* Bytes(const core::Tensor& t) { return static_cast<uint8_t*>(t.raw_data()); }

// NOTE [Streaming copies]: in a large collective (its largest tensor has at least
// kStreamingBytes, more than the caches keep for long), pieces copied or reduced into the
// destination use non-temporal stores: it is not read back soon, and ordinary stores
// would first read every line of it from memory (read for ownership). Slots themselves
// are filled with ordinary stores so the readers find them in cache. StreamFence() ends
// a collective's streaming stores (they are weakly ordered).
constexpr int64_t kStreamingBytes = int64_t{4} << 20;

void CopyOut(void* dst_v, const void* src_v, size_t n, bool streaming) {
#ifdef FSDP_SHM_X86
  if (streaming && n >= 256) {
    auto* dst = static_cast<uint8_t*>(dst_v);
    const auto* src = static_cast<const uint8_t*>(src_v);
    const size_t head = (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15;
    std::memcpy(dst, src, head);
    size_t i = head;
    for (; i + 64 <= n; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
      const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
    }
    std::memcpy(dst + i, src + i, n - i);
    return;
  }
#endif
  (void)streaming;
  std::memcpy(dst_v, src_v, n);
}

// Copies `src` into `slot` (ordinary stores) and into `dst` (streaming or not) in one
// pass over `src`, for an all-gather's own piece.
void CopyTwice(void* slot_v, void* dst_v, const void* src_v, size_t n, bool streaming) {
#ifdef FSDP_SHM_X86
  auto* dst = static_cast<uint8_t*>(dst_v);
  if (streaming && n >= 256 && (reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
    auto* slot = static_cast<uint8_t*>(slot_v);
    const auto* src = static_cast<const uint8_t*>(src_v);
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
      const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(slot + i), a);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(slot + i + 16), b);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(slot + i + 32), c);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(slot + i + 48), d);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
    }
    std::memcpy(slot + i, src + i, n - i);
    std::memcpy(dst + i, src + i, n - i);
    return;
  }
#endif
  std::memcpy(slot_v, src_v, n);
  CopyOut(dst_v, src_v, n, streaming);
}

// out[i] = chunks[0][i] op chunks[1][i] op ... (rank order; average divides the sum by
// n) for fp32, with streaming stores: the same operations, in the same order, as
// internal::ReduceChunkList, so the same bits. `out` may be one of the chunks. False
// when it cannot (not x86, or `out` not 16-byte aligned): then the caller goes through
// ReduceChunkList.
bool StreamReduceFloat(ReduceOp op, const void* const* chunks, int n, int64_t len, void* out_v) {
#ifdef FSDP_SHM_X86
  auto* out = static_cast<float*>(out_v);
  if ((reinterpret_cast<uintptr_t>(out) & 15) != 0) return false;
  const __m128 divisor = _mm_set1_ps(static_cast<float>(n));
  const auto at = [&](int j, int64_t i) { return static_cast<const float*>(chunks[j]) + i; };
  int64_t i = 0;
  for (; i + 8 <= len; i += 8) {
    __m128 a = _mm_loadu_ps(at(0, i));
    __m128 b = _mm_loadu_ps(at(0, i + 4));
    for (int j = 1; j < n; ++j) {
      const __m128 x = _mm_loadu_ps(at(j, i));
      const __m128 y = _mm_loadu_ps(at(j, i + 4));
      if (op == ReduceOp::kMax) {
        // std::max(acc, v) == (acc < v ? v : acc) == maxps(v, acc), NaNs included.
        a = _mm_max_ps(x, a);
        b = _mm_max_ps(y, b);
      } else {
        a = _mm_add_ps(a, x);
        b = _mm_add_ps(b, y);
      }
    }
    if (op == ReduceOp::kAverage) {
      a = _mm_div_ps(a, divisor);
      b = _mm_div_ps(b, divisor);
    }
    _mm_stream_ps(out + i, a);
    _mm_stream_ps(out + i + 4, b);
  }
  if (i < len) {
    std::vector<const void*> rest(static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) rest[j] = at(j, i);
    internal::ReduceChunkList(core::DType::kFloat32, op, rest.data(), n, len - i, out + i);
  }
  return true;
#else
  (void)op, (void)chunks, (void)n, (void)len, (void)out_v;
  return false;
#endif
}

void StreamFence() {
#ifdef FSDP_SHM_X86
  _mm_sfence();
#endif
}

std::string RandomHex() {
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  const uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                     (counter.fetch_add(1) * 0x9e3779b97f4a7c15ull) ^
                     static_cast<uint64_t>(absl::GetCurrentTimeNanos());
  return absl::StrCat(absl::Hex(v, absl::kZeroPad16));
}

// Unlinks a segment name on an error path.
void UnlinkQuietly(const std::string& name) {
  if (!name.empty()) shm_unlink(name.c_str());
}

}  // namespace

// Runs the steps of one collective on the worker thread: the waits of NOTE [Shm
// protocol] with their deadline and failure checks.
class ShmProcessGroup::Stepper {
 public:
  Stepper(ShmProcessGroup* group, const std::string& what, absl::Time deadline,
          absl::Duration timeout)
      : g_(group),
        seg_(*group->segment_),
        self_(group->rank_),
        n_(group->size_),
        what_(what),
        deadline_(deadline),
        timeout_(timeout),
        next_liveness_(absl::Now() + group->options_.liveness_interval) {}

  // Step 1: before filling this rank's slot for step s.
  absl::Status BeginWrite(uint64_t s) {
    if (s < 2) return absl::OkStatus();
    return WaitFor(&RankControl::consumed, s - 1, -1, "finish reading the slot of step",
                   s - 2);
  }
  // Step 2.
  void Publish(uint64_t s) {
    seg_.ctl[self_].published.store(s + 1, std::memory_order_seq_cst);
    seg_.NotifyPeers(self_);
  }
  // Step 3, for one peer (`peer` >= 0) or all (-1).
  absl::Status WaitPublished(uint64_t s, int peer) {
    return WaitFor(&RankControl::published, s + 1, peer, "publish step", s);
  }
  // Step 4.
  void Consumed(uint64_t s) {
    seg_.ctl[self_].consumed.store(s + 1, std::memory_order_seq_cst);
    seg_.NotifyPeers(self_);
  }

  // CMA (NOTE [CMA transport]): step 2 with the buffer the peers read in step s.
  void PublishBuffer(uint64_t s, const void* buffer, int64_t bytes) {
    seg_.ctl[self_].buffer.store(reinterpret_cast<uintptr_t>(buffer), std::memory_order_relaxed);
    seg_.ctl[self_].buffer_bytes.store(bytes, std::memory_order_relaxed);
    Publish(s);  // seq_cst: a peer that sees the step sees the buffer
  }
  // CMA: the owner's last wait, until every peer has finished reading step s.
  absl::Status WaitConsumed(uint64_t s) {
    return WaitFor(&RankControl::consumed, s + 1, -1, "finish reading this rank's buffer at step",
                   s);
  }
  // CMA: after WaitPublished(s, p), copies `len` bytes at offset `off` of the buffer p
  // published (`expect_bytes` long) into `dst` with process_vm_readv.
  absl::Status ReadPeer(int p, int64_t expect_bytes, int64_t off, void* dst, int64_t len) {
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
      return absl::InternalError(absl::StrCat(
          what_, ": process_vm_readv of ", len - done, " bytes at offset ", off + done,
          " of the buffer of ", RankName(p), " (", bytes, " bytes at 0x",
          absl::Hex(base), ") failed: ", r < 0 ? internal::ErrnoText(err) : "no progress"));
    }
    return absl::OkStatus();
  }

 private:
  // Waits until field >= target on `peer` (or every peer when -1).
  absl::Status WaitFor(std::atomic<uint64_t> RankControl::*field, uint64_t target, int peer,
                       const char* action, uint64_t step) {
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
    for (int i = 0; i < internal::kSpins; ++i) {
      if (!lagging(nullptr)) return absl::OkStatus();
      internal::CpuRelax();
    }
    // Then yield for up to spin_time (NOTE [Waiting]): a peer on this core gets it.
    if (g_->options_.spin_time > absl::ZeroDuration()) {
      const absl::Time until = absl::Now() + g_->options_.spin_time;
      while (true) {
        for (int i = 0; i < internal::kSpins; ++i) {
          if (!lagging(nullptr)) return absl::OkStatus();
          internal::CpuRelax();
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
        if (state != internal::kActive && lagging(nullptr)) {
          me.sleeping.store(0, std::memory_order_relaxed);
          return PeerGone(p, state == internal::kFailed ? "failed a collective of the group"
                                                        : "destroyed its group");
        }
      }
      if (now >= next_liveness_) {
        next_liveness_ = now + g_->options_.liveness_interval;
        for (int p : late) {
          if (internal::ProcessDead(seg_.ctl[p].pid.load(std::memory_order_acquire)) &&
              lagging(nullptr)) {
            me.sleeping.store(0, std::memory_order_relaxed);
            return PeerGone(p, "exited");
          }
        }
      }
      if (now >= deadline_) {
        me.sleeping.store(0, std::memory_order_relaxed);
        return TimedOut(late, action, step);
      }
      internal::FutexWait(&me.wake, wake, std::min(internal::kMaxSleep, deadline_ - now));
      me.sleeping.store(0, std::memory_order_relaxed);
    }
  }

  std::string RankName(int p) const {  // "rank 1 (pid 1234)"
    return absl::StrCat("rank ", p, " (pid ", seg_.ctl[p].pid.load(std::memory_order_relaxed),
                        ")");
  }

  absl::Status PeerGone(int p, const std::string& how) const {
    return MarkSecondary(
        absl::UnavailableError(absl::StrCat(what_, ": ", RankName(p), " ", how,
                                            " while this rank waited on it")),
        {p});
  }

  absl::Status TimedOut(const std::vector<int>& late, const char* action, uint64_t step) const {
    std::vector<std::string> names;
    for (int p : late) {
      names.push_back(absl::StrCat(
          RankName(p), ", at step ", seg_.ctl[p].published.load(std::memory_order_relaxed)));
    }
    return MarkSecondary(
        absl::DeadlineExceededError(absl::StrCat(
            what_, " timed out after ", absl::FormatDuration(timeout_), ": waited for ",
            absl::StrJoin(names, ", "), " to ", action, " ", step,
            " (it did not arrive at this collective, or is too slow)")),
        late);
  }

  ShmProcessGroup* g_;
  const ShmSegment& seg_;
  const int self_;
  const int n_;
  const std::string& what_;
  const absl::Time deadline_;
  const absl::Duration timeout_;
  absl::Time next_liveness_;
};

ShmProcessGroup::ShmProcessGroup(std::shared_ptr<Store> store, int rank, int size,
                                 ShmOptions options)
    : store_(std::move(store)), rank_(rank), size_(size), options_(std::move(options)) {}

const std::string& ShmProcessGroup::segment_name() const { return segment_->name; }

absl::StatusOr<std::shared_ptr<ShmProcessGroup>> ShmProcessGroup::Create(
    std::shared_ptr<Store> store, int rank, int size, const ShmOptions& options) {
  if (store == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("ShmProcessGroup::Create('", options.name, "'): store is null"));
  }
  return Join(std::make_shared<PrefixStore>(std::move(store), options.name), rank, size, options);
}

absl::StatusOr<std::shared_ptr<ShmProcessGroup>> ShmProcessGroup::Join(
    std::shared_ptr<Store> store, int rank, int size, const ShmOptions& options) {
  const std::string who =
      absl::StrCat("shm group '", options.name, "' (rank ", rank, " of ", size, ")");
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": rank must be in [0, size) and size at least 1"));
  }
  if (options.rendezvous_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": ShmOptions.rendezvous_timeout must be positive"));
  }
  if (options.liveness_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": ShmOptions.liveness_interval must be positive"));
  }
  if (options.slot_bytes < 4096 || options.slot_bytes > (int64_t{1} << 30) ||
      options.slot_bytes % 64 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": ShmOptions.slot_bytes ", options.slot_bytes,
                     " must be a multiple of 64 in [4096, 2^30]"));
  }
  if (options.slot_bytes < 64 * static_cast<int64_t>(size)) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": ShmOptions.slot_bytes ", options.slot_bytes,
                     " must be at least 64 bytes per rank (", 64 * static_cast<int64_t>(size),
                     ")"));
  }
  const internal::Layout layout = internal::LayoutFor(size, options.slot_bytes);
  const absl::Time deadline = absl::Now() + options.rendezvous_timeout;
  const auto left = [&] { return std::max(absl::Milliseconds(1), deadline - absl::Now()); };
  std::shared_ptr<ShmProcessGroup> group(new ShmProcessGroup(store, rank, size, options));
  group->allocator_ = core::Allocator::Current(core::Device::Cpu());
  auto seg = std::make_unique<ShmSegment>();
  seg->size = size;
  seg->slot_bytes = options.slot_bytes;

  if (rank == 0) {
    seg->name = absl::StrCat("/", kShmSegmentPrefix, getpid(), "_", RandomHex());
    const int fd = shm_open(seg->name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
      const int err = errno;
      return absl::UnavailableError(absl::StrCat(who, ": cannot create shared-memory segment ",
                                                 seg->name, ": ", internal::ErrnoText(err)));
    }
    const auto fail = [&](absl::StatusCode code, const std::string& what, int err) {
      close(fd);
      UnlinkQuietly(seg->name);
      return absl::Status(code, absl::StrCat(who, ": ", what, " shared-memory segment ",
                                             seg->name, " of ", layout.total_bytes,
                                             " bytes: ", internal::ErrnoText(err)));
    };
    if (ftruncate(fd, layout.total_bytes) != 0) {
      const int err = errno;
      return fail(err == ENOSPC || err == EFBIG ? absl::StatusCode::kResourceExhausted
                                                : absl::StatusCode::kUnavailable,
                  "cannot size", err);
    }
    // Reserve the pages now: a full /dev/shm is an error here, not a SIGBUS on first touch.
    if (const int err = posix_fallocate(fd, 0, layout.total_bytes); err != 0) {
      return fail(err == ENOSPC || err == ENOMEM || err == EFBIG
                      ? absl::StatusCode::kResourceExhausted
                      : absl::StatusCode::kUnavailable,
                  "cannot reserve (is /dev/shm full?)", err);
    }
    seg->base = mmap(nullptr, static_cast<size_t>(layout.total_bytes), PROT_READ | PROT_WRITE,
                     MAP_SHARED, fd, 0);
    if (seg->base == MAP_FAILED) {
      const int err = errno;
      return fail(absl::StatusCode::kResourceExhausted, "cannot map", err);
    }
    close(fd);
    seg->bytes = static_cast<size_t>(layout.total_bytes);
    auto* header = static_cast<internal::SegmentHeader*>(seg->base);
    header->version = internal::kVersion;
    header->size = size;
    header->slot_bytes = options.slot_bytes;
    header->total_bytes = layout.total_bytes;
    header->data_offset = layout.data_offset;
    header->creator_pid = getpid();
    std::atomic_thread_fence(std::memory_order_release);
    header->magic = internal::kMagic;
  } else {
    absl::StatusOr<std::string> name = store->Get("segment", left());
    if (!name.ok()) {
      return absl::Status(name.status().code(),
                          absl::StrCat(who, ": rank 0 did not publish the segment name within ",
                                       "rendezvous_timeout ",
                                       absl::FormatDuration(options.rendezvous_timeout), ": ",
                                       name.status().message()));
    }
    if (!absl::StartsWith(*name, absl::StrCat("/", kShmSegmentPrefix)) ||
        name->find('/', 1) != std::string::npos || name->size() > 200) {
      return absl::DataLossError(absl::StrCat(who, ": key '", options.name,
                                              "/segment' holds \"", absl::CEscape(*name),
                                              "\", not a segment name rank 0 would write"));
    }
    seg->name = *name;
    // Maps the segment; an error is also recorded for rank 0 (NOTE [Attach errors]).
    const auto attach = [&]() -> absl::Status {
      const int fd = shm_open(seg->name.c_str(), O_RDWR, 0);
      if (fd < 0) {
        const int err = errno;
        return absl::UnavailableError(absl::StrCat(
            who, ": cannot open shared-memory segment ", seg->name, " made by rank 0: ",
            internal::ErrnoText(err), " (the shm backend needs all ranks on one host)"));
      }
      struct stat st;
      if (fstat(fd, &st) != 0 || st.st_size != layout.total_bytes) {
        close(fd);
        return absl::FailedPreconditionError(absl::StrCat(
            who, ": segment ", seg->name, " made by rank 0 has ", st.st_size, " bytes, but ",
            layout.total_bytes, " are expected for ", size, " ranks of slot_bytes ",
            options.slot_bytes, "; do all ranks pass the same size and ShmOptions.slot_bytes?"));
      }
      seg->base = mmap(nullptr, static_cast<size_t>(layout.total_bytes), PROT_READ | PROT_WRITE,
                       MAP_SHARED, fd, 0);
      const int err = errno;
      close(fd);
      if (seg->base == MAP_FAILED) {
        return absl::ResourceExhaustedError(absl::StrCat(who, ": cannot map segment ", seg->name,
                                                         " of ", layout.total_bytes,
                                                         " bytes: ", internal::ErrnoText(err)));
      }
      seg->bytes = static_cast<size_t>(layout.total_bytes);
      const auto* header = static_cast<const internal::SegmentHeader*>(seg->base);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (header->magic != internal::kMagic || header->version != internal::kVersion ||
          header->size != size || header->slot_bytes != options.slot_bytes ||
          header->total_bytes != layout.total_bytes || header->data_offset != layout.data_offset) {
        return absl::FailedPreconditionError(absl::StrCat(
            who, ": segment ", seg->name, " has header version ", header->version, ", size ",
            header->size, ", slot_bytes ", header->slot_bytes, " (magic ",
            header->magic == internal::kMagic ? "ok" : "wrong", "); this rank expects version ",
            internal::kVersion, ", size ", size, ", slot_bytes ", options.slot_bytes));
      }
      return absl::OkStatus();
    };
    if (absl::Status s = attach(); !s.ok()) {
      (void)store->Set(absl::StrCat("attached/", rank), absl::StrCat("error: ", s.ToString()));
      return s;
    }
  }
  seg->header = static_cast<internal::SegmentHeader*>(seg->base);
  seg->ctl = reinterpret_cast<RankControl*>(static_cast<uint8_t*>(seg->base) +
                                            internal::kHeaderBytes);
  seg->data = static_cast<uint8_t*>(seg->base) + layout.data_offset;
  seg->ctl[rank].buffer.store(reinterpret_cast<uintptr_t>(&internal::kProbeWord),
                              std::memory_order_seq_cst);
  seg->ctl[rank].buffer_bytes.store(sizeof(internal::kProbeWord), std::memory_order_seq_cst);
  seg->ctl[rank].pid.store(getpid(), std::memory_order_seq_cst);

  if (rank == 0) {
    if (absl::Status s = store->Set("segment", seg->name); !s.ok()) {
      UnlinkQuietly(seg->name);
      return absl::Status(s.code(), absl::StrCat(who, ": publishing the segment name: ",
                                                 s.message()));
    }
    std::vector<std::string> keys;
    for (int r = 1; r < size; ++r) keys.push_back(absl::StrCat("attached/", r));
    absl::Status attached = keys.empty() ? absl::OkStatus() : store->Wait(keys, left());
    // Everyone has mapped it (or will not): the name is no longer needed.
    UnlinkQuietly(seg->name);
    // NOTE [Attach errors]: a rank that found the segment but could not map it (another
    // host, another size or slot_bytes) says why under its "attached/<rank>" key; rank 0
    // fails at once, naming it, and tells the other ranks through "ready".
    std::vector<int> failed;
    std::vector<std::string> reasons;
    for (int r = 1; attached.ok() && r < size; ++r) {
      absl::StatusOr<std::string> v = store->Get(absl::StrCat("attached/", r), left());
      if (v.ok() && absl::StartsWith(*v, "error: ")) {
        failed.push_back(r);
        reasons.push_back(absl::StrCat("rank ", r, ": ", v->substr(7)));
      }
    }
    if (!failed.empty()) {
      const std::string why = absl::StrCat("ranks ", absl::StrJoin(failed, ", "),
                                           " could not attach to segment ", seg->name, ": ",
                                           absl::StrJoin(reasons, "; "));
      (void)store->Set("ready", absl::StrCat("error: ", why));
      return MarkSecondary(absl::FailedPreconditionError(absl::StrCat(who, ": ", why)), failed);
    }
    if (!attached.ok()) {
      std::vector<int> missing;
      for (int r = 1; r < size; ++r) {
        absl::StatusOr<bool> there = store->Check({absl::StrCat("attached/", r)});
        if (there.ok() && !*there) missing.push_back(r);
      }
      return absl::Status(
          attached.code(),
          absl::StrCat(who, ": ranks ", absl::StrJoin(missing, ", "),
                       " did not attach to segment ", seg->name, " within rendezvous_timeout ",
                       absl::FormatDuration(options.rendezvous_timeout), ": ",
                       attached.message()));
    }
    if (absl::Status s = store->Set("ready", "1"); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(who, ": rendezvous: ", s.message()));
    }
  } else {
    if (absl::Status s = store->Set(absl::StrCat("attached/", rank), absl::StrCat("ok ", getpid()));
        !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(who, ": rendezvous: ", s.message()));
    }
    absl::StatusOr<std::string> ready = store->Get("ready", left());
    if (!ready.ok()) {
      // Rank 0 unlinks the name once every rank attached or failed; if it is gone, this
      // rank does, so nothing stays in /dev/shm. (Ranks never unlink on their other
      // errors: a peer may still have to open it.)
      UnlinkQuietly(seg->name);
      return absl::Status(ready.status().code(),
                          absl::StrCat(who, ": rank 0 did not see every rank attach within ",
                                       "rendezvous_timeout ",
                                       absl::FormatDuration(options.rendezvous_timeout), ": ",
                                       ready.status().message()));
    }
    if (absl::StartsWith(*ready, "error: ")) {
      return MarkSecondary(absl::FailedPreconditionError(absl::StrCat(
                               who, ": rank 0 gave up the rendezvous: ", ready->substr(7))),
                           {});
    }
  }
  group->segment_ = std::move(seg);
  if (absl::Status s = group->ChooseTransport(*store, who, deadline); !s.ok()) return s;
  group->worker_ = std::thread([g = group.get()] { g->WorkerLoop(); });
  VLOG(1) << group->Describe() << ": attached to " << group->segment_->name << ", transport "
          << group->transport_name();
  return group;
}

const char* ShmTransportName(ShmTransport transport) {
  switch (transport) {
    case ShmTransport::kAuto:
      return "auto";
    case ShmTransport::kSlots:
      return "slots";
    case ShmTransport::kCrossMemoryAttach:
      return "cma";
  }
  return "?";
}

absl::Status ShmProcessGroup::ChooseTransport(Store& store, const std::string& who,
                                              absl::Time deadline) {
  const auto left = [&] { return std::max(absl::Milliseconds(1), deadline - absl::Now()); };
  const int n = size_;
  const int64_t per_peer = options_.slot_bytes / std::max(1, n - 1) / 64 * 64;
  cma_piece_bytes_ = std::max<int64_t>(64, per_peer);
  // This rank's probe: every peer's word (its own in a group of one; thread ranks share
  // a pid, and reading one's own process works too).
  int err = 0;
  int bad_peer = -1;
  if (options_.transport != ShmTransport::kSlots) {
    if (options_.probe_override) {
      err = options_.probe_override();
    } else {
      for (int p = 0; p < n && err == 0; ++p) {
        if (p == rank_ && n > 1) continue;
        const RankControl& c = segment_->ctl[p];
        err = internal::ProbeRead(c.pid.load(std::memory_order_seq_cst),
                                  c.buffer.load(std::memory_order_seq_cst));
        if (err != 0) bad_peer = p;
      }
    }
  }
  if (absl::Status s = store.Set(absl::StrCat("transport/", rank_),
                                 absl::StrCat(ShmTransportName(options_.transport), " ", err,
                                              " ", bad_peer));
      !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(who, ": publishing the transport probe: ",
                                               s.message()));
  }
  std::vector<std::string> keys;
  for (int r = 0; r < n; ++r) keys.push_back(absl::StrCat("transport/", r));
  if (absl::Status s = store.Wait(keys, left()); !s.ok()) {
    std::vector<int> missing;
    for (int r = 0; r < n; ++r) {
      absl::StatusOr<bool> there = store.Check({keys[r]});
      if (there.ok() && !*there) missing.push_back(r);
    }
    return absl::Status(s.code(), absl::StrCat(who, ": ranks ", absl::StrJoin(missing, ", "),
                                               " did not publish their transport probe within ",
                                               "rendezvous_timeout ",
                                               absl::FormatDuration(options_.rendezvous_timeout),
                                               ": ", s.message()));
  }
  // Every rank reads the same n values, so every rank decides the same.
  std::string failure;  // the first rank that cannot read a peer
  std::vector<std::string> mismatch;
  for (int r = 0; r < n; ++r) {
    absl::StatusOr<std::string> v = store.Get(keys[r], left());
    if (!v.ok()) {
      return absl::Status(v.status().code(),
                          absl::StrCat(who, ": reading rank ", r, "'s transport probe: ",
                                       v.status().message()));
    }
    std::vector<std::string> parts = absl::StrSplit(*v, ' ');
    int r_err = 0;
    int r_peer = -1;
    if (parts.size() != 3 || !absl::SimpleAtoi(parts[1], &r_err) ||
        !absl::SimpleAtoi(parts[2], &r_peer)) {
      return absl::DataLossError(absl::StrCat(who, ": key '", options_.name, "/", keys[r],
                                              "' holds \"", absl::CEscape(*v),
                                              "\", not a transport probe"));
    }
    if (parts[0] != ShmTransportName(options_.transport)) {
      mismatch.push_back(absl::StrCat("rank ", r, " passes ", parts[0]));
    }
    if (r_err != 0 && failure.empty()) {
      failure = absl::StrCat(
          "rank ", r, " cannot process_vm_readv ",
          r_peer >= 0 ? absl::StrCat("rank ", r_peer, " (pid ",
                                     segment_->ctl[r_peer].pid.load(std::memory_order_relaxed),
                                     ")")
                      : std::string("its peers"),
          ": ", internal::ErrnoText(r_err), " (errno ", r_err, ")");
    }
  }
  if (!mismatch.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, ": ShmOptions.transport must be the same on every rank; this rank passes ",
        ShmTransportName(options_.transport), ", ", absl::StrJoin(mismatch, ", ")));
  }
  switch (options_.transport) {
    case ShmTransport::kSlots:
      cma_ = false;
      break;
    case ShmTransport::kCrossMemoryAttach:
      if (!failure.empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            who, ": ShmOptions.transport is cma (cross-memory attach), but ", failure,
            "; use kAuto or kSlots, or allow ptrace access (Yama ptrace_scope, seccomp)"));
      }
      cma_ = true;
      break;
    case ShmTransport::kAuto:
      cma_ = failure.empty();
      if (!cma_ && rank_ == 0) {
        LOG(INFO) << who << ": cross-memory attach unavailable (" << failure
                  << "); using the shared-memory slots";
      }
      break;
  }
  return absl::OkStatus();
}

absl::StatusOr<uint8_t*> ShmProcessGroup::CmaScratch() {
  const int64_t bytes = cma_piece_bytes_ * (size_ - 1);
  if (!cma_scratch_.defined()) {
    absl::StatusOr<core::Tensor> scratch = core::Tensor::Allocate(
        {(bytes + 3) / 4}, core::DType::kFloat32, core::MemoryTag::kComm);
    if (!scratch.ok()) return scratch.status();
    cma_scratch_ = *std::move(scratch);
  }
  return static_cast<uint8_t*>(cma_scratch_.raw_data());
}

ShmProcessGroup::~ShmProcessGroup() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (worker_.joinable()) worker_.join();
  if (segment_ != nullptr) {
    uint32_t expected = internal::kActive;
    segment_->ctl[rank_].state.compare_exchange_strong(expected, internal::kDestroyed);
    segment_->WakeAll();
  }
}

absl::Status ShmProcessGroup::CheckUsable(CollectiveKind kind) const {
  absl::MutexLock lock(&mu_);
  if (!broken_.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(CollectiveKindName(kind), " on ", Describe(),
                     ": the group is broken by an earlier failure: ", broken_.message()));
  }
  return absl::OkStatus();
}

std::shared_ptr<Work> ShmProcessGroup::Enqueue(CollectiveKind kind, absl::Duration timeout,
                                               Traffic traffic, RunFn run) {
  absl::MutexLock lock(&mu_);
  const uint64_t seq = next_seq_++;
  auto work = std::make_shared<CompletionWork>(
      absl::StrCat(CollectiveKindName(kind), " #", seq, " on ", Describe()));
  queue_.push_back(Op{kind, work, absl::Now() + timeout, timeout, seq, traffic, std::move(run)});
  return work;
}

void ShmProcessGroup::WorkerLoop() {
  core::ScopedAllocator scope(allocator_);
  while (true) {
    Op op;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) {
        for (Op& pending : queue_) {
          pending.run = nullptr;
          pending.work->Complete(absl::FailedPreconditionError(
              absl::StrCat(pending.work->Describe(), ": the group was destroyed first")));
        }
        queue_.clear();
        return;
      }
      op = std::move(queue_.front());
      queue_.pop_front();
    }
    absl::Status status = CheckUsable(op.kind);
    const bool was_usable = status.ok();
    if (status.ok()) {
      const absl::Time started = absl::Now();
      if (started >= op.deadline) {
        status = absl::DeadlineExceededError(absl::StrCat(
            op.work->Describe(), " did not start within its timeout of ",
            absl::FormatDuration(op.timeout),
            " (earlier collectives of the group took the time)"));
      } else {
        status = op.run(op.work->Describe(), op.deadline);
      }
      op.work->SetRunTime(absl::Now() - started);
    }
    if (status.ok()) {
      stats_.Record(op.kind, op.traffic);
    } else if (was_usable) {
      {
        absl::MutexLock lock(&mu_);
        if (broken_.ok()) broken_ = status;
      }
      // Peers waiting on this rank fail now rather than at their deadlines.
      segment_->ctl[rank_].state.store(internal::kFailed, std::memory_order_seq_cst);
      segment_->WakeAll();
    }
    op.run = nullptr;
    op.work->Complete(std::move(status));
  }
}

namespace {

// Bytes of a reduce-scatter slot's sub-slot per destination rank (64-byte aligned).
int64_t SubSlotBytes(int64_t slot_bytes, int n) { return slot_bytes / n / 64 * 64; }

int64_t Clip(int64_t v, int64_t lo, int64_t hi) { return std::max(lo, std::min(v, hi)); }

// All-reduce's chunks: m elements over n ranks, the first m % n chunks one element longer.
struct ChunkSplit {
  ChunkSplit(int64_t m, int n) : base(m / n), rem(m % n) {}
  int64_t begin(int q) const { return q * base + std::min<int64_t>(q, rem); }
  int64_t count(int q) const { return base + (q < rem ? 1 : 0); }
  int64_t longest() const { return base + (rem > 0 ? 1 : 0); }
  int64_t base;
  int64_t rem;
};

}  // namespace

absl::Status ShmProcessGroup::RunAllGather(const core::Tensor& input, const core::Tensor& output,
                                           const std::string& what, absl::Time deadline,
                                           absl::Duration timeout) {
  if (UseCma(input.nbytes())) return RunAllGatherCma(input, output, what, deadline, timeout);
  const int n = size_;
  const int64_t bytes = input.nbytes();
  const bool in_place = input.SharesStorage(output) && input.numel() > 0 &&
                        input.offset() == output.offset() + rank_ * input.numel();
  if (bytes == 0) return absl::OkStatus();
  const uint8_t* in = Bytes(input);
  uint8_t* out = Bytes(output);
  if (n == 1) {
    if (!in_place) std::memcpy(out, in, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }
  const int64_t piece = options_.slot_bytes;
  const int64_t pieces = (bytes + piece - 1) / piece;
  const bool streaming = output.nbytes() >= kStreamingBytes;
  Stepper st(this, what, deadline, timeout);
  for (int64_t i = 0; i < pieces; ++i) {
    const uint64_t s = step_ + static_cast<uint64_t>(i);
    const int64_t off = i * piece;
    const size_t len = static_cast<size_t>(std::min(piece, bytes - off));
    if (absl::Status w = st.BeginWrite(s); !w.ok()) return w;
    if (in_place) {
      std::memcpy(segment_->slot(rank_, s), in + off, len);
    } else {
      CopyTwice(segment_->slot(rank_, s), out + rank_ * bytes + off, in + off, len, streaming);
    }
    st.Publish(s);
    for (int d = 1; d < n; ++d) {
      const int p = (rank_ + d) % n;
      if (absl::Status w = st.WaitPublished(s, p); !w.ok()) return w;
      CopyOut(out + p * bytes + off, segment_->slot(p, s), len, streaming);
    }
    st.Consumed(s);
  }
  StreamFence();
  step_ += static_cast<uint64_t>(pieces);
  return absl::OkStatus();
}

absl::Status ShmProcessGroup::RunReduceScatter(const core::Tensor& input,
                                               const core::Tensor& output, ReduceOp op,
                                               const std::string& what, absl::Time deadline,
                                               absl::Duration timeout) {
  if (UseCma(input.nbytes())) {
    return RunReduceScatterCma(input, output, op, what, deadline, timeout);
  }
  const int n = size_;
  const int64_t k = output.numel();
  if (k == 0) return absl::OkStatus();
  const uint8_t* in = Bytes(input);
  uint8_t* out = Bytes(output);
  const int64_t esize = core::DTypeSize(input.dtype());
  if (n == 1) {
    if (!output.SharesStorage(input) || output.offset() != input.offset()) {
      std::memcpy(out, in, static_cast<size_t>(input.nbytes()));
    }
    return absl::OkStatus();
  }
  const int64_t sub = SubSlotBytes(options_.slot_bytes, n);
  const int64_t piece = sub / esize;  // elements per destination and step
  const int64_t pieces = (k + piece - 1) / piece;
  const bool streaming = input.nbytes() >= kStreamingBytes;  // the bytes it streams through
  std::vector<const void*> chunks(static_cast<size_t>(n));
  Stepper st(this, what, deadline, timeout);
  for (int64_t i = 0; i < pieces; ++i) {
    const uint64_t s = step_ + static_cast<uint64_t>(i);
    const int64_t off = i * piece;
    const int64_t len = std::min(piece, k - off);
    if (absl::Status w = st.BeginWrite(s); !w.ok()) return w;
    uint8_t* mine = segment_->slot(rank_, s);
    for (int q = 0; q < n; ++q) {
      if (q == rank_) continue;
      std::memcpy(mine + q * sub, in + (q * k + off) * esize, static_cast<size_t>(len * esize));
    }
    st.Publish(s);
    if (absl::Status w = st.WaitPublished(s, -1); !w.ok()) return w;
    for (int j = 0; j < n; ++j) {
      chunks[j] = j == rank_ ? static_cast<const void*>(in + (rank_ * k + off) * esize)
                             : static_cast<const void*>(segment_->slot(j, s) + rank_ * sub);
    }
    if (absl::Status r = ReducePiece(input.dtype(), op, chunks.data(), len, out + off * esize,
                                     streaming);
        !r.ok()) {
      return r;
    }
    st.Consumed(s);
  }
  StreamFence();
  step_ += static_cast<uint64_t>(pieces);
  return absl::OkStatus();
}

absl::Status ShmProcessGroup::ReducePiece(core::DType dtype, ReduceOp op,
                                          const void* const* chunks, int64_t len, uint8_t* out,
                                          bool streaming) {
  const int64_t bytes = len * core::DTypeSize(dtype);
  if (!streaming) {
    internal::ReduceChunkList(dtype, op, chunks, size_, len, out);
    return absl::OkStatus();
  }
  if (dtype == core::DType::kFloat32 && StreamReduceFloat(op, chunks, size_, len, out)) {
    return absl::OkStatus();
  }
  if (!reduce_scratch_.defined() || reduce_scratch_.nbytes() < bytes) {
    reduce_scratch_ = core::Tensor();
    absl::StatusOr<core::Tensor> scratch = core::Tensor::Allocate(
        {(std::max(bytes, SubSlotBytes(options_.slot_bytes, size_)) + 3) / 4},
        core::DType::kFloat32,
        core::MemoryTag::kComm);
    if (!scratch.ok()) return scratch.status();
    reduce_scratch_ = *std::move(scratch);
  }
  internal::ReduceChunkList(dtype, op, chunks, size_, len, reduce_scratch_.raw_data());
  CopyOut(out, reduce_scratch_.raw_data(), static_cast<size_t>(bytes), true);
  return absl::OkStatus();
}

// Reduce-scatter of the tensor's n chunks (chunk q: the q-th of n near-equal parts, the
// first m % n one element longer) into each rank's own chunk in place, then an
// all-gather of the chunks; the same rank-order sums as ReduceScatter.
absl::Status ShmProcessGroup::RunAllReduce(const core::Tensor& tensor, ReduceOp op,
                                           const std::string& what, absl::Time deadline,
                                           absl::Duration timeout) {
  if (UseCma(tensor.nbytes())) return RunAllReduceCma(tensor, op, what, deadline, timeout);
  const int n = size_;
  const int64_t m = tensor.numel();
  if (m == 0 || n == 1) return absl::OkStatus();
  uint8_t* t = Bytes(tensor);
  const int64_t esize = core::DTypeSize(tensor.dtype());
  const ChunkSplit split(m, n);
  const auto begin = [&](int q) { return split.begin(q); };
  const auto count = [&](int q) { return split.count(q); };
  const int64_t longest = split.longest();
  Stepper st(this, what, deadline, timeout);
  const bool streaming = tensor.nbytes() >= kStreamingBytes;
  // Reduce-scatter phase.
  const int64_t sub = SubSlotBytes(options_.slot_bytes, n);
  const int64_t piece = sub / esize;
  const int64_t pieces = (longest + piece - 1) / piece;
  std::vector<const void*> chunks(static_cast<size_t>(n));
  for (int64_t i = 0; i < pieces; ++i) {
    const uint64_t s = step_ + static_cast<uint64_t>(i);
    const int64_t off = i * piece;
    if (absl::Status w = st.BeginWrite(s); !w.ok()) return w;
    uint8_t* mine = segment_->slot(rank_, s);
    for (int q = 0; q < n; ++q) {
      if (q == rank_) continue;
      const int64_t len = Clip(count(q) - off, 0, piece);
      std::memcpy(mine + q * sub, t + (begin(q) + off) * esize, static_cast<size_t>(len * esize));
    }
    st.Publish(s);
    if (absl::Status w = st.WaitPublished(s, -1); !w.ok()) return w;
    const int64_t len = Clip(count(rank_) - off, 0, piece);
    uint8_t* own = t + (begin(rank_) + off) * esize;
    for (int j = 0; j < n; ++j) {
      chunks[j] = j == rank_ ? static_cast<const void*>(own)
                             : static_cast<const void*>(segment_->slot(j, s) + rank_ * sub);
    }
    if (absl::Status r = ReducePiece(tensor.dtype(), op, chunks.data(), len, own, streaming);
        !r.ok()) {
      return r;
    }
    st.Consumed(s);
  }
  step_ += static_cast<uint64_t>(pieces);
  StreamFence();  // the reduced chunk is read back below
  // All-gather phase, in whole-slot pieces.
  const int64_t gpiece = options_.slot_bytes / esize;
  const int64_t gpieces = (longest + gpiece - 1) / gpiece;
  for (int64_t i = 0; i < gpieces; ++i) {
    const uint64_t s = step_ + static_cast<uint64_t>(i);
    const int64_t off = i * gpiece;
    if (absl::Status w = st.BeginWrite(s); !w.ok()) return w;
    const int64_t len = Clip(count(rank_) - off, 0, gpiece);
    std::memcpy(segment_->slot(rank_, s), t + (begin(rank_) + off) * esize,
                static_cast<size_t>(len * esize));
    st.Publish(s);
    for (int d = 1; d < n; ++d) {
      const int p = (rank_ + d) % n;
      if (absl::Status w = st.WaitPublished(s, p); !w.ok()) return w;
      const int64_t plen = Clip(count(p) - off, 0, gpiece);
      CopyOut(t + (begin(p) + off) * esize, segment_->slot(p, s),
              static_cast<size_t>(plen * esize), streaming);
    }
    st.Consumed(s);
  }
  StreamFence();
  step_ += static_cast<uint64_t>(gpieces);
  return absl::OkStatus();
}

absl::Status ShmProcessGroup::RunBroadcast(const core::Tensor& tensor, int root,
                                           const std::string& what, absl::Time deadline,
                                           absl::Duration timeout) {
  if (UseCma(tensor.nbytes())) return RunBroadcastCma(tensor, root, what, deadline, timeout);
  const int64_t bytes = tensor.nbytes();
  if (bytes == 0 || size_ == 1) return absl::OkStatus();
  uint8_t* t = Bytes(tensor);
  const int64_t piece = options_.slot_bytes;
  const int64_t pieces = (bytes + piece - 1) / piece;
  const bool streaming = bytes >= kStreamingBytes;
  Stepper st(this, what, deadline, timeout);
  for (int64_t i = 0; i < pieces; ++i) {
    const uint64_t s = step_ + static_cast<uint64_t>(i);
    const int64_t off = i * piece;
    const size_t len = static_cast<size_t>(std::min(piece, bytes - off));
    if (rank_ == root) {
      if (absl::Status w = st.BeginWrite(s); !w.ok()) return w;
      std::memcpy(segment_->slot(root, s), t + off, len);
      st.Publish(s);
    } else {
      st.Publish(s);
      if (absl::Status w = st.WaitPublished(s, root); !w.ok()) return w;
      CopyOut(t + off, segment_->slot(root, s), len, streaming);
    }
    st.Consumed(s);
  }
  StreamFence();
  step_ += static_cast<uint64_t>(pieces);
  return absl::OkStatus();
}

absl::Status ShmProcessGroup::ReduceFromPeersCma(Stepper& st, core::DType dtype, ReduceOp op,
                                                 const uint8_t* own, int64_t buf_bytes,
                                                 int64_t at, int64_t elems, uint8_t* out,
                                                 uint8_t* scratch, bool streaming) {
  const int n = size_;
  const int64_t esize = core::DTypeSize(dtype);
  const int64_t piece = cma_piece_bytes_ / esize;  // elements per peer and read
  std::vector<const void*> chunks(static_cast<size_t>(n));
  for (int64_t off = 0; off < elems; off += piece) {
    const int64_t len = std::min(piece, elems - off);
    const int64_t from = at + off * esize;
    for (int j = 0, slot = 0; j < n; ++j) {
      if (j == rank_) {
        chunks[j] = own + from;
        continue;
      }
      uint8_t* dst = scratch + (slot++) * cma_piece_bytes_;
      if (absl::Status r = st.ReadPeer(j, buf_bytes, from, dst, len * esize); !r.ok()) return r;
      chunks[j] = dst;
    }
    if (absl::Status r = ReducePiece(dtype, op, chunks.data(), len, out + off * esize, streaming);
        !r.ok()) {
      return r;
    }
  }
  return absl::OkStatus();
}

absl::Status ShmProcessGroup::RunAllGatherCma(const core::Tensor& input,
                                              const core::Tensor& output,
                                              const std::string& what, absl::Time deadline,
                                              absl::Duration timeout) {
  const int n = size_;
  const int64_t bytes = input.nbytes();
  const bool in_place = input.SharesStorage(output) &&
                        input.offset() == output.offset() + rank_ * input.numel();
  const uint8_t* in = Bytes(input);
  uint8_t* out = Bytes(output);
  const bool streaming = output.nbytes() >= kStreamingBytes;
  Stepper st(this, what, deadline, timeout);
  const uint64_t s = step_;
  st.PublishBuffer(s, in, bytes);
  if (!in_place) CopyOut(out + rank_ * bytes, in, static_cast<size_t>(bytes), streaming);
  for (int d = 1; d < n; ++d) {
    const int p = (rank_ + d) % n;
    if (absl::Status w = st.WaitPublished(s, p); !w.ok()) return w;
    if (absl::Status r = st.ReadPeer(p, bytes, 0, out + p * bytes, bytes); !r.ok()) return r;
  }
  StreamFence();
  st.Consumed(s);
  if (absl::Status w = st.WaitConsumed(s); !w.ok()) return w;
  step_ += 1;
  return absl::OkStatus();
}

absl::Status ShmProcessGroup::RunReduceScatterCma(const core::Tensor& input,
                                                  const core::Tensor& output, ReduceOp op,
                                                  const std::string& what, absl::Time deadline,
                                                  absl::Duration timeout) {
  const int64_t k = output.numel();
  const uint8_t* in = Bytes(input);
  uint8_t* out = Bytes(output);
  const int64_t esize = core::DTypeSize(input.dtype());
  const int64_t in_bytes = input.nbytes();
  const bool streaming = in_bytes >= kStreamingBytes;
  absl::StatusOr<uint8_t*> scratch = CmaScratch();
  if (!scratch.ok()) return scratch.status();
  Stepper st(this, what, deadline, timeout);
  const uint64_t s = step_;
  st.PublishBuffer(s, in, in_bytes);
  if (absl::Status w = st.WaitPublished(s, -1); !w.ok()) return w;
  if (absl::Status r = ReduceFromPeersCma(st, input.dtype(), op, in, in_bytes, rank_ * k * esize,
                                          k, out, *scratch, streaming);
      !r.ok()) {
    return r;
  }
  StreamFence();
  st.Consumed(s);
  if (absl::Status w = st.WaitConsumed(s); !w.ok()) return w;
  step_ += 1;
  return absl::OkStatus();
}

absl::Status ShmProcessGroup::RunAllReduceCma(const core::Tensor& tensor, ReduceOp op,
                                              const std::string& what, absl::Time deadline,
                                              absl::Duration timeout) {
  const int n = size_;
  const int64_t m = tensor.numel();
  uint8_t* t = Bytes(tensor);
  const int64_t esize = core::DTypeSize(tensor.dtype());
  const int64_t t_bytes = tensor.nbytes();
  const ChunkSplit split(m, n);
  const auto begin = [&](int q) { return split.begin(q); };
  const auto count = [&](int q) { return split.count(q); };
  const bool streaming = t_bytes >= kStreamingBytes;
  absl::StatusOr<uint8_t*> scratch = CmaScratch();
  if (!scratch.ok()) return scratch.status();
  Stepper st(this, what, deadline, timeout);
  const uint64_t s = step_;
  // Reduce-scatter of the own chunk, in place (peers read only their own chunks of it).
  st.PublishBuffer(s, t, t_bytes);
  if (absl::Status w = st.WaitPublished(s, -1); !w.ok()) return w;
  const int64_t at = begin(rank_) * esize;
  if (absl::Status r = ReduceFromPeersCma(st, tensor.dtype(), op, t, t_bytes, at, count(rank_),
                                          t + at, *scratch, streaming);
      !r.ok()) {
    return r;
  }
  StreamFence();  // the reduced chunk is read by the peers next
  // All-gather: step s + 1 says this rank's chunk is final and that it has finished
  // reading the peers' chunks, so a peer may overwrite them once it sees it.
  st.Publish(s + 1);
  for (int d = 1; d < n; ++d) {
    const int p = (rank_ + d) % n;
    if (absl::Status w = st.WaitPublished(s + 1, p); !w.ok()) return w;
    const int64_t at = begin(p) * esize;
    if (absl::Status r = st.ReadPeer(p, t_bytes, at, t + at, count(p) * esize); !r.ok()) {
      return r;
    }
  }
  st.Consumed(s + 1);
  if (absl::Status w = st.WaitConsumed(s + 1); !w.ok()) return w;
  step_ += 2;
  return absl::OkStatus();
}

absl::Status ShmProcessGroup::RunBroadcastCma(const core::Tensor& tensor, int root,
                                              const std::string& what, absl::Time deadline,
                                              absl::Duration timeout) {
  const int64_t bytes = tensor.nbytes();
  uint8_t* t = Bytes(tensor);
  Stepper st(this, what, deadline, timeout);
  const uint64_t s = step_;
  if (rank_ == root) {
    st.PublishBuffer(s, t, bytes);
    st.Consumed(s);
    if (absl::Status w = st.WaitConsumed(s); !w.ok()) return w;
  } else {
    st.Publish(s);
    if (absl::Status w = st.WaitPublished(s, root); !w.ok()) return w;
    if (absl::Status r = st.ReadPeer(root, bytes, 0, t, bytes); !r.ok()) return r;
    st.Consumed(s);
  }
  step_ += 1;
  return absl::OkStatus();
}

absl::Status ShmProcessGroup::RunBarrier(const std::string& what, absl::Time deadline,
                                         absl::Duration timeout) {
  if (size_ == 1) return absl::OkStatus();
  Stepper st(this, what, deadline, timeout);
  const uint64_t s = step_;
  st.Publish(s);
  if (absl::Status w = st.WaitPublished(s, -1); !w.ok()) return w;
  st.Consumed(s);
  step_ += 1;
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Work>> ShmProcessGroup::AllGather(
    const core::Tensor& input, const core::Tensor& output, const AllGatherOptions& options) {
  constexpr CollectiveKind kind = CollectiveKind::kAllGather;
  if (auto s = ValidateAllGather(*this, input, output, options); !s.ok()) return s;
  if (auto s = ValidateDevice(*this, kind, {&input, &output}, core::Device::Cpu()); !s.ok()) {
    return s;
  }
  if (auto s = CheckUsable(kind); !s.ok()) return s;
  const absl::Duration timeout = options.timeout;
  return Enqueue(kind, timeout, ExpectedTraffic(kind, output.nbytes(), size_, rank_),
                 [this, input, output, timeout](const std::string& what, absl::Time deadline) {
                   return RunAllGather(input, output, what, deadline, timeout);
                 });
}

absl::StatusOr<std::shared_ptr<Work>> ShmProcessGroup::ReduceScatter(
    const core::Tensor& input, const core::Tensor& output, const ReduceScatterOptions& options) {
  constexpr CollectiveKind kind = CollectiveKind::kReduceScatter;
  if (auto s = ValidateReduceScatter(*this, input, output, options); !s.ok()) return s;
  if (auto s = ValidateDevice(*this, kind, {&input, &output}, core::Device::Cpu()); !s.ok()) {
    return s;
  }
  if (auto s = CheckUsable(kind); !s.ok()) return s;
  const absl::Duration timeout = options.timeout;
  const ReduceOp op = options.reduce_op;
  return Enqueue(
      kind, timeout, ExpectedTraffic(kind, input.nbytes(), size_, rank_),
      [this, input, output, op, timeout](const std::string& what, absl::Time deadline) {
        return RunReduceScatter(input, output, op, what, deadline, timeout);
      });
}

absl::StatusOr<std::shared_ptr<Work>> ShmProcessGroup::AllReduce(const core::Tensor& tensor,
                                                                 const AllReduceOptions& options) {
  constexpr CollectiveKind kind = CollectiveKind::kAllReduce;
  if (auto s = ValidateAllReduce(*this, tensor, options); !s.ok()) return s;
  if (auto s = ValidateDevice(*this, kind, {&tensor}, core::Device::Cpu()); !s.ok()) return s;
  if (auto s = CheckUsable(kind); !s.ok()) return s;
  const absl::Duration timeout = options.timeout;
  const ReduceOp op = options.reduce_op;
  return Enqueue(kind, timeout, ExpectedTraffic(kind, tensor.nbytes(), size_, rank_),
                 [this, tensor, op, timeout](const std::string& what, absl::Time deadline) {
                   return RunAllReduce(tensor, op, what, deadline, timeout);
                 });
}

absl::StatusOr<std::shared_ptr<Work>> ShmProcessGroup::Broadcast(const core::Tensor& tensor,
                                                                 const BroadcastOptions& options) {
  constexpr CollectiveKind kind = CollectiveKind::kBroadcast;
  if (auto s = ValidateBroadcast(*this, tensor, options); !s.ok()) return s;
  if (auto s = ValidateDevice(*this, kind, {&tensor}, core::Device::Cpu()); !s.ok()) return s;
  if (auto s = CheckUsable(kind); !s.ok()) return s;
  const absl::Duration timeout = options.timeout;
  const int root = options.root;
  return Enqueue(kind, timeout, ExpectedTraffic(kind, tensor.nbytes(), size_, rank_, root),
                 [this, tensor, root, timeout](const std::string& what, absl::Time deadline) {
                   return RunBroadcast(tensor, root, what, deadline, timeout);
                 });
}

absl::StatusOr<std::shared_ptr<Work>> ShmProcessGroup::Barrier(const BarrierOptions& options) {
  constexpr CollectiveKind kind = CollectiveKind::kBarrier;
  if (auto s = ValidateBarrier(*this, options); !s.ok()) return s;
  if (auto s = CheckUsable(kind); !s.ok()) return s;
  const absl::Duration timeout = options.timeout;
  return Enqueue(kind, timeout, Traffic{},
                 [this, timeout](const std::string& what, absl::Time deadline) {
                   return RunBarrier(what, deadline, timeout);
                 });
}

absl::StatusOr<std::shared_ptr<ProcessGroup>> ShmProcessGroup::NewSubgroup(
    const std::vector<int>& ranks, const SubgroupOptions& options) {
  int index = 0;
  {
    absl::MutexLock lock(&mu_);
    index = next_subgroup_++;
  }
  absl::StatusOr<SubgroupPlacement> place = PlaceInSubgroup(*this, ranks, index);
  if (!place.ok()) return place.status();
  ShmOptions sub = options_;
  sub.name = options.name.empty() ? absl::StrCat(options_.name, "/", place->key_prefix)
                                  : options.name;
  sub.rendezvous_timeout = options.timeout;
  absl::StatusOr<std::shared_ptr<ShmProcessGroup>> group =
      Join(std::make_shared<PrefixStore>(store_, place->key_prefix), place->rank, place->size, sub);
  if (!group.ok()) return group.status();
  return std::shared_ptr<ProcessGroup>(*std::move(group));
}

}  // namespace comm
