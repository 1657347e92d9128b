#include "comm/internal/gloo_blame.h"

#include <gloo/context.h>

#include <algorithm>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "comm/failure.h"
#include "comm/internal/gloo_diagnosis.h"
#include "glog/logging.h"

namespace comm {
namespace internal {

absl::StatusOr<PeerDirectory> ConfirmConnections(Store& store, gloo::Context& context, int rank,
                                                 int size, absl::Time deadline,
                                                 absl::Duration rendezvous_timeout,
                                                 const std::string& key_prefix,
                                                 PeerDirectory listening) {
  std::map<int, PeerAddress> local_ends;
  try {
    for (int r = 0; r < size; ++r) {
      if (r != rank) local_ends[r] = LocalEnd(context.getPair(r).get());
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("reading gloo's pairs: ", e.what()));
  } catch (...) {
    return absl::InternalError("reading gloo's pairs: gloo threw");
  }
  if (absl::Status s = store.Set(ConnKey(rank), EncodeConnections(local_ends)); !s.ok()) {
    return s;
  }
  // Peers publish right after their own connectFullMesh; allow a little past the
  // deadline if ours took all of it.
  const absl::Duration wait = std::max(deadline - absl::Now(), rendezvous_timeout / 10);
  std::vector<std::string> keys;
  for (const auto& [r, unused] : local_ends) keys.push_back(ConnKey(r));
  if (absl::Status s = store.Wait(keys, wait); !s.ok()) {
    std::vector<int> missing;
    std::vector<std::string> their_keys;
    for (const auto& [r, unused] : local_ends) {
      absl::StatusOr<bool> present = store.Check({ConnKey(r)});
      if (present.ok() && !*present) {
        missing.push_back(r);
        their_keys.push_back(absl::StrCat("'", key_prefix, r, "'"));
      }
    }
    if (missing.empty()) return s;
    const bool one = missing.size() == 1;
    return absl::DeadlineExceededError(absl::StrCat(
        RanksPhrase(missing), " did not confirm ", one ? "its connections" : "their connections",
        " by the rendezvous deadline (", "rendezvous_timeout ",
        absl::FormatDuration(rendezvous_timeout), "): ", one ? "it" : "they",
        " failed to connect, or the address key", one ? " " : "s ", absl::StrJoin(their_keys, ", "),
        " did not come from ", one ? "it" : "them", " (forged), so a connection went elsewhere"));
  }
  for (const auto& [r, unused] : local_ends) {
    absl::StatusOr<std::string> published = store.Get(ConnKey(r), wait);
    if (!published.ok()) return published.status();
    absl::StatusOr<PeerAddress> theirs = FindConnection(*published, r, rank);
    if (!theirs.ok()) {
      return absl::DataLossError(
          absl::StrCat("key '", key_prefix, ConnKey(r), "': ", theirs.status().message()));
    }
    listening.Add(*theirs, r);
  }
  return listening;
}

GlooBlame::GlooBlame(std::shared_ptr<Store> store, BlameOptions options, PeerDirectory peers)
    : options_(std::move(options)),
      peers_(std::move(peers)),
      agent_(std::move(store), options_.group) {}

void GlooBlame::Arrived(uint64_t seq) {
  agent_.Post(ProgressKey(options_.rank), absl::StrCat(seq));
}

std::string GlooBlame::StoreSilent(const absl::Status& error) const {
  const int server = options_.store_server_rank;
  std::string out = options_.store_name;
  if (server >= 0) absl::StrAppend(&out, " (served by rank ", server, ")");
  absl::StrAppend(&out, " does not answer (", error.message(), "): ");
  if (server >= 0 && server != options_.rank) {
    absl::StrAppend(&out, "rank ", server, " is gone or stopped");
  } else {
    absl::StrAppend(&out, "the process serving it is gone or stopped");
  }
  return out;
}

void GlooBlame::RecordFailure(const absl::Status& status) {
  Record(EncodeBrokenRecord(status), options_.probe_timeout, /*failure=*/true);
}

void GlooBlame::RecordDestroyed() {
  Record(EncodeDestroyedRecord(), std::min(options_.probe_timeout, kDestroyRecordWait),
         /*failure=*/false);
}

void GlooBlame::Record(std::string value, absl::Duration wait, bool failure) {
  absl::Status s = agent_.Call([key = BrokenKey(options_.rank), value = std::move(value)](
                                   Store& store) { return store.Set(key, value); },
                               wait);
  if (s.ok()) return;
  if (failure) {
    LOG(WARNING) << options_.group << ": could not record in " << options_.store_name
                 << " why the group failed: " << s;
  } else {
    // Usual at the end of a job whose store server (rank 0) has already exited.
    VLOG(1) << options_.group << ": could not record in " << options_.store_name
            << " that the group closes: " << s;
  }
}

GlooBlame::StoreProbe GlooBlame::ProbeStore(uint64_t seq, int peer) {
  // Read every rank's progress and, after a closed connection, the peer's record;
  // all within the probe timeout (the record may come a little after the close).
  struct Probe {
    std::vector<std::optional<int64_t>> progress;
    std::optional<BrokenRecord> record;
  };
  auto probe = std::make_shared<Probe>();
  probe->progress.resize(options_.size);
  const int size = options_.size;
  const int self = options_.rank;
  const absl::Duration record_wait = options_.probe_timeout / 2;
  StoreProbe out;
  out.status = agent_.Call(
      [probe, size, self, peer, record_wait](Store& store) -> absl::Status {
        for (int r = 0; r < size; ++r) {
          if (r == self) continue;
          absl::StatusOr<bool> present = store.Check({ProgressKey(r)});
          if (!present.ok()) return present.status();
          if (!*present) continue;
          absl::StatusOr<std::string> v = store.Get(ProgressKey(r), absl::ZeroDuration());
          if (!v.ok()) return v.status();
          probe->progress[r] = ParseProgress(*v);
        }
        if (peer >= 0) {
          absl::StatusOr<std::string> v = store.Get(BrokenKey(peer), record_wait);
          if (v.ok()) {
            absl::StatusOr<BrokenRecord> record = DecodeBrokenRecord(*v);
            if (record.ok()) probe->record = *std::move(record);
          } else if (v.status().code() != absl::StatusCode::kDeadlineExceeded) {
            return v.status();
          }
        }
        return absl::OkStatus();
      },
      options_.probe_timeout);
  // Only read `probe` once the call has finished: after a timeout it may still run.
  out.progress.resize(options_.size);
  if (out.status.ok()) {
    out.progress = probe->progress;
    out.record = probe->record;
  }
  out.progress[options_.rank] = static_cast<int64_t>(seq);
  return out;
}

absl::Status GlooBlame::Diagnose(const std::string& what, uint64_t seq, absl::Duration timeout,
                                 bool gloo_timeout, const std::string& gloo_error) {
  const std::string gloo_note = absl::StrCat(" [gloo: ", gloo_error, "]");
  std::string peer_address;
  const int peer = gloo_timeout ? -1 : peers_.RankIn(gloo_error, &peer_address);
  const StoreProbe probe = ProbeStore(seq, peer);
  if (gloo_timeout) {
    const std::string head =
        absl::StrCat(what, " timed out after ", absl::FormatDuration(timeout), ": ");
    if (!probe.status.ok()) {
      std::vector<int> server_culprit;
      if (options_.store_server_rank >= 0 && options_.store_server_rank != options_.rank) {
        server_culprit.push_back(options_.store_server_rank);
      }
      return MarkSecondary(
          absl::DeadlineExceededError(absl::StrCat(head, "cannot tell which ranks did not arrive: ",
                                                   StoreSilent(probe.status), gloo_note)),
          server_culprit);
    }
    ArrivalReport arrival = DescribeArrival(seq, probe.progress);
    return MarkSecondary(absl::DeadlineExceededError(absl::StrCat(head, arrival.text, gloo_note)),
                         arrival.missing);
  }
  const std::string head = absl::StrCat(what, " failed: ");
  if (peer < 0) {
    return MarkSecondary(
        absl::UnavailableError(absl::StrCat(
            head,
            "a peer closed its connection or failed, and its address is not one of the "
            "group's ranks",
            gloo_note)),
        {});
  }
  return ExplainClosed(absl::StrCat(head, "rank ", peer, " (", peer_address, ")"), seq, peer, probe,
                       gloo_note);
}

absl::Status GlooBlame::ExplainClosed(const std::string& head_who, uint64_t seq, int peer,
                                      const StoreProbe& probe, const std::string& gloo_note) {
  if (!probe.status.ok()) {
    return MarkSecondary(
        absl::UnavailableError(absl::StrCat(head_who, " closed its connection; why is unknown, as ",
                                            StoreSilent(probe.status), gloo_note)),
        {peer});
  }
  const std::string peer_last = probe.progress[peer].has_value()
                                    ? absl::StrCat("last at collective #", *probe.progress[peer])
                                    : "no collective yet";
  const std::optional<BrokenRecord>& record = probe.record;
  if (!record.has_value()) {
    return MarkSecondary(absl::UnavailableError(absl::StrCat(
                             head_who, " closed its connection without recording why within ",
                             absl::FormatDuration(options_.probe_timeout / 2),
                             ": its process exited or was killed (", peer_last, ")", gloo_note)),
                         {peer});
  }
  if (record->destroyed) {
    return MarkSecondary(absl::UnavailableError(absl::StrCat(
                             head_who, " closed its connection: its group was destroyed (",
                             peer_last, ")", gloo_note)),
                         {peer});
  }
  if (record->code == absl::StatusCode::kDeadlineExceeded) {
    // The peer gave up waiting; whoever it waited for has not arrived here either.
    ArrivalReport arrival = DescribeArrival(seq, probe.progress);
    std::vector<int> culprits = arrival.missing;
    if (culprits.empty()) culprits = record->secondary ? record->culprits : std::vector<int>{peer};
    return MarkSecondary(absl::DeadlineExceededError(absl::StrCat(
                             head_who, " timed out and closed its connection: ", arrival.text,
                             " (rank ", peer, ": ", record->message, ")", gloo_note)),
                         culprits);
  }
  if (record->secondary) {
    return MarkSecondary(
        absl::UnavailableError(
            absl::StrCat(head_who, " closed its connection after a failure caused by ",
                         record->culprits.empty() ? "another rank" : RanksPhrase(record->culprits),
                         ": ", record->message, gloo_note)),
        record->culprits);
  }
  return MarkSecondary(
      absl::UnavailableError(absl::StrCat(
          head_who, " closed its connection after failing: ", record->message, gloo_note)),
      {peer});
}

}  // namespace internal
}  // namespace comm
