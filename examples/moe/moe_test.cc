// The mixture-of-experts decoder through the stage API: the router sends each token to its
// top 2 experts and adds their outputs back with the normalised router weights; the balance
// loss is NOTE [Sequence-level balance loss]'s; policy-wrapped FSDP on N = 2 and 4 ranks trains
// to the losses and weights of N = 1 under every strategy; fit, validate, test, re-wrap,
// checkpoint resumed at another world size and release; the deterministic mode's bits at every
// world size; and it learns from a token file.
#include "examples/moe/moe.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/random.h"
#include "core/status_macros.h"
#include "data/markov_language.h"
#include "examples/moe/moe_module.h"
#include "examples/testing/stage_parity.h"
#include "fsdp/testing/gpt_training.h"
#include "gtest/gtest.h"
#include "integration/testing/stage_testing.h"
#include "nn/functional/functional.h"

namespace moe {
namespace {

namespace F = ::nn::functional;
using ::examples::testing::FitAndRelease;
using ::fsdp::testing::StrategyCase;
using ::fsdp::testing::TrainingRun;

// A nanoGPT token file (uint16 tokens) of 20,000 tokens of the test Markov language over 32
// symbols, written once.
const std::string& TokenPath() {
  static const std::string* path = [] {
    auto* p = new std::string(::testing::TempDir() + "/moe_tokens.bin");
    data::MarkovLanguageOptions options;
    options.vocab_size = 32;
    data::MarkovLanguage language = data::MarkovLanguage::Create(options).value();
    const std::vector<float> tokens = language.Batch(0, 100, 200).value().inputs.ToVector();
    std::vector<uint16_t> out(tokens.begin(), tokens.end());
    std::ofstream f(*p, std::ios::binary);
    f.write(reinterpret_cast<const char*>(out.data()), out.size() * sizeof(uint16_t));
    return p;
  }();
  return *path;
}

MoeModuleOptions Small() {
  MoeModuleOptions o;
  o.train_tokens = TokenPath();
  o.optimizer.adamw.lr = 3e-3;
  return o;
}

// NOTE [Parity optimizer] in examples/seq2seq/seq2seq_test.cc: SGD for the parity runs.
MoeModuleOptions ForParity() {
  MoeModuleOptions o = Small();
  o.optimizer.kind = optim::OptimizerKind::kSgd;
  o.optimizer.sgd.lr = 0.2;
  o.optimizer.sgd.momentum = 0.9;
  return o;
}

examples::testing::ModuleFactory Factory(const MoeModuleOptions& options) {
  return [options]() -> absl::StatusOr<std::unique_ptr<integration::TrainModule>> {
    ASSIGN_OR_RETURN(std::unique_ptr<MoeModule> m, MoeModule::Create(options));
    return std::unique_ptr<integration::TrainModule>(std::move(m));
  };
}

integration::StageOptions Stages(int64_t steps) {
  integration::StageOptions o = integration::testing::TinyStages(/*rows=*/8, steps);
  o.wrap.policy = BlockPolicy();
  return o;
}

core::Tensor RandomActivations(const core::Shape& shape, uint64_t seed) {
  core::Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(shape[0] * shape[1] * shape[2]));
  for (float& x : v) x = rng.Normal(0.0f, 1.0f);
  return core::Tensor::FromVector(v, shape).value();
}

TEST(MoeTest, EachTokenGetsItsTopTwoExpertsWeightedByTheRouter) {
  MoeConfig config;
  MoeLayer layer(config, 7);
  const core::Tensor x = RandomActivations({2, 5, config.width}, 3);
  core::NoGradScope no_grad;
  ASSERT_OK_AND_ASSIGN(core::Tensors out, layer.Call({x}));
  const std::vector<float> y = out[0].ToVector();
  // The router's probabilities, token by token, and each expert on every token.
  core::ParameterPtr router = layer.NamedParameters()[0].second;
  ASSERT_EQ(layer.NamedParameters()[0].first, "router");
  ASSERT_OK_AND_ASSIGN(core::Tensor tokens, F::Reshape(x, {10, config.width}));
  ASSERT_OK_AND_ASSIGN(core::Tensor probs_t, F::Softmax(F::Linear(tokens, router)));
  const std::vector<float> probs = probs_t.ToVector();
  std::vector<std::vector<float>> expert_out;
  for (const auto& expert : layer.experts()) {
    ASSERT_OK_AND_ASSIGN(core::Tensor e, expert->CallOne({tokens}));
    expert_out.push_back(e.ToVector());
  }
  const int64_t c = config.width, e = config.experts;
  std::vector<int> used(e, 0);
  for (int64_t t = 0; t < 10; ++t) {
    std::vector<int> order(e);
    for (int k = 0; k < e; ++k) order[k] = k;
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return probs[t * e + a] > probs[t * e + b]; });
    const int e1 = order[0], e2 = order[1];
    ++used[e1], ++used[e2];
    const double p1 = probs[t * e + e1], p2 = probs[t * e + e2];
    for (int64_t j = 0; j < c; ++j) {
      const double want =
          p1 / (p1 + p2) * expert_out[e1][t * c + j] + p2 / (p1 + p2) * expert_out[e2][t * c + j];
      ASSERT_NEAR(y[t * c + j], want, 1e-5) << "token " << t << " dim " << j;
    }
  }
  EXPECT_EQ(*std::min_element(used.begin(), used.end()) > 0, true) << "every expert chosen";
  // The balance loss: E sum_e f_be P_be, averaged over the 2 sequences.
  double aux = 0;
  for (int b = 0; b < 2; ++b) {
    for (int k = 0; k < e; ++k) {
      double f = 0, p = 0;
      for (int t = b * 5; t < b * 5 + 5; ++t) {
        std::vector<int> order(e);
        for (int q = 0; q < e; ++q) order[q] = q;
        std::stable_sort(order.begin(), order.end(),
                         [&](int a, int z) { return probs[t * e + a] > probs[t * e + z]; });
        f += (order[0] == k) + (order[1] == k);
        p += probs[t * e + k];
      }
      aux += e * (f / 10) * (p / 5) / 2;
    }
  }
  EXPECT_NEAR(out[1].ToVector()[0], aux, 1e-6);
}

