#include "comm/nccl_process_group.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "comm/cuda/convert.h"
#include "comm/failure.h"
#include "comm/internal/watchdog.h"
#include "comm/prefix_store.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "glog/logging.h"
#include "kernels/cuda/grad.h"

namespace comm {
namespace internal {

// The communicator and the state its Works share with the group. Every NCCL call on
// `comm` is made under `mu` (NCCL communicators are not thread-safe).
struct NcclComm {
  absl::Mutex mu;
  ncclComm_t comm ABSL_GUARDED_BY(mu) = nullptr;
  absl::Status broken ABSL_GUARDED_BY(mu);

  // Records the first failure and aborts the communicator (which makes NCCL kernels
  // still waiting on peers return).
  void Break(const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    BreakLocked(why);
  }
  void BreakLocked(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (broken.ok()) broken = why;
    if (comm != nullptr) {
      ncclCommAbort(comm);
      comm = nullptr;
    }
  }
  // NCCL's asynchronous error, if any.
  absl::Status AsyncError() ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    if (!broken.ok()) return broken;
    if (comm == nullptr) return absl::FailedPreconditionError("communicator destroyed");
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm, &state);
    if (state != ncclSuccess && state != ncclInProgress) {
      return absl::InternalError(absl::StrCat(
          "NCCL asynchronous error: ", ncclGetErrorString(state), " ", ncclGetLastError(comm)));
    }
    return absl::OkStatus();
  }
};

}  // namespace internal

namespace {

absl::Status CudaStatus(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(err)));
}

// Finishes an NCCL call made on a non-blocking communicator: ncclInProgress means the
// call is still being enqueued; wait for that (not for the collective) until `deadline`.
absl::Status NcclStatus(ncclResult_t r, ncclComm_t comm, absl::Time deadline,
                        absl::string_view what) {
  while (r == ncclInProgress) {
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, ": NCCL still in progress at the deadline"));
    }
    absl::SleepFor(absl::Microseconds(100));
    ncclCommGetAsyncError(comm, &r);
  }
  if (r == ncclSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", ncclGetErrorString(r), " ",
                                          comm != nullptr ? ncclGetLastError(comm) : ""));
}

ncclDataType_t NcclType(core::DType dtype) {
  switch (dtype) {
    case core::DType::kFloat32:
      return ncclFloat32;
    case core::DType::kBFloat16:
      return ncclBfloat16;
    case core::DType::kInt32:
      return ncclInt32;
  }
  return ncclFloat32;
}

ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAverage:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
  }
  return ncclSum;
}

absl::Status ConvertStatus(int err, absl::string_view what) {
  return CudaStatus(static_cast<cudaError_t>(err), what);
}

// NOTE [Staged collectives] on the collective's stream: `stage_from` into `input`,
// through `staging` (a device buffer of stage_from's dtype) when it comes from the host
// and needs a cast.
absl::Status StageInOnStream(const core::Tensor& input, const core::Tensor& stage_from,
                             const core::Tensor& staging, cudaStream_t stream) {
  if (!stage_from.defined() || input.numel() == 0) return absl::OkStatus();
  core::Tensor src = stage_from;
  if (stage_from.device().is_cpu()) {
    const core::Tensor& dst = stage_from.dtype() == input.dtype() ? input : staging;
    RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(dst.raw_data(), stage_from.raw_data(),
                                               stage_from.nbytes(), cudaMemcpyHostToDevice, stream),
                               "copying options.stage_from to the device"));
    src = dst;
  }
  if (src.dtype() == input.dtype()) {
    if (src.raw_data() == input.raw_data()) return absl::OkStatus();
    return CudaStatus(cudaMemcpyAsync(input.raw_data(), src.raw_data(), input.nbytes(),
                                      cudaMemcpyDeviceToDevice, stream),
                      "copying options.stage_from into the input");
  }
  if (input.dtype() == core::DType::kBFloat16) {
    return ConvertStatus(
        cuda::FloatToBf16(src.data<float>(), input.raw_data(), input.numel(), stream),
        "options.stage_from fp32 -> bf16");
  }
  return ConvertStatus(
      cuda::Bf16ToFloat(src.raw_data(), input.data<float>(), input.numel(), stream),
      "options.stage_from bf16 -> fp32");
}

