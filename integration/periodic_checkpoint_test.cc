// NOTE [Periodic checkpoints] through the StageRunner, over thread ranks: checkpoints every k
// steps and at reports after t minutes, pruned to the newest K; ResumeLatest loads the newest
// complete one (passing over a damaged one) at another world size and the run ends on the
// uninterrupted run's bits in the deterministic mode; with none, it starts fresh.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/series.h"
#include "checkpoint/sharded.h"
#include "comm/testing/thread_ranks.h"
#include "core/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/gpt_module.h"
#include "integration/stage_runner.h"
#include "integration/testing/stage_testing.h"

namespace integration {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;
using testing::RunRanks;

std::string Dir(const std::string& name) { return ::testing::TempDir() + "/periodic_" + name; }

// The deterministic mode (4 micro-batches of 2 rows), so N = 1, 2 and 4 give the same bits.
StageOptions Deterministic(int64_t steps) {
  StageOptions o = testing::TinyStages(/*rows=*/8, steps, /*log_every=*/2);
  o.wrap.deterministic = true;
  o.deterministic_micro_batches = 4;
  return o;
}

struct FitRun {
  std::vector<double> losses;
  std::vector<std::string> checkpoints;
  std::vector<std::vector<float>> params;  // after the runs, rank 0's, released
};

// On `n` ranks: optionally ResumeLatest from options.checkpoint_dir, then Fit `steps`
// (options.fit_steps when 0), then Release.
FitRun FitOn(int n, const StageOptions& options, bool resume, ResumeResult* resumed = nullptr) {
  FitRun out;
  absl::Status s = RunRanks(n, [&](comm::testing::RankContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(auto module, GptTrainModule::Create(testing::TinyGpt(16, 16, 3)));
    ASSIGN_OR_RETURN(auto runner, StageRunner::Create(ctx.group, options));
    if (resume) {
      ASSIGN_OR_RETURN(ResumeResult r,
                       runner->ResumeLatest(*module, options.checkpoint_dir, {/*optimizer=*/true}));
      if (ctx.rank == 0 && resumed != nullptr) *resumed = r;
    }
    ASSIGN_OR_RETURN(FitResult fit, runner->Fit(*module));
    RETURN_IF_ERROR(runner->Release(*module));
    if (ctx.rank == 0) {
      out.losses = fit.losses;
      out.checkpoints = fit.checkpoints;
      for (const core::ParameterPtr& p : module->model()->Parameters()) {
        out.params.push_back(p->data.ToVector());
      }
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

// Synchronous saves, and NOTE [Asynchronous save]'s (written in the background, committed at
// a report, at the next save or at the end): the same checkpoints, pruning and bits.
class PeriodicSavesTest : public ::testing::TestWithParam<bool> {
 protected:
  StageOptions With(StageOptions o, const std::string& name) const {
    o.checkpoint_dir = Dir(name + (GetParam() ? "_async" : "_sync"));
    o.async_checkpoints = GetParam();
    return o;
  }
};

TEST_P(PeriodicSavesTest, EveryKStepsAndTheLastKeepingTheNewestK) {
  StageOptions o = With(Deterministic(10), "every3");
  o.checkpoint_every_steps = 3;
  o.keep_checkpoints = 2;
  const FitRun run = FitOn(2, o, /*resume=*/false);
  EXPECT_THAT(run.checkpoints, ElementsAre(checkpoint::StepDirectory(o.checkpoint_dir, 3),
                                           checkpoint::StepDirectory(o.checkpoint_dir, 6),
                                           checkpoint::StepDirectory(o.checkpoint_dir, 9),
                                           checkpoint::StepDirectory(o.checkpoint_dir, 10)));
  EXPECT_THAT(*checkpoint::ListStepCheckpoints(o.checkpoint_dir),
              ElementsAre(Pair(9, checkpoint::StepDirectory(o.checkpoint_dir, 9)),
                          Pair(10, checkpoint::StepDirectory(o.checkpoint_dir, 10))));
  EXPECT_FALSE(std::filesystem::exists(o.checkpoint_dir + "/metadata.pb"))
      << "no end-of-fit save to the root itself";
  for (int64_t step : {9, 10}) {
    EXPECT_TRUE(
        checkpoint::VerifyCheckpoint(checkpoint::StepDirectory(o.checkpoint_dir, step)).ok());
  }
  // Each checkpoint holds its own step's weights: the last one, the released model's.
  EXPECT_EQ(checkpoint::ReadMetadata(checkpoint::StepDirectory(o.checkpoint_dir, 10))->step, 10);
}

TEST_P(PeriodicSavesTest, EveryTMinutesSavesAtTheReports) {
  StageOptions o = With(Deterministic(6), "minutes");  // reports at steps 2, 4, 6
  o.checkpoint_every_minutes = 1e-9;                   // due at every report
  const FitRun run = FitOn(2, o, /*resume=*/false);
  EXPECT_THAT(run.checkpoints, ElementsAre(checkpoint::StepDirectory(o.checkpoint_dir, 2),
                                           checkpoint::StepDirectory(o.checkpoint_dir, 4),
                                           checkpoint::StepDirectory(o.checkpoint_dir, 6)));
}

TEST_P(PeriodicSavesTest, ResumingTheLatestAtAnotherWorldSizeEndsOnTheUninterruptedBits) {
  const FitRun uninterrupted = FitOn(1, Deterministic(10), /*resume=*/false);
  // A run at N = 2 that saves every 2 steps and stops after 6 (as if killed there).
  StageOptions o = With(Deterministic(6), "resume");
  o.checkpoint_every_steps = 2;
  const FitRun first = FitOn(2, o, /*resume=*/false);
  // Step 6's checkpoint is damaged: the resume passes over it, to step 4, and says why.
  for (const auto& entry :
       std::filesystem::directory_iterator(checkpoint::StepDirectory(o.checkpoint_dir, 6))) {
    if (entry.path().filename() != "metadata.pb") std::ofstream(entry.path()) << "torn";
  }
  // N = 4 resumes and fits to global step 10 (NOTE [Training to a global step]): 6 steps.
  o.max_steps = 10;
  ResumeResult resumed;
  const FitRun second = FitOn(4, o, /*resume=*/true, &resumed);
  ASSERT_TRUE(resumed.resumed);
  EXPECT_EQ(resumed.dir, checkpoint::StepDirectory(o.checkpoint_dir, 4));
  EXPECT_EQ(resumed.loaded.step, 4);
  ASSERT_EQ(resumed.skipped.size(), 1u);
  EXPECT_THAT(resumed.skipped[0], HasSubstr("step-000000006"));
  // Steps 5 .. 10 and the released weights: the uninterrupted run's, bit for bit.
  ASSERT_EQ(uninterrupted.losses.size(), 10u);
  ASSERT_EQ(second.losses.size(), 6u);
  EXPECT_EQ(std::vector<double>(uninterrupted.losses.begin() + 4, uninterrupted.losses.end()),
            second.losses);
  EXPECT_EQ(uninterrupted.params, second.params);
  EXPECT_EQ(std::vector<double>(uninterrupted.losses.begin(), uninterrupted.losses.begin() + 6),
            first.losses);
}

// A disk that fills while a periodic checkpoint is written: Fit fails on every rank naming
// the rank and the disk, the previous checkpoint is intact and loads, and nothing of the failed
// save is left beside it.
TEST_P(PeriodicSavesTest, ADiskThatFillsDuringASaveKeepsThePreviousCheckpoint) {
  StageOptions o = With(Deterministic(8), "diskfull");
  o.checkpoint_every_steps = 2;
  const absl::Status full = absl::ResourceExhaustedError("No space left on device");
  absl::Status s = RunRanks(2, [&](comm::testing::RankContext& ctx) -> absl::Status {
    StageOptions mine = o;
    if (ctx.rank == 1) {
      mine.testonly_write_error = [&](int64_t step) { return step == 6 ? full : absl::OkStatus(); };
    }
    ASSIGN_OR_RETURN(auto module, GptTrainModule::Create(testing::TinyGpt(16, 16, 3)));
    ASSIGN_OR_RETURN(auto runner, StageRunner::Create(ctx.group, mine));
    return runner->Fit(*module).status();
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("rank 1"));
  EXPECT_THAT(s.message(), HasSubstr("No space left on device"));
  EXPECT_THAT(s.message(), HasSubstr("step-000000006"));
  std::vector<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator(o.checkpoint_dir)) {
    left.push_back(entry.path().filename().string());
  }
  std::sort(left.begin(), left.end());
  EXPECT_THAT(left, ElementsAre("step-000000002", "step-000000004")) << "no temporary left";
  ResumeResult resumed;
  o.max_steps = 8;
  const FitRun rest = FitOn(2, o, /*resume=*/true, &resumed);
  EXPECT_EQ(resumed.dir, checkpoint::StepDirectory(o.checkpoint_dir, 4));
  EXPECT_TRUE(resumed.skipped.empty());
  EXPECT_EQ(rest.losses.size(), 4u);
  EXPECT_EQ(rest.params, FitOn(1, Deterministic(8), /*resume=*/false).params);
}

INSTANTIATE_TEST_SUITE_P(SyncAndAsync, PeriodicSavesTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Async" : "Sync"; });

TEST(PeriodicCheckpointTest, ResumingWithNoCheckpointStartsFresh) {
  StageOptions o = Deterministic(2);
  o.checkpoint_dir = Dir("none");
  ResumeResult resumed;
  resumed.resumed = true;
  const FitRun run = FitOn(2, o, /*resume=*/true, &resumed);
  EXPECT_FALSE(resumed.resumed);
  EXPECT_EQ(run.losses, FitOn(2, Deterministic(2), /*resume=*/false).losses);
}

// NOTE [Training to a global step]: a run already at max_steps trains nothing and saves
// nothing.
TEST(PeriodicCheckpointTest, AFitAtMaxStepsTrainsNothing) {
  StageOptions o = Deterministic(4);
  o.checkpoint_dir = Dir("at_max");
  o.checkpoint_every_steps = 2;
  o.max_steps = 4;
  EXPECT_EQ(FitOn(2, o, /*resume=*/false).losses.size(), 4u);
  const auto before = checkpoint::ListStepCheckpoints(o.checkpoint_dir);
  ResumeResult resumed;
  const FitRun again = FitOn(2, o, /*resume=*/true, &resumed);
  EXPECT_EQ(resumed.loaded.step, 4);
  EXPECT_TRUE(again.losses.empty());
  EXPECT_TRUE(again.checkpoints.empty());
  EXPECT_EQ(*checkpoint::ListStepCheckpoints(o.checkpoint_dir), *before);
  o.max_steps = -1;
  EXPECT_THAT(o.Validate(2).message(), HasSubstr("StageOptions.max_steps = -1"));
}

TEST(PeriodicCheckpointTest, ASingleSaveNeverReplacesADirectoryOfStepCheckpoints) {
  StageOptions o = Deterministic(2);
  o.checkpoint_dir = Dir("guard");
  o.checkpoint_every_steps = 1;
  FitOn(2, o, /*resume=*/false);
  o.checkpoint_every_steps = 0;  // the one save at the end would replace the directory
  absl::Status s = RunRanks(2, [&](comm::testing::RankContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(auto module, GptTrainModule::Create(testing::TinyGpt(16, 16, 3)));
    ASSIGN_OR_RETURN(auto runner, StageRunner::Create(ctx.group, o));
    return runner->Fit(*module).status();
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("holds 2 step checkpoints"));
  EXPECT_EQ(checkpoint::ListStepCheckpoints(o.checkpoint_dir)->size(), 2u);
}

TEST(PeriodicCheckpointTest, OptionsWithoutACheckpointDirAreRefused) {
  StageOptions o = Deterministic(2);
  o.checkpoint_every_steps = 5;
  EXPECT_THAT(o.Validate(2).message(), HasSubstr("checkpoint_dir"));
  o = Deterministic(2);
  o.checkpoint_dir = Dir("bad");
  o.keep_checkpoints = -1;
  EXPECT_THAT(o.Validate(2).message(), HasSubstr("StageOptions.keep_checkpoints = -1"));
  o.keep_checkpoints = 0;
  o.checkpoint_every_minutes = -1;
  EXPECT_THAT(o.Validate(2).message(), HasSubstr("checkpoint_every_minutes"));
}

}  // namespace
}  // namespace integration
