// The options of a ShmProcessGroup (comm/shm_process_group.h, which documents the
// transports and the failures): the group's name, slot size, waiting, and the transport.
// A header of its own so that the backend's internals (comm/internal/shm_*.h) can take
// them without depending on the group itself.
//
//   comm::ShmOptions opts;
//   opts.transport = comm::ShmTransport::kAuto;
//   ASSIGN_OR_RETURN(auto group, comm::ShmProcessGroup::Create(store, rank, size, opts));
#ifndef COMM_SHM_OPTIONS_H_
#define COMM_SHM_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/time/time.h"

namespace comm {

// The prefix of every segment name in /dev/shm ("/fsdp_shm_<pid>_<random>").
inline constexpr char kShmSegmentPrefix[] = "fsdp_shm_";

// How a ShmProcessGroup moves bulk data (see the top of this file).
enum class ShmTransport {
  // "cma" when every rank can process_vm_readv every peer (probed at Create), else
  // "slots" (the reason is logged once).
  kAuto,
  // Always the slots.
  kSlots,
  // Always cross-memory attach: Create is FailedPrecondition naming the rank, the peer
  // and the errno when some rank cannot read some peer; never a silent fallback.
  kCrossMemoryAttach,
};

// "auto", "slots", "cma".
const char* ShmTransportName(ShmTransport transport);

struct ShmOptions {
  // Name of the group; its store keys live under "<name>/". Must be fresh in the store.
  std::string name = "world";
  // How long Create waits for the other ranks.
  absl::Duration rendezvous_timeout = absl::Seconds(60);
  // Bytes of one slot (each rank has two); the piece size of every collective. A
  // multiple of 64 in [4 KiB, 1 GiB]; all ranks must pass the same value.
  int64_t slot_bytes = int64_t{256} << 10;
  // How long a waiting rank polls (pausing, yielding its core between polls) before it
  // sleeps on the futex (NOTE [Waiting] in comm/internal/shm_segment.cc). Zero: sleep
  // after a few pauses.
  absl::Duration spin_time = absl::Microseconds(5);
  // How often a waiting rank checks that the peers it waits on are still alive.
  absl::Duration liveness_interval = absl::Milliseconds(100);
  // Which transport moves the bulk data. All ranks must pass the same value (else
  // Create is FailedPrecondition naming the ranks).
  ShmTransport transport = ShmTransport::kSlots;
  // With "cma": a collective whose per-call size (all-gather: input bytes; reduce-scatter:
  // input bytes; all-reduce, broadcast: tensor bytes) is below this goes through the
  // slots (a small copy costs less than a system call and a round trip). >= 0; all ranks
  // must pass the same value.
  int64_t cma_min_bytes = int64_t{64} << 10;
  // For tests only: when set, Create calls it instead of probing the peers with
  // process_vm_readv, and publishes its result (0: every peer readable, else an errno)
  // as this rank's probe.
  std::function<int()> probe_override;
};

}  // namespace comm

#endif  // COMM_SHM_OPTIONS_H_