// NOTE [Staged collectives]: `result` into the host tensor `unstage_to`, on the stream.
absl::Status StageOutOnStream(const core::Tensor& result, const core::Tensor& unstage_to,
                              cudaStream_t stream) {
  if (!unstage_to.defined() || result.numel() == 0) return absl::OkStatus();
  return CudaStatus(cudaMemcpyAsync(unstage_to.raw_data(), result.raw_data(), result.nbytes(),
                                    cudaMemcpyDeviceToHost, stream),
                    "copying the result into options.unstage_to");
}

// What a collective's Work and the watchdog share: the events recorded on the group's
// stream before and after the NCCL calls, the outcome, the tensors the device still uses,
// and the event the first stream-ordered Wait recorded on the compute stream.
struct PendingCollective {
  PendingCollective(std::string what, core::Device dev)
      : description(std::move(what)), device(dev) {}
  ~PendingCollective() {
    // Destroying an event with pending waits is allowed: CUDA releases it once they end.
    if (start != nullptr) cudaEventDestroy(start);
    if (event != nullptr) cudaEventDestroy(event);
    absl::MutexLock lock(&mu);
    if (reached != nullptr) cudaEventDestroy(reached);
  }
  const std::string description;
  const core::Device device;
  cudaEvent_t start = nullptr;  // the collective's start on its stream
  cudaEvent_t event = nullptr;  // its end
  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::Status status ABSL_GUARDED_BY(mu);
  std::vector<core::Tensor> keep ABSL_GUARDED_BY(mu);
  // NOTE [Comm overlap] on the device: whether Wait was called, and the compute stream's
  // position when it was (null when the collective was already done then).
  bool waited ABSL_GUARDED_BY(mu) = false;
  cudaEvent_t reached ABSL_GUARDED_BY(mu) = nullptr;
};

// Milliseconds from `from` to `to` (both recorded with timing, both complete).
std::optional<absl::Duration> ElapsedBetween(cudaEvent_t from, cudaEvent_t to) {
  float ms = 0.0f;
  if (cudaEventElapsedTime(&ms, from, to) != cudaSuccess) {
    cudaGetLastError();  // not sticky: leave no error for the next launch to report
    return std::nullopt;
  }
  return absl::Microseconds(static_cast<int64_t>(static_cast<double>(ms) * 1000.0));
}

// A collective queued on the group's stream. The group's watchdog completes it (NOTE
// [Watchdog] in comm/internal/watchdog.h); Wait orders the compute stream after it.
class NcclWork : public Work {
 public:
  explicit NcclWork(std::shared_ptr<PendingCollective> op) : op_(std::move(op)) {}

  bool IsCompleted() const override {
    absl::MutexLock lock(&op_->mu);
    return op_->done;
  }

  // Stream-ordered (comm/work.h): the legacy default stream waits for the event. The
  // first Wait marks the compute stream's position first (StreamWaitTiming).
  absl::Status Wait(absl::Duration /*timeout*/) override {
    const std::string what = absl::StrCat("Wait on ", op_->description);
    absl::MutexLock lock(&op_->mu);
    const bool first = !op_->waited;
    op_->waited = true;
    if (op_->done) return op_->status;  // finished: nothing left to order after
    RETURN_IF_ERROR(
        CudaStatus(cudaSetDevice(op_->device.index), absl::StrCat(what, ": cudaSetDevice")));
    if (first) {
      RETURN_IF_ERROR(
          CudaStatus(cudaEventCreate(&op_->reached), absl::StrCat(what, ": cudaEventCreate")));
      RETURN_IF_ERROR(CudaStatus(cudaEventRecord(op_->reached, cudaStreamLegacy),
                                 absl::StrCat(what, ": cudaEventRecord(compute stream)")));
    }
    return CudaStatus(cudaStreamWaitEvent(cudaStreamLegacy, op_->event, 0),
                      absl::StrCat(what, ": cudaStreamWaitEvent(compute stream)"));
  }

