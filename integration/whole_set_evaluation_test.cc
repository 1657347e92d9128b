// NOTE [Whole-set evaluation] through the StageRunner over thread ranks, on token files:
// validate and test evaluate every window of the evaluation file exactly once (the last
// batch padded, padding counted 0, a rank of padding only still running), the loss is the
// exact mean over all target tokens, the same at every world size (in the deterministic
// mode the same bits), and ranks that would run different batch counts fail, not hang.
#include <cmath>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "comm/testing/thread_ranks.h"
#include "core/status_macros.h"
#include "data/token_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/gpt_module.h"
#include "integration/stage_runner.h"
#include "integration/testing/stage_testing.h"

namespace integration {
namespace {

using ::testing::HasSubstr;
using testing::RunRanks;

constexpr int kSeqLen = 8;    // testing::TinyGpt's
constexpr int kWindows = 13;  // a multiple of no batch size below

std::string Dir(const std::string& name) { return ::testing::TempDir() + "/whole_set_" + name; }

// `windows` windows of pseudo-random tokens below 16 from `seed`, as a nanoGPT file.
std::string WriteTokens(const std::string& name, int windows, uint32_t seed) {
  const std::string path = Dir(name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  uint32_t x = seed * 2654435761u + 12345u;
  for (int i = 0; i < windows * kSeqLen + 1; ++i) {
    x = x * 1664525u + 1013904223u;
    const uint16_t t = static_cast<uint16_t>((x >> 16) % 16);
    out.write(reinterpret_cast<const char*>(&t), 2);
  }
  return path;
}

GptModuleOptions OnTokens(const std::string& eval_path) {
  GptModuleOptions o = testing::TinyGpt(16, 16, 3);
  o.data_path = eval_path;
  o.eval_data_path = eval_path;
  return o;
}

// The mean over every window's target tokens of -log softmax(logits)[target], computed in
// one process on the plain model, one window at a time, in double.
double DirectMean(const std::string& path) {
  std::unique_ptr<GptTrainModule> module = GptTrainModule::Create(OnTokens(path)).value();
  const data::TokenFile tokens = data::TokenFile::Open(path).value();
  EXPECT_EQ(tokens.NumWindows(kSeqLen), kWindows);
  double sum = 0;
  int64_t count = 0;
  for (int64_t w = 0; w < tokens.NumWindows(kSeqLen); ++w) {
    const data::WindowBatch one = tokens.Windows(w, 1, kSeqLen, 16).value();
    const std::vector<float> logits = module->model()->Forward(one.batch.inputs).value().ToVector();
    const std::vector<float> targets = one.batch.targets.ToVector();
    for (int t = 0; t < kSeqLen; ++t) {
      const float* row = logits.data() + t * 16;
      double most = row[0], total = 0;
      for (int v = 0; v < 16; ++v) most = std::max<double>(most, row[v]);
      for (int v = 0; v < 16; ++v) total += std::exp(row[v] - most);
      sum += most + std::log(total) - row[static_cast<int>(targets[static_cast<size_t>(t)])];
      ++count;
    }
  }
  return sum / static_cast<double>(count);
}

struct Evaluated {
  EvalResult validate;
  EvalResult test;
};

// Validate and Test on `n` ranks (rank 0's results; every rank's are checked equal).
Evaluated EvaluateOn(int n, const StageOptions& options, const std::string& path) {
  std::vector<Evaluated> out(static_cast<size_t>(n));
  const absl::Status s = RunRanks(n, [&](comm::testing::RankContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(auto module, GptTrainModule::Create(OnTokens(path)));
    ASSIGN_OR_RETURN(auto runner, StageRunner::Create(ctx.group, options));
    ASSIGN_OR_RETURN(out[static_cast<size_t>(ctx.rank)].validate, runner->Validate(*module));
    ASSIGN_OR_RETURN(out[static_cast<size_t>(ctx.rank)].test, runner->Test(*module));
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  for (const Evaluated& e : out) {
    EXPECT_EQ(e.test.loss, out[0].test.loss);
    EXPECT_EQ(e.test.count, out[0].test.count);
  }
  return out[0];
}

StageOptions EvalOptions(int eval_batch_size) {
  StageOptions o = testing::TinyStages(/*rows=*/8, /*fit_steps=*/1);
  o.eval_batch_size = eval_batch_size;
  o.eval_batches = 1;  // does not limit a whole-set evaluation
  return o;
}

// 13 windows in batches of 4: 4 batches, the last one window and three rows of padding; at
// N = 4 ranks 1 to 3 hold padding only in it and still run. Every window once: 13 x 8
// target tokens, and the loss is their exact mean, at every world size.
TEST(WholeSetEvaluationTest, EveryWindowOnceAndTheExactMeanAtEveryWorldSize) {
  const std::string path = WriteTokens("exact.bin", kWindows, 1);
  const double direct = DirectMean(path);
  for (int n : {1, 2, 4}) {
    const Evaluated e = EvaluateOn(n, EvalOptions(4), path);
    for (const EvalResult& r : {e.validate, e.test}) {
      EXPECT_TRUE(r.whole_set);
      EXPECT_EQ(r.batches, 4) << n;
      EXPECT_EQ(r.count, kWindows * kSeqLen) << n;
      EXPECT_NEAR(r.loss, direct, 1e-5 * direct) << n;
    }
    // Validate and test read the same file: the same windows, the same mean.
    EXPECT_NEAR(e.validate.loss, e.test.loss, 1e-6 * direct);
  }
}

// NOTE [Deterministic training]: batches of 8 rows in 4 micro-batches of 2; the last batch
// has 5 windows, so micro-batch 2 is half padding and micro-batch 3 all padding. The loss
// is the same bits at N = 1, 2 and 4.
TEST(WholeSetEvaluationTest, TheDeterministicModeGivesTheSameBitsAtEveryWorldSize) {
  const std::string path = WriteTokens("bits.bin", kWindows, 2);
  StageOptions o = EvalOptions(8);
  o.wrap.deterministic = true;
  o.deterministic_micro_batches = 4;
  const Evaluated one = EvaluateOn(1, o, path);
  EXPECT_EQ(one.test.batches, 2);
  EXPECT_EQ(one.test.count, kWindows * kSeqLen);
  EXPECT_NEAR(one.test.loss, DirectMean(path), 1e-5 * one.test.loss);
  for (int n : {2, 4}) {
    const Evaluated e = EvaluateOn(n, o, path);
    EXPECT_EQ(e.test.loss, one.test.loss) << n;  // bits
    EXPECT_EQ(e.validate.loss, one.validate.loss) << n;
    EXPECT_EQ(e.test.count, one.test.count) << n;
  }
  // eval_batch_size must divide into the micro-batches.
  o.eval_batch_size = 6;
  EXPECT_THAT(o.Validate(2).message(), HasSubstr("StageOptions.eval_batch_size = 6"));
}

// Rank 1's evaluation file has another number of windows: it would run another number of
// batches, so every rank fails naming it instead of waiting for the others.
TEST(WholeSetEvaluationTest, RanksThatWouldRunDifferentBatchCountsFailTogether) {
  const std::string path = WriteTokens("rank0.bin", kWindows, 3);
  const std::string other = WriteTokens("rank1.bin", 2 * kWindows, 3);
  std::vector<absl::Status> got(2);
  const absl::Status s = RunRanks(2, [&](comm::testing::RankContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(auto module, GptTrainModule::Create(OnTokens(ctx.rank == 1 ? other : path)));
    ASSIGN_OR_RETURN(auto runner, StageRunner::Create(ctx.group, EvalOptions(4)));
    got[static_cast<size_t>(ctx.rank)] = runner->Test(*module).status();
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  for (const absl::Status& r : got) {
    EXPECT_EQ(r.code(), absl::StatusCode::kFailedPrecondition) << r;
    EXPECT_THAT(r.message(), HasSubstr("test: rank 1 would run 7 batches and rank 0 4"));
  }
}

// The Markov language has no finite held-out set: StageOptions::eval_batches batches.
TEST(WholeSetEvaluationTest, TheLanguageRunsEvalBatches) {
  StageOptions o = EvalOptions(4);
  o.eval_batches = 3;
  EvalResult result;
  const absl::Status s = RunRanks(2, [&](comm::testing::RankContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(auto module, GptTrainModule::Create(testing::TinyGpt(16, 16, 3)));
    ASSIGN_OR_RETURN(auto runner, StageRunner::Create(ctx.group, o));
    ASSIGN_OR_RETURN(EvalResult r, runner->Test(*module));
    if (ctx.rank == 0) result = r;
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_FALSE(result.whole_set);
  EXPECT_EQ(result.batches, 3);
  EXPECT_EQ(result.count, 3 * 4 * kSeqLen);
}

}  // namespace
}  // namespace integration
