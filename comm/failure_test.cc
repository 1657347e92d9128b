#include "comm/failure.h"

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace comm {
namespace {

TEST(FailureTest, MarkSecondaryNamesTheCulpritsAndKeepsTheCode) {
  absl::Status s = MarkSecondary(absl::UnavailableError("peer closed its connection"), {1, 3});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(IsSecondary(s));
  EXPECT_EQ(CulpritRanks(s), (std::vector<int>{1, 3}));
  EXPECT_EQ(s.message(), "secondary (caused by ranks 1, 3): peer closed its connection");
  // Marking twice changes nothing.
  absl::Status again = MarkSecondary(s, {2});
  EXPECT_EQ(again.message(), s.message());
  EXPECT_EQ(CulpritRanks(again), (std::vector<int>{1, 3}));
  EXPECT_FALSE(IsSecondary(absl::DataLossError("x")));
  EXPECT_TRUE(CulpritRanks(absl::DataLossError("x")).empty());
  EXPECT_TRUE(MarkSecondary(absl::OkStatus(), {1}).ok());
}

TEST(FailureTest, AnAnnotatedSecondaryErrorStaysSecondary) {
  absl::Status s = MarkSecondary(absl::DeadlineExceededError("AllGather #41 timed out"), {1, 2});
  // A caller prefixes the message into a new status and so drops the payload.
  absl::Status annotated(s.code(), absl::StrCat("fsdp unit <root> (Gpt): ", s.message()));
  EXPECT_TRUE(IsSecondary(annotated));
  EXPECT_EQ(CulpritRanks(annotated), (std::vector<int>{1, 2}));
  absl::Status unknown = MarkSecondary(absl::UnavailableError("peer closed"), {});
  absl::Status annotated_unknown(unknown.code(), absl::StrCat("fit: ", unknown.message()));
  EXPECT_TRUE(IsSecondary(annotated_unknown));
  EXPECT_TRUE(CulpritRanks(annotated_unknown).empty());
  EXPECT_FALSE(IsSecondary(absl::UnavailableError("a secondary cause of nothing")));
}

TEST(FailureTest, RecordRoundTripsAndARootCauseIsNeverReplaced) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/error.json";
  ::setenv(kErrorFileEnv, path.c_str(), 1);
  EXPECT_FALSE(ReadFailureRecord(path).ok());
  ASSERT_TRUE(RecordFailure(MarkSecondary(absl::UnavailableError("peer gone"), {2}), 0).ok());
  absl::StatusOr<FailureRecord> r = ReadFailureRecord(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->secondary);
  EXPECT_EQ(r->culprit_ranks, std::vector<int>{2});
  // A second secondary error replaces nothing.
  ASSERT_TRUE(RecordFailure(MarkSecondary(absl::DeadlineExceededError("late"), {1}), 0).ok());
  r = ReadFailureRecord(path);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->culprit_ranks, std::vector<int>{2});
  // A root cause replaces a secondary record.
  ASSERT_TRUE(RecordFailure(absl::DataLossError("metadata.pb: checksum mismatch"), 0).ok());
  r = ReadFailureRecord(path);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->secondary);
  EXPECT_EQ(r->rank, 0);
  EXPECT_EQ(r->code, static_cast<int>(absl::StatusCode::kDataLoss));
  EXPECT_EQ(r->message, "metadata.pb: checksum mismatch");
  EXPECT_GT(r->time_unix_ns, 0);
  // Nothing replaces a root cause.
  ASSERT_TRUE(RecordFailure(absl::InternalError("later"), 0).ok());
  r = ReadFailureRecord(path);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->message, "metadata.pb: checksum mismatch");
  ::unsetenv(kErrorFileEnv);
}

TEST(FailureTest, MalformedRecordIsDataLoss) {
  EXPECT_EQ(ParseFailureRecord("{").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ParseFailureRecord("{\"rank\": \"x\"}").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ParseFailureRecord("[1]").status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace comm