  std::optional<StreamTiming> StreamWaitTiming() const override {
    absl::MutexLock lock(&op_->mu);
    if (!op_->done || !op_->status.ok() || !op_->waited) return std::nullopt;
    if (cudaSetDevice(op_->device.index) != cudaSuccess) {
      cudaGetLastError();
      return std::nullopt;
    }
    std::optional<absl::Duration> run = ElapsedBetween(op_->start, op_->event);
    if (!run.has_value()) return std::nullopt;
    if (op_->reached == nullptr) return StreamTiming{*run, absl::ZeroDuration()};
    const cudaError_t q = cudaEventQuery(op_->reached);
    if (q != cudaSuccess) {
      cudaGetLastError();  // NotReady too: no later launch may report it as its own
      return std::nullopt;
    }
    // Positive when the collective ended after the compute stream reached the Wait.
    std::optional<absl::Duration> stood = ElapsedBetween(op_->reached, op_->event);
    if (!stood.has_value()) return std::nullopt;
    return StreamTiming{*run, std::max(*stood, absl::ZeroDuration())};
  }

  absl::Status WaitHost(absl::Duration timeout) override {
    absl::MutexLock lock(&op_->mu);
    if (op_->mu.AwaitWithTimeout(absl::Condition(&op_->done), timeout)) return op_->status;
    return absl::DeadlineExceededError(absl::StrCat("WaitHost(", absl::FormatDuration(timeout),
                                                    ") on ", op_->description,
                                                    ": still running when the wait ended"));
  }

  std::string Describe() const override { return op_->description; }

 private:
  const std::shared_ptr<PendingCollective> op_;
};

// The watchdog's view of `op` (NOTE [Watchdog]).
// `stats` counts the collective when it succeeds; the watchdog, which calls `complete`,
// ends before the group (and its counters) goes away.
internal::WatchedOp WatchCollective(const std::shared_ptr<PendingCollective>& op,
                                    const std::shared_ptr<internal::NcclComm>& comm,
                                    StatsRecorder* stats, absl::Duration timeout,
                                    CollectiveKind kind, Traffic traffic) {
  internal::WatchedOp w;
  w.description = op->description;
  w.timeout = timeout;
  w.poll = [op, comm]() -> std::optional<absl::Status> {
    {
      // After an abort the event fires although the collective did not run: a broken
      // group fails every collective not yet seen to succeed.
      absl::MutexLock lock(&comm->mu);
      if (!comm->broken.ok()) {
        return core::Annotate(comm->broken, absl::StrCat(op->description, ": the group broke"));
      }
    }
    const cudaError_t q = cudaEventQuery(op->event);
    if (q == cudaSuccess) return absl::OkStatus();
    if (q != cudaErrorNotReady) return CudaStatus(q, op->description);
    absl::Status async = comm->AsyncError();
    if (!async.ok()) return core::Annotate(async, op->description);
    return std::nullopt;
  };
  w.device_done = [op] { return cudaEventQuery(op->event) != cudaErrorNotReady; };
  w.complete = [op, stats, kind, traffic](const absl::Status& s) {
    if (s.ok()) stats->Record(kind, traffic);  // before waiters can read Stats()
    absl::MutexLock lock(&op->mu);
    op->done = true;
    op->status = s;
  };
  w.release = [op] {
    std::vector<core::Tensor> keep;
    {
      absl::MutexLock lock(&op->mu);
      keep.swap(op->keep);
    }
    // The tensors go back to the allocator here, after the event fired.
  };
  return w;
}

// Rank 0 makes the communicator's unique id and writes it under "nccl_unique_id"; the
// others read it, waiting up to options.init_timeout.
absl::StatusOr<ncclUniqueId> ExchangeUniqueId(Store& store, int rank, const std::string& who,
                                              const NcclOptions& options, absl::Time deadline) {
  ncclUniqueId id;
  if (rank == 0) {
    RETURN_IF_ERROR(NcclStatus(ncclGetUniqueId(&id), nullptr, deadline,
                               absl::StrCat(who, ": ncclGetUniqueId")));
    RETURN_IF_ERROR(
        store.Set("nccl_unique_id", absl::string_view(id.internal, sizeof(id.internal))));
    return id;
  }
  absl::StatusOr<std::string> got = store.Get("nccl_unique_id", options.init_timeout);
  if (!got.ok()) {
    return core::Annotate(got.status(), absl::StrCat(who, ": waiting for rank 0's NCCL id"));
  }
  if (got->size() != sizeof(id.internal)) {
    return absl::InternalError(
        absl::StrCat(who, ": NCCL id has ", got->size(), " bytes, not ", sizeof(id.internal)));
  }
  std::memcpy(id.internal, got->data(), sizeof(id.internal));
  return id;
}

}  // namespace

