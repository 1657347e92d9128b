#include "integration/gpt_training.h"

#include <cmath>

#include "gtest/gtest.h"

namespace integration {
namespace {

// The foundation's learning claim: a few hundred AdamW steps bring the small GPT within
// 10% of the language's exact entropy floor, on unseen sequences. The floor is at most
// half of log V (the loss of a model that learnt nothing), so reaching it is learning.
TEST(GptTrainingTest, SmallGptReachesTheEntropyFloor) {
  GptTrainingOptions options;  // V 64, context 32, width 64, 2 layers, 4 heads; order 1
  options.steps = 300;
  options.log_every = 100;
  int reports = 0;
  absl::StatusOr<GptTrainingResult> result =
      TrainGpt(options, [&reports](const TrainingProgress& p) {
        ++reports;
        EXPECT_GT(p.memory.peak(core::MemoryTag::kParam), 0);
        EXPECT_GT(p.memory.peak(core::MemoryTag::kOptim), 0);
      });
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(reports, 3);
  ASSERT_EQ(result->losses.size(), 300u);
  EXPECT_LE(result->entropy_floor, 0.5 * result->log_vocab);
  // An untrained model starts near log V.
  EXPECT_NEAR(result->losses.front(), result->log_vocab, 0.5);
  EXPECT_LE(result->eval_loss, 1.10 * result->entropy_floor)
      << "eval " << result->eval_loss << " floor " << result->entropy_floor;
  // No model beats the floor by more than the sampling noise of 8 x 16 x 32 = 4096
  // evaluation tokens: per-token loss std is about 1 nat, so one standard error is about
  // 1/64 and 0.07 is over 4 of them.
  EXPECT_GE(result->eval_loss, result->entropy_floor - 0.07);
  // AdamW holds two fp32 states per parameter: optimizer bytes are twice parameter bytes.
  EXPECT_EQ(result->memory.peak(core::MemoryTag::kOptim),
            2 * result->memory.peak(core::MemoryTag::kParam));
}

TEST(GptTrainingTest, BadOptionsNameTheOption) {
  GptTrainingOptions options;
  options.seq_len = 64;  // longer than block_size 32
  absl::StatusOr<GptTrainingResult> result = TrainGpt(options);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(result.status().message().find("seq_len"), std::string::npos);
  options = GptTrainingOptions();
  options.steps = 0;
  EXPECT_NE(TrainGpt(options).status().message().find("steps"), std::string::npos);
}

}  // namespace
}  // namespace integration
