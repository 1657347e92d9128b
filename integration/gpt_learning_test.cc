// The learning claim of the main job's model: GptTrainModule with its defaults (the
// main job's model and optimizer: V 64, context 32, width 64, 2 layers, 4 heads, AdamW
// lr 1e-2 with 20 warm-up steps; a language of order 1, seed 0), trained by
// StageRunner::Fit (the main job's training loop) on one rank, reaches the language's
// entropy floor on sequences it has not seen.
#include <cmath>
#include <memory>
#include <vector>

#include "comm/testing/thread_ranks.h"
#include "core/allocator.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"
#include "integration/gpt_module.h"
#include "integration/stage_runner.h"
#include "integration/testing/stage_testing.h"
#include "policy/wrap_policy.h"

namespace integration {
namespace {

// A few hundred AdamW steps bring the small GPT within 10% of the language's exact
// entropy floor, on unseen sequences. The floor is at most half of log V (the loss of a
// model that learnt nothing), so reaching it is learning.
TEST(GptLearningTest, SmallGptReachesTheEntropyFloor) {
  INTEGRATION_ASSERT_OK(testing::RunRanks(1, [](comm::testing::RankContext& ctx) -> absl::Status {
    GptModuleOptions model;  // V 64, context 32, width 64, 2 layers, 4 heads; order 1
    ASSIGN_OR_RETURN(std::unique_ptr<GptTrainModule> module, GptTrainModule::Create(model));
    const int64_t param_bytes = 4 * module->model()->NumParameterElements();  // fp32, unwrapped
    StageOptions stages;
    stages.wrap.policy = policy::ModuleTypes({"TransformerBlock"});
    stages.fit_steps = 300;
    stages.train_batch_size = 16;
    stages.eval_batch_size = 16;
    stages.eval_batches = 8;
    stages.log_every = 100;
    ASSIGN_OR_RETURN(std::unique_ptr<StageRunner> runner, StageRunner::Create(ctx.group, stages));
    int reports = 0;
    runner->set_progress_callback([&reports](const Progress& p) {
      ++reports;
      EXPECT_GT(p.memory[0].peak_by_tag[static_cast<int>(core::MemoryTag::kParam)], 0);
      EXPECT_GT(p.memory[0].peak_by_tag[static_cast<int>(core::MemoryTag::kOptim)], 0);
    });
    ASSIGN_OR_RETURN(FitResult fit, runner->Fit(*module));
    EXPECT_EQ(reports, 3);
    EXPECT_EQ(fit.losses.size(), 300u);
    RETURN_IF_ERROR(testing::NoFailuresYet());
    const double floor = module->EntropyFloor();
    const double log_vocab = std::log(static_cast<double>(model.model.vocab_size));
    EXPECT_LE(floor, 0.5 * log_vocab);
    // An untrained model starts near log V.
    EXPECT_NEAR(fit.losses.front(), log_vocab, 0.5);
    // Validation batches are ones training never reaches (kValidateBatchOffset).
    ASSIGN_OR_RETURN(EvalResult eval, runner->Validate(*module));
    EXPECT_LE(eval.loss, 1.10 * floor) << "eval " << eval.loss << " floor " << floor;
    // No model beats the floor by more than the sampling noise of 8 x 16 x 32 = 4096
    // evaluation tokens: per-token loss std is about 1 nat, so one standard error is
    // about 1/64 and 0.07 is over 4 of them.
    EXPECT_EQ(eval.count, 8 * 16 * 32);
    EXPECT_GE(eval.loss, floor - 0.07);
    // AdamW holds two fp32 states per parameter: optimizer bytes are twice the
    // parameters' fp32 bytes (on one rank a shard is the whole parameter; the param tag
    // also counts FSDP's unsharded copies, so it is not the reference).
    EXPECT_EQ(fit.report.memory[0].peak_by_tag[static_cast<int>(core::MemoryTag::kOptim)],
              2 * param_bytes);
    return absl::OkStatus();
  }));
}

}  // namespace
}  // namespace integration