NcclProcessGroup::NcclProcessGroup(std::shared_ptr<Store> store, int rank, int size,
                                   core::Device device, NcclOptions options)
    : BackendGroup(std::move(store), rank, size, options.name),
      device_(device),
      options_(std::move(options)),
      comm_(std::make_shared<internal::NcclComm>()) {}

absl::StatusOr<std::shared_ptr<NcclProcessGroup>> NcclProcessGroup::Create(
    std::shared_ptr<Store> store, int rank, int size, core::Device device,
    const NcclOptions& options) {
  ASSIGN_OR_RETURN(std::shared_ptr<Store> scoped,
                   internal::GroupStore(std::move(store), "NcclProcessGroup", options.name));
  return Join(std::move(scoped), rank, size, device, options, /*failure_rank=*/rank);
}

absl::StatusOr<std::shared_ptr<NcclProcessGroup>> NcclProcessGroup::Join(
    std::shared_ptr<Store> store, int rank, int size, core::Device device,
    const NcclOptions& options, int failure_rank) {
  const std::string who = internal::JoinWho("nccl", options.name, rank, size);
  RETURN_IF_ERROR(internal::CheckRankAndSize(who, rank, size));
  if (!device.is_cuda()) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": NCCL needs a CUDA device, got ", device.ToString()));
  }
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device.index), absl::StrCat(who, ": cudaSetDevice")));
  std::shared_ptr<NcclProcessGroup> group(
      new NcclProcessGroup(std::move(store), rank, size, device, options));
  RETURN_IF_ERROR(group->InitCommunicator(who));
  // The highest priority the device has, as FSDP2's collective streams: the scheduler
  // starts a collective's blocks before queued compute blocks, so it is not starved.
  int least = 0, greatest = 0;
  RETURN_IF_ERROR(CudaStatus(cudaDeviceGetStreamPriorityRange(&least, &greatest),
                             absl::StrCat(who, ": cudaDeviceGetStreamPriorityRange")));
  RETURN_IF_ERROR(
      CudaStatus(cudaStreamCreateWithPriority(&group->stream_, cudaStreamNonBlocking, greatest),
                 absl::StrCat(who, ": cudaStreamCreateWithPriority")));
  group->failure_rank_ = failure_rank;
  internal::Watchdog::Options dog;
  std::shared_ptr<internal::NcclComm> shared = group->comm_;
  dog.on_failure = [shared, failure_rank](const absl::Status& s) {
    shared->Break(s);  // aborts the communicator: NCCL kernels waiting on peers return
    RecordFailure(s, failure_rank).IgnoreError();
  };
  const int index = device.index;
  dog.thread_init = [index] { cudaSetDevice(index); };
  group->watchdog_ = std::make_unique<internal::Watchdog>(std::move(dog));
  VLOG(1) << who << ": NCCL communicator ready on " << device.ToString();
  return group;
}

absl::Status NcclProcessGroup::InitCommunicator(const std::string& who) {
  const absl::Time deadline = absl::Now() + options_.init_timeout;
  ASSIGN_OR_RETURN(ncclUniqueId id, ExchangeUniqueId(*store(), rank(), who, options_, deadline));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // so that a missing peer is a timeout we control, not a hang
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, size(), id, rank(), &config);
  while (r == ncclInProgress && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
    ncclCommGetAsyncError(comm, &r);
  }
  if (r == ncclInProgress) {
    ncclCommAbort(comm);
    return absl::DeadlineExceededError(
        absl::StrCat(who, ": the peers did not all join within init_timeout ",
                     absl::FormatDuration(options_.init_timeout)));
  }
  if (r != ncclSuccess) {
    const std::string last = comm != nullptr ? ncclGetLastError(comm) : "";
    if (comm != nullptr) ncclCommAbort(comm);
    return absl::UnavailableError(
        absl::StrCat(who, ": ncclCommInitRankConfig failed: ", ncclGetErrorString(r), " ", last));
  }
  absl::MutexLock lock(&comm_->mu);
  comm_->comm = comm;
  return absl::OkStatus();
}

