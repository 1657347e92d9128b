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
#include "checkpoint/safetensors.h"
#include "gtest/gtest.h"
#include "integration/testing/e2e_harness.h"
#include "nlohmann/json.hpp"

namespace integration {
namespace {

using testing::MainJob;
using testing::ReadFile;
using testing::RunResult;
using testing::TempDir;

// --batch_size=8 (SmallModelFlags) in 4 micro-batches of 2 rows: world sizes 1, 2, 4.
std::vector<std::string> Deterministic(std::vector<std::string> extra) {
  extra.push_back("--deterministic");
  extra.push_back("--deterministic_micro_batches=4");
  return extra;
}

std::vector<double> Losses(const std::string& dir) {
  std::vector<double> out;
  const nlohmann::json summary = nlohmann::json::parse(ReadFile(dir + "/summary.json"));
  for (const auto& v : summary.at("fit_losses")) out.push_back(v.get<double>());
  return out;
}

// The first index where the two differ in any bit, or -1.
int FirstDifference(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(double)) != 0) return static_cast<int>(i);
  }
  return -1;
}

// Every tensor of two safetensors files, byte for byte.
void ExpectSameWeights(const std::string& a, const std::string& b) {
  absl::StatusOr<checkpoint::SafetensorsFile> x = checkpoint::ImportSafetensors(a);
  absl::StatusOr<checkpoint::SafetensorsFile> y = checkpoint::ImportSafetensors(b);
  ASSERT_TRUE(x.ok() && y.ok()) << x.status() << y.status();
  ASSERT_EQ(x->tensors.size(), y->tensors.size());
  for (size_t i = 0; i < x->tensors.size(); ++i) {
    const core::Tensor& s = x->tensors[i].second;
    const core::Tensor& t = y->tensors[i].second;
    ASSERT_EQ(s.nbytes(), t.nbytes()) << x->tensors[i].first;
    EXPECT_EQ(std::memcmp(s.raw_data(), t.raw_data(), s.nbytes()), 0) << x->tensors[i].first;
  }
}

class DeterministicE2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    one_ = new RunResult(MainJob(1, TempDir() + "/det1",
                                 Deterministic({"--stages=fit", "--steps=20"})));
  }
  static void TearDownTestSuite() { delete one_; }
  void SetUp() override { ASSERT_EQ(one_->exit_code, 0) << one_->output; }
  static RunResult* one_;
};
RunResult* DeterministicE2eTest::one_ = nullptr;

TEST_F(DeterministicE2eTest, WorldSizesOneTwoAndFourGiveTheSameBits) {
  const std::vector<double> want = Losses(TempDir() + "/det1");
  ASSERT_EQ(want.size(), 20u) << one_->output;
  for (const auto& [n, backend] : {std::pair<int, const char*>{2, "gloo"}, {4, "shm"}}) {
    const std::string dir = absl::StrCat(TempDir(), "/det", n);
    RunResult r = MainJob(n, dir, Deterministic({"--stages=fit", "--steps=20",
                                                 absl::StrCat("--backend=", backend)}));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(FirstDifference(want, Losses(dir)), -1) << "N = " << n;
    ExpectSameWeights(TempDir() + "/det1/model.safetensors", dir + "/model.safetensors");
    std::printf("--deterministic, N = %d (%s): 20 losses and every weight bit for bit as N = 1; "
                "final loss %.17g\n", n, backend, Losses(dir).back());
  }
}

TEST_F(DeterministicE2eTest, AResumeAtAnotherWorldSizeContinuesTheUninterruptedRun) {
  const std::string first = TempDir() + "/det_first10";
  RunResult a = MainJob(2, first, Deterministic({"--stages=fit", "--steps=10", "--release=false"}));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const std::string next = TempDir() + "/det_next10";
  RunResult b = MainJob(4, next, Deterministic({"--stages=fit", "--steps=10", "--backend=shm",
                                                "--resume_from=" + first + "/checkpoint"}));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const std::vector<double> straight = Losses(TempDir() + "/det1");
  const std::vector<double> head = Losses(first);
  const std::vector<double> tail = Losses(next);
  ASSERT_EQ(head.size(), 10u);
  ASSERT_EQ(tail.size(), 10u);
  EXPECT_EQ(FirstDifference(std::vector<double>(straight.begin(), straight.begin() + 10), head),
            -1);
  EXPECT_EQ(FirstDifference(std::vector<double>(straight.begin() + 10, straight.end()), tail), -1);
  ExpectSameWeights(TempDir() + "/det1/model.safetensors", next + "/model.safetensors");
}

TEST_F(DeterministicE2eTest, TheNormalModeDiffersAcrossWorldSizes) {
  RunResult one = MainJob(1, TempDir() + "/normal1", {"--stages=fit", "--steps=20"});
  RunResult two = MainJob(2, TempDir() + "/normal2", {"--stages=fit", "--steps=20"});
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(two.exit_code, 0) << two.output;
  const int at = FirstDifference(Losses(TempDir() + "/normal1"), Losses(TempDir() + "/normal2"));
  EXPECT_NE(at, -1);
  std::printf("normal mode, N = 2 vs N = 1: first differing loss at step %d\n", at + 1);
}

}  // namespace
}  // namespace integration
