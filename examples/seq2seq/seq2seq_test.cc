// The encoder-decoder through the stage API, as its trainer author would use it: the padding
// mask keeps padding out of every real token's output; policy-wrapped FSDP on N = 2 and 4
// ranks trains to the losses and weights of N = 1 under every strategy; fit, validate, test,
// a re-wrap by reuse (0 bytes copied), a checkpoint resumed at another world size and the
// release to a plain module; dropout and the mean over real tokens give the same bits at every
// world size in the deterministic mode; and the model learns the task.
#include "examples/seq2seq/seq2seq.h"

#include <memory>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/status_macros.h"
#include "examples/seq2seq/seq2seq_module.h"
#include "examples/testing/stage_parity.h"
#include "fsdp/testing/gpt_training.h"
#include "gtest/gtest.h"
#include "integration/stage_runner.h"
#include "integration/testing/stage_testing.h"
#include "policy/wrap_policy.h"

namespace seq2seq {
namespace {

using ::examples::testing::FitAndRelease;
using ::fsdp::testing::StrategyCase;
using ::fsdp::testing::TrainingRun;

Seq2SeqModuleOptions Small(double dropout = 0) {
  Seq2SeqModuleOptions o;
  o.model.max_positions = 8;
  o.model.dropout = dropout;
  o.task.max_symbols = 7;
  o.optimizer.adamw.lr = 3e-3;
  return o;
}

// NOTE [Parity optimizer]: the parity runs step with SGD (lr 0.2, momentum 0.9): N ranks give
// gradients within a few fp32 ulps of one rank's (their sums run in another order), which SGD
// carries into the weights as they are (worst |error| / tolerance about 0.2 after 6 steps),
// while a defect (a gradient not averaged, a shard lost) moves them by lr |g| ~ 1e-2. AdamW
// would divide each gradient element by its own magnitude: an element that is near zero by
// cancellation (|g| 1.5e-7 here, among gradients of 0.1 to 1, summed from terms whose ulps are
// 1e-8) then differs by up to lr x 7% between the runs, above the tolerance without any defect.
// AdamW is checked bit for bit in the deterministic mode below.
Seq2SeqModuleOptions ForParity() {
  Seq2SeqModuleOptions o = Small();
  o.optimizer.kind = optim::OptimizerKind::kSgd;
  o.optimizer.sgd.lr = 0.2;
  o.optimizer.sgd.momentum = 0.9;
  return o;
}

examples::testing::ModuleFactory Factory(const Seq2SeqModuleOptions& options) {
  return [options]() -> absl::StatusOr<std::unique_ptr<integration::TrainModule>> {
    ASSIGN_OR_RETURN(std::unique_ptr<Seq2SeqModule> m, Seq2SeqModule::Create(options));
    return std::unique_ptr<integration::TrainModule>(std::move(m));
  };
}

integration::StageOptions Stages(int64_t steps) {
  integration::StageOptions o = integration::testing::TinyStages(/*rows=*/8, steps);
  o.wrap.policy = LayerPolicy();
  return o;
}

std::vector<int32_t> Ints(const core::Tensor& t) {
  std::vector<int32_t> out;
  for (float v : t.ToVector()) out.push_back(static_cast<int32_t>(v));
  return out;
}

TEST(Seq2SeqTest, PaddingNeverReachesARealTokensOutput) {
  ASSERT_OK_AND_ASSIGN(ReverseTask task, ReverseTask::Create(Small().task));
  ASSERT_OK_AND_ASSIGN(ReverseBatch batch, task.Rows(0, 0, 8));
  // The same batch with every padded source position holding a symbol instead of kPad.
  std::vector<int32_t> src = Ints(batch.src), mask = Ints(batch.src_mask);
  int padded = 0;
  for (size_t i = 0; i < src.size(); ++i) {
    if (mask[i] == 0) src[i] = kFirstSymbol + static_cast<int32_t>(i % 5), ++padded;
  }
  ASSERT_GT(padded, 0) << "the batch has padding";
  ASSERT_OK_AND_ASSIGN(core::Tensor other_src, core::Tensor::FromInts(src, batch.src.shape()));
  ASSERT_OK_AND_ASSIGN(
      core::Tensor all_real,
      core::Tensor::FromInts(std::vector<int32_t>(mask.size(), 1), batch.src_mask.shape()));
  Seq2Seq model(Small().model);
  core::NoGradScope no_grad;
  ASSERT_OK_AND_ASSIGN(core::Tensor a, model.CallOne({batch.src, batch.src_mask, batch.tgt}));
  ASSERT_OK_AND_ASSIGN(core::Tensor b, model.CallOne({other_src, batch.src_mask, batch.tgt}));
  EXPECT_EQ(a.ToVector(), b.ToVector()) << "masked padding changed the logits";
  // Without the mask the padding is attended to (the test above can fail).
  ASSERT_OK_AND_ASSIGN(core::Tensor c, model.CallOne({other_src, all_real, batch.tgt}));
  EXPECT_NE(a.ToVector(), c.ToVector());
}

TEST(Seq2SeqTest, BadInputsAreErrorsNamingThem) {
  Seq2Seq model(Small().model);
  ASSERT_OK_AND_ASSIGN(core::Tensor ids, core::Tensor::FromInts({3, 4}, {1, 2}));
  absl::StatusOr<core::Tensor> two = model.CallOne({ids, ids});
  EXPECT_EQ(two.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(two.status().message().find("{src, src_mask, tgt}"), std::string::npos) << two.status();
  ASSERT_OK_AND_ASSIGN(core::Tensor long_ids,
                       core::Tensor::FromInts(std::vector<int32_t>(9, 3), {1, 9}));
  ASSERT_OK_AND_ASSIGN(core::Tensor mask, core::Tensor::FromInts({1, 1}, {1, 1, 1, 2}));
  absl::StatusOr<core::Tensor> too_long = model.CallOne({ids, mask, long_ids});
  EXPECT_NE(too_long.status().message().find("tgt"), std::string::npos) << too_long.status();
  Seq2SeqModuleOptions mismatched = Small();
  mismatched.task.vocab = 20;
  EXPECT_NE(Seq2SeqModule::Create(mismatched).status().message().find("task.vocab"),
            std::string::npos);
}

TEST(Seq2SeqTest, LearnsToReverse) {
  ASSERT_OK_AND_ASSIGN(TrainingRun run, FitAndRelease(2, Stages(60), Factory(Small())));
  ASSERT_EQ(run.losses.size(), 60u);
  EXPECT_LT(run.losses.back(), run.losses.front() - 1.0);
}

class Seq2SeqParityTest : public ::testing::TestWithParam<StrategyCase> {};

TEST_P(Seq2SeqParityTest, LossesAndTrainedWeightsMatchOneRank) {
  examples::testing::CheckParityWithOneRank(Stages(6), Factory(ForParity()), GetParam());
}

INSTANTIATE_TEST_SUITE_P(EveryStrategy, Seq2SeqParityTest,
                         ::testing::ValuesIn(examples::testing::EveryStrategyCase()),
                         [](const auto& info) {
                           return fsdp::testing::StrategyCaseName(info.param);
                         });

TEST(Seq2SeqTest, DropoutAndTheTokenMeanGiveTheSameBitsAtEveryWorldSize) {
  const integration::StageOptions options = examples::testing::Deterministic(Stages(4), 4);
  examples::testing::CheckSameBitsAtEveryWorldSize(options, Factory(Small(0.1)));
  // Dropout was on: without it the run differs.
  ASSERT_OK_AND_ASSIGN(TrainingRun dropout, FitAndRelease(1, options, Factory(Small(0.1))));
  ASSERT_OK_AND_ASSIGN(TrainingRun plain, FitAndRelease(1, options, Factory(Small(0))));
  EXPECT_NE(dropout.losses, plain.losses);
}

TEST(Seq2SeqTest, CheckpointedLayersGiveThePlainRunsBits) {
  integration::StageOptions options = Stages(4);
  ASSERT_OK_AND_ASSIGN(TrainingRun plain, FitAndRelease(2, options, Factory(Small(0.1))));
  // Each layer's activations recomputed in the backward instead of kept.
  options.wrap.checkpoint_policy = policy::ModuleTypes({"EncoderLayer", "DecoderLayer"});
  ASSERT_OK_AND_ASSIGN(TrainingRun checkpointed, FitAndRelease(2, options, Factory(Small(0.1))));
  EXPECT_OK(fsdp::testing::CompareRuns(plain, checkpointed, 0, 0));
}

TEST(Seq2SeqTest, StagesRewrapCheckpointResumeAtAnotherWorldSizeAndRelease) {
  // 2 encoder + 2 decoder layers and the root.
  examples::testing::CheckStagesAndResume(Factory(ForParity()), Stages(1), /*units=*/5,
                                          ::testing::TempDir() + "/seq2seq_checkpoint");
}

}  // namespace
}  // namespace seq2seq