NcclProcessGroup::~NcclProcessGroup() {
  cudaSetDevice(device_.index);
  if (stream_ != nullptr) {
    // Let queued collectives finish (bounded: a peer that is gone would block them).
    const absl::Time end = absl::Now() + absl::Seconds(30);
    while (cudaStreamQuery(stream_) == cudaErrorNotReady && absl::Now() < end) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    if (cudaStreamQuery(stream_) == cudaErrorNotReady) {
      comm_->Break(absl::AbortedError(absl::StrCat(Describe(), " destroyed with work pending")));
    }
  }
  if (watchdog_ != nullptr) {
    watchdog_->PollOnce();  // completes what finished; the rest ends Aborted
    watchdog_.reset();
  }
  {
    absl::MutexLock lock(&comm_->mu);
    if (comm_->comm != nullptr) {
      ncclCommDestroy(comm_->comm);
      comm_->comm = nullptr;
    }
    if (comm_->broken.ok()) {
      comm_->broken = absl::FailedPreconditionError(absl::StrCat(Describe(), " was destroyed"));
    }
  }
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::StatusOr<std::shared_ptr<Work>> NcclProcessGroup::Issue(CollectiveKind kind,
                                                              absl::Duration timeout,
                                                              Traffic traffic,
                                                              std::vector<core::Tensor> keep,
                                                              const LaunchFn& launch) {
  absl::MutexLock order(&mu_);
  const uint64_t seq = next_seq_++;
  const std::string what = absl::StrCat(CollectiveKindName(kind), " #", seq, " on ", Describe());
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&comm_->mu);
  if (!comm_->broken.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": the group is broken by an earlier failure: ", comm_->broken.message()));
  }
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_.index), what));
  // Order after everything already queued on the legacy default stream.
  cudaEvent_t ready = nullptr;
  RETURN_IF_ERROR(CudaStatus(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), what));
  cudaError_t err = cudaEventRecord(ready, cudaStreamLegacy);
  if (err == cudaSuccess) err = cudaStreamWaitEvent(stream_, ready, 0);
  cudaEventDestroy(ready);
  RETURN_IF_ERROR(CudaStatus(err, what));
  auto op = std::make_shared<PendingCollective>(what, device_);
  RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&op->start), what));
  RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&op->event), what));
  RETURN_IF_ERROR(CudaStatus(cudaEventRecord(op->start, stream_), what));
  // A launch that fails part way, or an end event that cannot be recorded, leaves work on
  // the stream that still reads and writes `keep`: the group breaks (the communicator is
  // aborted, so its kernels end) and the stream is drained before `keep` is let go.
  const auto fail = [&](const absl::Status& s) {
    comm_->BreakLocked(s);
    (void)cudaStreamSynchronize(stream_);
    (void)cudaGetLastError();
    return s;
  };
  absl::Status launched = launch(comm_->comm, stream_);
  if (!launched.ok()) {
    return fail(core::Annotate(launched, what));
  }
  (void)deadline;  // the watchdog counts the timeout from here too
  if (absl::Status s = CudaStatus(cudaEventRecord(op->event, stream_), what); !s.ok()) {
    return fail(s);
  }
  {
    absl::MutexLock op_lock(&op->mu);
    op->keep = std::move(keep);
  }
  watchdog_->Add(WatchCollective(op, comm_, &stats(), timeout, kind, traffic));
  return std::shared_ptr<Work>(std::make_shared<NcclWork>(std::move(op)));
}

bool NcclProcessGroup::OnHost(const std::vector<const core::Tensor*>& tensors) {
  for (const core::Tensor* t : tensors) {
    if (!t->device().is_cpu()) return false;
  }
  return true;
}

