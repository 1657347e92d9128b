// Timeouts from user-given seconds (flags, config fields), checked in one place so that
// every option spelt "..._timeout_s" accepts the same values with the same message.
//
//   ASSIGN_OR_RETURN(absl::Duration timeout,
//                    core::TimeoutFromSeconds(absl::GetFlag(FLAGS_timeout_s), "--timeout_s"));
//   options.wrap.timeout = timeout;
//
// NOTE [Timeout range]: a timeout is a number of seconds in
// [kMinTimeoutSeconds, kMaxTimeoutSeconds] = [0.001, 604800] (1 ms to 7 days). There is
// no spelling of "no timeout": collectives must never hang, so 0, negative numbers, NaN
// and infinity are rejected rather than read as "wait forever" (and values beyond 7 days,
// which would overflow deadline arithmetic into an immediate timeout, are rejected too).
#ifndef CORE_TIMEOUT_H_
#define CORE_TIMEOUT_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace core {

// The accepted range of TimeoutFromSeconds, in seconds (NOTE [Timeout range]).
inline constexpr double kMinTimeoutSeconds = 0.001;
inline constexpr double kMaxTimeoutSeconds = 7 * 24 * 3600.0;

// `seconds` as a Duration when it lies in [kMinTimeoutSeconds, kMaxTimeoutSeconds];
// otherwise InvalidArgument "<option_name> = <seconds>: ..." stating the accepted range
// and that there is no "no timeout". `option_name` names the flag or field, e.g.
// "--timeout_s" or "StageConfig.collective_timeout_s".
absl::StatusOr<absl::Duration> TimeoutFromSeconds(double seconds, absl::string_view option_name);

}  // namespace core

#endif  // CORE_TIMEOUT_H_
