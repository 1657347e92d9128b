// Helpers shared by the Store implementations: counter parsing and error messages.
#ifndef COMM_INTERNAL_STORE_UTIL_H_
#define COMM_INTERNAL_STORE_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace comm {
namespace internal {

// The counter stored under `key` ("" or absent counts as 0) plus `delta`, as Add keeps it.
// InvalidArgument naming the key when it holds a non-integer, and naming the key, the
// value and the delta when the sum leaves the int64 range (never wraps).
inline absl::StatusOr<int64_t> AddToCounter(absl::string_view store_name, absl::string_view key,
                                            const std::string* current, int64_t delta) {
  int64_t value = 0;
  if (current != nullptr && !current->empty() && !absl::SimpleAtoi(*current, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(store_name, ": Add(\"", key, "\") on a key that holds a non-integer value"));
  }
  int64_t sum = 0;
  if (__builtin_add_overflow(value, delta, &sum)) {
    return absl::InvalidArgumentError(absl::StrCat(store_name, ": Add(\"", key, "\", ", delta,
                                                   ") overflows: the counter holds ", value,
                                                   " and the sum is outside the int64 range"));
  }
  return sum;
}

inline absl::Status WaitTimedOut(absl::string_view store_name,
                                 const std::vector<std::string>& missing, absl::Duration timeout) {
  return absl::DeadlineExceededError(absl::StrCat(store_name, ": keys [",
                                                  absl::StrJoin(missing, ", "), "] not set within ",
                                                  absl::FormatDuration(timeout)));
}

}  // namespace internal
}  // namespace comm

#endif  // COMM_INTERNAL_STORE_UTIL_H_
