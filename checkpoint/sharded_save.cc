// checkpoint::Save and CleanUpInterruptedSaves (sharded.h). NOTE [Checkpoint commit]
// describes the protocol and NOTE [Save lock] the clean-up; the three exchanges below
// are all-gathers of serialized messages (internal/save_exchange.proto, through
// comm::AllGatherBytes), so every rank learns every other rank's errors and all of them
// return the same status.
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint.pb.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/internal/file_io.h"
#include "checkpoint/internal/host_staging.h"
#include "checkpoint/internal/metadata.h"
#include "checkpoint/internal/save_exchange.pb.h"
#include "checkpoint/sharded.h"
#include "comm/agreement.h"
#include "core/errno_text.h"
#include "core/status_macros.h"

namespace checkpoint {

TensorSlice FullSlice(std::string name, const core::Tensor& tensor) {
  TensorSlice s;
  s.name = std::move(name);
  s.shape = tensor.shape();
  s.dtype = tensor.dtype();
  s.begin = 0;
  s.end = tensor.numel();
  s.data = tensor;
  return s;
}

namespace {

using internal::CheckedNumel;
using internal::CommitMessage;
using internal::PlanMessage;
using internal::RankError;
using internal::SliceDescription;
using internal::WrittenMessage;

template <typename Message>
void SetError(const absl::Status& status, Message* m) {
  m->set_failed(true);
  m->mutable_error()->set_code(static_cast<int>(status.code()));
  m->mutable_error()->set_message(std::string(status.message()));
}

// The lowest rank's error among `messages`, as a status ("rank <r>: " prefixed when
// there is more than one rank); OK when none failed.
template <typename Message>
absl::Status FirstError(const std::vector<Message>& messages) {
  for (size_t r = 0; r < messages.size(); ++r) {
    if (!messages[r].failed()) continue;
    const std::string prefix = messages.size() > 1 ? absl::StrCat("rank ", r, ": ") : "";
    return absl::Status(static_cast<absl::StatusCode>(messages[r].error().code()),
                        absl::StrCat(prefix, messages[r].error().message()));
  }
  return absl::OkStatus();
}

template <typename Message>
absl::StatusOr<std::vector<Message>> Exchange(comm::ProcessGroup* group, const Message& mine,
                                              absl::Duration timeout) {
  ASSIGN_OR_RETURN(std::vector<std::string> all,
                   comm::AllGatherBytes(group, mine.SerializeAsString(), timeout));
  std::vector<Message> out(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    if (!out[r].ParseFromString(all[r])) {
      return absl::InternalError(
          absl::StrCat("checkpoint::Save: rank ", r, "'s message does not parse"));
    }
  }
  return out;
}

// Checks this rank's slices on their own (ranges, data sizes, dtypes, duplicates).
absl::Status ValidateLocal(const std::string& dir, const std::vector<TensorSlice>& local) {
  std::set<std::string> names;
  for (const TensorSlice& s : local) {
    const std::string what = absl::StrCat("checkpoint::Save to '", dir, "': tensor '", s.name, "'");
    if (s.name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint::Save to '", dir, "': a slice has an empty tensor name"));
    }
    if (!names.insert(s.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(what, " is listed twice by this rank"));
    }
    ASSIGN_OR_RETURN(int64_t numel, CheckedNumel(s.shape, what));
    if (s.begin < 0 || s.end < s.begin || s.end > numel) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " of shape ", core::ShapeToString(s.shape), " (", numel,
                       " elements): slice [", s.begin, ", ", s.end, ") is out of range"));
    }
    const int64_t n = s.end - s.begin;
    if (n == 0 && !s.data.defined()) continue;
    if (!s.data.defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": slice [", s.begin, ", ", s.end, ") has undefined data"));
    }
    if (s.data.numel() != n) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": slice [", s.begin, ", ", s.end,
                                                     ") has ", n, " elements but its data ",
                                                     s.data.ToString(), " has ", s.data.numel()));
    }
    if (!internal::Convertible(s.data.dtype(), s.dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": data of dtype ", core::DTypeName(s.data.dtype()),
                       " cannot be stored as ", core::DTypeName(s.dtype)));
    }
  }
  return absl::OkStatus();
}

