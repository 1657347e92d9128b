// GlooProcessGroup: the CPU backend of ProcessGroup, on Debian's libgloo over TCP.
//
//   auto store = std::make_shared<comm::HashStore>();   // or TcpStore across processes
//   comm::GlooOptions opts;                             // name "world", 127.0.0.1
//   ASSIGN_OR_RETURN(std::shared_ptr<comm::GlooProcessGroup> group,
//                    comm::GlooProcessGroup::Create(store, rank, world_size, opts));
//   ASSIGN_OR_RETURN(auto work, group->AllReduce(t, comm::AllReduceOptions{}));
//   RETURN_IF_ERROR(work->Wait(absl::Seconds(60)));
//
// Create() meets the other ranks through the store (keys under "<name>/") and connects
// a full mesh of TCP pairs; it blocks until all `size` ranks have joined, or returns
// DeadlineExceeded after options.rendezvous_timeout naming the ranks that did not.
// Collectives take CPU tensors and run one at a time, in issue order, on the group's
// worker thread (which counts its temporaries under the allocator that was current on
// the thread that called Create, tag kComm).
//
// All the rules in comm/process_group.h hold, in particular NOTE [Same order on all
// ranks]: every rank issues the same collectives in the same order. No exception from
// gloo escapes: its errors come back as absl::Status naming the group, the collective
// and, where it can be known, the rank to blame:
// - a timeout is DeadlineExceeded naming the ranks that had not arrived at the
//   collective: "AllGather #17 on gloo group 'world' (rank 0 of 3) timed out after 1m:
//   rank 1 did not arrive (last at collective #16); ranks 0, 2 did";
// - a peer that closed its connection or died is Unavailable naming it by rank:
//   "... rank 1 (127.0.0.1:41234) closed its connection: its group was destroyed";
// both are secondary errors (comm/failure.h) with those ranks as culprits. How (NOTE
// [Who is to blame] in comm/internal/gloo_blame.h): each rank records in the store the
// number of the last collective it started (one small Set per collective, written by a
// background thread so a slow store never delays a collective), and a rank whose group
// fails records why before it closes its connections. A failing collective reads these back
// within GlooOptions.store_probe_timeout; when the store does not answer, the error
// says so ("the store at 127.0.0.1:29500 (served by rank 0) does not answer ...").
// A failed collective breaks the group and closes its connections at once, so peers
// blocked on this rank fail too instead of waiting out their own deadlines.
//
// Rendezvous values are checked before gloo parses them: bytes that cannot be a
// rank's gloo address or host name give DataLoss naming the key and the rank it claims
// to be; an address that is well formed but leads elsewhere gives an error within
// rendezvous_timeout, because every rank checks with each peer, through the store, that
// their connection joins the two of them.
//
// Gloo's sockets raise SIGPIPE when a peer dies; the group's threads block it, so it
// becomes an error, never a killed process (comm/internal/sigpipe.h).
//
// Destroying the group cancels collectives that have not started (FailedPrecondition),
// waits for the one running (bounded by its timeout), then closes the connections,
// which makes peers still waiting on this rank fail fast.
#ifndef COMM_GLOO_PROCESS_GROUP_H_
#define COMM_GLOO_PROCESS_GROUP_H_

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/internal/worker_group.h"
#include "comm/process_group.h"
#include "comm/store.h"

namespace gloo {
class Context;
namespace transport {
class Device;
}  // namespace transport
}  // namespace gloo

