#include "comm/internal/store_util.h"

#include <cstdint>
#include <string>

#include "gtest/gtest.h"

namespace comm {
namespace internal {
namespace {

TEST(AddToCounterTest, AddsToAbsentEmptyAndIntegerValues) {
  EXPECT_EQ(AddToCounter("S", "k", nullptr, 5).value(), 5);
  const std::string empty, seven = "7", negative = "-3";
  EXPECT_EQ(AddToCounter("S", "k", &empty, -2).value(), -2);
  EXPECT_EQ(AddToCounter("S", "k", &seven, 3).value(), 10);
  EXPECT_EQ(AddToCounter("S", "k", &negative, 3).value(), 0);
}

TEST(AddToCounterTest, OverflowEitherWayIsInvalidArgumentNamingKeyValueAndDelta) {
  const std::string max = std::to_string(INT64_MAX), min = std::to_string(INT64_MIN);
  absl::StatusOr<int64_t> over = AddToCounter("HashStore", "ctr", &max, 1);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(over.status().message(),
            "HashStore: Add(\"ctr\", 1) overflows: the counter holds 9223372036854775807 and "
            "the sum is outside the int64 range");
  absl::StatusOr<int64_t> under = AddToCounter("HashStore", "ctr", &min, -1);
  EXPECT_EQ(under.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(under.status().message().find("-9223372036854775808"), std::string::npos);
  EXPECT_EQ(AddToCounter("S", "k", nullptr, INT64_MIN).value(), INT64_MIN);
  EXPECT_EQ(AddToCounter("S", "k", &max, INT64_MIN).value(), -1);
  EXPECT_EQ(AddToCounter("S", "k", &min, INT64_MAX).value(), -1);
}

TEST(AddToCounterTest, NonIntegerIsInvalidArgument) {
  const std::string text = "hello", huge = "99999999999999999999";
  EXPECT_EQ(AddToCounter("S", "k", &text, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AddToCounter("S", "k", &huge, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace internal
}  // namespace comm
