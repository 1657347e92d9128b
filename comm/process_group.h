// ProcessGroup: a set of ranks that run collectives together, and the options, byte
// counters and argument checks every backend shares.
//
//   std::shared_ptr<comm::ProcessGroup> group = ...;  // GlooProcessGroup::Create, InitFromEnv
//   core::Tensor shard = ...;                          // [k] on this rank
//   core::Tensor full = core::Tensor::Empty({group->size() * k});
//   ASSIGN_OR_RETURN(auto work, group->AllGather(shard, full, comm::AllGatherOptions{}));
//   RETURN_IF_ERROR(work->Wait(absl::Seconds(60)));   // full = shard of rank 0, 1, ...
//
//   comm::ReduceScatterOptions rs;
//   rs.reduce_op = comm::ReduceOp::kAverage;
//   ASSIGN_OR_RETURN(work, group->ReduceScatter(full_grad, grad_shard, rs));
//
// Rules every backend keeps:
// - NOTE [Same order on all ranks] (comm/store.h): every rank of the group must issue
//   the same collectives, with the same sizes, dtypes and options, in the same order.
//   Collectives of one group complete in the order they were issued.
// - Arguments are checked when the collective is issued; a bad shape, dtype, device or
//   alias is InvalidArgument naming the collective, the group and the sizes, and nothing
//   is sent.
// - Every collective has a deadline: `timeout` from its options, counted from when it
//   is issued. One that cannot finish in time completes with DeadlineExceeded naming
//   the collective, the group and the timeout; none hangs.
// - A collective that fails (timeout, dead peer) breaks the group: later collectives
//   fail at once with FailedPrecondition quoting the first error. Make a new group.
// - Supported element types: fp32 and bf16 everywhere, int32 for AllGather, Broadcast
//   and the sum/max reductions. bf16 reductions accumulate in fp32 and round once.
//   Zero-length tensors are fine (nothing is sent, the call is still counted).
//
// NOTE [Byte counters]: Stats() counts, per collective kind, completed calls and the
// logical bytes one rank sends and receives under the standard algorithms, not what a
// backend's implementation happens to move. With n ranks:
//   all-gather of S bytes in total (output size), reduce-scatter of S bytes in total
//   (input size): S(n-1)/n sent and S(n-1)/n received;
//   all-reduce of S bytes: 2S(n-1)/n sent and received;
//   broadcast of S bytes, as a chain root -> root+1 -> ... (mod n): every rank except
//   the root receives S, every rank except the last in the chain, (root-1) mod n,
//   sends S, so that in total sent == received == S(n-1);
//   barrier: 0 bytes.
// Divisions round down. A group of one rank moves nothing.
//
// NOTE [Staged collectives]: a collective may carry a copy into its input or out of its
// result, done as part of it, where it runs: on a CUDA backend on the collective's own
// stream (after the compute-stream work it waits for, so the copy and any cast overlap
// whatever the caller queues next), on a CPU backend on its worker before or after the
// exchange. FSDP's CPU offload brings a host shard to the device this way and its reduced
// gradient back (NOTE [CPU offload] in fsdp/options.h).
//   AllGatherOptions::stage_from: copied into `input` first, converted between fp32 and
//     bf16 when the dtypes differ (input's dtype otherwise: an int32 input takes int32);
//     same numel as `input`, on the host (page-locked memory for an asynchronous copy; on
//     a CUDA backend a pageable one makes the issuing call wait for the copy) or on
//     `input`'s device, overlapping neither `input` nor the output.
//   ReduceScatterOptions::unstage_to, AllReduceOptions::unstage_to: a host tensor of the
//     result's numel and dtype the result is copied into once reduced; WaitHost returns
//     once it is there (on CUDA, Wait only orders later device work). Page-locked on a
//     CUDA backend, or the issuing call waits for the whole collective.
//   ReduceScatterOptions::accumulate_into: an fp32 tensor of the output's numel on the
//     output's device that the reduced output is added into (accumulate_into[i] +=
//     output[i], a bf16 output widened exactly), the reduction's post-processing done
//     off the caller's stream (FSDP adds a unit's reduced gradient into its gradient
//     shard so); overlapping neither the output nor the input. Not together with
//     unstage_to.
// The caller must not write stage_from nor touch unstage_to or accumulate_into until the
// Work completes.
// A bad one is InvalidArgument naming the option, like any argument.
#ifndef COMM_PROCESS_GROUP_H_
#define COMM_PROCESS_GROUP_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "comm/work.h"
#include "core/tensor.h"

