// ShmProcessGroup: a CPU backend of ProcessGroup for ranks on one host, exchanging
// through one POSIX shared-memory segment instead of sockets.
//
//   auto store = std::make_shared<comm::HashStore>();   // or a TcpStore across processes
//   comm::ShmOptions opts;                              // name "world", 256 KiB slots
//   ASSIGN_OR_RETURN(std::shared_ptr<comm::ShmProcessGroup> group,
//                    comm::ShmProcessGroup::Create(store, rank, world_size, opts));
//   ASSIGN_OR_RETURN(auto work, group->AllGather(shard, full, comm::AllGatherOptions{}));
//   RETURN_IF_ERROR(work->Wait(absl::Seconds(60)));
//
// Create() meets the other ranks through the store (keys under "<name>/"): rank 0
// creates a segment of 2 x size x slot_bytes (plus a small control block), reserves its
// pages (a full /dev/shm is ResourceExhausted here, never a SIGBUS later) and publishes
// its name; the others map it; once all have, rank 0 unlinks it, so nothing is left in
// /dev/shm whatever happens to the processes afterwards. Every rank returns from Create
// only after that. All ranks must be processes (or threads) of one host.
//
// Collectives take CPU tensors and run one at a time, in issue order, on the group's
// worker thread (NOTE [Shm protocol] in comm/internal/shm_segment.cc). Two transports
// move the bulk data:
// - "slots": tensors move in slot-sized pieces through two slots per rank (each byte is
//   copied twice: owner -> slot, slot -> peer);
// - "cma" (Linux cross-memory attach, NOTE [CMA transport] in
//   comm/internal/shm_collectives.cc): each rank publishes the
//   address and length of the buffer its peers need in its control block, and the peers
//   copy straight out of its process with process_vm_readv (one copy per byte); the
//   owner returns only once every peer has finished reading. Messages below
//   ShmOptions.cma_min_bytes (64 KiB) keep using the slots, which need no system call.
// ShmOptions.transport picks one: kSlots (the default: on the 2-vCPU machine this was
// built on, quiet, the slots moved 4-16 MiB at 1.1-1.6x cma's busbw, since
// process_vm_readv copies there at only 0.45-0.7 of memcpy), kCrossMemoryAttach, or
// kAuto, which probes at Create and uses "cma" when every rank can read every peer (all
// ranks agree through the store), else the slots, saying why once in the log (e.g. EPERM
// under Yama ptrace_scope >= 1 or a seccomp profile, ENOSYS). Measure both on a new
// host with bench/collectives_bench --shm_transport. transport_name() says which one
// the group uses.
// Reductions combine the ranks in rank order 0, 1, ..., n-1 (bf16 in fp32, rounded once)
// with either transport, so ReduceScatter gives the same bits as GlooProcessGroup's;
// AllReduce is that reduce-scatter followed by an all-gather.
//
// All the rules in comm/process_group.h hold. Waiting for a peer spins for a few
// microseconds, then sleeps on a futex in the segment (no core is burnt on a
// descheduled peer). Failures:
// - a collective still waiting for a peer at its deadline is DeadlineExceeded naming the
//   collective, the group, the timeout and the ranks that had not arrived (a secondary
//   error, comm/failure.h, with those ranks as culprits);
// - a peer process that died (checked every ShmOptions.liveness_interval while waiting),
//   a peer whose group failed or was destroyed while this rank waits on it: Unavailable
//   naming its rank and pid, at once, not after the timeout (secondary, culprit that rank);
//   with "cma", a peer process that dies while being read (ESRCH) is the same error;
// - a process_vm_readv that fails otherwise (EFAULT: a peer published a bad buffer) is
//   Internal naming the collective, the peer and the errno;
// either breaks the group: later collectives fail at once with FailedPrecondition
// quoting the first error, and the peers waiting on this rank fail fast too.
//
// Destroying the group cancels collectives that have not started (FailedPrecondition),
// waits for the one running (bounded by its timeout), then unmaps the segment.
#ifndef COMM_SHM_PROCESS_GROUP_H_
#define COMM_SHM_PROCESS_GROUP_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/internal/worker_group.h"
#include "comm/process_group.h"
#include "comm/shm_options.h"
#include "comm/store.h"

