#include "core/timeout.h"

#include <cmath>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace core {
namespace {

using ::testing::HasSubstr;

TEST(TimeoutFromSecondsTest, AcceptsTheRangeAndConvertsExactly) {
  EXPECT_EQ(TimeoutFromSeconds(12.5, "--timeout_s").value(), absl::Milliseconds(12500));
  EXPECT_EQ(TimeoutFromSeconds(kMinTimeoutSeconds, "--timeout_s").value(), absl::Milliseconds(1));
  EXPECT_EQ(TimeoutFromSeconds(kMaxTimeoutSeconds, "--timeout_s").value(), absl::Hours(7 * 24));
  // The largest accepted timeout still leaves room for deadline arithmetic.
  const absl::Time deadline = absl::Now() + TimeoutFromSeconds(kMaxTimeoutSeconds, "x").value();
  EXPECT_GT(deadline, absl::Now() + absl::Hours(24));
}

TEST(TimeoutFromSecondsTest, RejectsValuesOutsideTheRangeNamingTheOptionAndTheRange) {
  const double bad[] = {0.0,
                        -1.0,
                        1e-9,
                        std::numeric_limits<double>::quiet_NaN(),
                        std::numeric_limits<double>::infinity(),
                        -std::numeric_limits<double>::infinity(),
                        kMaxTimeoutSeconds * 1.0001,
                        1e10,
                        1e300};
  for (double seconds : bad) {
    absl::StatusOr<absl::Duration> t =
        TimeoutFromSeconds(seconds, "StageConfig.collective_timeout_s");
    ASSERT_FALSE(t.ok()) << seconds;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << seconds;
    EXPECT_THAT(t.status().message(), HasSubstr("StageConfig.collective_timeout_s = "));
    EXPECT_THAT(t.status().message(), HasSubstr("[0.001, 604800]"));
    EXPECT_THAT(t.status().message(), HasSubstr("no 'no timeout'"));
  }
}

}  // namespace
}  // namespace core