namespace comm {

enum class ReduceOp { kSum, kAverage, kMax };

// "sum", "average", "max".
std::string ReduceOpName(ReduceOp op);

enum class CollectiveKind { kAllGather, kReduceScatter, kAllReduce, kBroadcast, kBarrier };
inline constexpr int kNumCollectiveKinds = 5;

// "AllGather", "ReduceScatter", "AllReduce", "Broadcast", "Barrier".
std::string CollectiveKindName(CollectiveKind kind);

// Default deadline of a collective, as in PyTorch's c10d (which uses 30 min for NCCL).
inline constexpr absl::Duration kDefaultCollectiveTimeout = absl::Minutes(5);

struct AllGatherOptions {
  absl::Duration timeout = kDefaultCollectiveTimeout;
  // NOTE [Staged collectives]: copied (converted) into the input first when defined.
  core::Tensor stage_from;
};

struct ReduceScatterOptions {
  ReduceOp reduce_op = ReduceOp::kSum;
  absl::Duration timeout = kDefaultCollectiveTimeout;
  // NOTE [Staged collectives]: the host tensor the output is copied into when defined.
  core::Tensor unstage_to;
  // NOTE [Staged collectives]: the fp32 tensor the output is added into when defined.
  core::Tensor accumulate_into;
};

struct AllReduceOptions {
  ReduceOp reduce_op = ReduceOp::kSum;
  absl::Duration timeout = kDefaultCollectiveTimeout;
  // NOTE [Staged collectives]: the host tensor the result is copied into when defined.
  core::Tensor unstage_to;
};

struct BroadcastOptions {
  // Rank (in this group) whose tensor everyone receives.
  int root = 0;
  absl::Duration timeout = kDefaultCollectiveTimeout;
};

struct BarrierOptions {
  absl::Duration timeout = kDefaultCollectiveTimeout;
};

struct SubgroupOptions {
  // Name used in messages; "<parent>/sub<k>" when empty.
  std::string name;
  // How long creating the subgroup may wait for its members.
  absl::Duration timeout = absl::Seconds(60);
};

// Completed calls of one collective kind and the bytes they moved (NOTE [Byte counters]).
struct CollectiveStats {
  int64_t calls = 0;
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
};

struct CommStats {
  std::array<CollectiveStats, kNumCollectiveKinds> by_kind{};

  const CollectiveStats& of(CollectiveKind kind) const { return by_kind[static_cast<int>(kind)]; }
  // All kinds together.
  CollectiveStats Total() const;
  // "AllGather: 3 calls, 1.50MiB sent, 1.50MiB received; ..." (kinds with calls only).
  std::string ToString() const;
};

// What one rank sends and receives in one collective (NOTE [Byte counters]).
struct Traffic {
  int64_t sent = 0;
  int64_t received = 0;
};

// The NOTE [Byte counters] figures for a collective of `bytes` (the all-gather output,
// the reduce-scatter input, the all-reduce or broadcast tensor) at `rank` of `size`.
Traffic ExpectedTraffic(CollectiveKind kind, int64_t bytes, int size, int rank, int root = 0);

// Thread-safe counters that backends keep and Stats() reads.
class StatsRecorder {
 public:
  void Record(CollectiveKind kind, const Traffic& traffic);
  CommStats Snapshot() const;
  void Reset();

 private:
  mutable absl::Mutex mu_;
  CommStats stats_ ABSL_GUARDED_BY(mu_);
};

// A group of ranks. Pure interface; see the rules at the top of this file. Every
// collective is asynchronous and returns a Work (comm/work.h), or an error right away
// when its arguments are invalid or the group is broken.
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  // This process's rank in the group, in [0, size()).
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "gloo" or "nccl".
  virtual std::string backend_name() const = 0;
  // The group's name: "world", "world/sub0", or the SubgroupOptions name.
  virtual std::string name() const = 0;

  // Gathers every rank's `input` ([k] elements) into `output` ([size() * k], any shape
  // of that numel) in rank order. `input` may alias its own slot of `output`
  // (output.View(rank() * k, ...)), for an in-place all-gather; any other overlap is
  // InvalidArgument.
  virtual absl::StatusOr<std::shared_ptr<Work>> AllGather(const core::Tensor& input,
                                                          const core::Tensor& output,
                                                          const AllGatherOptions& options) = 0;