// One tensor of the merged plan: who holds which range.
struct Holder {
  int rank;
  int64_t begin;
  int64_t end;
};
struct PlannedTensor {
  std::string name;
  core::Shape shape;
  core::DType dtype = core::DType::kFloat32;
  int64_t numel = 0;
  std::vector<Holder> holders;
};

struct Plan {
  std::vector<PlannedTensor> tensors;
  std::map<std::string, int> by_name;
};

// Merges every rank's slice list; the same result on every rank. InvalidArgument for
// disagreeing shapes or dtypes and for elements nobody holds.
absl::StatusOr<Plan> MergePlans(const std::string& dir, const std::vector<PlanMessage>& plans) {
  Plan plan;
  for (size_t r = 0; r < plans.size(); ++r) {
    for (const SliceDescription& s : plans[r].slices()) {
      core::Shape shape(s.shape().begin(), s.shape().end());
      ASSIGN_OR_RETURN(core::DType dtype, core::ParseDType(s.dtype()));
      auto [it, inserted] = plan.by_name.emplace(s.name(), static_cast<int>(plan.tensors.size()));
      if (inserted) {
        PlannedTensor t;
        t.name = s.name();
        t.shape = shape;
        t.dtype = dtype;
        t.numel = core::NumElements(shape);
        plan.tensors.push_back(std::move(t));
      }
      PlannedTensor& t = plan.tensors[it->second];
      if (t.shape != shape || t.dtype != dtype) {
        return absl::InvalidArgumentError(
            absl::StrCat("checkpoint::Save to '", dir, "': ranks disagree on tensor '", t.name,
                         "': rank ", t.holders.empty() ? 0 : t.holders.front().rank, " has ",
                         core::DTypeName(t.dtype), " ", core::ShapeToString(t.shape), ", rank ", r,
                         " has ", core::DTypeName(dtype), " ", core::ShapeToString(shape)));
      }
      if (s.end() > s.begin()) t.holders.push_back({static_cast<int>(r), s.begin(), s.end()});
    }
  }
  for (const PlannedTensor& t : plan.tensors) {
    std::vector<Holder> h = t.holders;
    std::sort(h.begin(), h.end(),
              [](const Holder& a, const Holder& b) { return a.begin < b.begin; });
    int64_t covered = 0;
    for (const Holder& x : h) {
      if (x.begin > covered) break;
      covered = std::max(covered, x.end);
    }
    if (covered < t.numel) {
      int64_t gap_end = t.numel;
      for (const Holder& x : h) {
        if (x.begin > covered) {
          gap_end = x.begin;
          break;
        }
      }
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint::Save to '", dir, "': tensor '", t.name, "' of shape ",
                       core::ShapeToString(t.shape), ": elements [", covered, ", ", gap_end,
                       ") are held by no rank"));
    }
  }
  return plan;
}

// The parts of [begin, end) that no rank below `rank` holds (NOTE [Replicated slices]).
std::vector<std::pair<int64_t, int64_t>> PiecesToWrite(const PlannedTensor& t, int rank,
                                                       int64_t begin, int64_t end) {
  std::vector<std::pair<int64_t, int64_t>> lower;
  for (const Holder& h : t.holders) {
    if (h.rank < rank) lower.push_back({h.begin, h.end});
  }
  std::sort(lower.begin(), lower.end());
  std::vector<std::pair<int64_t, int64_t>> pieces;
  int64_t pos = begin;
  for (const auto& [b, e] : lower) {
    if (e <= pos) continue;
    if (b >= end) break;
    if (b > pos) pieces.push_back({pos, b});
    pos = std::max(pos, e);
    if (pos >= end) break;
  }
  if (pos < end) pieces.push_back({pos, end});
  return pieces;
}

