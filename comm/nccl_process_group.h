// NcclProcessGroup: the GPU backend of ProcessGroup, on NCCL. Built only under
// --config=cuda (without it this header declares nothing).
//
//   comm::NcclOptions opts;
//   ASSIGN_OR_RETURN(auto group, comm::NcclProcessGroup::Create(
//                                    store, rank, world_size, core::Device::Cuda(local_rank),
//                                    opts));
//   ASSIGN_OR_RETURN(auto work, group->AllReduce(cuda_tensor, comm::AllReduceOptions{}));
//   RETURN_IF_ERROR(work->Wait(absl::Seconds(60)));
//
// Create() exchanges the NCCL unique id through the store (rank 0 writes it under
// "<name>/nccl_unique_id") and initialises a non-blocking communicator, so a rank that
// never arrives gives DeadlineExceeded after options.init_timeout instead of a hang.
// Collectives take CUDA tensors on the group's device and run on the group's own CUDA
// stream (of the device's highest priority): each first waits (through an event) for the
// work already queued on the legacy default stream ("the compute stream", where core's
// kernels and copies run), so it sees their results and writes no block the caching
// allocator handed out again while a queued kernel still used it; its Work records an
// event when it is done.
//
// Waiting (comm/work.h): Work::Wait does not block the host; it makes the compute
// stream wait for the collective's event (cudaStreamWaitEvent on the legacy default
// stream) and returns, or returns the error of a work that already failed. Results are
// then ready for any later kernel or copy on the compute stream, and host reads
// synchronise with it. Work::WaitHost blocks the host until the watchdog has seen the
// collective finish and returns its final status. Work::StreamWaitTiming gives the
// collective's run time on its stream and how long the compute stream stood at the first
// Wait, from events recorded around the NCCL calls and at that Wait (NOTE [Comm overlap]
// in fsdp/unit.h).
//
// Host tensors: a collective whose tensors are all CPU tensors (the small host-side
// exchanges of agreements, plan fingerprints, loss averages) is staged through fresh
// device buffers of the group's device and is complete, results copied back, when the
// call returns. Mixing CPU and CUDA tensors in one collective is InvalidArgument.
//
// Watchdog: a thread per group (comm/internal/watchdog.h) polls every collective's
// event and NCCL's asynchronous error, and enforces each collective's deadline (its
// options' timeout, from issue) even when nobody waits: past it, the communicator is
// aborted, the group is broken, the Work completes with DeadlineExceeded naming the
// collective, its sequence number, the group and the timeout, and the failure is
// recorded (comm::RecordFailure). NCCL's own errors do the same. The watchdog holds the
// collective's tensors until its event has fired, so the caching allocator never hands
// out a block NCCL still reads or writes, whatever the caller does with its handles.
// bf16 reductions run on fp32 copies (kComm) and round back once.
//
// All the rules in comm/process_group.h hold, in particular NOTE [Same order on all
// ranks]: every rank issues the same collectives in the same order. Byte counters
// follow NOTE [Byte counters] and count a collective once the watchdog has seen it
// succeed (after WaitHost returns OK it is counted). One group per GPU: NCCL refuses two ranks of
// one communicator on the same device.
#ifndef COMM_NCCL_PROCESS_GROUP_H_
#define COMM_NCCL_PROCESS_GROUP_H_

#ifdef FSDP_WITH_CUDA

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "comm/internal/worker_group.h"
#include "comm/process_group.h"
#include "comm/store.h"
#include "core/device.h"

namespace comm {

struct NcclOptions {
  // Name of the group; its store keys live under "<name>/". Must be fresh in the store.
  std::string name = "world";
  // How long Create waits for the unique id and for the communicator to come up.
  absl::Duration init_timeout = absl::Seconds(60);
};

namespace internal {
struct NcclComm;
class Watchdog;
}  // namespace internal

class NcclProcessGroup : public internal::BackendGroup {
 public:
  // Joins the group as `rank` of `size` on CUDA `device`. InvalidArgument for a bad
  // rank/size/device or a null store; DeadlineExceeded when the id or the peers do not
  // arrive in time; Internal/Unavailable for CUDA or NCCL failures, with their text.
  static absl::StatusOr<std::shared_ptr<NcclProcessGroup>> Create(std::shared_ptr<Store> store,
                                                                  int rank, int size,
                                                                  core::Device device,
                                                                  const NcclOptions& options);
  ~NcclProcessGroup() override;
  NcclProcessGroup(const NcclProcessGroup&) = delete;
  NcclProcessGroup& operator=(const NcclProcessGroup&) = delete;

  std::string backend_name() const override { return "nccl"; }
  core::Device device() const { return device_; }
  // The stream the collectives run on (non-blocking, the device's highest priority).
  cudaStream_t stream() const { return stream_; }

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

  absl::StatusOr<std::shared_ptr<ProcessGroup>> NewSubgroup(
      const std::vector<int>& ranks, const SubgroupOptions& options) override;

 private:
  NcclProcessGroup(std::shared_ptr<Store> store, int rank, int size, core::Device device,
                   NcclOptions options);
  static absl::StatusOr<std::shared_ptr<NcclProcessGroup>> Join(std::shared_ptr<Store> store,
                                                                int rank, int size,
                                                                core::Device device,
                                                                const NcclOptions& options,
                                                                int failure_rank);

  // Issues the NCCL calls `launch` makes on the group's stream after the compute
  // stream's pending work, and returns the Work that completes after them. `keep`
  // holds temporaries alive until then.
  using LaunchFn = std::function<absl::Status(ncclComm_t comm, cudaStream_t stream)>;
  // True when every tensor is a CPU tensor (the staged path).
  static bool OnHost(const std::vector<const core::Tensor*>& tensors);
  // The staged path: copies `host` to fresh device tensors, issues the collective on
  // them, waits for it on the host and copies the results back; the returned Work is
  // complete.
  absl::StatusOr<std::shared_ptr<Work>> Staged(
      const std::vector<core::Tensor>& host, absl::Duration timeout,
      const std::function<absl::StatusOr<std::shared_ptr<Work>>(const std::vector<core::Tensor>&)>&
          issue);
  absl::StatusOr<std::shared_ptr<Work>> Issue(CollectiveKind kind, absl::Duration timeout,
                                              Traffic traffic, std::vector<core::Tensor> keep,
                                              const LaunchFn& launch);

  // Creates the communicator (rank 0's unique id through the store) within
  // options_.init_timeout; `who` names the group in errors.
  absl::Status InitCommunicator(const std::string& who);

  const core::Device device_;
  const NcclOptions options_;
  std::shared_ptr<internal::NcclComm> comm_;
  cudaStream_t stream_ = nullptr;
  // Polls every collective's event, enforces its deadline and releases its tensors
  // (NOTE [Watchdog] in comm/internal/watchdog.h). Created once the communicator is up.
  std::unique_ptr<internal::Watchdog> watchdog_;
  // The rank a failure is recorded under (comm::RecordFailure): the world rank.
  int failure_rank_ = 0;

  absl::Mutex mu_;  // serialises issuing (NCCL calls on one communicator)
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace comm

#endif  // FSDP_WITH_CUDA
#endif  // COMM_NCCL_PROCESS_GROUP_H_