namespace comm {
namespace internal {
class ShmCollectives;
}  // namespace internal

class ShmProcessGroup : public internal::BackendGroup {
 public:
  // Joins the group as `rank` of `size`, meeting the others through `store`.
  // InvalidArgument for a bad rank/size/option or a null store; DeadlineExceeded naming
  // the ranks that did not arrive within options.rendezvous_timeout; ResourceExhausted
  // naming the segment and its bytes when /dev/shm cannot hold it; FailedPrecondition
  // when the segment rank 0 made does not match this rank's size or slot_bytes;
  // Unavailable when the segment cannot be created or opened (e.g. another host). A rank
  // that cannot attach tells rank 0 through the store, and every rank then fails at once
  // (FailedPrecondition naming that rank), not at the rendezvous timeout.
  static absl::StatusOr<std::shared_ptr<ShmProcessGroup>> Create(std::shared_ptr<Store> store,
                                                                 int rank, int size,
                                                                 const ShmOptions& options);
  ~ShmProcessGroup() override;
  ShmProcessGroup(const ShmProcessGroup&) = delete;
  ShmProcessGroup& operator=(const ShmProcessGroup&) = delete;

  std::string backend_name() const override { return "shm"; }
  // The segment's name as created in /dev/shm (unlinked once Create returned).
  const std::string& segment_name() const;
  // The transport the group uses: "cma" or "slots" (the same on every rank).
  std::string transport_name() const;

  absl::StatusOr<std::shared_ptr<Work>> AllGather(const core::Tensor& input,
                                                  const core::Tensor& output,
                                                  const AllGatherOptions& options) override;
  absl::StatusOr<std::shared_ptr<Work>> ReduceScatter(const core::Tensor& input,
                                                      const core::Tensor& output,
                                                      const ReduceScatterOptions& options) override;
  absl::StatusOr<std::shared_ptr<Work>> AllReduce(const core::Tensor& tensor,
                                                  const AllReduceOptions& options) override;
  absl::StatusOr<std::shared_ptr<Work>> Broadcast(const core::Tensor& tensor,
                                                  const BroadcastOptions& options) override;
  absl::StatusOr<std::shared_ptr<Work>> Barrier(const BarrierOptions& options) override;

  // A new segment for the subgroup, under the subgroup's key prefix; its ShmOptions are
  // this group's with name and rendezvous_timeout from `options`.
  absl::StatusOr<std::shared_ptr<ProcessGroup>> NewSubgroup(
      const std::vector<int>& ranks, const SubgroupOptions& options) override;

 private:
  ShmProcessGroup(std::shared_ptr<Store> store, int rank, int size, ShmOptions options);
  static absl::StatusOr<std::shared_ptr<ShmProcessGroup>> Join(std::shared_ptr<Store> store,
                                                               int rank, int size,
                                                               const ShmOptions& options);
  // Queues `run` (a body of collectives_) as the next collective of `kind`, once the
  // arguments have been checked.
  absl::StatusOr<std::shared_ptr<Work>> Enqueue(CollectiveKind kind, absl::Duration timeout,
                                                Traffic traffic,
                                                internal::CollectiveWorker::RunFn run);

  const ShmOptions options_;
  // The segment and the collectives' bodies (comm/internal/shm_collectives.h); set in
  // Join, before the worker starts; used only by the worker thread after that.
  std::unique_ptr<internal::ShmCollectives> collectives_;
  // Runs the collectives in issue order; stopped first in the destructor.
  internal::CollectiveWorker worker_;
};

}  // namespace comm

#endif  // COMM_SHM_PROCESS_GROUP_H_
