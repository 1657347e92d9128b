// What a failing gloo collective reads from and writes to the store to say which rank
// is to blame: per-rank progress (the number of the last collective each rank started)
// and per-rank "broken" records (why a rank's group failed, written before it closes its
// connections, so that the peers that see the closed connection can tell why).
//
//   // Every rank, before it runs collective #17:    Set(ProgressKey(rank), "17")
//   // At a timeout, with every rank's progress read back:
//   internal::ArrivalReport r = internal::DescribeArrival(17, {17, 16, 17});
//   r.text;      // "rank 1 did not arrive (last at collective #16); ranks 0, 2 did"
//   r.missing;   // {1}
//
// The keys live in the group's own store namespace (its PrefixStore), beside gloo's
// rendezvous keys ("<rank>", "rank_<rank>").
#ifndef COMM_INTERNAL_GLOO_DIAGNOSIS_H_
#define COMM_INTERNAL_GLOO_DIAGNOSIS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace comm {
namespace internal {

// "progress/<rank>": the decimal number of the last collective `rank` started.
std::string ProgressKey(int rank);
// "broken/<rank>": an EncodeBrokenRecord value.
std::string BrokenKey(int rank);
// "conn/<rank>": an EncodeConnections value (comm/internal/gloo_address.h).
std::string ConnKey(int rank);

// "rank 3" or "ranks 0, 2".
std::string RanksPhrase(const std::vector<int>& ranks);

// Who had started collective #seq, from `last_started[r]`: the number of the last
// collective rank r started (nullopt: none yet). A rank arrived iff its number >= seq.
struct ArrivalReport {
  std::vector<int> missing;  // ranks that had not arrived, ascending
  std::vector<int> arrived;  // ranks that had, ascending
  // "rank 1 did not arrive (last at collective #16); ranks 0, 2 did", or for several
  // "ranks 1 (last at collective #16), 3 (no collective yet) did not arrive; rank 0 did",
  // or "every rank arrived (ranks 0, 1, 2)".
  std::string text;
};
ArrivalReport DescribeArrival(uint64_t seq,
                              const std::vector<std::optional<int64_t>>& last_started);

// Parses a progress value; nullopt unless it is a non-negative decimal integer.
std::optional<int64_t> ParseProgress(absl::string_view value);

// Why a rank's group failed (or that it was destroyed), as its peers read it.
struct BrokenRecord {
  absl::StatusCode code = absl::StatusCode::kUnknown;
  bool secondary = false;     // the failure was caused by other ranks ...
  std::vector<int> culprits;  // ... these (may be empty: unknown which)
  bool destroyed = false;     // the group was destroyed, not failed
  std::string message;
};

// The record of a group that failed with `status` (not OK).
std::string EncodeBrokenRecord(const absl::Status& status);
// The record of a group that was destroyed before any failure.
std::string EncodeDestroyedRecord();
// DataLoss when `value` is not an Encode*Record value.
absl::StatusOr<BrokenRecord> DecodeBrokenRecord(absl::string_view value);

}  // namespace internal
}  // namespace comm

#endif  // COMM_INTERNAL_GLOO_DIAGNOSIS_H_
