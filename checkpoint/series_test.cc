// Step checkpoints under one root: their names, listing, the newest complete one (damaged
// ones skipped with why), pruning to the newest K.
#include "checkpoint/series.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint/sharded.h"
#include "core/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace checkpoint {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

std::string Root(const std::string& name) { return ::testing::TempDir() + "/series_" + name; }

// A one-tensor checkpoint of `step` at `dir`.
void SaveStep(const std::string& dir, int64_t step) {
  core::Tensor t = core::Tensor::FromVector({1.0f * step, 2.0f}, {2}).value();
  SaveOptions options;
  options.step = step;
  ASSERT_TRUE(Save(dir, {FullSlice("w", t)}, options).ok());
}

TEST(SeriesTest, StepDirectoriesAreNamedAndListedByStep) {
  EXPECT_EQ(StepDirectory("/ckpt", 1200), "/ckpt/step-000001200");
  EXPECT_EQ(StepDirectory("/ckpt", 12345678901), "/ckpt/step-12345678901");
  const std::string root = Root("list");
  EXPECT_TRUE(ListStepCheckpoints(root)->empty()) << "a missing root lists nothing";
  for (int64_t step : {20, 5, 100}) SaveStep(StepDirectory(root, step), step);
  // Not step checkpoints: a save's leftovers and other names.
  std::ofstream(root + "/step-000000007.tmp-abc") << "x";
  std::ofstream(root + "/notes") << "x";
  std::ofstream(root + "/step-") << "x";
  EXPECT_THAT(*ListStepCheckpoints(root),
              ElementsAre(Pair(5, StepDirectory(root, 5)), Pair(20, StepDirectory(root, 20)),
                          Pair(100, StepDirectory(root, 100))));
}

TEST(SeriesTest, TheLatestCompleteCheckpointIsFoundAndDamagedOnesAreSkipped) {
  const std::string root = Root("latest");
  for (int64_t step : {10, 20, 30}) SaveStep(StepDirectory(root, step), step);
  absl::StatusOr<LatestCheckpoint> latest = FindLatestCheckpoint(root);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->dir, StepDirectory(root, 30));
  EXPECT_EQ(latest->step, 30);
  EXPECT_TRUE(latest->skipped.empty());
  // Step 30's data damaged, step 20's metadata gone (as a torn copy would leave it).
  for (const auto& entry : std::filesystem::directory_iterator(StepDirectory(root, 30))) {
    if (entry.path().filename() != "metadata.pb") std::ofstream(entry.path()) << "torn";
  }
  std::remove((StepDirectory(root, 20) + "/metadata.pb").c_str());
  latest = FindLatestCheckpoint(root);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->step, 10);
  ASSERT_EQ(latest->skipped.size(), 2u);
  EXPECT_THAT(latest->skipped[0], HasSubstr("step-000000030"));
  EXPECT_THAT(latest->skipped[1], HasSubstr("step-000000020"));
}

TEST(SeriesTest, ARootThatIsItselfACheckpointIsTheLatestAndNoneIsNotFound) {
  const std::string root = Root("single");
  SaveStep(root, 7);
  absl::StatusOr<LatestCheckpoint> latest = FindLatestCheckpoint(root);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->dir, root);
  EXPECT_EQ(latest->step, 7);
  absl::StatusOr<LatestCheckpoint> none = FindLatestCheckpoint(Root("empty"));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(none.status().message(), HasSubstr("series_empty"));
}

TEST(SeriesTest, PruningKeepsTheNewest) {
  const std::string root = Root("prune");
  for (int64_t step : {1, 2, 3, 4}) SaveStep(StepDirectory(root, step), step);
  EXPECT_EQ(*PruneStepCheckpoints(root, 2), 2);
  EXPECT_THAT(*ListStepCheckpoints(root),
              ElementsAre(Pair(3, StepDirectory(root, 3)), Pair(4, StepDirectory(root, 4))));
  EXPECT_EQ(*PruneStepCheckpoints(root, 5), 0);
  EXPECT_EQ(PruneStepCheckpoints(root, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace checkpoint
