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
// worker thread (NOTE [Shm protocol] in the .cc). Two transports move the bulk data:
// - "slots": tensors move in slot-sized pieces through two slots per rank (each byte is
//   copied twice: owner -> slot, slot -> peer);
// - "cma" (Linux cross-memory attach, NOTE [CMA transport]): each rank publishes the
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
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "comm/process_group.h"
#include "comm/store.h"
#include "core/allocator.h"

namespace comm {
namespace internal {
struct ShmSegment;
}  // namespace internal

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
  // sleeps on the futex (NOTE [Waiting] in the .cc). Zero: sleep after a few pauses.
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

class ShmProcessGroup : public ProcessGroup {
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

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend_name() const override { return "shm"; }
  std::string name() const override { return options_.name; }
  // The segment's name as created in /dev/shm (unlinked once Create returned).
  const std::string& segment_name() const;
  // The transport the group uses: "cma" or "slots" (the same on every rank).
  std::string transport_name() const { return cma_ ? "cma" : "slots"; }

  absl::StatusOr<std::shared_ptr<Work>> AllGather(const core::Tensor& input,
                                                  const core::Tensor& output,
                                                  const AllGatherOptions& options) override;
  absl::StatusOr<std::shared_ptr<Work>> ReduceScatter(
      const core::Tensor& input, const core::Tensor& output,
      const ReduceScatterOptions& options) override;
  absl::StatusOr<std::shared_ptr<Work>> AllReduce(const core::Tensor& tensor,
                                                  const AllReduceOptions& options) override;
  absl::StatusOr<std::shared_ptr<Work>> Broadcast(const core::Tensor& tensor,
                                                  const BroadcastOptions& options) override;
  absl::StatusOr<std::shared_ptr<Work>> Barrier(const BarrierOptions& options) override;

  CommStats Stats() const override { return stats_.Snapshot(); }
  void ResetStats() override { stats_.Reset(); }

  // A new segment for the subgroup, under the subgroup's key prefix; its ShmOptions are
  // this group's with name and rendezvous_timeout from `options`.
  absl::StatusOr<std::shared_ptr<ProcessGroup>> NewSubgroup(
      const std::vector<int>& ranks, const SubgroupOptions& options) override;

 private:
  // One queued collective; `run` gets its description and deadline.
  using RunFn = std::function<absl::Status(const std::string& what, absl::Time deadline)>;
  struct Op {
    CollectiveKind kind;
    std::shared_ptr<CompletionWork> work;
    absl::Time deadline;
    absl::Duration timeout;
    uint64_t seq;
    Traffic traffic;
    RunFn run;
  };
  class Stepper;

  ShmProcessGroup(std::shared_ptr<Store> store, int rank, int size, ShmOptions options);
  static absl::StatusOr<std::shared_ptr<ShmProcessGroup>> Join(std::shared_ptr<Store> store,
                                                               int rank, int size,
                                                               const ShmOptions& options);

  std::shared_ptr<Work> Enqueue(CollectiveKind kind, absl::Duration timeout, Traffic traffic,
                                RunFn run);
  absl::Status CheckUsable(CollectiveKind kind) const;
  void WorkerLoop();

  // The collectives' bodies, on the worker thread.
  absl::Status RunAllGather(const core::Tensor& input, const core::Tensor& output,
                            const std::string& what, absl::Time deadline, absl::Duration timeout);
  absl::Status RunReduceScatter(const core::Tensor& input, const core::Tensor& output,
                                ReduceOp op, const std::string& what, absl::Time deadline,
                                absl::Duration timeout);
  absl::Status RunAllReduce(const core::Tensor& tensor, ReduceOp op, const std::string& what,
                            absl::Time deadline, absl::Duration timeout);
  absl::Status RunBroadcast(const core::Tensor& tensor, int root, const std::string& what,
                            absl::Time deadline, absl::Duration timeout);
  absl::Status RunBarrier(const std::string& what, absl::Time deadline, absl::Duration timeout);
  // The same collectives over cross-memory attach (NOTE [CMA transport]).
  absl::Status RunAllGatherCma(const core::Tensor& input, const core::Tensor& output,
                               const std::string& what, absl::Time deadline,
                               absl::Duration timeout);
  absl::Status RunReduceScatterCma(const core::Tensor& input, const core::Tensor& output,
                                   ReduceOp op, const std::string& what, absl::Time deadline,
                                   absl::Duration timeout);
  absl::Status RunAllReduceCma(const core::Tensor& tensor, ReduceOp op, const std::string& what,
                               absl::Time deadline, absl::Duration timeout);
  absl::Status RunBroadcastCma(const core::Tensor& tensor, int root, const std::string& what,
                               absl::Time deadline, absl::Duration timeout);
  // Reduces `elems` elements at byte `at` of every rank's published buffer (`buf_bytes`
  // long; this rank's is `own`) into `out` in rank order, reading the peers' pieces into
  // `scratch` (CmaScratch); the reduce-scatter part of both CMA reductions.
  absl::Status ReduceFromPeersCma(Stepper& st, core::DType dtype, ReduceOp op,
                                  const uint8_t* own, int64_t buf_bytes, int64_t at,
                                  int64_t elems, uint8_t* out, uint8_t* scratch,
                                  bool streaming);
  // Whether a collective of `bytes` (the size ShmOptions.cma_min_bytes talks about) uses
  // cross-memory attach; the same on every rank.
  bool UseCma(int64_t bytes) const {
    return cma_ && size_ > 1 && bytes > 0 && bytes >= options_.cma_min_bytes;
  }
  // Probes process_vm_readv of every peer and agrees with the others on the transport
  // (sets cma_); in Join, before the worker starts.
  absl::Status ChooseTransport(Store& store, const std::string& who, absl::Time deadline);
  // Scratch of the CMA reduce-scatter: (n - 1) pieces of cma_piece_bytes_.
  absl::StatusOr<uint8_t*> CmaScratch();
  // Reduces `len` elements of `chunks` (rank order) into `out`; with `streaming`, through
  // reduce_scratch_ and non-temporal stores.
  absl::Status ReducePiece(core::DType dtype, ReduceOp op, const void* const* chunks,
                           int64_t len, uint8_t* out, bool streaming);

  const std::shared_ptr<Store> store_;
  const int rank_;
  const int size_;
  const ShmOptions options_;
  std::shared_ptr<core::Allocator> allocator_;
  std::unique_ptr<internal::ShmSegment> segment_;
  StatsRecorder stats_;
  // Steps this rank has completed (NOTE [Shm protocol]); used only by the worker thread.
  uint64_t step_ = 0;
  // Where large reductions land before they stream out (NOTE [Streaming copies]); one
  // sub-slot, allocated on first use (tag kComm); used only by the worker thread.
  core::Tensor reduce_scratch_;
  // Whether bulk data goes through cross-memory attach; set in Join, then constant.
  bool cma_ = false;
  // Bytes of one peer's piece in a CMA reduction (the pieces of all peers fit in L2).
  int64_t cma_piece_bytes_ = 0;
  core::Tensor cma_scratch_;

  mutable absl::Mutex mu_;
  std::deque<Op> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  int next_subgroup_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  std::thread worker_;
};

}  // namespace comm

#endif  // COMM_SHM_PROCESS_GROUP_H_
