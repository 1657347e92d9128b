// NOTE [Deterministic training] end to end, with real processes: the main job with
// --deterministic gives, at world sizes 1, 2 (gloo) and 4 (shm), the same losses and the
// same released weights, bit for bit, over 20 steps; a run stopped after 10 steps at
// N = 2 and resumed at N = 4 gives the uninterrupted run's last 10 losses and its weights,
// bit for bit. The normal mode's losses at N = 2 differ from N = 1's (what the mode is for).
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "trainer/testing/e2e_harness.h"

namespace integration {
namespace {

using testing::FitLosses;
using testing::MainJob;
using testing::RunResult;
using testing::SameSafetensors;
using testing::TempDir;

// --batch_size=8 (SmallModelFlags) in 4 micro-batches of 2 rows: world sizes 1, 2, 4.
std::vector<std::string> Deterministic(std::vector<std::string> extra) {
  extra.push_back("--deterministic");
  extra.push_back("--deterministic_micro_batches=4");
  return extra;
}

// The first index where the two differ in any bit, or -1.
int FirstDifference(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(double)) != 0) return static_cast<int>(i);
  }
  return -1;
}

class DeterministicE2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    one_ = new RunResult(
        MainJob(1, TempDir() + "/det1", Deterministic({"--stages=fit", "--steps=20"})));
  }
  static void TearDownTestSuite() { delete one_; }
  void SetUp() override { ASSERT_EQ(one_->exit_code, 0) << one_->output; }
  static RunResult* one_;
};
RunResult* DeterministicE2eTest::one_ = nullptr;

TEST_F(DeterministicE2eTest, WorldSizesOneTwoAndFourGiveTheSameBits) {
  const std::vector<double> want = FitLosses(TempDir() + "/det1");
  ASSERT_EQ(want.size(), 20u) << one_->output;
  for (const auto& [n, backend] : {std::pair<int, const char*>{2, "gloo"}, {4, "shm"}}) {
    const std::string dir = absl::StrCat(TempDir(), "/det", n);
    RunResult r = MainJob(
        n, dir, Deterministic({"--stages=fit", "--steps=20", absl::StrCat("--backend=", backend)}));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(FirstDifference(want, FitLosses(dir)), -1) << "N = " << n;
    EXPECT_TRUE(
        SameSafetensors(TempDir() + "/det1/model.safetensors", dir + "/model.safetensors").ok());
    std::printf(
        "--deterministic, N = %d (%s): 20 losses and every weight bit for bit as N = 1; "
        "final loss %.17g\n",
        n, backend, FitLosses(dir).back());
  }
}

TEST_F(DeterministicE2eTest, AResumeAtAnotherWorldSizeContinuesTheUninterruptedRun) {
  const std::string first = TempDir() + "/det_first10";
  RunResult a = MainJob(2, first, Deterministic({"--stages=fit", "--steps=10", "--release=false"}));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const std::string next = TempDir() + "/det_next10";
  RunResult b = MainJob(4, next,
                        Deterministic({"--stages=fit", "--steps=10", "--backend=shm",
                                       "--resume_from=" + first + "/checkpoint"}));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const std::vector<double> straight = FitLosses(TempDir() + "/det1");
  const std::vector<double> head = FitLosses(first);
  const std::vector<double> tail = FitLosses(next);
  ASSERT_EQ(head.size(), 10u);
  ASSERT_EQ(tail.size(), 10u);
  EXPECT_EQ(FirstDifference(std::vector<double>(straight.begin(), straight.begin() + 10), head),
            -1);
  EXPECT_EQ(FirstDifference(std::vector<double>(straight.begin() + 10, straight.end()), tail), -1);
  const absl::Status same =
      SameSafetensors(TempDir() + "/det1/model.safetensors", next + "/model.safetensors");
  EXPECT_TRUE(same.ok()) << same;
}

TEST_F(DeterministicE2eTest, TheNormalModeDiffersAcrossWorldSizes) {
  RunResult one = MainJob(1, TempDir() + "/normal1", {"--stages=fit", "--steps=20"});
  RunResult two = MainJob(2, TempDir() + "/normal2", {"--stages=fit", "--steps=20"});
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(two.exit_code, 0) << two.output;
  const int at =
      FirstDifference(FitLosses(TempDir() + "/normal1"), FitLosses(TempDir() + "/normal2"));
  EXPECT_NE(at, -1);
  std::printf("normal mode, N = 2 vs N = 1: first differing loss at step %d\n", at + 1);
}

}  // namespace
}  // namespace integration
