#include "examples/testing/stage_parity.h"

#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/status_macros.h"
#include "integration/stage_runner.h"
#include "integration/testing/stage_testing.h"

namespace examples {
namespace testing {

std::vector<std::pair<std::string, std::vector<float>>> FullParameters(const core::Module& model) {
  std::vector<std::pair<std::string, std::vector<float>>> out;
  for (const core::NamedParameter& p : model.NamedParameters()) {
    out.emplace_back(p.first, p.second->data.ToVector());
  }
  return out;
}

absl::StatusOr<fsdp::testing::TrainingRun> FitAndRelease(int world,
                                                         const integration::StageOptions& options,
                                                         const ModuleFactory& make) {
  absl::Mutex mu;
  std::vector<fsdp::testing::TrainingRun> runs(world);
  RETURN_IF_ERROR(
      integration::testing::RunRanks(world, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(std::unique_ptr<integration::TrainModule> module, make());
        ASSIGN_OR_RETURN(auto runner, integration::StageRunner::Create(ctx.group, options));
        ASSIGN_OR_RETURN(integration::FitResult fit, runner->Fit(*module));
        RETURN_IF_ERROR(runner->Release(*module));
        fsdp::testing::TrainingRun run{fit.losses, FullParameters(*module->model())};
        absl::MutexLock lock(&mu);
        runs[ctx.rank] = std::move(run);
        return absl::OkStatus();
      }));
  for (int r = 1; r < world; ++r) {
    const absl::Status same = fsdp::testing::CompareRuns(runs[0], runs[r], 0, 0);
    if (!same.ok()) {
      return absl::InternalError(
          absl::StrCat("rank ", r, " differs from rank 0: ", same.message()));
    }
  }
  return runs[0];
}

namespace {

// NOTE [Parity tolerance] in fsdp/parity_test.cc.
constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;

std::vector<float> Flat(const fsdp::testing::TrainingRun& run) {
  std::vector<float> out;
  for (const auto& [name, values] : run.params) out.insert(out.end(), values.begin(), values.end());
  return out;
}

}  // namespace

void CheckStagesAndResume(const ModuleFactory& make, integration::StageOptions options, int units,
                          const std::string& dir) {
  options.checkpoint_dir = dir;
  options.fit_steps = 4;
  fsdp::testing::TrainingRun released;
  absl::Status s =
      integration::testing::RunRanks(2, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(std::unique_ptr<integration::TrainModule> module, make());
        const std::shared_ptr<core::Module> model = module->model();
        const std::vector<core::ParameterPtr> before = model->Parameters();
        ASSIGN_OR_RETURN(auto runner, integration::StageRunner::Create(ctx.group, options));
        ASSIGN_OR_RETURN(integration::FitResult fit, runner->Fit(*module));
        EXPECT_EQ(fit.report.wrap.units, units);
        ASSIGN_OR_RETURN(integration::EvalResult validate, runner->Validate(*module));
        ASSIGN_OR_RETURN(integration::EvalResult test, runner->Test(*module));
        for (const integration::EvalResult* r : {&validate, &test}) {
          EXPECT_TRUE(r->report.wrap.reused);
          EXPECT_EQ(r->report.wrap.param_bytes_copied, 0);
        }
        EXPECT_NE(validate.loss, test.loss) << "held-out batches differ per stage";
        ASSIGN_OR_RETURN(integration::FitResult more, runner->Fit(*module, 2));
        EXPECT_TRUE(more.report.wrap.reused);
        EXPECT_EQ(more.first_step, 4);
        RETURN_IF_ERROR(runner->Release(*module));
        EXPECT_EQ(module->model(), model);
        EXPECT_EQ(model->Parameters(), before) << "the same Parameter objects";
        if (ctx.rank == 0) released.params = FullParameters(*model);
        return absl::OkStatus();
      });
  ASSERT_TRUE(s.ok()) << s;
  // N = 4 resumes what the second Fit saved (model and optimizer, at step 6).
  fsdp::testing::TrainingRun resumed;
  options.checkpoint_dir.clear();
  options.fit_steps = 2;
  s = integration::testing::RunRanks(4, [&](comm::testing::RankContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(std::unique_ptr<integration::TrainModule> module, make());
    ASSIGN_OR_RETURN(auto runner, integration::StageRunner::Create(ctx.group, options));
    ASSIGN_OR_RETURN(integration::LoadedCheckpoint loaded,
                     runner->LoadCheckpoint(*module, dir, /*optimizer=*/true));
    EXPECT_EQ(loaded.step, 6);
    EXPECT_EQ(loaded.saved_world_size, 2);
    ASSIGN_OR_RETURN(integration::FitResult fit, runner->Fit(*module));
    EXPECT_EQ(fit.first_step, 6);
    RETURN_IF_ERROR(runner->Release(*module));
    if (ctx.rank == 0) resumed = {fit.losses, FullParameters(*module->model())};
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  // Each equals one uninterrupted rank: 6 steps for the released N = 2 model, 8 for the resumed.
  options.fit_steps = 6;
  absl::StatusOr<fsdp::testing::TrainingRun> six = FitAndRelease(1, options, make);
  ASSERT_TRUE(six.ok()) << six.status();
  const std::vector<float> expected = Flat(*six), actual = Flat(released);
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    ASSERT_NEAR(actual[i], expected[i], kAtol + kRtol * std::abs(expected[i])) << "element " << i;
  }
  options.fit_steps = 8;
  absl::StatusOr<fsdp::testing::TrainingRun> eight = FitAndRelease(1, options, make);
  ASSERT_TRUE(eight.ok()) << eight.status();
  eight->losses.erase(eight->losses.begin(), eight->losses.begin() + 6);
  EXPECT_EQ(absl::OkStatus(), fsdp::testing::CompareRuns(*eight, resumed, kRtol, kAtol));
}

void CheckParityWithOneRank(const integration::StageOptions& options, const ModuleFactory& make,
                            const fsdp::testing::StrategyCase& c) {
  absl::StatusOr<fsdp::testing::TrainingRun> one = FitAndRelease(1, options, make);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_FALSE(one->losses.empty());
  EXPECT_GT(one->losses.front(), one->losses.back() + 0.1) << "the steps train";
  absl::StatusOr<fsdp::testing::TrainingRun> run =
      FitAndRelease(c.world_size, WithStrategy(options, c), make);
  ASSERT_TRUE(run.ok()) << run.status();
  double worst = 0;
  EXPECT_EQ(absl::OkStatus(), fsdp::testing::CompareRuns(*one, *run, kRtol, kAtol, &worst));
  std::printf("worst |error| / tolerance: %.3g\n", worst);
}

void CheckSameBitsAtEveryWorldSize(const integration::StageOptions& options,
                                   const ModuleFactory& make) {
  absl::StatusOr<fsdp::testing::TrainingRun> one = FitAndRelease(1, options, make);
  ASSERT_TRUE(one.ok()) << one.status();
  for (int n : {2, 4}) {
    absl::StatusOr<fsdp::testing::TrainingRun> run = FitAndRelease(n, options, make);
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_EQ(absl::OkStatus(), fsdp::testing::CompareRuns(*one, *run, 0, 0)) << "N = " << n;
  }
}

std::vector<fsdp::testing::StrategyCase> EveryStrategyCase() {
  using fsdp::ShardingStrategy;
  std::vector<fsdp::testing::StrategyCase> cases;
  for (int n : {2, 4}) {
    cases.push_back({ShardingStrategy::kFullShard, n, 0});
    cases.push_back({ShardingStrategy::kShardGradOp, n, 0});
    cases.push_back({ShardingStrategy::kNoShard, n, 0});
    cases.push_back({ShardingStrategy::kHybridShard, n, n / 2});
  }
  return cases;
}

integration::StageOptions WithStrategy(integration::StageOptions options,
                                       const fsdp::testing::StrategyCase& c) {
  options.wrap.strategy = c.strategy;
  options.wrap.hybrid_shard_size = c.hybrid_shard_size;
  options.wrap.timeout = absl::Seconds(60);
  return options;
}

integration::StageOptions Deterministic(integration::StageOptions options, int micro_batches) {
  options.wrap.deterministic = true;
  options.deterministic_micro_batches = micro_batches;
  return options;
}

}  // namespace testing
}  // namespace examples
