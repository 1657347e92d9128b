#include "core/timeout.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace core {

absl::StatusOr<absl::Duration> TimeoutFromSeconds(double seconds, absl::string_view option_name) {
  // Written so that NaN fails the check (every comparison with NaN is false).
  if (!(seconds >= kMinTimeoutSeconds && seconds <= kMaxTimeoutSeconds)) {
    return absl::InvalidArgumentError(absl::StrCat(
        option_name, " = ", seconds, ": a timeout must be a number of seconds in [",
        kMinTimeoutSeconds, ", ", kMaxTimeoutSeconds,
        "] (1 ms to 7 days); there is no 'no timeout' (0, inf), since collectives must "
        "never hang"));
  }
  return absl::Seconds(seconds);
}

}  // namespace core
