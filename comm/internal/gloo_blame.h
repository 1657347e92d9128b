// GlooBlame: what lets a failing gloo collective name the rank that caused it, and the
// check that every connection made at rendezvous reaches the rank it was meant for.
// Used by GlooProcessGroup (comm/gloo_process_group.h); one per group of two or more.
//
//   ASSIGN_OR_RETURN(internal::PeerDirectory peers,
//                    internal::ConfirmConnections(*store, *context, rank, size, deadline,
//                                                 rendezvous_timeout, "world/", listening));
//   internal::GlooBlame blame(store, options, std::move(peers));
//   blame.Arrived(17);                                  // before running collective #17
//   ... gloo throws ...
//   absl::Status s = blame.Diagnose("AllReduce #17 on ...", 17, timeout, is_timeout, e.what());
//   blame.RecordFailure(s);                             // before closing the connections
//
// NOTE [Who is to blame]: gloo's errors name addresses, not ranks, and a timeout names
// nobody. So that a failing collective can say which rank caused it:
// - Progress. Before it runs collective #n, each rank posts Set("progress/<rank>", n)
//   to a StoreAgent (comm/internal/store_agent.h), a background thread: one small store
//   op per collective, coalesced when the store lags, never waited for. At a timeout the
//   rank reads every rank's progress back (within the probe timeout): ranks below n had
//   not arrived.
// - Broken records. A rank whose group fails writes Set("broken/<rank>", why) before it
//   closes its connections (bounded too); a group destroyed while healthy writes
//   "destroyed". A rank that sees a peer close its connection maps the address in
//   gloo's message to the rank (PeerDirectory) and reads that rank's record: a peer that
//   timed out waiting for others passes the timeout on (DeadlineExceeded naming the
//   ranks that did not arrive); one that failed because of other ranks passes its
//   culprits on; one that was destroyed, failed on its own, or left no record (its
//   process died) is the culprit itself.
// - A store that does not answer within the probe timeout is said to ("the store at
//   host:port (served by rank 0) does not answer"), blaming the serving rank if known.
// All such errors are MarkSecondary (comm/failure.h) with the culprits found (none
// when unknown).
//
// NOTE [Connection check]: gloo's TCP pairs have no handshake: a rank connects to
// whatever address the store holds for its peer, so a forged address could connect it
// to another process, and the group would seem to work until the first collective.
// After connectFullMesh every rank publishes the local end of each of its pairs
// ("conn/<rank>") and waits, until the rendezvous deadline, for every peer's record.
// A peer publishes only once all its own pairs connected, which a peer whose partner
// went elsewhere never does, so a misdirected connection fails the rendezvous at the
// deadline naming that peer. The records also give each rank the address its peers'
// ends have, which is what gloo names in its errors.
#ifndef COMM_INTERNAL_GLOO_BLAME_H_
#define COMM_INTERNAL_GLOO_BLAME_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/internal/gloo_address.h"
#include "comm/internal/gloo_diagnosis.h"
#include "comm/internal/store_agent.h"
#include "comm/store.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace comm {
namespace internal {

// NOTE [Connection check]. `store` is the group's namespace, `key_prefix` what it puts
// before keys (for messages), `listening` the peers' listening addresses seen at
// rendezvous. Returns `listening` plus the address of each peer's end of its pair with
// this rank. DeadlineExceeded naming the peers that did not confirm by `deadline` (at
// least rendezvous_timeout / 10 from now); DataLoss for a malformed record.
absl::StatusOr<PeerDirectory> ConfirmConnections(Store& store, gloo::Context& context, int rank,
                                                 int size, absl::Time deadline,
                                                 absl::Duration rendezvous_timeout,
                                                 const std::string& key_prefix,
                                                 PeerDirectory listening);

struct BlameOptions {
  int rank = 0;
  int size = 0;
  // "gloo group 'world' (rank 0 of 3)", for log lines.
  std::string group;
  // The store's Describe(): "the store at 127.0.0.1:29500", "the store".
  std::string store_name;
  // GlooOptions.store_server_rank and .store_probe_timeout.
  int store_server_rank = -1;
  absl::Duration probe_timeout = absl::Seconds(2);
};

class GlooBlame {
 public:
  // `store` is the group's namespace; `peers` from ConfirmConnections.
  GlooBlame(std::shared_ptr<Store> store, BlameOptions options, PeerDirectory peers);

  // Records, in the background, that this rank has started collective #seq.
  void Arrived(uint64_t seq);

  // The status of collective #seq (`what` describes it, `timeout` was its deadline),
  // which failed in gloo with `gloo_error`, a timeout or not: DeadlineExceeded or
  // Unavailable naming the ranks to blame and marked secondary with them. Takes at most
  // about the probe timeout.
  absl::Status Diagnose(const std::string& what, uint64_t seq, absl::Duration timeout,
                        bool gloo_timeout, const std::string& gloo_error);

  // Writes this rank's broken record: why its group failed (`status`, not OK), waiting
  // at most the probe timeout; or that it was destroyed while healthy, waiting at most
  // kDestroyRecordWait (at the end of a job the store's server may be gone first).
  void RecordFailure(const absl::Status& status);
  void RecordDestroyed();
  static constexpr absl::Duration kDestroyRecordWait = absl::Milliseconds(500);

 private:
  // "the store at host:port (served by rank 0) does not answer (...): rank 0 is gone
  // or stopped" for the probe's `error`.
  std::string StoreSilent(const absl::Status& error) const;

  // What the store says after collective #seq failed: every rank's progress (this rank's
  // is `seq`) and, when `peer` >= 0, that peer's broken record if it comes within half
  // the probe timeout. `status` is the store's error, if it did not answer.
  struct StoreProbe {
    absl::Status status;
    std::vector<std::optional<int64_t>> progress;
    std::optional<BrokenRecord> record;
  };
  StoreProbe ProbeStore(uint64_t seq, int peer);
  // Diagnose's status when `peer` closed its connection; `head_who` opens the message
  // ("<what> failed: rank 2 (host:port)").
  absl::Status ExplainClosed(const std::string& head_who, uint64_t seq, int peer,
                             const StoreProbe& probe, const std::string& gloo_note);
  void Record(std::string value, absl::Duration wait, bool failure);

  const BlameOptions options_;
  const PeerDirectory peers_;
  StoreAgent agent_;
};

}  // namespace internal
}  // namespace comm

#endif  // COMM_INTERNAL_GLOO_BLAME_H_