namespace comm {
namespace internal {
class GlooBlame;
}  // namespace internal

struct GlooOptions {
  // Name of the group; its store keys live under "<name>/". Must be fresh in the store.
  std::string name = "world";
  // The local address the transport binds to and tells peers: loopback for ranks on
  // one machine, this host's address on the peers' network otherwise (InitFromEnv picks
  // the address that routes to MASTER_ADDR).
  std::string hostname = "127.0.0.1";
  // How long Create waits for the other ranks.
  absl::Duration rendezvous_timeout = absl::Seconds(60);
  // How long a failing collective waits for the store when it finds out which ranks
  // did not arrive or why a peer closed its connection.
  absl::Duration store_probe_timeout = absl::Seconds(2);
  // The rank of this group whose process serves the store (0 for a TcpStore started by
  // InitFromEnv), or -1 if none or unknown. When the store stops answering, a failing
  // collective names this rank as the likely culprit.
  int store_server_rank = -1;
};

class GlooProcessGroup : public internal::BackendGroup {
 public:
  // Joins the group as `rank` of `size`, meeting the others through `store`.
  // InvalidArgument for a bad rank/size, option or a null store; DeadlineExceeded when
  // the others do not all arrive (or confirm their connections) within
  // options.rendezvous_timeout; Unavailable when the transport cannot bind
  // options.hostname or reach a peer (naming it); DataLoss naming the key and the rank
  // when a rendezvous value cannot be what that rank's gloo wrote.
  static absl::StatusOr<std::shared_ptr<GlooProcessGroup>> Create(std::shared_ptr<Store> store,
                                                                  int rank, int size,
                                                                  const GlooOptions& options);
  ~GlooProcessGroup() override;
  GlooProcessGroup(const GlooProcessGroup&) = delete;
  GlooProcessGroup& operator=(const GlooProcessGroup&) = delete;

  std::string backend_name() const override { return "gloo"; }
  // The address this rank's transport listens on.
  const std::string& hostname() const { return options_.hostname; }

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

  // ReduceScatter moves each chunk in pieces of at most this many bytes and reduces a
  // piece while the next arrives (NOTE [Pipelined reduce-scatter] in the .cc); the group
  // keeps 2 (size - 1) piece-sized receive buffers (tag kComm) from its first
  // reduce-scatter on.
  static constexpr int64_t kReduceScatterPieceBytes = int64_t{1} << 20;

  // The subgroup's GlooOptions are this group's, with name and rendezvous_timeout from
  // `options` and store_server_rank renumbered into the subgroup (-1 if not a member).
  absl::StatusOr<std::shared_ptr<ProcessGroup>> NewSubgroup(
      const std::vector<int>& ranks, const SubgroupOptions& options) override;

 private:
  // A collective's gloo calls: `tag` is its sequence number, `left` the time left
  // before its deadline.
  using RunFn = std::function<absl::Status(uint32_t tag, std::chrono::milliseconds left)>;

  // `store` is the group's own namespace (already prefixed); `options.name` is only
  // the name shown in messages.
  GlooProcessGroup(std::shared_ptr<Store> store, int rank, int size, GlooOptions options);
  static absl::StatusOr<std::shared_ptr<GlooProcessGroup>> Join(std::shared_ptr<Store> store,
                                                                int rank, int size,
                                                                const GlooOptions& options);

  // The worker's hooks: NOTE [Who is to blame] and the fast failure of the peers.
  internal::CollectiveWorker::Hooks WorkerHooks();
  // The rendezvous: connects the full mesh through the store, from `ip`, and confirms
  // it; `who` names the group in its errors.
  absl::Status Connect(const std::string& who, const std::string& ip);
  // Queues `run` as the next collective of `kind`, to finish within `timeout`.
  std::shared_ptr<Work> Enqueue(CollectiveKind kind, absl::Duration timeout, Traffic traffic,
                                RunFn run);
  // Runs `run` for `op` on the worker thread; gloo's exceptions become its status.
  absl::Status RunOp(const internal::QueuedOp& op, const RunFn& run);
  // The body of ReduceScatter, on the worker thread.
  absl::Status RunReduceScatter(const core::Tensor& input, const core::Tensor& output, ReduceOp op,
                                uint32_t tag, std::chrono::milliseconds left);
  // reduce_scatter_scratch_, grown to at least `bytes` (tag kComm).
  absl::StatusOr<uint8_t*> ReduceScatterScratch(int64_t bytes);

  const GlooOptions options_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  // Names the ranks to blame for a failure (NOTE [Who is to blame]); null in a group
  // of one.
  std::shared_ptr<internal::GlooBlame> blame_;  // shared with Works' timeout diagnoses
  // ReduceScatter's receive ring; used only by the worker thread.
  core::Tensor reduce_scatter_scratch_;
  // Runs the collectives in issue order; stopped first in the destructor.
  internal::CollectiveWorker worker_;
};

}  // namespace comm

#endif  // COMM_GLOO_PROCESS_GROUP_H_
