#include "comm/shm_process_group.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/internal/shm_collectives.h"
#include "comm/internal/shm_rendezvous.h"
#include "comm/internal/shm_segment.h"
#include "core/status_macros.h"
#include "glog/logging.h"

// The backend in four files: this one (Create, the API, the worker's hooks), the
// rendezvous (comm/internal/shm_rendezvous.h), the segment and its step protocol
// (comm/internal/shm_segment.h) and the collectives' bodies over it
// (comm/internal/shm_collectives.h).

namespace comm {
namespace {

// Join's checks of the rank, the size and the options.
absl::Status CheckJoin(const std::string& who, int rank, int size, const ShmOptions& options) {
  RETURN_IF_ERROR(internal::CheckRankAndSize(who, rank, size));
  RETURN_IF_ERROR(
      internal::CheckPositive(who, "ShmOptions.rendezvous_timeout", options.rendezvous_timeout));
  RETURN_IF_ERROR(
      internal::CheckPositive(who, "ShmOptions.liveness_interval", options.liveness_interval));
  if (options.slot_bytes < 4096 || options.slot_bytes > (int64_t{1} << 30) ||
      options.slot_bytes % 64 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": ShmOptions.slot_bytes ",
                                                   options.slot_bytes,
                                                   " must be a multiple of 64 in [4096, 2^30]"));
  }
  if (options.slot_bytes < 64 * static_cast<int64_t>(size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": ShmOptions.slot_bytes ", options.slot_bytes,
        " must be at least 64 bytes per rank (", 64 * static_cast<int64_t>(size), ")"));
  }
  return absl::OkStatus();
}

}  // namespace

ShmProcessGroup::ShmProcessGroup(std::shared_ptr<Store> store, int rank, int size,
                                 ShmOptions options)
    : BackendGroup(std::move(store), rank, size, options.name),
      options_(std::move(options)),
      worker_(this, &stats(), [this] {
        internal::CollectiveWorker::Hooks hooks;
        // Peers waiting on this rank fail now rather than at their deadlines.
        hooks.on_break = [this](const absl::Status&) {
          collectives_->segment().MarkFailed(this->rank());
        };
        return hooks;
      }()) {}

ShmProcessGroup::~ShmProcessGroup() {
  worker_.Stop();
  if (collectives_ != nullptr) collectives_->segment().MarkDestroyed(rank());
}

const std::string& ShmProcessGroup::segment_name() const { return collectives_->segment().name; }

std::string ShmProcessGroup::transport_name() const {
  return collectives_->cma() ? "cma" : "slots";
}

absl::StatusOr<std::shared_ptr<ShmProcessGroup>> ShmProcessGroup::Create(
    std::shared_ptr<Store> store, int rank, int size, const ShmOptions& options) {
  ASSIGN_OR_RETURN(std::shared_ptr<Store> scoped,
                   internal::GroupStore(std::move(store), "ShmProcessGroup", options.name));
  return Join(std::move(scoped), rank, size, options);
}

absl::StatusOr<std::shared_ptr<ShmProcessGroup>> ShmProcessGroup::Join(std::shared_ptr<Store> store,
                                                                       int rank, int size,
                                                                       const ShmOptions& options) {
  const std::string who = internal::JoinWho("shm", options.name, rank, size);
  RETURN_IF_ERROR(CheckJoin(who, rank, size, options));
  const absl::Time deadline = absl::Now() + options.rendezvous_timeout;
  std::shared_ptr<ShmProcessGroup> group(new ShmProcessGroup(store, rank, size, options));
  ASSIGN_OR_RETURN(std::unique_ptr<internal::ShmSegment> segment,
                   internal::JoinShmSegment(*store, rank, size, options, who, deadline));
  absl::StatusOr<bool> cma =
      internal::ChooseShmTransport(*store, *segment, rank, size, options, who, deadline);
  if (!cma.ok()) {
    segment->MarkDestroyed(rank);  // peers already past the probe fail fast on this rank
    return cma.status();
  }
  group->collectives_ =
      std::make_unique<internal::ShmCollectives>(std::move(segment), rank, size, options, *cma);
  group->worker_.Start();
  VLOG(1) << group->Describe() << ": attached to " << group->segment_name() << ", transport "
          << group->transport_name();
  return group;
}

absl::StatusOr<std::shared_ptr<Work>> ShmProcessGroup::Enqueue(
    CollectiveKind kind, absl::Duration timeout, Traffic traffic,
    internal::CollectiveWorker::RunFn run) {
  RETURN_IF_ERROR(worker_.CheckUsable(kind));
  return worker_.Enqueue(kind, timeout, traffic, std::move(run));
}

