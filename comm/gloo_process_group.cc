#include "comm/gloo_process_group.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "comm/failure.h"
#include "comm/internal/gloo_diagnosis.h"
#include "comm/internal/gloo_store_adapter.h"
#include "comm/internal/reduce.h"
#include "comm/internal/sigpipe.h"
#include "comm/internal/socket.h"
#include "comm/prefix_store.h"
#include "comm/tcp_store.h"
#include "glog/logging.h"

// NOTE [Who is to blame]: gloo's errors name addresses, not ranks, and a timeout names
// nobody. So that a failing collective can say which rank caused it:
// - Progress. Before it runs collective #n, each rank's worker posts
//   Set("progress/<rank>", n) to the group's StoreAgent, a background thread (one
//   small store op per collective, coalesced when the store lags, never waited for).
//   At a timeout the worker reads every rank's progress back (bounded by
//   store_probe_timeout): ranks below n had not arrived.
// - Broken records. A rank whose group fails writes Set("broken/<rank>", why) before it
//   closes its connections (bounded too); a group destroyed while healthy writes
//   "destroyed". A rank that sees a peer close its connection maps the address in
//   gloo's message to the rank (PeerDirectory, filled at rendezvous from gloo's pairs)
//   and reads that rank's record: a peer that timed out waiting for others passes the
//   timeout on (DeadlineExceeded naming the ranks that did not arrive); one that failed
//   because of other ranks passes its culprits on; one that was destroyed, failed on
//   its own or left no record (its process died) is the culprit itself.
// All such errors are MarkSecondary with the culprits found (none when unknown).
//
// NOTE [Connection check]: gloo's TCP pairs have no handshake: a rank connects to
// whatever address the store holds for its peer, so a forged address could connect it
// to another process, and the group would seem to work until the first collective.
// After connectFullMesh every rank publishes the local end of each of its pairs
// ("conn/<rank>") and waits, until the rendezvous deadline, for every peer's record.
// A peer publishes only once all its own pairs connected, which a peer whose partner
// went elsewhere never does, so a misdirected connection fails the rendezvous at the
// deadline naming that peer. The records also give each rank the address its peers'
// ends have, which is what gloo names in its errors (PeerDirectory).

namespace comm {
namespace {

std::chrono::milliseconds ToMillis(absl::Duration d) {
  return std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(d)));
}

// Gloo's timeout messages ("Timed out waiting ...", "Read timeout ...", "Connect
// timeout ...", "Application timeout caused pair closure").
bool IsGlooTimeout(absl::string_view what) {
  return absl::StrContains(what, "Timed out") || absl::StrContains(what, "timeout") ||
         absl::StrContains(what, "Timeout");
}

uint8_t* Bytes(const core::Tensor& t) { return static_cast<uint8_t*>(t.raw_data()); }

// What `store` puts before a key, for messages: "world/" for PrefixStore(base, "world").
std::string KeyPrefix(const Store* store) {
  std::string prefix;
  while (const auto* p = dynamic_cast<const PrefixStore*>(store)) {
    prefix = absl::StrCat(p->prefix(), "/", prefix);
    store = p->base().get();
  }
  return prefix;
}

// "the store at 127.0.0.1:29500" for a TcpStore under any PrefixStores, else "the store".
std::string StoreName(const Store* store) {
  while (const auto* p = dynamic_cast<const PrefixStore*>(store)) store = p->base().get();
  if (const auto* tcp = dynamic_cast<const TcpStore*>(store)) {
    return absl::StrCat("the store at ", tcp->host(), ":", tcp->port());
  }
  return "the store";
}

}  // namespace

GlooProcessGroup::GlooProcessGroup(std::shared_ptr<Store> store, int rank, int size,
                                   GlooOptions options)
    : store_(std::move(store)), rank_(rank), size_(size), options_(std::move(options)) {}

