#include "trainer/internal/run_log.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace integration {
namespace internal {
namespace {

std::string LogPath(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

Progress Report(int64_t global_step, std::vector<double> losses) {
  Progress p;
  p.global_step = global_step;
  p.losses = std::move(losses);
  p.loss = p.losses.back();
  return p;
}

TEST(RunLogTest, ARestartCountsTheStepsItRecomputesAndTheTimeItTookToCatchUp) {
  const std::string path = LogPath("restart.jsonl");
  {
    absl::StatusOr<RunLog> first = RunLog::Open(path, /*restart=*/0, /*fresh=*/true);
    ASSERT_TRUE(first.ok()) << first.status();
    ASSERT_TRUE(first->Started(0, 4, 100.0).ok());
    ASSERT_TRUE(first->Reported(Report(3, {3.0, 2.5, 2.25}), 103.0).ok());
    ASSERT_TRUE(first->Reported(Report(5, {2.0, 1.75}), 105.0).ok());  // then killed
    EXPECT_EQ(first->ProgressSuffix(), "");
  }
  absl::StatusOr<RunLog> second = RunLog::Open(path, /*restart=*/1, /*fresh=*/false);
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE(second->Started(/*from_step=*/2, /*world_size=*/2, 110.0).ok());
  EXPECT_EQ(second->figures().restarts, 1);
  EXPECT_EQ(second->figures().steps_recomputed, 3);
  EXPECT_EQ(second->ProgressSuffix(), "  restarts 1, 3 steps recomputed, recomputing to step 5");
  ASSERT_TRUE(second->Reported(Report(4, {2.5, 2.0}), 113.0).ok());
  EXPECT_EQ(second->figures().seconds_lost, 0);  // not there yet
  ASSERT_TRUE(second->Reported(Report(5, {1.5}), 114.5).ok());
  EXPECT_DOUBLE_EQ(second->figures().seconds_lost, 114.5 - 105.0);
  EXPECT_EQ(second->ProgressSuffix(), "  restarts 1, 3 steps recomputed, 9.5 s lost");
  // The restart's losses replace the failed start's for the steps it trained again.
  const std::map<int64_t, double> expected = {{1, 3.0}, {2, 2.5}, {3, 2.5}, {4, 2.0}, {5, 1.5}};
  EXPECT_EQ(second->step_losses(), expected);

  // A third start reads everything the two wrote.
  absl::StatusOr<RunLog> third = RunLog::Open(path, /*restart=*/2, /*fresh=*/false);
  ASSERT_TRUE(third.ok()) << third.status();
  ASSERT_TRUE(third->Started(5, 2, 120.0).ok());
  EXPECT_EQ(third->figures().restarts, 2);
  EXPECT_EQ(third->figures().recomputed_per_restart, (std::vector<int64_t>{3, 0}));
  EXPECT_DOUBLE_EQ(third->figures().seconds_lost, 9.5);
  EXPECT_EQ(third->step_losses(), expected);
}

TEST(RunLogTest, LossesKeepEveryDigit) {
  const std::string path = LogPath("digits.jsonl");
  const double loss = 2.4431772232055664123;
  absl::StatusOr<RunLog> log = RunLog::Open(path, 0, true);
  ASSERT_TRUE(log.ok());
  ASSERT_TRUE(log->Started(0, 1, 1.0).ok());
  ASSERT_TRUE(log->Reported(Report(1, {loss}), 2.0).ok());
  absl::StatusOr<RunLog> again = RunLog::Open(path, 1, false);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->step_losses().at(1), loss);  // bit for bit
}

TEST(RunLogTest, AFreshStartEmptiesTheLog) {
  const std::string path = LogPath("fresh.jsonl");
  {
    absl::StatusOr<RunLog> log = RunLog::Open(path, 0, true);
    ASSERT_TRUE(log->Started(0, 1, 1.0).ok());
    ASSERT_TRUE(log->Reported(Report(2, {1.0, 0.5}), 2.0).ok());
  }
  absl::StatusOr<RunLog> fresh = RunLog::Open(path, 0, true);
  ASSERT_TRUE(fresh.ok());
  ASSERT_TRUE(fresh->Started(0, 1, 3.0).ok());
  EXPECT_TRUE(fresh->step_losses().empty());
  EXPECT_EQ(fresh->figures().steps_recomputed, 0);
}

TEST(RunLogTest, ADamagedLineIsRefusedNamingTheFileAndLine) {
  const std::string path = LogPath("damaged.jsonl");
  std::ofstream(path) << R"({"event":"start","restart":0,"recomputed":0})"
                      << "\n"
                      << R"({"event":"step","step":1,"loss":)"
                      << "\n";
  absl::StatusOr<RunLog> log = RunLog::Open(path, 1, false);
  ASSERT_FALSE(log.ok());
  EXPECT_EQ(log.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(log.status().message().find(path + "' line 2"), std::string::npos) << log.status();
}

TEST(RunLogTest, ATornLastLineIsDroppedAndTheLogGoesOn) {
  const std::string path = LogPath("torn.jsonl");
  std::ofstream(path) << R"({"event":"start","restart":0,"recomputed":0})"
                      << "\n"
                      << R"({"event":"step","step":1,"loss":2.5,"time":1})"
                      << "\n"
                      << R"({"event":"step","step":2,"lo)";  // killed mid-append
  absl::StatusOr<RunLog> log = RunLog::Open(path, 1, false);
  ASSERT_TRUE(log.ok()) << log.status();
  ASSERT_TRUE(log->Started(1, 1, 5.0).ok());
  EXPECT_EQ(log->figures().steps_recomputed, 0);  // step 2 was never logged whole
  absl::StatusOr<RunLog> again = RunLog::Open(path, 2, false);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->figures().restarts, 1);
  EXPECT_EQ(again->step_losses(), (std::map<int64_t, double>{{1, 2.5}}));
}

}  // namespace
}  // namespace internal
}  // namespace integration