absl::StatusOr<std::shared_ptr<Work>> NcclProcessGroup::Staged(
    const std::vector<core::Tensor>& host, absl::Duration timeout,
    const std::function<absl::StatusOr<std::shared_ptr<Work>>(const std::vector<core::Tensor>&)>&
        issue) {
  RETURN_IF_ERROR(
      CudaStatus(cudaSetDevice(device_.index), absl::StrCat(Describe(), ": cudaSetDevice")));
  std::vector<core::Tensor> dev;
  for (const core::Tensor& h : host) {
    ASSIGN_OR_RETURN(core::Tensor d,
                     core::Tensor::Allocate(h.shape(), h.dtype(), core::MemoryTag::kComm, device_));
    if (h.numel() > 0) RETURN_IF_ERROR(d.CopyFrom(h));
    dev.push_back(std::move(d));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<Work> work, issue(dev));
  absl::Status status = work->WaitHost(timeout);
  for (size_t i = 0; status.ok() && i < host.size(); ++i) {
    if (host[i].numel() > 0) status = host[i].CopyFrom(dev[i]);
  }
  return std::shared_ptr<Work>(CompletionWork::Done(status, work->Describe()));
}

absl::StatusOr<std::shared_ptr<Work>> NcclProcessGroup::AllGather(const core::Tensor& input,
                                                                  const core::Tensor& output,
                                                                  const AllGatherOptions& options) {
  constexpr CollectiveKind kind = CollectiveKind::kAllGather;
  RETURN_IF_ERROR(ValidateAllGather(*this, input, output, options));
  if (OnHost({&input, &output})) {
    RETURN_IF_ERROR(StageIn(input, options.stage_from));
    AllGatherOptions plain = options;
    plain.stage_from = core::Tensor();
    return Staged({input, output}, options.timeout,
                  [&](const std::vector<core::Tensor>& d) { return AllGather(d[0], d[1], plain); });
  }
  RETURN_IF_ERROR(ValidateDevice(*this, kind, {&input, &output}, device_));
  const absl::Time deadline = absl::Now() + options.timeout;
  std::vector<core::Tensor> keep = {input, output};
  core::Tensor staging;
  if (options.stage_from.defined()) {
    keep.push_back(options.stage_from);
    if (options.stage_from.device().is_cpu() && options.stage_from.dtype() != input.dtype()) {
      ASSIGN_OR_RETURN(staging, core::Tensor::Allocate({input.numel()}, options.stage_from.dtype(),
                                                       core::MemoryTag::kComm, device_));
      keep.push_back(staging);
    }
  }
  return Issue(kind, options.timeout, ExpectedTraffic(kind, output.nbytes(), size(), rank()),
               std::move(keep), [&](ncclComm_t comm, cudaStream_t stream) -> absl::Status {
                 if (input.numel() == 0) return absl::OkStatus();
                 RETURN_IF_ERROR(StageInOnStream(input, options.stage_from, staging, stream));
                 return NcclStatus(ncclAllGather(input.raw_data(), output.raw_data(),
                                                 input.nbytes(), ncclUint8, comm, stream),
                                   comm, deadline, "ncclAllGather");
               });
}