absl::StatusOr<std::shared_ptr<GlooProcessGroup>> GlooProcessGroup::Create(
    std::shared_ptr<Store> store, int rank, int size, const GlooOptions& options) {
  if (store == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("GlooProcessGroup::Create('", options.name, "'): store is null"));
  }
  return Join(std::make_shared<PrefixStore>(std::move(store), options.name), rank, size, options);
}

absl::StatusOr<std::shared_ptr<GlooProcessGroup>> GlooProcessGroup::Join(
    std::shared_ptr<Store> store, int rank, int size, const GlooOptions& options) {
  const std::string who =
      absl::StrCat("gloo group '", options.name, "' (rank ", rank, " of ", size, ")");
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": rank must be in [0, size) and size at least 1"));
  }
  if (options.rendezvous_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": GlooOptions.rendezvous_timeout must be positive"));
  }
  if (options.store_probe_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": GlooOptions.store_probe_timeout must be positive"));
  }
  if (options.store_server_rank < -1 || options.store_server_rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": GlooOptions.store_server_rank ",
                                                   options.store_server_rank,
                                                   " is neither -1 nor a rank of the group"));
  }
  // Gloo dereferences a failed getaddrinfo result (a crash, not an error), so resolve
  // and test-bind the address here and hand gloo a dotted quad.
  absl::StatusOr<sockaddr_in> addr = internal::ResolveIPv4(options.hostname, 0);
  if (!addr.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": GlooOptions.hostname: ", addr.status().message()));
  }
  const std::string ip = internal::IPv4ToString(*addr);
  if (absl::StatusOr<internal::Fd> probe = internal::Listen(ip, 0, 1); !probe.ok()) {
    return absl::UnavailableError(absl::StrCat(who, ": GlooOptions.hostname \"", options.hostname,
                                               "\" is not a local address: ",
                                               probe.status().message()));
  }
  // NOTE in comm/internal/sigpipe.h: gloo's threads (the device's event loop, started
  // here, and our worker, started below) inherit a mask with SIGPIPE blocked.
  internal::ScopedBlockSigpipe block_sigpipe;
  std::shared_ptr<GlooProcessGroup> group(new GlooProcessGroup(store, rank, size, options));
  group->allocator_ = core::Allocator::Current(core::Device::Cpu());
  group->store_name_ = StoreName(store.get());
  const std::string key_prefix = KeyPrefix(store.get());
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + options.rendezvous_timeout;
  internal::GlooStoreAdapter adapter(store, rank, size, deadline, key_prefix);
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = ip;
    group->device_ = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    // A pair waits up to 5 times the context timeout for its peer to connect; keep
    // that within rendezvous_timeout (collectives pass their own timeouts).
    context->setTimeout(ToMillis(options.rendezvous_timeout / 5));
    context->connectFullMesh(adapter, group->device_);
    group->context_ = std::move(context);
  } catch (const internal::StoreError& e) {
    if (e.status().code() != absl::StatusCode::kDeadlineExceeded) {
      return absl::Status(e.status().code(),
                          absl::StrCat(who, ": rendezvous: ", e.status().message()));
    }
    return absl::Status(e.status().code(),
                        absl::StrCat(who, ": rendezvous failed after ",
                                     absl::FormatDuration(absl::Now() - start),
                                     " (rendezvous_timeout ",
                                     absl::FormatDuration(options.rendezvous_timeout),
                                     "); keys named below are the ranks that did not join: ",
                                     e.status().message()));
  } catch (const std::exception& e) {
    std::string address;
    const int peer = adapter.listening().RankIn(e.what(), &address);
    const std::string target =
        peer < 0 ? "the peers"
                 : absl::StrCat("rank ", peer, " at ", address, " (the address in key '",
                                key_prefix, peer, "')");
    return absl::Status(
        IsGlooTimeout(e.what()) ? absl::StatusCode::kDeadlineExceeded
                                : absl::StatusCode::kUnavailable,
        absl::StrCat(who, ": connecting to ", target, " from ", options.hostname,
                     " failed (rendezvous_timeout ",
                     absl::FormatDuration(options.rendezvous_timeout), "): ", e.what()));
  } catch (...) {
    return absl::InternalError(
        absl::StrCat(who, ": rendezvous: gloo threw something that is not an exception"));
  }
  group->peers_ = adapter.listening();
  if (size > 1) {
    if (absl::Status s = group->CheckConnections(deadline, key_prefix); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(who, ": rendezvous: ", s.message()));
    }
    group->agent_ = std::make_unique<internal::StoreAgent>(store, who);
  }
  group->worker_ = std::thread([g = group.get()] { g->WorkerLoop(); });
  VLOG(1) << group->Describe() << ": connected on " << options.hostname;
  return group;
}

