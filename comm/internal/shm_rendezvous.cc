#include "comm/internal/shm_rendezvous.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "comm/failure.h"
#include "core/errno_text.h"
#include "core/status_macros.h"
#include "glog/logging.h"

namespace comm {
namespace internal {
namespace {

// The time left before `deadline`, at least 1 ms.
absl::Duration Left(absl::Time deadline) {
  return std::max(absl::Milliseconds(1), deadline - absl::Now());
}

std::string RandomHex() {
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  const uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                     (counter.fetch_add(1) * 0x9e3779b97f4a7c15ull) ^
                     static_cast<uint64_t>(absl::GetCurrentTimeNanos());
  return absl::StrCat(absl::Hex(v, absl::kZeroPad16));
}

// Unlinks a segment name on an error path.
void UnlinkQuietly(const std::string& name) {
  if (!name.empty()) shm_unlink(name.c_str());
}

// Rank 0: creates, sizes, reserves and maps a fresh segment and writes its header.
absl::Status CreateSegment(ShmSegment& seg, const Layout& layout, int size,
                           const ShmOptions& options, const std::string& who) {
  seg.name = absl::StrCat("/", kShmSegmentPrefix, getpid(), "_", RandomHex());
  const int fd = shm_open(seg.name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    const int err = errno;
    return absl::UnavailableError(absl::StrCat(who, ": cannot create shared-memory segment ",
                                               seg.name, ": ", core::ErrnoText(err)));
  }
  const auto fail = [&](absl::StatusCode code, const std::string& what, int err) {
    close(fd);
    UnlinkQuietly(seg.name);
    return absl::Status(code,
                        absl::StrCat(who, ": ", what, " shared-memory segment ", seg.name, " of ",
                                     layout.total_bytes, " bytes: ", core::ErrnoText(err)));
  };
  if (ftruncate(fd, layout.total_bytes) != 0) {
    const int err = errno;
    return fail(err == ENOSPC || err == EFBIG ? absl::StatusCode::kResourceExhausted
                                              : absl::StatusCode::kUnavailable,
                "cannot size", err);
  }
  // Reserve the pages now: a full /dev/shm is an error here, not a SIGBUS on first touch.
  if (const int err = posix_fallocate(fd, 0, layout.total_bytes); err != 0) {
    return fail(err == ENOSPC || err == ENOMEM || err == EFBIG
                    ? absl::StatusCode::kResourceExhausted
                    : absl::StatusCode::kUnavailable,
                "cannot reserve (is /dev/shm full?)", err);
  }
  seg.base = mmap(nullptr, static_cast<size_t>(layout.total_bytes), PROT_READ | PROT_WRITE,
                  MAP_SHARED, fd, 0);
  if (seg.base == MAP_FAILED) {
    const int err = errno;
    return fail(absl::StatusCode::kResourceExhausted, "cannot map", err);
  }
  close(fd);
  seg.bytes = static_cast<size_t>(layout.total_bytes);
  auto* header = static_cast<SegmentHeader*>(seg.base);
  header->version = kShmVersion;
  header->size = size;
  header->slot_bytes = options.slot_bytes;
  header->total_bytes = layout.total_bytes;
  header->data_offset = layout.data_offset;
  header->creator_pid = getpid();
  std::atomic_thread_fence(std::memory_order_release);
  header->magic = kShmMagic;
  return absl::OkStatus();
}

// Ranks > 0: the segment name rank 0 published.
absl::Status ReadSegmentName(Store& store, ShmSegment& seg, const ShmOptions& options,
                             const std::string& who, absl::Time deadline) {
  absl::StatusOr<std::string> name = store.Get("segment", Left(deadline));
  if (!name.ok()) {
    return core::Annotate(
        name.status(),
        absl::StrCat(who, ": rank 0 did not publish the segment name within ",
                     "rendezvous_timeout ", absl::FormatDuration(options.rendezvous_timeout)));
  }
  if (!absl::StartsWith(*name, absl::StrCat("/", kShmSegmentPrefix)) ||
      name->find('/', 1) != std::string::npos || name->size() > 200) {
    return absl::DataLossError(absl::StrCat(who, ": key '", options.name, "/segment' holds \"",
                                            absl::CEscape(*name),
                                            "\", not a segment name rank 0 would write"));
  }
  seg.name = *name;
  return absl::OkStatus();
}

// Ranks > 0: maps the segment rank 0 made and checks its size and header.
absl::Status AttachSegment(ShmSegment& seg, const Layout& layout, int size,
                           const ShmOptions& options, const std::string& who) {
  const int fd = shm_open(seg.name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    const int err = errno;
    return absl::UnavailableError(absl::StrCat(who, ": cannot open shared-memory segment ",
                                               seg.name, " made by rank 0: ", core::ErrnoText(err),
                                               " (the shm backend needs all ranks on one host)"));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size != layout.total_bytes) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        who, ": segment ", seg.name, " made by rank 0 has ", st.st_size, " bytes, but ",
        layout.total_bytes, " are expected for ", size, " ranks of slot_bytes ", options.slot_bytes,
        "; do all ranks pass the same size and ShmOptions.slot_bytes?"));
  }
  seg.base = mmap(nullptr, static_cast<size_t>(layout.total_bytes), PROT_READ | PROT_WRITE,
                  MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (seg.base == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat(who, ": cannot map segment ", seg.name, " of ",
                                                     layout.total_bytes,
                                                     " bytes: ", core::ErrnoText(err)));
  }
  seg.bytes = static_cast<size_t>(layout.total_bytes);
  const auto* header = static_cast<const SegmentHeader*>(seg.base);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (header->magic != kShmMagic || header->version != kShmVersion || header->size != size ||
      header->slot_bytes != options.slot_bytes || header->total_bytes != layout.total_bytes ||
      header->data_offset != layout.data_offset) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, ": segment ", seg.name, " has header version ", header->version,
                     ", size ", header->size, ", slot_bytes ", header->slot_bytes, " (magic ",
                     header->magic == kShmMagic ? "ok" : "wrong", "); this rank expects version ",
                     kShmVersion, ", size ", size, ", slot_bytes ", options.slot_bytes));
  }
  return absl::OkStatus();
}