absl::StatusOr<std::shared_ptr<Work>> NcclProcessGroup::ReduceScatter(
    const core::Tensor& input, const core::Tensor& output, const ReduceScatterOptions& options) {
  constexpr CollectiveKind kind = CollectiveKind::kReduceScatter;
  RETURN_IF_ERROR(ValidateReduceScatter(*this, input, output, options));
  if (OnHost({&input, &output})) {
    ReduceScatterOptions plain = options;
    plain.unstage_to = core::Tensor();
    plain.accumulate_into = core::Tensor();
    ASSIGN_OR_RETURN(std::shared_ptr<Work> work, Staged({input, output}, options.timeout,
                                                        [&](const std::vector<core::Tensor>& d) {
                                                          return ReduceScatter(d[0], d[1], plain);
                                                        }));
    RETURN_IF_ERROR(work->WaitHost(options.timeout));
    RETURN_IF_ERROR(StageOut(output, options.unstage_to));
    RETURN_IF_ERROR(AccumulateOut(output, options.accumulate_into));
    return work;
  }
  RETURN_IF_ERROR(ValidateDevice(*this, kind, {&input, &output}, device_));
  const absl::Time deadline = absl::Now() + options.timeout;
  const int64_t k = output.numel();
  std::vector<core::Tensor> keep = {input, output};
  if (options.unstage_to.defined()) keep.push_back(options.unstage_to);
  if (options.accumulate_into.defined()) keep.push_back(options.accumulate_into);
  // NOTE [Staged collectives]: accumulate_into += output on the stream, after the reduction.
  auto accumulate = [&](cudaStream_t stream) -> absl::Status {
    if (!options.accumulate_into.defined() || k == 0) return absl::OkStatus();
    return ConvertStatus(
        ::kernels::cuda::AddInto(options.accumulate_into.data<float>(), output.raw_data(),
                                 output.dtype() == core::DType::kBFloat16, k, stream),
        "adding the output into options.accumulate_into");
  };
  core::Tensor wide_in, wide_out;
  const bool bf16 = input.dtype() == core::DType::kBFloat16;
  if (bf16 && k > 0) {
    ASSIGN_OR_RETURN(wide_in, core::Tensor::Allocate({input.numel()}, core::DType::kFloat32,
                                                     core::MemoryTag::kComm, device_));
    ASSIGN_OR_RETURN(wide_out, core::Tensor::Allocate({k}, core::DType::kFloat32,
                                                      core::MemoryTag::kComm, device_));
    keep.push_back(wide_in);
    keep.push_back(wide_out);
  }
  return Issue(
      kind, options.timeout, ExpectedTraffic(kind, input.nbytes(), size(), rank()), std::move(keep),
      [&](ncclComm_t comm, cudaStream_t stream) -> absl::Status {
        if (k == 0) return absl::OkStatus();
        if (!bf16) {
          RETURN_IF_ERROR(NcclStatus(
              ncclReduceScatter(input.raw_data(), output.raw_data(), k, NcclType(input.dtype()),
                                NcclOp(options.reduce_op), comm, stream),
              comm, deadline, "ncclReduceScatter"));
          RETURN_IF_ERROR(StageOutOnStream(output, options.unstage_to, stream));
          return accumulate(stream);
        }
        RETURN_IF_ERROR(ConvertStatus(
            cuda::Bf16ToFloat(input.raw_data(), wide_in.data<float>(), input.numel(), stream),
            "bf16 -> fp32"));
        RETURN_IF_ERROR(
            NcclStatus(ncclReduceScatter(wide_in.raw_data(), wide_out.raw_data(), k, ncclFloat32,
                                         NcclOp(options.reduce_op), comm, stream),
                       comm, deadline, "ncclReduceScatter"));
        RETURN_IF_ERROR(
            ConvertStatus(cuda::FloatToBf16(wide_out.data<float>(), output.raw_data(), k, stream),
                          "fp32 -> bf16"));
        RETURN_IF_ERROR(StageOutOnStream(output, options.unstage_to, stream));
        return accumulate(stream);
      });
}

absl::StatusOr<std::shared_ptr<Work>> NcclProcessGroup::AllReduce(const core::Tensor& tensor,
                                                                  const AllReduceOptions& options) {
  constexpr CollectiveKind kind = CollectiveKind::kAllReduce;
  RETURN_IF_ERROR(ValidateAllReduce(*this, tensor, options));
  if (OnHost({&tensor})) {
    AllReduceOptions plain = options;
    plain.unstage_to = core::Tensor();
    ASSIGN_OR_RETURN(std::shared_ptr<Work> work,
                     Staged({tensor}, options.timeout, [&](const std::vector<core::Tensor>& d) {
                       return AllReduce(d[0], plain);
                     }));
    RETURN_IF_ERROR(work->WaitHost(options.timeout));
    RETURN_IF_ERROR(StageOut(tensor, options.unstage_to));
    return work;
  }
  RETURN_IF_ERROR(ValidateDevice(*this, kind, {&tensor}, device_));
  const absl::Time deadline = absl::Now() + options.timeout;
  const int64_t n = tensor.numel();
  std::vector<core::Tensor> keep = {tensor};
  if (options.unstage_to.defined()) keep.push_back(options.unstage_to);
  core::Tensor wide;
  const bool bf16 = tensor.dtype() == core::DType::kBFloat16;
  if (bf16 && n > 0) {
    ASSIGN_OR_RETURN(
        wide, core::Tensor::Allocate({n}, core::DType::kFloat32, core::MemoryTag::kComm, device_));
    keep.push_back(wide);
  }
  return Issue(
      kind, options.timeout, ExpectedTraffic(kind, tensor.nbytes(), size(), rank()),
      std::move(keep), [&](ncclComm_t comm, cudaStream_t stream) -> absl::Status {
        if (n == 0) return absl::OkStatus();
        if (!bf16) {
          RETURN_IF_ERROR(NcclStatus(
              ncclAllReduce(tensor.raw_data(), tensor.raw_data(), n, NcclType(tensor.dtype()),
                            NcclOp(options.reduce_op), comm, stream),
              comm, deadline, "ncclAllReduce"));
          return StageOutOnStream(tensor, options.unstage_to, stream);
        }
        RETURN_IF_ERROR(ConvertStatus(
            cuda::Bf16ToFloat(tensor.raw_data(), wide.data<float>(), n, stream), "bf16 -> fp32"));
        RETURN_IF_ERROR(NcclStatus(ncclAllReduce(wide.raw_data(), wide.raw_data(), n, ncclFloat32,
                                                 NcclOp(options.reduce_op), comm, stream),
                                   comm, deadline, "ncclAllReduce"));
        RETURN_IF_ERROR(ConvertStatus(
            cuda::FloatToBf16(wide.data<float>(), tensor.raw_data(), n, stream), "fp32 -> bf16"));
        return StageOutOnStream(tensor, options.unstage_to, stream);
      });
}