absl::StatusOr<std::shared_ptr<Work>> ShmProcessGroup::AllGather(const core::Tensor& input,
                                                                 const core::Tensor& output,
                                                                 const AllGatherOptions& options) {
  constexpr CollectiveKind kind = CollectiveKind::kAllGather;
  RETURN_IF_ERROR(ValidateAllGather(*this, input, output, options));
  RETURN_IF_ERROR(ValidateDevice(*this, kind, {&input, &output}, core::Device::Cpu()));
  return Enqueue(kind, options.timeout, ExpectedTraffic(kind, output.nbytes(), size(), rank()),
                 [c = collectives_.get(), input, output,
                  stage_from = options.stage_from](const internal::QueuedOp& op) -> absl::Status {
                   RETURN_IF_ERROR(StageIn(input, stage_from));
                   return c->AllGather(input, output, op);
                 });
}

absl::StatusOr<std::shared_ptr<Work>> ShmProcessGroup::ReduceScatter(
    const core::Tensor& input, const core::Tensor& output, const ReduceScatterOptions& options) {
  constexpr CollectiveKind kind = CollectiveKind::kReduceScatter;
  RETURN_IF_ERROR(ValidateReduceScatter(*this, input, output, options));
  RETURN_IF_ERROR(ValidateDevice(*this, kind, {&input, &output}, core::Device::Cpu()));
  return Enqueue(kind, options.timeout, ExpectedTraffic(kind, input.nbytes(), size(), rank()),
                 [c = collectives_.get(), input, output, reduce = options.reduce_op,
                  unstage_to = options.unstage_to,
                  into = options.accumulate_into](const internal::QueuedOp& op) -> absl::Status {
                   RETURN_IF_ERROR(c->ReduceScatter(input, output, reduce, op));
                   RETURN_IF_ERROR(StageOut(output, unstage_to));
                   return AccumulateOut(output, into);
                 });
}

absl::StatusOr<std::shared_ptr<Work>> ShmProcessGroup::AllReduce(const core::Tensor& tensor,
                                                                 const AllReduceOptions& options) {
  constexpr CollectiveKind kind = CollectiveKind::kAllReduce;
  RETURN_IF_ERROR(ValidateAllReduce(*this, tensor, options));
  RETURN_IF_ERROR(ValidateDevice(*this, kind, {&tensor}, core::Device::Cpu()));
  return Enqueue(kind, options.timeout, ExpectedTraffic(kind, tensor.nbytes(), size(), rank()),
                 [c = collectives_.get(), tensor, reduce = options.reduce_op,
                  unstage_to = options.unstage_to](const internal::QueuedOp& op) -> absl::Status {
                   RETURN_IF_ERROR(c->AllReduce(tensor, reduce, op));
                   return StageOut(tensor, unstage_to);
                 });
}

absl::StatusOr<std::shared_ptr<Work>> ShmProcessGroup::Broadcast(const core::Tensor& tensor,
                                                                 const BroadcastOptions& options) {
  constexpr CollectiveKind kind = CollectiveKind::kBroadcast;
  RETURN_IF_ERROR(ValidateBroadcast(*this, tensor, options));
  RETURN_IF_ERROR(ValidateDevice(*this, kind, {&tensor}, core::Device::Cpu()));
  const int root = options.root;
  return Enqueue(kind, options.timeout,
                 ExpectedTraffic(kind, tensor.nbytes(), size(), rank(), root),
                 [c = collectives_.get(), tensor, root](const internal::QueuedOp& op) {
                   return c->Broadcast(tensor, root, op);
                 });
}

absl::StatusOr<std::shared_ptr<Work>> ShmProcessGroup::Barrier(const BarrierOptions& options) {
  constexpr CollectiveKind kind = CollectiveKind::kBarrier;
  RETURN_IF_ERROR(ValidateBarrier(*this, options));
  return Enqueue(kind, options.timeout, Traffic{},
                 [c = collectives_.get()](const internal::QueuedOp& op) { return c->Barrier(op); });
}

absl::StatusOr<std::shared_ptr<ProcessGroup>> ShmProcessGroup::NewSubgroup(
    const std::vector<int>& ranks, const SubgroupOptions& options) {
  ASSIGN_OR_RETURN(SubgroupPlacement place, PlaceNextSubgroup(ranks));
  ShmOptions sub = options_;
  sub.name = SubgroupName(options, place);
  sub.rendezvous_timeout = options.timeout;
  ASSIGN_OR_RETURN(std::shared_ptr<ShmProcessGroup> group,
                   Join(SubgroupStore(place), place.rank, place.size, sub));
  return std::shared_ptr<ProcessGroup>(std::move(group));
}

}  // namespace comm
