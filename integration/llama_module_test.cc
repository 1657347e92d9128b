// LlamaTrainModule: the Llama through the decoder module the GPT uses: its spec (what the
// main job wraps and counts), bad options named, and one process learning the Markov
// language with it. (FSDP parity is fsdp:llama_parity_test; the main job with
// --model=llama is trainer:llama_e2e_test.)
#include "integration/llama_module.h"

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace integration {
namespace {

using ::testing::HasSubstr;

LlamaModuleOptions Tiny() {
  LlamaModuleOptions o;  // LlamaConfig's defaults: V 64, width 64, 2 layers, 4 heads, 2 kv
  o.model.hidden_size = 32;
  o.model.intermediate_size = 88;
  o.model.max_position_embeddings = 16;
  o.model.seed = 3;
  o.language.seed = 4;
  o.seq_len = 16;
  o.warmup_steps = 2;
  return o;
}

TEST(LlamaTrainModuleTest, SpecDescribesTheLlama) {
  absl::StatusOr<std::unique_ptr<LlamaTrainModule>> module = LlamaTrainModule::Create(Tiny());
  ASSERT_TRUE(module.ok()) << module.status();
  LlamaTrainModule& m = **module;
  EXPECT_EQ(std::static_pointer_cast<core::Module>(m.llama()), m.model());
  EXPECT_EQ(m.model()->TypeName(), "Llama");
  EXPECT_EQ(m.spec().block_type, "LlamaDecoderLayer");
  EXPECT_EQ(m.spec().num_layers, 2);
  EXPECT_EQ(m.spec().hidden_size, 32);
  EXPECT_EQ(m.spec().vocab_size, 64);
  EXPECT_EQ(m.language().vocab_size(), 64);
  EXPECT_GT(m.EntropyFloor(), 0);
}

TEST(LlamaTrainModuleTest, BadOptionsNameTheOption) {
  LlamaModuleOptions o = Tiny();
  o.seq_len = 17;  // longer than max_position_embeddings 16
  absl::Status s = LlamaTrainModule::Create(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("LlamaModuleOptions.seq_len = 17"));
  EXPECT_THAT(s.message(), HasSubstr("LlamaConfig.max_position_embeddings = 16"));
  o = Tiny();
  o.model.num_key_value_heads = 3;
  s = LlamaTrainModule::Create(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("LlamaConfig.num_key_value_heads (3)"));
  o = Tiny();
  o.warmup_steps = -1;
  EXPECT_THAT(LlamaTrainModule::Create(o).status().message(),
              HasSubstr("LlamaModuleOptions.warmup_steps"));
  o = Tiny();
  o.data_path = "/nonexistent/train.bin";
  EXPECT_THAT(LlamaTrainModule::Create(o).status().message(),
              HasSubstr("LlamaModuleOptions.data_path: "));
}

// 40 AdamW steps on one process: the loss falls from about log V towards the floor.
TEST(LlamaTrainModuleTest, LearnsTheLanguageOnOneProcess) {
  absl::StatusOr<std::unique_ptr<LlamaTrainModule>> module = LlamaTrainModule::Create(Tiny());
  ASSERT_TRUE(module.ok()) << module.status();
  LlamaTrainModule& m = **module;
  absl::StatusOr<std::unique_ptr<optim::Optimizer>> opt =
      m.ConfigureOptimizer(m.model()->NamedParameters());
  ASSERT_TRUE(opt.ok()) << opt.status();
  StepContext ctx;
  ctx.batch_size = 8;
  double first = 0, last = 0;
  for (int64_t step = 0; step < 40; ++step) {
    ctx.step = step;
    (*opt)->set_lr(*m.LearningRate(step));
    (*opt)->ZeroGrad();
    absl::StatusOr<StepOutput> out = m.TrainingStep(ctx);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->count, 8 * 16);
    ASSERT_TRUE((*opt)->Step().ok());
    // NOTE [Deferred loss]: the step leaves its loss on the device until read.
    absl::StatusOr<double> loss = out->ReadLoss();
    ASSERT_TRUE(loss.ok()) << loss.status();
    if (step == 0) first = *loss;
    last = *loss;
  }
  EXPECT_NEAR(first, std::log(64.0), 0.2);
  ctx.stage = Stage::kTest;
  ctx.step = 0;
  absl::StatusOr<StepOutput> test = m.EvaluationStep(ctx);
  ASSERT_TRUE(test.ok()) << test.status();
  std::printf("first loss %.4f, last %.4f, test %.4f, floor %.4f\n", first, last, test->loss,
              m.EntropyFloor());
  EXPECT_LT(last, first - 1.0);
  EXPECT_LT(test->loss, first - 1.0);
}

}  // namespace
}  // namespace integration