absl::StatusOr<std::shared_ptr<Work>> NcclProcessGroup::Broadcast(const core::Tensor& tensor,
                                                                  const BroadcastOptions& options) {
  constexpr CollectiveKind kind = CollectiveKind::kBroadcast;
  RETURN_IF_ERROR(ValidateBroadcast(*this, tensor, options));
  if (OnHost({&tensor})) {
    return Staged({tensor}, options.timeout,
                  [&](const std::vector<core::Tensor>& d) { return Broadcast(d[0], options); });
  }
  RETURN_IF_ERROR(ValidateDevice(*this, kind, {&tensor}, device_));
  const absl::Time deadline = absl::Now() + options.timeout;
  return Issue(
      kind, options.timeout, ExpectedTraffic(kind, tensor.nbytes(), size(), rank(), options.root),
      {tensor}, [&](ncclComm_t comm, cudaStream_t stream) -> absl::Status {
        if (tensor.numel() == 0) return absl::OkStatus();
        return NcclStatus(ncclBroadcast(tensor.raw_data(), tensor.raw_data(), tensor.nbytes(),
                                        ncclUint8, options.root, comm, stream),
                          comm, deadline, "ncclBroadcast");
      });
}

absl::StatusOr<std::shared_ptr<Work>> NcclProcessGroup::Barrier(const BarrierOptions& options) {
  constexpr CollectiveKind kind = CollectiveKind::kBarrier;
  RETURN_IF_ERROR(ValidateBarrier(*this, options));
  const absl::Time deadline = absl::Now() + options.timeout;
  ASSIGN_OR_RETURN(core::Tensor token, core::Tensor::Allocate({1}, core::DType::kInt32,
                                                              core::MemoryTag::kComm, device_));
  return Issue(kind, options.timeout, Traffic{}, {token},
               [&](ncclComm_t comm, cudaStream_t stream) -> absl::Status {
                 return NcclStatus(ncclAllReduce(token.raw_data(), token.raw_data(), 1, ncclInt32,
                                                 ncclSum, comm, stream),
                                   comm, deadline, "ncclAllReduce (barrier)");
               });
}

absl::StatusOr<std::shared_ptr<ProcessGroup>> NcclProcessGroup::NewSubgroup(
    const std::vector<int>& ranks, const SubgroupOptions& options) {
  ASSIGN_OR_RETURN(SubgroupPlacement place, PlaceNextSubgroup(ranks));
  NcclOptions sub = options_;
  sub.name = SubgroupName(options, place);
  sub.init_timeout = options.timeout;
  ASSIGN_OR_RETURN(auto group,
                   Join(SubgroupStore(place), place.rank, place.size, device_, sub, failure_rank_));
  return std::shared_ptr<ProcessGroup>(std::move(group));
}

}  // namespace comm
