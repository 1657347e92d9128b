#include "comm/internal/worker_group.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/prefix_store.h"
#include "core/device.h"

namespace comm {
namespace internal {

std::string JoinWho(absl::string_view backend, absl::string_view name, int rank, int size) {
  return absl::StrCat(backend, " group '", name, "' (rank ", rank, " of ", size, ")");
}

absl::StatusOr<std::shared_ptr<Store>> GroupStore(std::shared_ptr<Store> store,
                                                  absl::string_view type, absl::string_view name) {
  if (store == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(type, "::Create('", name, "'): store is null"));
  }
  return std::make_shared<PrefixStore>(std::move(store), std::string(name));
}

absl::Status CheckRankAndSize(absl::string_view who, int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": rank must be in [0, size) and size at least 1"));
  }
  return absl::OkStatus();
}

absl::Status CheckPositive(absl::string_view who, absl::string_view option, absl::Duration value) {
  if (value <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": ", option, " must be positive"));
  }
  return absl::OkStatus();
}

BackendGroup::BackendGroup(std::shared_ptr<Store> store, int rank, int size, std::string name)
    : store_(std::move(store)), rank_(rank), size_(size), name_(std::move(name)) {}

absl::StatusOr<SubgroupPlacement> BackendGroup::PlaceNextSubgroup(const std::vector<int>& ranks) {
  return PlaceInSubgroup(*this, ranks, next_subgroup_.fetch_add(1));
}

std::string BackendGroup::SubgroupName(const SubgroupOptions& options,
                                       const SubgroupPlacement& place) const {
  return options.name.empty() ? absl::StrCat(name_, "/", place.key_prefix) : options.name;
}

std::shared_ptr<Store> BackendGroup::SubgroupStore(const SubgroupPlacement& place) const {
  return std::make_shared<PrefixStore>(store_, place.key_prefix);
}

CollectiveWorker::CollectiveWorker(const ProcessGroup* group, StatsRecorder* stats, Hooks hooks)
    : group_(group), stats_(stats), hooks_(std::move(hooks)) {}

CollectiveWorker::~CollectiveWorker() { Stop(); }

void CollectiveWorker::Start() {
  allocator_ = core::Allocator::Current(core::Device::Cpu());
  thread_ = std::thread([this] { Loop(); });
}

void CollectiveWorker::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  absl::MutexLock lock(&mu_);
  CancelQueued();  // when the thread never started
}

void CollectiveWorker::CancelQueued() {
  for (Entry& pending : queue_) {
    pending.run = nullptr;  // drop the tensors before waiters wake
    pending.work->Complete(absl::FailedPreconditionError(
        absl::StrCat(pending.work->Describe(), ": the group was destroyed first")));
  }
  queue_.clear();
}

absl::Status CollectiveWorker::CheckUsable(CollectiveKind kind) const {
  absl::MutexLock lock(&mu_);
  if (!broken_.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(CollectiveKindName(kind), " on ", group_->Describe(),
                     ": the group is broken by an earlier failure: ", broken_.message()));
  }
  return absl::OkStatus();
}

bool CollectiveWorker::broken() const {
  absl::MutexLock lock(&mu_);
  return !broken_.ok();
}

std::shared_ptr<Work> CollectiveWorker::Enqueue(CollectiveKind kind, absl::Duration timeout,
                                                Traffic traffic, RunFn run) {
  absl::MutexLock lock(&mu_);
  QueuedOp op;
  op.kind = kind;
  op.seq = next_seq_++;
  op.what = absl::StrCat(CollectiveKindName(kind), " #", op.seq, " on ", group_->Describe());
  op.deadline = absl::Now() + timeout;
  op.timeout = timeout;
  auto work = std::make_shared<CompletionWork>(op.what);
  if (hooks_.on_enqueue) hooks_.on_enqueue(*work, op);
  queue_.push_back(Entry{std::move(op), work, traffic, std::move(run)});
  return work;
}

void CollectiveWorker::Loop() {
  if (hooks_.thread_init) hooks_.thread_init();
  core::ScopedAllocator scope(allocator_);
  while (true) {
    Entry entry;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) {
        CancelQueued();
        return;
      }
      entry = std::move(queue_.front());
      queue_.pop_front();
    }
    RunOne(entry);
  }
}

void CollectiveWorker::RunOne(Entry& entry) {
  const QueuedOp& op = entry.op;
  absl::Status status = CheckUsable(op.kind);
  const bool was_usable = status.ok();
  if (status.ok()) {
    if (hooks_.on_start) hooks_.on_start(op);
    const absl::Time started = absl::Now();
    if (started >= op.deadline) {
      status = absl::DeadlineExceededError(absl::StrCat(
          op.what, " did not start within its timeout of ", absl::FormatDuration(op.timeout),
          " (earlier collectives of the group took the time)"));
    } else {
      status = entry.run(op);
    }
    entry.work->SetRunTime(absl::Now() - started);
  }
  if (status.ok()) {
    stats_->Record(op.kind, entry.traffic);
  } else if (was_usable) {
    {
      absl::MutexLock lock(&mu_);
      if (broken_.ok()) broken_ = status;
    }
    if (hooks_.on_break) hooks_.on_break(status);
  }
  // Drop the closure, and with it the collective's tensor references, before waking
  // the waiters: a caller that frees its buffers after Wait() must see them freed.
  entry.run = nullptr;
  entry.work->Complete(std::move(status));
}

}  // namespace internal
}  // namespace comm
