// The shared-memory segment of a ShmProcessGroup (comm/shm_process_group.h) and the
// step protocol its collectives run over it: the layout (a header, one control block
// per rank, two data slots per rank), the control blocks' counters and states, and the
// waits with their deadline, liveness and failure checks (ShmStepper).
//
//   ShmStepper st(segment, rank, op, options);       // one collective, step s
//   RETURN_IF_ERROR(st.BeginWrite(s));               // the slot is free
//   std::memcpy(segment.slot(rank, s), data, len);
//   st.Publish(s);
//   RETURN_IF_ERROR(st.WaitPublished(s, peer));      // the peer's slot is filled
//   std::memcpy(out, segment.slot(peer, s), len);
//   st.Consumed(s);
//
// NOTE [Shm protocol] and NOTE [Waiting] are in the .cc; NOTE [CMA transport] in
// comm/internal/shm_collectives.cc. Private to the shm_process_group library.
#ifndef COMM_INTERNAL_SHM_SEGMENT_H_
#define COMM_INTERNAL_SHM_SEGMENT_H_

#include <sys/mman.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "comm/internal/worker_group.h"
#include "comm/shm_options.h"

namespace comm {
namespace internal {

inline constexpr uint64_t kShmMagic = 0x314d485350445346ull;  // "FSDPSHM1"
inline constexpr uint32_t kShmVersion = 1;
inline constexpr int64_t kShmHeaderBytes = 64;

// What a rank's control block says about its group (NOTE [Waiting]).
enum RankState : uint32_t { kActive = 0, kFailed = 1, kDestroyed = 2 };

// The first bytes of the segment, written by rank 0 before it publishes the name.
struct SegmentHeader {
  uint64_t magic;
  uint32_t version;
  int32_t size;
  int64_t slot_bytes;
  int64_t total_bytes;
  int64_t data_offset;
  int32_t creator_pid;
};
static_assert(sizeof(SegmentHeader) <= kShmHeaderBytes, "header must fit its 64 bytes");

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

// Where the data slots start and how long the segment is, for `size` ranks.
struct Layout {
  int64_t data_offset;
  int64_t total_bytes;
};
Layout LayoutFor(int size, int64_t slot_bytes);

// The word every process publishes for the peers' process_vm_readv probe.
extern const uint64_t kProbeWord;
// Reads rank `pid`'s probe word at `addr`: 0, or the errno (EIO for a wrong value).
int ProbeRead(int32_t pid, uint64_t addr);
// Whether process `pid` has exited (gone, or a zombie not yet reaped).
bool ProcessDead(int32_t pid);

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

  ~ShmSegment();
  uint8_t* slot(int rank, uint64_t step) const {
    return data + (static_cast<size_t>(rank) * 2 + step % 2) * static_cast<size_t>(slot_bytes);
  }
  // Wakes peers of `self` that sleep (NOTE [Waiting]).
  void NotifyPeers(int self) const;
  // Wakes every rank, sleeping or about to: after a state change they must notice.
  void WakeAll() const;
  // Sets rank `self`'s state to kFailed (a collective of its group failed) and wakes
  // every rank, so peers waiting on it fail at once.
  void MarkFailed(int self) const;
  // Sets rank `self`'s state to kDestroyed unless it failed, and wakes every rank.
  void MarkDestroyed(int self) const;
};

// Runs the steps of one collective on the worker thread: the waits of NOTE [Shm
// protocol] with their deadline and failure checks. Errors name `op.what`.
class ShmStepper {
 public:
  ShmStepper(const ShmSegment& segment, int self, const QueuedOp& op, const ShmOptions& options);

  // Step 1: before filling this rank's slot for step s.
  absl::Status BeginWrite(uint64_t s);
  // Step 2.
  void Publish(uint64_t s);
  // Step 3, for one peer (`peer` >= 0) or all (-1).
  absl::Status WaitPublished(uint64_t s, int peer);
  // Step 4.
  void Consumed(uint64_t s);

  // CMA (NOTE [CMA transport]): step 2 with the buffer the peers read in step s.
  void PublishBuffer(uint64_t s, const void* buffer, int64_t bytes);
  // CMA: the owner's last wait, until every peer has finished reading step s.
  absl::Status WaitConsumed(uint64_t s);
  // CMA: after WaitPublished(s, p), copies `len` bytes at offset `off` of the buffer p
  // published (`expect_bytes` long) into `dst` with process_vm_readv.
  absl::Status ReadPeer(int p, int64_t expect_bytes, int64_t off, void* dst, int64_t len);

 private:
  // Waits until field >= target on `peer` (or every peer when -1).
  absl::Status WaitFor(std::atomic<uint64_t> RankControl::*field, uint64_t target, int peer,
                       const char* action, uint64_t step);
  std::string RankName(int p) const;  // "rank 1 (pid 1234)"
  absl::Status PeerGone(int p, const std::string& how) const;
  absl::Status TimedOut(const std::vector<int>& late, const char* action, uint64_t step) const;

  const ShmSegment& seg_;
  const int self_;
  const int n_;
  const std::string& what_;
  const absl::Time deadline_;
  const absl::Duration timeout_;
  const absl::Duration spin_time_;
  const absl::Duration liveness_interval_;
  absl::Time next_liveness_;
};

}  // namespace internal
}  // namespace comm

#endif  // COMM_INTERNAL_SHM_SEGMENT_H_