absl::Status GlooProcessGroup::CheckConnections(absl::Time deadline,
                                                const std::string& key_prefix) {
  std::map<int, internal::PeerAddress> local_ends;
  try {
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) local_ends[r] = internal::LocalEnd(context_->getPair(r).get());
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("reading gloo's pairs: ", e.what()));
  } catch (...) {
    return absl::InternalError("reading gloo's pairs: gloo threw");
  }
  if (absl::Status s =
          store_->Set(internal::ConnKey(rank_), internal::EncodeConnections(local_ends));
      !s.ok()) {
    return s;
  }
  // Peers publish right after their own connectFullMesh; allow a little past the
  // deadline if ours took all of it.
  const absl::Duration wait =
      std::max(deadline - absl::Now(), options_.rendezvous_timeout / 10);
  std::vector<std::string> keys;
  for (const auto& [r, unused] : local_ends) keys.push_back(internal::ConnKey(r));
  if (absl::Status s = store_->Wait(keys, wait); !s.ok()) {
    std::vector<int> missing;
    std::vector<std::string> their_keys;
    for (const auto& [r, unused] : local_ends) {
      absl::StatusOr<bool> present = store_->Check({internal::ConnKey(r)});
      if (present.ok() && !*present) {
        missing.push_back(r);
        their_keys.push_back(absl::StrCat("'", key_prefix, r, "'"));
      }
    }
    if (missing.empty()) return s;
    const bool one = missing.size() == 1;
    return absl::DeadlineExceededError(absl::StrCat(
        internal::RanksPhrase(missing), " did not confirm ",
        one ? "its connections" : "their connections", " by the rendezvous deadline (",
        "rendezvous_timeout ", absl::FormatDuration(options_.rendezvous_timeout), "): ",
        one ? "it" : "they", " failed to connect, or the address key", one ? " " : "s ",
        absl::StrJoin(their_keys, ", "), " did not come from ", one ? "it" : "them",
        " (forged), so a connection went elsewhere"));
  }
  for (const auto& [r, unused] : local_ends) {
    absl::StatusOr<std::string> published = store_->Get(internal::ConnKey(r), wait);
    if (!published.ok()) return published.status();
    absl::StatusOr<internal::PeerAddress> theirs =
        internal::FindConnection(*published, r, rank_);
    if (!theirs.ok()) {
      return absl::DataLossError(absl::StrCat("key '", key_prefix, internal::ConnKey(r), "': ",
                                              theirs.status().message()));
    }
    peers_.Add(*theirs, r);
  }
  return absl::OkStatus();
}

GlooProcessGroup::~GlooProcessGroup() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (worker_.joinable()) worker_.join();
  bool broken = false;
  {
    absl::MutexLock lock(&mu_);
    broken = !broken_.ok();
  }
  // Tell the peers why this rank's connections close (NOTE [Who is to blame]).
  if (context_ != nullptr && !broken) RecordBroken(absl::OkStatus());
  context_.reset();
  device_.reset();
  agent_.reset();
}

std::string GlooProcessGroup::DescribeOp(CollectiveKind kind, uint64_t seq) const {
  return absl::StrCat(CollectiveKindName(kind), " #", seq, " on ", Describe());
}