  // Reduces `input` ([size() * k]) across ranks and leaves chunk rank() of the result
  // ([k]) in `output`. `output` may alias its own chunk of `input`; any other overlap
  // is InvalidArgument. Sum, average or max.
  virtual absl::StatusOr<std::shared_ptr<Work>> ReduceScatter(
      const core::Tensor& input, const core::Tensor& output,
      const ReduceScatterOptions& options) = 0;

  // Reduces `tensor` across ranks in place: sum, average or max.
  virtual absl::StatusOr<std::shared_ptr<Work>> AllReduce(const core::Tensor& tensor,
                                                          const AllReduceOptions& options) = 0;

  // Copies the root's `tensor` into every other rank's `tensor`.
  virtual absl::StatusOr<std::shared_ptr<Work>> Broadcast(const core::Tensor& tensor,
                                                          const BroadcastOptions& options) = 0;

  // Completes once every rank has reached it.
  virtual absl::StatusOr<std::shared_ptr<Work>> Barrier(const BarrierOptions& options) = 0;

  // Per-kind counters of completed collectives (NOTE [Byte counters]).
  virtual CommStats Stats() const = 0;
  virtual void ResetStats() = 0;

  // A group of the ranks `ranks` (ranks of this group; subgroup rank i is ranks[i]),
  // for hybrid sharding. Every rank of this group must call it, in the same order and
  // with the same list, even ranks not in the list: they get NotFound saying so.
  // Blocks until the members have met (options.timeout: DeadlineExceeded).
  // InvalidArgument for an empty list, a repeated rank or one out of range.
  virtual absl::StatusOr<std::shared_ptr<ProcessGroup>> NewSubgroup(
      const std::vector<int>& ranks, const SubgroupOptions& options) = 0;

  // "gloo group 'world' (rank 1 of 4)", for messages.
  std::string Describe() const;
};

// Argument checks shared by the backends; each error names the collective, `group`
// and the sizes. They do not check the device, which is the backend's business.
absl::Status ValidateAllGather(const ProcessGroup& group, const core::Tensor& input,
                               const core::Tensor& output, const AllGatherOptions& options);
absl::Status ValidateReduceScatter(const ProcessGroup& group, const core::Tensor& input,
                                   const core::Tensor& output, const ReduceScatterOptions& options);
absl::Status ValidateAllReduce(const ProcessGroup& group, const core::Tensor& tensor,
                               const AllReduceOptions& options);
absl::Status ValidateBroadcast(const ProcessGroup& group, const core::Tensor& tensor,
                               const BroadcastOptions& options);
absl::Status ValidateBarrier(const ProcessGroup& group, const BarrierOptions& options);
// Checks a NewSubgroup rank list against `group`.
absl::Status ValidateSubgroupRanks(const ProcessGroup& group, const std::vector<int>& ranks);

// Where this rank stands in the `index`-th subgroup `ranks` of `group` (what every
// backend's NewSubgroup needs before it joins): the store prefix the subgroup's keys go
// under ("sub<index>"), this rank's index in `ranks` and the subgroup's size.
struct SubgroupPlacement {
  std::string key_prefix;
  int rank = 0;
  int size = 0;
};
// ValidateSubgroupRanks, then NotFound naming the rank when group.rank() is not in `ranks`.
absl::StatusOr<SubgroupPlacement> PlaceInSubgroup(const ProcessGroup& group,
                                                  const std::vector<int>& ranks, int index);
// NOTE [Staged collectives] on a CPU backend's worker: copies `stage_from` into `input`
// (converting), or `result` into `unstage_to`; OK when the option is undefined.
absl::Status StageIn(const core::Tensor& input, const core::Tensor& stage_from);
absl::Status StageOut(const core::Tensor& result, const core::Tensor& unstage_to);
// accumulate_into += result (ReduceScatterOptions::accumulate_into) on the host; OK when it
// is undefined.
absl::Status AccumulateOut(const core::Tensor& result, const core::Tensor& accumulate_into);

// InvalidArgument unless every tensor in `tensors` is on `device`.
absl::Status ValidateDevice(const ProcessGroup& group, CollectiveKind kind,
                            const std::vector<const core::Tensor*>& tensors, core::Device device);

}  // namespace comm

#endif  // COMM_PROCESS_GROUP_H_
