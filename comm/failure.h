// Root causes and secondary errors across ranks, and the per-rank error file.
//
// When one rank fails, the others fail too: a peer closes its connection, a collective
// times out because a rank never arrives, or an agreement (comm/agreement.h) hands every
// rank the failing rank's error. Those errors are *secondary*: they carry a payload
// naming the ranks that caused them, so the launcher (comm/launcher.h) and users can
// report the root cause first.
//
//   absl::Status s = comm::MarkSecondary(
//       absl::UnavailableError("peer closed its connection"), {1});
//   comm::IsSecondary(s);         // true
//   comm::CulpritRanks(s);        // {1}
//
// The error file (like torchelastic's): a launcher sets FSDP_ERROR_FILE for each rank;
// RecordFailure writes the rank's error there as one JSON object, atomically, with a
// timestamp, before the rank tears anything down. A root cause replaces an earlier
// secondary record; nothing replaces a root cause, and a secondary replaces nothing.
#ifndef COMM_FAILURE_H_
#define COMM_FAILURE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace comm {

// Payload type URL of a secondary error; the payload is the culprit ranks, comma-separated.
inline constexpr char kSecondaryPayload[] = "type.fsdp/comm.Secondary";
// Environment variable naming the error file of this rank (set by comm::Launch).
inline constexpr char kErrorFileEnv[] = "FSDP_ERROR_FILE";

// `status` (not OK) marked as caused by `culprit_ranks` (may be empty: caused by another
// rank, unknown which). Its message gets the prefix "secondary (caused by rank r): " once.
absl::Status MarkSecondary(absl::Status status, const std::vector<int>& culprit_ranks);
// Also true for an error whose message holds a secondary error's text: callers that
// annotate an error into a new status ("fsdp unit ...: <error>") keep it secondary.
bool IsSecondary(const absl::Status& status);
// The culprit ranks of a secondary error; empty otherwise.
std::vector<int> CulpritRanks(const absl::Status& status);

// One rank's recorded failure.
struct FailureRecord {
  int rank = -1;
  int64_t time_unix_ns = 0;  // when it was recorded
  int code = 0;              // absl::StatusCode
  std::string message;
  bool secondary = false;
  std::vector<int> culprit_ranks;
  std::string ToJson() const;
};

absl::StatusOr<FailureRecord> ParseFailureRecord(const std::string& json);

// Writes `status` as this rank's failure to $FSDP_ERROR_FILE (nothing when unset or when
// `status` is OK), following the replacement rule at the top of this file. Atomic
// (temporary file + rename). Returns an error only when the file cannot be written.
absl::Status RecordFailure(const absl::Status& status, int rank);

// Reads the record at `path`; NotFound when there is none.
absl::StatusOr<FailureRecord> ReadFailureRecord(const std::string& path);

}  // namespace comm

#endif  // COMM_FAILURE_H_