absl::Status GlooProcessGroup::CheckUsable(CollectiveKind kind) const {
  absl::MutexLock lock(&mu_);
  if (!broken_.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(CollectiveKindName(kind), " on ", Describe(),
                     ": the group is broken by an earlier failure: ", broken_.message()));
  }
  return absl::OkStatus();
}

std::shared_ptr<Work> GlooProcessGroup::Enqueue(CollectiveKind kind, absl::Duration timeout,
                                                Traffic traffic, RunFn run) {
  absl::MutexLock lock(&mu_);
  const uint64_t seq = next_seq_++;
  auto work = std::make_shared<CompletionWork>(DescribeOp(kind, seq));
  queue_.push_back(
      Op{kind, work, absl::Now() + timeout, timeout, seq, traffic, std::move(run)});
  return work;
}

void GlooProcessGroup::WorkerLoop() {
  internal::BlockSigpipeForThisThread();
  core::ScopedAllocator scope(allocator_);
  while (true) {
    Op op;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) {
        for (Op& pending : queue_) {
          pending.run = nullptr;  // drop the tensors before waiters wake
          pending.work->Complete(absl::FailedPreconditionError(
              absl::StrCat(pending.work->Describe(), ": the group was destroyed first")));
        }
        queue_.clear();
        return;
      }
      op = std::move(queue_.front());
      queue_.pop_front();
    }
    absl::Status status = CheckUsable(op.kind);
    const bool was_usable = status.ok();
    if (status.ok()) {
      // NOTE [Who is to blame]: this rank has arrived at collective #seq.
      if (agent_ != nullptr) agent_->Post(internal::ProgressKey(rank_), absl::StrCat(op.seq));
      status = RunOp(op);
    }
    if (status.ok()) {
      stats_.Record(op.kind, op.traffic);
    } else if (was_usable) {
      {
        absl::MutexLock lock(&mu_);
        if (broken_.ok()) broken_ = status;
      }
      RecordBroken(status);
      // Peers may be blocked receiving from this rank; closing the connections makes
      // them fail now instead of at their deadlines (gloo signals a closed pair at once).
      try {
        context_->closeConnections();
      } catch (const std::exception& e) {
        LOG(WARNING) << Describe() << ": closing connections after a failure: " << e.what();
      } catch (...) {
        LOG(WARNING) << Describe() << ": closing connections after a failure threw";
      }
    }
    // Drop the closure, and with it the collective's tensor references, before waking
    // the waiters: a caller that frees its buffers after Wait() must see them freed.
    op.run = nullptr;
    op.work->Complete(std::move(status));
  }
}

absl::Status GlooProcessGroup::RunOp(Op& op) {
  const std::string what = op.work->Describe();
  const absl::Duration left = op.deadline - absl::Now();
  if (left <= absl::ZeroDuration()) {
    return absl::DeadlineExceededError(absl::StrCat(
        what, " did not start within its timeout of ", absl::FormatDuration(op.timeout),
        " (earlier collectives of the group took the time)"));
  }
  try {
    absl::Status s = op.run(static_cast<uint32_t>(op.seq), ToMillis(left));
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
    return absl::OkStatus();
  } catch (const gloo::IoException& e) {
    return Diagnose(op, IsGlooTimeout(e.what()), e.what());
  } catch (const gloo::EnforceNotMet& e) {
    return absl::InternalError(absl::StrCat(what, ": gloo check failed: ", e.what()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what()));
  } catch (...) {
    return absl::InternalError(
        absl::StrCat(what, ": gloo threw something that is not an exception"));
  }
}

std::string GlooProcessGroup::StoreSilent(const absl::Status& error) const {
  const int server = options_.store_server_rank;
  std::string out = store_name_;
  if (server >= 0) absl::StrAppend(&out, " (served by rank ", server, ")");
  absl::StrAppend(&out, " does not answer (", error.message(), "): ");
  if (server >= 0 && server != rank_) {
    absl::StrAppend(&out, "rank ", server, " is gone or stopped");
  } else {
    absl::StrAppend(&out, "the process serving it is gone or stopped");
  }
  return out;
}