// Writes this rank's data file into `temp_dir` and describes its chunks.
absl::StatusOr<WrittenMessage> WriteDataFile(const std::string& temp_dir, int rank, int world,
                                             const std::vector<TensorSlice>& local,
                                             const Plan& plan, int64_t block_bytes) {
  WrittenMessage out;
  const std::string file = internal::DataFileName(rank, world);
  const std::string path = internal::JoinPath(temp_dir, file);
  ASSIGN_OR_RETURN(internal::FileWriter writer, internal::FileWriter::Create(path));
  for (const TensorSlice& s : local) {
    const PlannedTensor& t = plan.tensors[plan.by_name.at(s.name)];
    const auto pieces = PiecesToWrite(t, rank, s.begin, s.end);
    if (pieces.empty()) continue;
    // Device tensors come through a pinned host buffer (internal/host_staging.h).
    ASSIGN_OR_RETURN(internal::HostBytes src,
                     internal::HostBytes::Of(
                         s.data, s.dtype, absl::StrCat("checkpoint::Save: tensor '", s.name, "'")));
    const int64_t es = core::DTypeSize(s.dtype);
    const char* base = static_cast<const char*>(src.data());
    TensorProto* tp = out.add_tensors();
    tp->set_name(s.name);
    for (const auto& [b, e] : pieces) {
      ChunkProto* c = tp->add_chunks();
      c->set_file(file);
      c->set_begin(b);
      c->set_end(e);
      c->set_byte_offset(writer.size());
      c->set_byte_length((e - b) * es);
      const char* p = base + (b - s.begin) * es;
      for (int64_t off = 0; off < c->byte_length(); off += block_bytes) {
        const size_t n = static_cast<size_t>(std::min(block_bytes, c->byte_length() - off));
        c->add_block_crc32c(Crc32c(p + off, n));
        absl::Status w = writer.Append(p + off, n);
        if (!w.ok()) {
          return absl::Status(w.code(), absl::StrCat(w.message(), " (tensor '", s.name, "')"));
        }
      }
    }
  }
  out.mutable_file()->set_name(file);
  out.mutable_file()->set_rank(rank);
  out.mutable_file()->set_size_bytes(writer.size());
  RETURN_IF_ERROR(writer.SyncAndClose());
  return out;
}

absl::Status Crash(SimulatedCrash point, const std::string& dir, const std::string& temp_dir) {
  const char* name = point == SimulatedCrash::kBeforeMetadata ? "before writing metadata"
                     : point == SimulatedCrash::kBeforeRename ? "before renaming into place"
                                                              : "after renaming into place";
  return absl::AbortedError(absl::StrCat("checkpoint::Save to '", dir, "': simulated crash ", name,
                                         " (SaveOptions.simulate_crash); temporary '", temp_dir,
                                         "' left behind"));
}