// Points `seg` into its mapping and initialises this rank's control block.
void InitControl(ShmSegment& seg, const Layout& layout, int rank) {
  seg.header = static_cast<SegmentHeader*>(seg.base);
  seg.ctl = reinterpret_cast<RankControl*>(static_cast<uint8_t*>(seg.base) + kShmHeaderBytes);
  seg.data = static_cast<uint8_t*>(seg.base) + layout.data_offset;
  seg.ctl[rank].buffer.store(reinterpret_cast<uintptr_t>(&kProbeWord), std::memory_order_seq_cst);
  seg.ctl[rank].buffer_bytes.store(sizeof(kProbeWord), std::memory_order_seq_cst);
  seg.ctl[rank].pid.store(getpid(), std::memory_order_seq_cst);
}

// Rank 0: publishes the name, waits for every rank to attach, unlinks the name and
// says "ready" (or why not) to the others.
absl::Status AwaitAttached(Store& store, const ShmSegment& seg, int size, const ShmOptions& options,
                           const std::string& who, absl::Time deadline) {
  if (absl::Status s = store.Set("segment", seg.name); !s.ok()) {
    UnlinkQuietly(seg.name);
    return core::Annotate(s, absl::StrCat(who, ": publishing the segment name"));
  }
  std::vector<std::string> keys;
  for (int r = 1; r < size; ++r) keys.push_back(absl::StrCat("attached/", r));
  absl::Status attached = keys.empty() ? absl::OkStatus() : store.Wait(keys, Left(deadline));
  // Everyone has mapped it (or will not): the name is no longer needed.
  UnlinkQuietly(seg.name);
  // NOTE [Attach errors]: a rank that found the segment but could not map it (another
  // host, another size or slot_bytes) says why under its "attached/<rank>" key; rank 0
  // fails at once, naming it, and tells the other ranks through "ready".
  std::vector<int> failed;
  std::vector<std::string> reasons;
  for (int r = 1; attached.ok() && r < size; ++r) {
    absl::StatusOr<std::string> v = store.Get(absl::StrCat("attached/", r), Left(deadline));
    if (v.ok() && absl::StartsWith(*v, "error: ")) {
      failed.push_back(r);
      reasons.push_back(absl::StrCat("rank ", r, ": ", v->substr(7)));
    }
  }
  if (!failed.empty()) {
    const std::string why =
        absl::StrCat("ranks ", absl::StrJoin(failed, ", "), " could not attach to segment ",
                     seg.name, ": ", absl::StrJoin(reasons, "; "));
    (void)store.Set("ready", absl::StrCat("error: ", why));
    return MarkSecondary(absl::FailedPreconditionError(absl::StrCat(who, ": ", why)), failed);
  }
  if (!attached.ok()) {
    std::vector<int> missing;
    for (int r = 1; r < size; ++r) {
      absl::StatusOr<bool> there = store.Check({absl::StrCat("attached/", r)});
      if (there.ok() && !*there) missing.push_back(r);
    }
    return core::Annotate(attached, absl::StrCat(who, ": ranks ", absl::StrJoin(missing, ", "),
                                                 " did not attach to segment ", seg.name,
                                                 " within rendezvous_timeout ",
                                                 absl::FormatDuration(options.rendezvous_timeout)));
  }
  if (absl::Status s = store.Set("ready", "1"); !s.ok()) {
    return core::Annotate(s, absl::StrCat(who, ": rendezvous"));
  }
  return absl::OkStatus();
}