void GlooProcessGroup::RecordBroken(const absl::Status& status) {
  if (agent_ == nullptr) return;
  std::string key = internal::BrokenKey(rank_);
  std::string value =
      status.ok() ? internal::EncodeDestroyedRecord() : internal::EncodeBrokenRecord(status);
  const absl::Duration wait = status.ok()
                                  ? std::min(options_.store_probe_timeout, kDestroyRecordWait)
                                  : options_.store_probe_timeout;
  absl::Status s = agent_->Call(
      [key = std::move(key), value = std::move(value)](Store& store) {
        return store.Set(key, value);
      },
      wait);
  if (s.ok()) return;
  if (status.ok()) {
    // Usual at the end of a job whose store server (rank 0) has already exited.
    VLOG(1) << Describe() << ": could not record in " << store_name_
            << " that the group closes: " << s;
  } else {
    LOG(WARNING) << Describe() << ": could not record in " << store_name_
                 << " why the group failed: " << s;
  }
}

absl::Status GlooProcessGroup::Diagnose(const Op& op, bool timeout,
                                        const std::string& gloo_error) {
  const std::string what = op.work->Describe();
  const std::string gloo_note = absl::StrCat(" [gloo: ", gloo_error, "]");
  std::string peer_address;
  const int peer = timeout ? -1 : peers_.RankIn(gloo_error, &peer_address);

  // Read every rank's progress and, after a closed connection, the peer's record;
  // all within store_probe_timeout (the record may come a little after the close).
  struct Probe {
    std::vector<std::optional<int64_t>> progress;
    std::optional<internal::BrokenRecord> record;
  };
  auto probe = std::make_shared<Probe>();
  probe->progress.resize(size_);
  absl::Status store_status = absl::UnavailableError("no store agent");
  if (agent_ != nullptr) {
    const int size = size_;
    const int self = rank_;
    const absl::Duration record_wait = options_.store_probe_timeout / 2;
    store_status = agent_->Call(
        [probe, size, self, peer, record_wait](Store& store) -> absl::Status {
          for (int r = 0; r < size; ++r) {
            if (r == self) continue;
            absl::StatusOr<bool> present = store.Check({internal::ProgressKey(r)});
            if (!present.ok()) return present.status();
            if (!*present) continue;
            absl::StatusOr<std::string> v =
                store.Get(internal::ProgressKey(r), absl::ZeroDuration());
            if (!v.ok()) return v.status();
            probe->progress[r] = internal::ParseProgress(*v);
          }
          if (peer >= 0) {
            absl::StatusOr<std::string> v = store.Get(internal::BrokenKey(peer), record_wait);
            if (v.ok()) {
              absl::StatusOr<internal::BrokenRecord> record = internal::DecodeBrokenRecord(*v);
              if (record.ok()) probe->record = *std::move(record);
            } else if (v.status().code() != absl::StatusCode::kDeadlineExceeded) {
              return v.status();
            }
          }
          return absl::OkStatus();
        },
        options_.store_probe_timeout);
  }
  // Only read `probe` once the call has finished: after a timeout it may still run.
  std::vector<std::optional<int64_t>> progress(size_);
  std::optional<internal::BrokenRecord> record;
  if (store_status.ok()) {
    progress = probe->progress;
    record = probe->record;
  }
  progress[rank_] = static_cast<int64_t>(op.seq);
  std::vector<int> server_culprit;
  if (options_.store_server_rank >= 0 && options_.store_server_rank != rank_) {
    server_culprit.push_back(options_.store_server_rank);
  }

  if (timeout) {
    const std::string head =
        absl::StrCat(what, " timed out after ", absl::FormatDuration(op.timeout), ": ");
    if (!store_status.ok()) {
      return MarkSecondary(
          absl::DeadlineExceededError(absl::StrCat(head, "cannot tell which ranks did not arrive: ",
                                                   StoreSilent(store_status), gloo_note)),
          server_culprit);
    }
    internal::ArrivalReport arrival = internal::DescribeArrival(op.seq, progress);
    return MarkSecondary(absl::DeadlineExceededError(absl::StrCat(head, arrival.text, gloo_note)),
                         arrival.missing);
  }

  const std::string head = absl::StrCat(what, " failed: ");
  if (peer < 0) {
    return MarkSecondary(
        absl::UnavailableError(absl::StrCat(
            head, "a peer closed its connection or failed, and its address is not one of the "
                  "group's ranks",
            gloo_note)),
        {});
  }
  const std::string who = absl::StrCat("rank ", peer, " (", peer_address, ")");
  if (!store_status.ok()) {
    return MarkSecondary(absl::UnavailableError(absl::StrCat(
                             head, who, " closed its connection; why is unknown, as ",
                             StoreSilent(store_status), gloo_note)),
                         {peer});
  }
  const std::string peer_last =
      progress[peer].has_value() ? absl::StrCat("last at collective #", *progress[peer])
                                 : "no collective yet";
  if (!record.has_value()) {
    return MarkSecondary(
        absl::UnavailableError(absl::StrCat(
            head, who, " closed its connection without recording why within ",
            absl::FormatDuration(options_.store_probe_timeout / 2),
            ": its process exited or was killed (", peer_last, ")", gloo_note)),
        {peer});
  }
  if (record->destroyed) {
    return MarkSecondary(absl::UnavailableError(absl::StrCat(
                             head, who, " closed its connection: its group was destroyed (",
                             peer_last, ")", gloo_note)),
                         {peer});
  }
  if (record->code == absl::StatusCode::kDeadlineExceeded) {
    // The peer gave up waiting; whoever it waited for has not arrived here either.
    internal::ArrivalReport arrival = internal::DescribeArrival(op.seq, progress);
    std::vector<int> culprits = arrival.missing;
    if (culprits.empty()) culprits = record->secondary ? record->culprits : std::vector<int>{peer};
    return MarkSecondary(
        absl::DeadlineExceededError(absl::StrCat(
            head, who, " timed out and closed its connection: ", arrival.text,
            " (rank ", peer, ": ", record->message, ")", gloo_note)),
        culprits);
  }
  if (record->secondary) {
    return MarkSecondary(absl::UnavailableError(absl::StrCat(
                             head, who, " closed its connection after a failure caused by ",
                             record->culprits.empty() ? "another rank"
                                                      : internal::RanksPhrase(record->culprits),
                             ": ", record->message, gloo_note)),
                         record->culprits);
  }
  return MarkSecondary(absl::UnavailableError(absl::StrCat(
                           head, who, " closed its connection after failing: ", record->message,
                           gloo_note)),
                       {peer});
}