// Rank 0's part after every data file is written: metadata.pb, then the commit.
absl::Status Commit(const std::string& dir, const std::string& temp_dir, const Plan& plan,
                    const std::vector<WrittenMessage>& written, const SaveOptions& options,
                    int world) {
  if (options.simulate_crash == SimulatedCrash::kBeforeMetadata) {
    return Crash(options.simulate_crash, dir, temp_dir);
  }
  CheckpointMetadata meta;
  meta.set_format_version(kFormatVersion);
  meta.set_world_size(world);
  meta.set_step(options.step);
  for (const auto& [k, v] : options.user_metadata) (*meta.mutable_user_metadata())[k] = v;
  for (const auto& [k, v] : options.records) (*meta.mutable_records())[k] = v;
  meta.set_block_bytes(options.block_bytes);
  std::vector<std::vector<ChunkProto>> chunks(plan.tensors.size());
  for (const WrittenMessage& w : written) {
    *meta.add_files() = w.file();
    for (const TensorProto& t : w.tensors()) {
      auto it = plan.by_name.find(t.name());
      if (it == plan.by_name.end()) {
        return absl::InternalError(absl::StrCat("checkpoint::Save: rank ", w.file().rank(),
                                                " wrote unplanned tensor '", t.name(), "'"));
      }
      for (const ChunkProto& c : t.chunks()) chunks[it->second].push_back(c);
    }
  }
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const PlannedTensor& t = plan.tensors[i];
    TensorProto* tp = meta.add_tensors();
    tp->set_name(t.name);
    for (int64_t d : t.shape) tp->add_shape(d);
    tp->set_dtype(core::DTypeName(t.dtype));
    std::sort(chunks[i].begin(), chunks[i].end(),
              [](const ChunkProto& a, const ChunkProto& b) { return a.begin() < b.begin(); });
    for (ChunkProto& c : chunks[i]) *tp->add_chunks() = std::move(c);
  }
  // The merged metadata must pass the reader's own checks before it is committed.
  const std::string meta_path = internal::JoinPath(temp_dir, kMetadataFileName);
  {
    absl::StatusOr<internal::MetadataIndex> check =
        internal::IndexMetadata(meta, temp_dir, meta_path);
    if (!check.ok()) {
      return absl::InternalError(
          absl::StrCat("checkpoint::Save produced invalid metadata: ", check.status().message()));
    }
  }
  const std::string bytes = internal::EncodeMetadataFile(meta);
  ASSIGN_OR_RETURN(internal::FileWriter writer, internal::FileWriter::Create(meta_path));
  RETURN_IF_ERROR(writer.Append(bytes.data(), bytes.size()));
  RETURN_IF_ERROR(writer.SyncAndClose());
  RETURN_IF_ERROR(internal::SyncDirectory(temp_dir));
  if (options.simulate_crash == SimulatedCrash::kBeforeRename) {
    return Crash(options.simulate_crash, dir, temp_dir);
  }
  std::function<absl::Status()> after_swap;
  if (options.simulate_crash == SimulatedCrash::kAfterRename) {
    after_swap = [&] { return Crash(SimulatedCrash::kAfterRename, dir, temp_dir); };
  }
  return internal::CommitDirectory(temp_dir, dir, internal::CommitMode::kAtomicExchange,
                                   after_swap);
}

std::string LockPath(const std::string& dir) { return absl::StrCat(dir, ".lock"); }

// Deletes the `<dir>.tmp-*` and `<dir>.old-*` siblings of `dir`, first restoring the
// newest complete `.old-*` as `dir` when `dir` is missing; returns how many it deleted.
// The caller holds `<dir>.lock` (NOTE [Save lock]).
absl::StatusOr<int> RemoveInterruptedSaves(const std::string& dir, const char* caller) {
  const std::string parent = internal::ParentDirectory(dir);
  const std::string base = dir.substr(dir.rfind('/') == std::string::npos ? 0 : dir.rfind('/') + 1);
  std::vector<std::string> temps, olds;
  DIR* d = ::opendir(parent.c_str());
  if (d == nullptr) {
    return absl::NotFoundError(
        absl::StrCat(caller, ": cannot open '", parent, "': ", core::ErrnoText(errno)));
  }
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (absl::StartsWith(name, base + ".tmp-")) temps.push_back(internal::JoinPath(parent, name));
    if (absl::StartsWith(name, base + ".old-")) olds.push_back(internal::JoinPath(parent, name));
  }
  ::closedir(d);
  if (!internal::PathExists(dir)) {
    // Restore the newest complete previous checkpoint.
    std::string best;
    int64_t best_time = -1;
    for (const std::string& o : olds) {
      if (!internal::ReadMetadataIndex(o).ok()) continue;
      struct stat st;
      if (::stat(internal::JoinPath(o, kMetadataFileName).c_str(), &st) != 0) continue;
      const int64_t t = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
      if (t > best_time) {
        best_time = t;
        best = o;
      }
    }
    if (!best.empty()) {
      RETURN_IF_ERROR(internal::RenameAndSync(best, dir));
      olds.erase(std::find(olds.begin(), olds.end(), best));
    }
  }
  int removed = 0;
  for (const auto* list : {&temps, &olds}) {
    for (const std::string& p : *list) {
      absl::Status s = internal::RemoveRecursively(p);
      if (!s.ok()) {
        return core::Annotate(
            s, absl::StrCat(caller, ": cannot delete the interrupted save '", p, "'"));
      }
      ++removed;
    }
  }
  return removed;
}

