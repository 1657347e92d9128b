// NOTE [Functional fusions] (nn/functional/fused.h) at the model level: nn::Gpt written as a
// forward-only graph module (nn/functional/testing/graph_gpt.h: the embeddings added by BiasAdd,
// the blocks of fused steps, ln_f, the tied head) over the Gpt's own parameters gives its logits,
// its loss (F::CrossEntropy against nn::CrossEntropyLoss) and every parameter gradient bit for
// bit, with fp32 weights and with the bf16 weights of FSDP's mixed precision, the tied wte
// gradient (head and embedding) included.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/autograd.h"
#include "core/random.h"
#include "gtest/gtest.h"
#include "nn/functional/fused.h"
#include "nn/functional/internal/layer_test_util.h"
#include "nn/functional/loss.h"
#include "nn/functional/testing/graph_gpt.h"
#include "nn/gpt.h"
#include "nn/losses.h"
#include "nn/testing/gradcheck.h"
#include "nn/to_device.h"

namespace nn {
namespace functional {
namespace {

using core::DType;
using core::Tensor;
using layer_test_util::ExpectSameBits;

// The logits, the loss (as a one-element tensor) and every parameter gradient
// (NamedParameters order) of one step.
struct Step {
  Tensor logits;
  float loss = 0;
  std::vector<Tensor> grads;
};

Tensor Tokens(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  return gradcheck::RandomTokens(B, T, V, seed);
}

Step HandWritten(nn::Gpt& gpt, const Tensor& tokens, const Tensor& targets) {
  Step step;
  gpt.ZeroGrad(/*set_to_none=*/true);
  absl::StatusOr<Tensor> logits = gpt.Forward(tokens);
  EXPECT_TRUE(logits.ok()) << logits.status();
  if (!logits.ok()) return step;
  absl::StatusOr<nn::LossResult> loss = nn::CrossEntropyLoss(*logits, targets);
  EXPECT_TRUE(loss.ok()) << loss.status();
  if (!loss.ok()) return step;
  EXPECT_TRUE(gpt.Backward(loss->grad).ok());
  step.logits = *logits;
  step.loss = loss->loss;
  for (const auto& [name, p] : gpt.NamedParameters()) step.grads.push_back(p->grad);
  return step;
}

Step Graph(nn::Gpt& gpt, const Tensor& tokens, const Tensor& targets) {
  Step step;
  gpt.ZeroGrad(/*set_to_none=*/true);
  auto graph = std::make_shared<testing::GraphGpt>(gpt);
  absl::StatusOr<Tensor> logits = graph->CallOne({tokens});
  EXPECT_TRUE(logits.ok()) << logits.status();
  if (!logits.ok()) return step;
  absl::StatusOr<Tensor> loss = CrossEntropy(*logits, targets);
  EXPECT_TRUE(loss.ok()) << loss.status();
  if (!loss.ok()) return step;
  const absl::Status back = core::Backward(*loss);
  EXPECT_TRUE(back.ok()) << back;
  step.logits = *logits;
  step.loss = loss->ToVector()[0];
  for (const auto& [name, p] : gpt.NamedParameters()) step.grads.push_back(p->grad);
  return step;
}

class GptGraphTest : public ::testing::TestWithParam<DType> {};

TEST_P(GptGraphTest, LogitsLossAndEveryGradientAreTheHandWrittenGptsBits) {
  nn::GptConfig config;
  config.vocab_size = 32;
  config.block_size = 8;
  config.n_embd = 32;
  config.n_layer = 2;
  config.n_head = 2;
  config.seed = 7;
  absl::StatusOr<std::shared_ptr<nn::Gpt>> gpt = nn::Gpt::Create(config);
  ASSERT_TRUE(gpt.ok()) << gpt.status();
  // Off the special points of the initialisation (LayerNorm's 1 and 0).
  gradcheck::RandomizeParameters(**gpt, /*seed=*/5, 0.0f, 0.3f);
  ASSERT_TRUE(nn::ConvertParameters(**gpt, GetParam()).ok());
  const Tensor tokens = Tokens(3, 8, config.vocab_size, 1);
  const Tensor targets = Tokens(3, 8, config.vocab_size, 2);

  const Step want = HandWritten(**gpt, tokens, targets);
  const Step got = Graph(**gpt, tokens, targets);
  ASSERT_EQ(got.grads.size(), want.grads.size());
  ASSERT_TRUE(got.logits.defined());
  EXPECT_EQ(got.logits.dtype(), want.logits.dtype());
  ExpectSameBits(got.logits, want.logits, "logits");
  EXPECT_EQ(std::memcmp(&got.loss, &want.loss, sizeof(float)), 0)
      << "loss " << got.loss << " vs " << want.loss;
  const std::vector<core::NamedParameter> params = (*gpt)->NamedParameters();
  for (size_t i = 0; i < params.size(); ++i) {
    ExpectSameBits(got.grads[i], want.grads[i], params[i].first + " gradient");
  }
}

INSTANTIATE_TEST_SUITE_P(Fp32AndBf16Weights, GptGraphTest,
                         ::testing::Values(DType::kFloat32, DType::kBFloat16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(core::DTypeName(info.param));
                         });

}  // namespace
}  // namespace functional
}  // namespace nn