absl::StatusOr<std::shared_ptr<Work>> GlooProcessGroup::AllGather(
    const core::Tensor& input, const core::Tensor& output, const AllGatherOptions& options) {
  constexpr CollectiveKind kind = CollectiveKind::kAllGather;
  if (auto s = ValidateAllGather(*this, input, output, options); !s.ok()) return s;
  if (auto s = ValidateDevice(*this, kind, {&input, &output}, core::Device::Cpu()); !s.ok()) {
    return s;
  }
  if (auto s = CheckUsable(kind); !s.ok()) return s;
  const bool in_place = input.SharesStorage(output) && input.numel() > 0 &&
                        input.offset() == output.offset() + rank_ * input.numel();
  const int n = size_;
  const int rank = rank_;
  auto context = context_;
  return Enqueue(kind, options.timeout, ExpectedTraffic(kind, output.nbytes(), n, rank_),
                 [=](uint32_t tag, std::chrono::milliseconds left) -> absl::Status {
                   if (input.numel() == 0) return absl::OkStatus();
                   if (n == 1 || in_place) {
                     if (!in_place) std::memcpy(Bytes(output), Bytes(input), input.nbytes());
                     if (n == 1) return absl::OkStatus();
                   }
                   gloo::AllgatherOptions o(context);
                   if (!in_place) o.setInput<uint8_t>(Bytes(input), input.nbytes());
                   o.setOutput<uint8_t>(Bytes(output), output.nbytes());
                   o.setTag(tag);
                   o.setTimeout(left);
                   gloo::allgather(o);
                   (void)rank;
                   return absl::OkStatus();
                 });
}