// What rank 0 holds for the duration of a Save.
struct Prepared {
  internal::FileLock lock;
  std::string temp_dir;
};

// Rank 0, before anything is written: the parent exists, NOTE [Save lock] is taken and
// interrupted saves are tidied, `dir` is absent, an empty directory or a checkpoint
// (never someone's other data), and a fresh temporary directory for this save exists.
absl::StatusOr<Prepared> Prepare(const std::string& dir, absl::Duration lock_wait) {
  RETURN_IF_ERROR(internal::MakeDirectories(internal::ParentDirectory(dir)));
  absl::StatusOr<internal::FileLock> lock = internal::FileLock::Acquire(LockPath(dir), lock_wait);
  if (!lock.ok()) {
    return core::Annotate(lock.status(), absl::StrCat("checkpoint::Save to '", dir,
                                                      "': another save to it is running"));
  }
  RETURN_IF_ERROR(RemoveInterruptedSaves(dir, "checkpoint::Save").status());
  struct stat st;
  if (::lstat(dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint::Save: '", dir, "' exists and is not a directory; refusing to replace it"));
    }
    if (!internal::PathExists(internal::JoinPath(dir, kMetadataFileName))) {
      DIR* d = ::opendir(dir.c_str());
      bool empty = true;
      if (d != nullptr) {
        while (dirent* e = ::readdir(d)) {
          if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) empty = false;
        }
        ::closedir(d);
      }
      if (!empty) {
        return absl::FailedPreconditionError(
            absl::StrCat("checkpoint::Save: '", dir, "' exists, is not empty and has no ",
                         kMetadataFileName, ", so it is not a checkpoint; refusing to replace it"));
      }
    }
  }
  ASSIGN_OR_RETURN(std::string temp, internal::MakeUniqueDirectory(absl::StrCat(dir, ".tmp-")));
  return Prepared{*std::move(lock), std::move(temp)};
}

}  // namespace

// NOTE [Asynchronous save]: what a begun Save carries from its first phase to Finish.
struct PendingSave::State {
  std::string dir;
  SaveOptions options;
  comm::ProcessGroup* group = nullptr;
  int rank = 0;
  int world = 1;
  std::optional<Prepared> prepared;  // rank 0's lock and temporary directory
  std::string temp_dir;
  Plan plan;
  // What this rank writes: the caller's slices, or with `background` their snapshot.
  std::vector<TensorSlice> local;
  // This rank's data file, written inline by Finish or on `writer`.
  std::future<absl::StatusOr<WrittenMessage>> write;
  bool finished = false;

  // Rank 0 deletes its temporary directory on every error except a simulated crash.
  void Cleanup() {
    if (prepared.has_value()) internal::RemoveRecursively(prepared->temp_dir).IgnoreError();
  }
};

PendingSave::PendingSave(std::unique_ptr<State> state) : state_(std::move(state)) {}

PendingSave::~PendingSave() {
  if (state_ == nullptr || state_->finished) return;
  if (state_->write.valid()) state_->write.wait();
  state_->Cleanup();
}

const std::string& PendingSave::dir() const { return state_->dir; }