TEST(MoeTest, BadInputsAreErrorsNamingThem) {
  MoeDecoder model(MoeConfig{});
  ASSERT_OK_AND_ASSIGN(core::Tensor long_ids,
                       core::Tensor::FromInts(std::vector<int32_t>(17, 1), {1, 17}));
  absl::StatusOr<core::Tensors> out = model.Call({long_ids});
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find("max_positions (16)"), std::string::npos) << out.status();
  MoeModuleOptions one_expert = Small();
  one_expert.model.experts = 1;
  EXPECT_NE(MoeModule::Create(one_expert).status().message().find("experts 1"), std::string::npos);
  MoeModuleOptions no_file = Small();
  no_file.train_tokens = ::testing::TempDir() + "/no_such_tokens";
  EXPECT_EQ(MoeModule::Create(no_file).status().code(), absl::StatusCode::kNotFound);
}

TEST(MoeTest, LearnsFromATokenFile) {
  ASSERT_OK_AND_ASSIGN(TrainingRun run, FitAndRelease(2, Stages(60), Factory(Small())));
  ASSERT_EQ(run.losses.size(), 60u);
  EXPECT_LT(run.losses.back(), run.losses.front() - 0.5);
}

class MoeParityTest : public ::testing::TestWithParam<StrategyCase> {};

TEST_P(MoeParityTest, LossesAndTrainedWeightsMatchOneRank) {
  examples::testing::CheckParityWithOneRank(Stages(6), Factory(ForParity()), GetParam());
}

INSTANTIATE_TEST_SUITE_P(EveryStrategy, MoeParityTest,
                         ::testing::ValuesIn(examples::testing::EveryStrategyCase()),
                         [](const auto& info) {
                           return fsdp::testing::StrategyCaseName(info.param);
                         });

TEST(MoeTest, TheDeterministicModeGivesTheSameBitsAtEveryWorldSize) {
  examples::testing::CheckSameBitsAtEveryWorldSize(examples::testing::Deterministic(Stages(4), 4),
                                                   Factory(Small()));
}

TEST(MoeTest, StagesRewrapCheckpointResumeAtAnotherWorldSizeAndRelease) {
  // 2 blocks and the root.
  examples::testing::CheckStagesAndResume(Factory(ForParity()), Stages(1), /*units=*/3,
                                          ::testing::TempDir() + "/moe_checkpoint");
}

}  // namespace
}  // namespace moe