// Ranks > 0: says this rank attached, then waits for rank 0's "ready".
absl::Status AwaitReady(Store& store, const ShmSegment& seg, int rank, const ShmOptions& options,
                        const std::string& who, absl::Time deadline) {
  if (absl::Status s = store.Set(absl::StrCat("attached/", rank), absl::StrCat("ok ", getpid()));
      !s.ok()) {
    return core::Annotate(s, absl::StrCat(who, ": rendezvous"));
  }
  absl::StatusOr<std::string> ready = store.Get("ready", Left(deadline));
  if (!ready.ok()) {
    // Rank 0 unlinks the name once every rank attached or failed; if it is gone, this
    // rank does, so nothing stays in /dev/shm. (Ranks never unlink on their other
    // errors: a peer may still have to open it.)
    UnlinkQuietly(seg.name);
    return core::Annotate(
        ready.status(),
        absl::StrCat(who, ": rank 0 did not see every rank attach within ", "rendezvous_timeout ",
                     absl::FormatDuration(options.rendezvous_timeout)));
  }
  if (absl::StartsWith(*ready, "error: ")) {
    return MarkSecondary(absl::FailedPreconditionError(absl::StrCat(
                             who, ": rank 0 gave up the rendezvous: ", ready->substr(7))),
                         {});
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShmSegment>> JoinShmSegment(Store& store, int rank, int size,
                                                           const ShmOptions& options,
                                                           const std::string& who,
                                                           absl::Time deadline) {
  const Layout layout = LayoutFor(size, options.slot_bytes);
  auto seg = std::make_unique<ShmSegment>();
  seg->size = size;
  seg->slot_bytes = options.slot_bytes;
  if (rank == 0) {
    RETURN_IF_ERROR(CreateSegment(*seg, layout, size, options, who));
  } else {
    RETURN_IF_ERROR(ReadSegmentName(store, *seg, options, who, deadline));
    // An error is also recorded for rank 0 (NOTE [Attach errors]).
    if (absl::Status s = AttachSegment(*seg, layout, size, options, who); !s.ok()) {
      (void)store.Set(absl::StrCat("attached/", rank), absl::StrCat("error: ", s.ToString()));
      return s;
    }
  }
  InitControl(*seg, layout, rank);
  RETURN_IF_ERROR(rank == 0 ? AwaitAttached(store, *seg, size, options, who, deadline)
                            : AwaitReady(store, *seg, rank, options, who, deadline));
  return seg;
}

namespace {

// This rank's probe: every peer's word (its own in a group of one; thread ranks share
// a pid, and reading one's own process works too). 0 or the errno; `bad_peer` is the
// peer that could not be read (-1 if none or unknown).
int ProbePeers(const ShmSegment& segment, int rank, int n, const ShmOptions& options,
               int* bad_peer) {
  int err = 0;
  *bad_peer = -1;
  if (options.transport == ShmTransport::kSlots) return 0;
  if (options.probe_override) return options.probe_override();
  for (int p = 0; p < n && err == 0; ++p) {
    if (p == rank && n > 1) continue;
    const RankControl& c = segment.ctl[p];
    err =
        ProbeRead(c.pid.load(std::memory_order_seq_cst), c.buffer.load(std::memory_order_seq_cst));
    if (err != 0) *bad_peer = p;
  }
  return err;
}

// Publishes this rank's probe and waits until every rank has published its own.
absl::Status ExchangeProbes(Store& store, const std::vector<std::string>& keys, int rank,
                            const ShmOptions& options, int err, int bad_peer,
                            const std::string& who, absl::Time deadline) {
  const int n = static_cast<int>(keys.size());
  if (absl::Status s = store.Set(
          keys[rank], absl::StrCat(ShmTransportName(options.transport), " ", err, " ", bad_peer));
      !s.ok()) {
    return core::Annotate(s, absl::StrCat(who, ": publishing the transport probe"));
  }
  if (absl::Status s = store.Wait(keys, Left(deadline)); !s.ok()) {
    std::vector<int> missing;
    for (int r = 0; r < n; ++r) {
      absl::StatusOr<bool> there = store.Check({keys[r]});
      if (there.ok() && !*there) missing.push_back(r);
    }
    return core::Annotate(
        s, absl::StrCat(who, ": ranks ", absl::StrJoin(missing, ", "),
                        " did not publish their transport probe within ", "rendezvous_timeout ",
                        absl::FormatDuration(options.rendezvous_timeout)));
  }
  return absl::OkStatus();
}

// Reads every rank's probe; `failure` says the first rank that cannot read a peer
// (empty if none). FailedPrecondition when the ranks pass different transports.
absl::Status ReadProbes(Store& store, const std::vector<std::string>& keys,
                        const ShmSegment& segment, const ShmOptions& options,
                        const std::string& who, absl::Time deadline, std::string* failure) {
  // Every rank reads the same n values, so every rank decides the same.
  std::vector<std::string> mismatch;
  for (size_t r = 0; r < keys.size(); ++r) {
    absl::StatusOr<std::string> v = store.Get(keys[r], Left(deadline));
    if (!v.ok()) {
      return core::Annotate(v.status(),
                            absl::StrCat(who, ": reading rank ", r, "'s transport probe"));
    }
    std::vector<std::string> parts = absl::StrSplit(*v, ' ');
    int r_err = 0;
    int r_peer = -1;
    if (parts.size() != 3 || !absl::SimpleAtoi(parts[1], &r_err) ||
        !absl::SimpleAtoi(parts[2], &r_peer)) {
      return absl::DataLossError(absl::StrCat(who, ": key '", options.name, "/", keys[r],
                                              "' holds \"", absl::CEscape(*v),
                                              "\", not a transport probe"));
    }
    if (parts[0] != ShmTransportName(options.transport)) {
      mismatch.push_back(absl::StrCat("rank ", r, " passes ", parts[0]));
    }
    if (r_err != 0 && failure->empty()) {
      *failure = absl::StrCat(
          "rank ", r, " cannot process_vm_readv ",
          r_peer >= 0 ? absl::StrCat("rank ", r_peer, " (pid ",
                                     segment.ctl[r_peer].pid.load(std::memory_order_relaxed), ")")
                      : std::string("its peers"),
          ": ", core::ErrnoText(r_err), " (errno ", r_err, ")");
    }
  }
  if (!mismatch.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, ": ShmOptions.transport must be the same on every rank; this rank passes ",
        ShmTransportName(options.transport), ", ", absl::StrJoin(mismatch, ", ")));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<bool> ChooseShmTransport(Store& store, const ShmSegment& segment, int rank, int size,
                                        const ShmOptions& options, const std::string& who,
                                        absl::Time deadline) {
  int bad_peer = -1;
  const int err = ProbePeers(segment, rank, size, options, &bad_peer);
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(absl::StrCat("transport/", r));
  RETURN_IF_ERROR(ExchangeProbes(store, keys, rank, options, err, bad_peer, who, deadline));
  std::string failure;
  RETURN_IF_ERROR(ReadProbes(store, keys, segment, options, who, deadline, &failure));
  switch (options.transport) {
    case ShmTransport::kSlots:
      return false;
    case ShmTransport::kCrossMemoryAttach:
      if (!failure.empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            who, ": ShmOptions.transport is cma (cross-memory attach), but ", failure,
            "; use kAuto or kSlots, or allow ptrace access (Yama ptrace_scope, seccomp)"));
      }
      return true;
    case ShmTransport::kAuto:
      if (!failure.empty() && rank == 0) {
        LOG(INFO) << who << ": cross-memory attach unavailable (" << failure
                  << "); using the shared-memory slots";
      }
      return failure.empty();
  }
  return false;
}

}  // namespace internal
}  // namespace comm