bool PendingSave::WriteDone() const {
  return !state_->write.valid() ||
         state_->write.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

absl::Status PendingSave::Finish() {
  State& st = *state_;
  if (st.finished) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint::PendingSave to '", st.dir, "': Finish called twice"));
  }
  st.finished = true;
  // Phase 2: this rank's data file, written and fsynced (inline, or the background write
  // awaited); exchange the chunk lists.
  absl::StatusOr<WrittenMessage> written =
      st.write.valid() ? st.write.get()
      : !st.options.simulate_write_error.ok()
          ? absl::StatusOr<WrittenMessage>(st.options.simulate_write_error)
          : WriteDataFile(st.temp_dir, st.rank, st.world, st.local, st.plan,
                          st.options.block_bytes);
  st.local.clear();  // the snapshot's memory goes now
  WrittenMessage written_mine;
  if (written.ok()) {
    written_mine = *std::move(written);
  } else {
    SetError(written.status(), &written_mine);
  }
  absl::StatusOr<std::vector<WrittenMessage>> all_written =
      Exchange(st.group, written_mine, st.options.timeout);
  if (!all_written.ok()) {
    st.Cleanup();
    return all_written.status();
  }
  absl::Status status = FirstError(*all_written);
  if (!status.ok()) {
    st.Cleanup();
    return status;
  }

  // Phase 3: rank 0 writes metadata.pb and commits; everyone learns the result (this
  // exchange is also the barrier that keeps ranks from returning early). Once committed,
  // the temporary name is gone (or names the previous checkpoint, already deleted).
  CommitMessage commit;
  if (st.rank == 0) {
    absl::Status s = Commit(st.dir, st.temp_dir, st.plan, *all_written, st.options, st.world);
    if (!s.ok()) {
      if (st.options.simulate_crash == SimulatedCrash::kNone) st.Cleanup();
      SetError(s, &commit);
    }
  }
  absl::StatusOr<std::vector<CommitMessage>> commits =
      Exchange(st.group, commit, st.options.timeout);
  st.prepared.reset();  // rank 0's lock goes with the save
  RETURN_IF_ERROR(commits.status());
  return FirstError(*commits);
}

