#include "core/status_macros.h"

#include <string>

#include "absl/strings/cord.h"
#include "gtest/gtest.h"

namespace core {
namespace {

TEST(AnnotateTest, OkStaysOk) { EXPECT_TRUE(Annotate(absl::OkStatus(), "loading").ok()); }

TEST(AnnotateTest, PrefixesTheMessageAndKeepsTheCode) {
  absl::Status s = Annotate(absl::DeadlineExceededError("no reply"), "loading 'ckpt'");
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s.message(), "loading 'ckpt': no reply");
}

TEST(AnnotateTest, NestsOutermostFirst) {
  absl::Status s = Annotate(Annotate(absl::InternalError("bad"), "inner"), "outer");
  EXPECT_EQ(s.message(), "outer: inner: bad");
}

TEST(AnnotateTest, KeepsEveryPayload) {
  absl::Status error = absl::UnavailableError("peer closed its connection");
  error.SetPayload("type.test/a", absl::Cord("1,2"));
  error.SetPayload("type.test/b", absl::Cord("x"));
  absl::Status s = Annotate(error, "step 3");
  ASSERT_TRUE(s.GetPayload("type.test/a").has_value());
  EXPECT_EQ(std::string(*s.GetPayload("type.test/a")), "1,2");
  ASSERT_TRUE(s.GetPayload("type.test/b").has_value());
  EXPECT_EQ(std::string(*s.GetPayload("type.test/b")), "x");
}

// RETURN_IF_ERROR over Annotate returns the annotated error and passes OK through.
absl::Status Step(const absl::Status& inner, bool* reached_end) {
  RETURN_IF_ERROR(Annotate(inner, "step"));
  *reached_end = true;
  return absl::OkStatus();
}

TEST(AnnotateTest, ComposesWithReturnIfError) {
  bool reached_end = false;
  EXPECT_TRUE(Step(absl::OkStatus(), &reached_end).ok());
  EXPECT_TRUE(reached_end);
  reached_end = false;
  absl::Status s = Step(absl::NotFoundError("gone"), &reached_end);
  EXPECT_FALSE(reached_end);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "step: gone");
}

}  // namespace
}  // namespace core
