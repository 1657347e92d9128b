// Cross-rank agreement on the outcome of a step that can fail on some ranks only
// (loading a checkpoint, parsing a configuration, planning a wrap): every rank learns
// every rank's status, and all return the same error, naming the rank where it happened,
// before anyone goes on to the next collective.
//
//   absl::Status local = LoadMyPart(...);                    // may fail on rank 1 only
//   RETURN_IF_ERROR(comm::AgreeOnStatus(group, local, "load checkpoint", timeout));
//   // every rank: OK, or "rank 1: <its error>" (same code) on all ranks
//
// Collective: every rank calls it, in the same order relative to the group's other
// collectives.
#ifndef COMM_AGREEMENT_H_
#define COMM_AGREEMENT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "comm/process_group.h"

namespace comm {

// Every rank's `bytes`, in rank order (two all-gathers: lengths, then the bytes padded
// to the longest). group == nullptr or a world of one returns {bytes}.
absl::StatusOr<std::vector<std::string>> AllGatherBytes(ProcessGroup* group,
                                                        const std::string& bytes,
                                                        absl::Duration timeout);

// Exchanges `local` (this rank's outcome of `what`) and returns, on every rank:
// - OK when every rank's status is OK;
// - otherwise the error of the lowest failing rank, with its code, its message prefixed
//   "rank <r>: " (when the world has more than one rank) and, on every rank but r,
//   marked secondary (comm/failure.h) with culprit r. Before exchanging, a failing rank
//   records its own error (RecordFailure), so the root cause is on disk even if this
//   process is stopped while waiting.
// If the exchange itself fails (a peer died or hung), that error is returned, mentioning
// `what` and the local status when it was not OK.
absl::Status AgreeOnStatus(ProcessGroup* group, const absl::Status& local, absl::string_view what,
                           absl::Duration timeout = kDefaultCollectiveTimeout);

}  // namespace comm

#endif  // COMM_AGREEMENT_H_