absl::StatusOr<std::unique_ptr<PendingSave>> BeginSave(const std::string& dir_in,
                                                       const std::vector<TensorSlice>& local,
                                                       const SaveOptions& options,
                                                       comm::ProcessGroup* group, bool background) {
  auto st = std::make_unique<PendingSave::State>();
  st->rank = group == nullptr ? 0 : group->rank();
  st->world = group == nullptr ? 1 : group->size();
  st->group = group;
  st->options = options;
  // Argument errors every rank can see on its own come first (no collective yet is
  // fine: every rank sees the same options and returns the same error).
  ASSIGN_OR_RETURN(st->dir, internal::NormalizeDirectory(dir_in, "checkpoint::Save"));
  const std::string& dir = st->dir;
  if (options.block_bytes <= 0 || options.block_bytes > kMaxBlockBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint::Save to '", dir, "': SaveOptions.block_bytes is ",
                     options.block_bytes, "; it must be in [1, ", kMaxBlockBytes, "]"));
  }

  // Phase 1: validate locally, rank 0 takes the lock, tidies and prepares the temporary
  // directory; exchange. Rank 0 keeps the lock until Finish.
  PlanMessage mine;
  absl::Status local_status = ValidateLocal(dir, local);
  if (local_status.ok() && st->rank == 0) {
    absl::StatusOr<Prepared> p = Prepare(dir, options.timeout / 2);
    if (p.ok()) {
      st->prepared.emplace(*std::move(p));
      mine.set_temp_dir(st->prepared->temp_dir);
    } else {
      local_status = p.status();
    }
  }
  if (local_status.ok()) {
    for (const TensorSlice& s : local) {
      SliceDescription* d = mine.add_slices();
      d->set_name(s.name);
      for (int64_t x : s.shape) d->add_shape(x);
      d->set_dtype(core::DTypeName(s.dtype));
      d->set_begin(s.begin);
      d->set_end(s.end);
    }
  } else {
    SetError(local_status, &mine);
  }
  absl::StatusOr<std::vector<PlanMessage>> plans = Exchange(group, mine, options.timeout);
  if (!plans.ok()) {
    st->Cleanup();
    return plans.status();
  }
  st->temp_dir = (*plans)[0].temp_dir();
  absl::Status status = FirstError(*plans);
  if (status.ok()) {
    absl::StatusOr<Plan> plan = MergePlans(dir, *plans);
    status = plan.status();
    if (plan.ok()) st->plan = *std::move(plan);
  }
  if (!status.ok()) {
    st->Cleanup();
    return status;
  }
  if (!background) {
    st->local = local;
    return std::unique_ptr<PendingSave>(new PendingSave(std::move(st)));
  }
  // The snapshot: every slice copied (converted to its stored dtype) into host memory of its
  // own, so the caller may change its tensors once BeginSave returns. A failure here is this
  // rank's write error, reported by Finish's exchange like any other.
  absl::Status snapshot = absl::OkStatus();
  for (const TensorSlice& s : local) {
    TensorSlice copy = s;
    const int64_t n = s.end - s.begin;
    absl::StatusOr<core::Tensor> staged = internal::PinnedStaging(
        n, s.dtype, absl::StrCat("checkpoint::BeginSave: snapshot of tensor '", s.name, "'"));
    if (staged.ok() && n > 0) {
      absl::StatusOr<core::Tensor> flat = s.data.View(0, {n});
      snapshot = flat.ok() ? staged->CopyFrom(*flat) : flat.status();
    } else {
      snapshot = staged.status();
    }
    if (!snapshot.ok()) break;
    copy.data = *std::move(staged);
    st->local.push_back(std::move(copy));
  }
  PendingSave::State* raw = st.get();
  if (snapshot.ok()) {
    raw->write = std::async(std::launch::async, [raw]() -> absl::StatusOr<WrittenMessage> {
      if (!raw->options.simulate_write_error.ok()) return raw->options.simulate_write_error;
      return WriteDataFile(raw->temp_dir, raw->rank, raw->world, raw->local, raw->plan,
                           raw->options.block_bytes);
    });
  } else {
    std::promise<absl::StatusOr<WrittenMessage>> failed;
    failed.set_value(snapshot);
    raw->write = failed.get_future();
  }
  return std::unique_ptr<PendingSave>(new PendingSave(std::move(st)));
}

absl::Status Save(const std::string& dir, const std::vector<TensorSlice>& local,
                  const SaveOptions& options, comm::ProcessGroup* group) {
  ASSIGN_OR_RETURN(std::unique_ptr<PendingSave> pending,
                   BeginSave(dir, local, options, group, /*background=*/false));
  return pending->Finish();
}

absl::StatusOr<int> CleanUpInterruptedSaves(const std::string& dir_in) {
  constexpr char kCaller[] = "checkpoint::CleanUpInterruptedSaves";
  ASSIGN_OR_RETURN(const std::string dir, internal::NormalizeDirectory(dir_in, kCaller));
  const std::string parent = internal::ParentDirectory(dir);
  if (!internal::PathExists(parent)) {
    return absl::NotFoundError(absl::StrCat(kCaller, ": the parent directory '", parent, "' of '",
                                            dir, "' does not exist"));
  }
  absl::StatusOr<internal::FileLock> lock =
      internal::FileLock::Acquire(LockPath(dir), absl::ZeroDuration());
  if (!lock.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        kCaller, "('", dir,
        "'): a save to it is running, so nothing is deleted: ", lock.status().message()));
  }
  return RemoveInterruptedSaves(dir, kCaller);
}

}  // namespace checkpoint
