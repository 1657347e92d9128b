// Tests of the blame records: who arrived at a collective, and why a peer closed.
#include "comm/internal/gloo_diagnosis.h"

#include "comm/failure.h"
#include "gtest/gtest.h"

namespace comm {
namespace internal {
namespace {

TEST(GlooDiagnosisTest, OneMissingRankIsNamedWithWhereItWas) {
  ArrivalReport r = DescribeArrival(17, {17, 16, 18});
  EXPECT_EQ(r.missing, std::vector<int>{1});
  EXPECT_EQ(r.arrived, (std::vector<int>{0, 2}));
  EXPECT_EQ(r.text, "rank 1 did not arrive (last at collective #16); ranks 0, 2 did");
}

TEST(GlooDiagnosisTest, SeveralMissingRanksAndRanksWithoutProgress) {
  ArrivalReport r = DescribeArrival(3, {3, 2, std::nullopt, 3});
  EXPECT_EQ(r.missing, (std::vector<int>{1, 2}));
  EXPECT_EQ(
      r.text,
      "ranks 1 (last at collective #2), 2 (no collective yet) did not arrive; ranks 0, 3 did");
  ArrivalReport none = DescribeArrival(0, {std::nullopt, std::nullopt});
  EXPECT_EQ(none.text, "ranks 0 (no collective yet), 1 (no collective yet) did not arrive");
}

TEST(GlooDiagnosisTest, EveryoneArrived) {
  ArrivalReport r = DescribeArrival(5, {5, 5, 6});
  EXPECT_TRUE(r.missing.empty());
  EXPECT_EQ(r.text, "every rank arrived (ranks 0, 1, 2)");
}

TEST(GlooDiagnosisTest, ParseProgressTakesNonNegativeIntegersOnly) {
  EXPECT_EQ(ParseProgress("17"), 17);
  EXPECT_EQ(ParseProgress("0"), 0);
  EXPECT_EQ(ParseProgress(""), std::nullopt);
  EXPECT_EQ(ParseProgress("-1"), std::nullopt);
  EXPECT_EQ(ParseProgress("12x"), std::nullopt);
  EXPECT_EQ(ParseProgress(std::string(30, '9')), std::nullopt);
}

TEST(GlooDiagnosisTest, BrokenRecordsKeepCodeCulpritsAndMessage) {
  absl::Status secondary =
      MarkSecondary(absl::DeadlineExceededError("AllReduce #3 timed out"), {1, 4});
  absl::StatusOr<BrokenRecord> r = DecodeBrokenRecord(EncodeBrokenRecord(secondary));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->code, absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(r->secondary);
  EXPECT_EQ(r->culprits, (std::vector<int>{1, 4}));
  EXPECT_FALSE(r->destroyed);
  EXPECT_EQ(r->message, "AllReduce #3 timed out");  // without MarkSecondary's prefix

  absl::StatusOr<BrokenRecord> unknown =
      DecodeBrokenRecord(EncodeBrokenRecord(MarkSecondary(absl::UnavailableError("x\ny"), {})));
  ASSERT_TRUE(unknown.ok()) << unknown.status();
  EXPECT_TRUE(unknown->secondary);
  EXPECT_TRUE(unknown->culprits.empty());
  EXPECT_EQ(unknown->message, "x\ny");

  absl::StatusOr<BrokenRecord> root =
      DecodeBrokenRecord(EncodeBrokenRecord(absl::InternalError("bad")));
  ASSERT_TRUE(root.ok()) << root.status();
  EXPECT_FALSE(root->secondary);
  EXPECT_EQ(root->code, absl::StatusCode::kInternal);

  absl::StatusOr<BrokenRecord> destroyed = DecodeBrokenRecord(EncodeDestroyedRecord());
  ASSERT_TRUE(destroyed.ok()) << destroyed.status();
  EXPECT_TRUE(destroyed->destroyed);
  EXPECT_EQ(destroyed->code, absl::StatusCode::kUnavailable);
}

TEST(GlooDiagnosisTest, GarbageIsNotARecord) {
  for (const std::string& v : {std::string(), std::string("v1\n"), std::string("v1\n0\nroot\nm"),
                               std::string("v1\n99\nroot\nm"), std::string("v1\n4\nwhat\nm"),
                               std::string("v1\n4\nsecondary:1,x\nm"), std::string(200, '\xff')}) {
    EXPECT_EQ(DecodeBrokenRecord(v).status().code(), absl::StatusCode::kDataLoss) << v;
  }
}

TEST(GlooDiagnosisTest, KeysAndPhrases) {
  EXPECT_EQ(ProgressKey(3), "progress/3");
  EXPECT_EQ(BrokenKey(3), "broken/3");
  EXPECT_EQ(ConnKey(3), "conn/3");
  EXPECT_EQ(RanksPhrase({2}), "rank 2");
  EXPECT_EQ(RanksPhrase({0, 2}), "ranks 0, 2");
}

}  // namespace
}  // namespace internal
}  // namespace comm
