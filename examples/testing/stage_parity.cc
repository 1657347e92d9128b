#include "examples/testing/stage_parity.h"

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