absl::StatusOr<std::shared_ptr<Work>> GlooProcessGroup::ReduceScatter(
    const core::Tensor& input, const core::Tensor& output, const ReduceScatterOptions& options) {
  constexpr CollectiveKind kind = CollectiveKind::kReduceScatter;
  if (auto s = ValidateReduceScatter(*this, input, output, options); !s.ok()) return s;
  if (auto s = ValidateDevice(*this, kind, {&input, &output}, core::Device::Cpu()); !s.ok()) {
    return s;
  }
  if (auto s = CheckUsable(kind); !s.ok()) return s;
  const int n = size_;
  const int rank = rank_;
  const ReduceOp op = options.reduce_op;
  auto context = context_;
  // Each rank sends chunk j of its input to rank j (an all-to-all, S(n-1)/n bytes each
  // way), then reduces the n chunks it received in rank order, in fp32 for bf16.
  return Enqueue(kind, options.timeout, ExpectedTraffic(kind, input.nbytes(), n, rank_),
                 [=](uint32_t tag, std::chrono::milliseconds left) -> absl::Status {
                   const int64_t k = output.numel();
                   if (k == 0) return absl::OkStatus();
                   if (n == 1) {
                     if (!output.SharesStorage(input) || output.offset() != input.offset()) {
                       std::memcpy(Bytes(output), Bytes(input), input.nbytes());
                     }
                     return absl::OkStatus();
                   }
                   absl::StatusOr<core::Tensor> received =
                       core::Tensor::Allocate({n * k}, input.dtype(), core::MemoryTag::kComm);
                   if (!received.ok()) return received.status();
                   gloo::AlltoallOptions o(context);
                   o.setInput<uint8_t>(Bytes(input), input.nbytes());
                   o.setOutput<uint8_t>(Bytes(*received), received->nbytes());
                   o.setTag(tag);
                   o.setTimeout(left);
                   gloo::alltoall(o);
                   internal::ReduceChunks(input.dtype(), op, received->raw_data(), n, k,
                                          output.raw_data());
                   (void)rank;
                   return absl::OkStatus();
                 });
}

absl::StatusOr<std::shared_ptr<Work>> GlooProcessGroup::AllReduce(
    const core::Tensor& tensor, const AllReduceOptions& options) {
  constexpr CollectiveKind kind = CollectiveKind::kAllReduce;
  if (auto s = ValidateAllReduce(*this, tensor, options); !s.ok()) return s;
  if (auto s = ValidateDevice(*this, kind, {&tensor}, core::Device::Cpu()); !s.ok()) return s;
  if (auto s = CheckUsable(kind); !s.ok()) return s;
  const int n = size_;
  const ReduceOp op = options.reduce_op;
  auto context = context_;
  return Enqueue(
      kind, options.timeout, ExpectedTraffic(kind, tensor.nbytes(), n, rank_),
      [=](uint32_t tag, std::chrono::milliseconds left) -> absl::Status {
        if (tensor.numel() == 0 || n == 1) return absl::OkStatus();
        // bf16 is reduced in an fp32 copy and rounded back once.
        core::Tensor buf = tensor;
        if (tensor.dtype() == core::DType::kBFloat16) {
          absl::StatusOr<core::Tensor> wide =
              tensor.ToDType(core::DType::kFloat32, core::MemoryTag::kComm);
          if (!wide.ok()) return wide.status();
          buf = *std::move(wide);
        }
        const core::DType dtype = buf.dtype();
        const ReduceOp pair_op = op == ReduceOp::kMax ? ReduceOp::kMax : ReduceOp::kSum;
        gloo::AllreduceOptions o(context);
        if (dtype == core::DType::kInt32) {
          o.setOutput<int32_t>(buf.data<int32_t>(), buf.numel());
        } else {
          o.setOutput<float>(buf.data<float>(), buf.numel());
        }
        o.setReduceFunction([dtype, pair_op](void* c, const void* a, const void* b, size_t count) {
          internal::ReducePair(dtype, pair_op, c, a, b, count);
        });
        o.setTag(tag);
        o.setTimeout(left);
        gloo::allreduce(o);
        if (op == ReduceOp::kAverage) internal::DivideInPlace(buf.data<float>(), buf.numel(), n);
        if (!buf.SharesStorage(tensor)) return tensor.CopyFrom(buf);
        return absl::OkStatus();
      });
}

absl::StatusOr<std::shared_ptr<Work>> GlooProcessGroup::Broadcast(
    const core::Tensor& tensor, const BroadcastOptions& options) {
  constexpr CollectiveKind kind = CollectiveKind::kBroadcast;
  if (auto s = ValidateBroadcast(*this, tensor, options); !s.ok()) return s;
  if (auto s = ValidateDevice(*this, kind, {&tensor}, core::Device::Cpu()); !s.ok()) return s;
  if (auto s = CheckUsable(kind); !s.ok()) return s;
  const int n = size_;
  const int root = options.root;
  auto context = context_;
  return Enqueue(kind, options.timeout,
                 ExpectedTraffic(kind, tensor.nbytes(), n, rank_, options.root),
                 [=](uint32_t tag, std::chrono::milliseconds left) -> absl::Status {
                   if (tensor.numel() == 0 || n == 1) return absl::OkStatus();
                   gloo::BroadcastOptions o(context);
                   o.setOutput<uint8_t>(Bytes(tensor), tensor.nbytes());
                   o.setRoot(root);
                   o.setTag(tag);
                   o.setTimeout(left);
                   gloo::broadcast(o);
                   return absl::OkStatus();
                 });
}

absl::StatusOr<std::shared_ptr<Work>> GlooProcessGroup::Barrier(const BarrierOptions& options) {
  constexpr CollectiveKind kind = CollectiveKind::kBarrier;
  if (auto s = ValidateBarrier(*this, options); !s.ok()) return s;
  if (auto s = CheckUsable(kind); !s.ok()) return s;
  const int n = size_;
  auto context = context_;
  return Enqueue(kind, options.timeout, Traffic{},
                 [=](uint32_t tag, std::chrono::milliseconds left) -> absl::Status {
                   if (n == 1) return absl::OkStatus();
                   gloo::BarrierOptions o(context);
                   o.setTag(tag);
                   o.setTimeout(left);
                   gloo::barrier(o);
                   return absl::OkStatus();
                 });
}

absl::StatusOr<std::shared_ptr<ProcessGroup>> GlooProcessGroup::NewSubgroup(
    const std::vector<int>& ranks, const SubgroupOptions& options) {
  int index = 0;
  {
    absl::MutexLock lock(&mu_);
    index = next_subgroup_++;
  }
  absl::StatusOr<SubgroupPlacement> place = PlaceInSubgroup(*this, ranks, index);
  if (!place.ok()) return place.status();
  GlooOptions sub = options_;
  sub.name = options.name.empty() ? absl::StrCat(options_.name, "/", place->key_prefix)
                                  : options.name;
  sub.rendezvous_timeout = options.timeout;
  auto server = std::find(ranks.begin(), ranks.end(), options_.store_server_rank);
  sub.store_server_rank = server == ranks.end() ? -1 : static_cast<int>(server - ranks.begin());
  absl::StatusOr<std::shared_ptr<GlooProcessGroup>> group =
      Join(std::make_shared<PrefixStore>(store_, place->key_prefix), place->rank, place->size, sub);
  if (!group.ok()) return group.status();
  return std::shared_ptr<ProcessGroup>(*std::move(group));
}

}  // namespace comm
