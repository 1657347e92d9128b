#include "nn/transformer.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/testing/fused_layers.h"
#include "nn/testing/gradcheck.h"

namespace nn {
namespace {

using ::testing::HasSubstr;

std::vector<std::string> Names(const core::Module& m) {
  std::vector<std::string> names;
  for (const auto& [name, p] : m.NamedParameters()) names.push_back(name);
  return names;
}

TEST(MlpTest, ChildrenAndForward) {
  Mlp mlp(4, 1);
  EXPECT_EQ(Names(mlp),
            (std::vector<std::string>{"fc.weight", "fc.bias", "proj.weight", "proj.bias"}));
  EXPECT_EQ(mlp.fc()->weight()->data.shape(), (core::Shape{16, 4}));
  EXPECT_EQ(mlp.proj()->weight()->data.shape(), (core::Shape{4, 16}));
  EXPECT_EQ(mlp.gelu()->Path(), "gelu");
  const core::Tensor x = gradcheck::RandomTensor({2, 3, 4}, 2);
  const std::vector<float> y = mlp.Forward(x).value().ToVector();
  const std::vector<float> manual =
      mlp.proj()
          ->Forward(mlp.gelu()->Forward(mlp.fc()->Forward(x).value()).value())
          .value()
          .ToVector();
  EXPECT_EQ(y, manual);
}

TEST(MlpTest, BackwardMatchesFiniteDifferences) {
  Mlp mlp(4, 1);
  gradcheck::RandomizeParameters(mlp, 3, 0.0f, 0.5f);
  // Tolerances per NOTE [Gradient-check tolerance]; GELU's curvature is O(1).
  absl::StatusOr<gradcheck::Report> r =
      gradcheck::CheckModule(mlp, gradcheck::RandomTensor({2, 3, 4}, 4), {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok()) << r->ToString();
  EXPECT_EQ(r->num_checked, 24 + 64 + 16 + 64 + 4);
}

TEST(TransformerBlockTest, ChildrenInGpt2Order) {
  TransformerBlock block(8, 2, 1);
  EXPECT_EQ(Names(block), (std::vector<std::string>{
                              "ln_1.weight", "ln_1.bias", "attn.qkv.weight", "attn.qkv.bias",
                              "attn.proj.weight", "attn.proj.bias", "ln_2.weight", "ln_2.bias",
                              "mlp.fc.weight", "mlp.fc.bias", "mlp.proj.weight", "mlp.proj.bias"}));
  EXPECT_EQ(block.attn()->qkv()->Path(), "attn.qkv");
}

TEST(TransformerBlockTest, ForwardIsPreLnWithResiduals) {
  TransformerBlock block(8, 2, 1);
  gradcheck::RandomizeParameters(block, 2, 0.0f, 0.5f);
  const core::Tensor x = gradcheck::RandomTensor({2, 3, 8}, 3);
  const std::vector<float> y = block.Forward(x).value().ToVector();
  // h = x + attn(ln_1(x)); y = h + mlp(ln_2(h)), through the children's public Forward.
  const std::vector<float> a =
      block.attn()->Forward(block.ln_1()->Forward(x).value()).value().ToVector();
  core::Tensor h = core::Tensor::Empty(x.shape());
  for (int64_t i = 0; i < h.numel(); ++i) h.data<float>()[i] = x.ToVector()[i] + a[i];
  const std::vector<float> m =
      block.mlp()->Forward(block.ln_2()->Forward(h).value()).value().ToVector();
  for (int64_t i = 0; i < h.numel(); ++i) EXPECT_EQ(y[i], h.data<float>()[i] + m[i]) << i;
}

TEST(TransformerBlockTest, ZeroProjectionsMakeTheBlockTheIdentity) {
  // With both residual branches' last Linear zero, each branch adds exactly 0.
  TransformerBlock block(8, 2, 1);
  for (const std::shared_ptr<Linear>& proj : {block.attn()->proj(), block.mlp()->proj()}) {
    proj->weight()->data.Zero();
    proj->bias()->data.Zero();
  }
  const core::Tensor x = gradcheck::RandomTensor({1, 4, 8}, 3);
  EXPECT_EQ(block.Forward(x).value().ToVector(), x.ToVector());
}

TEST(TransformerBlockTest, BackwardMatchesFiniteDifferences) {
  TransformerBlock block(8, 2, 1);
  // Parameters N(0, 0.5) so LayerNorm weights are not 1 and attention not uniform.
  // Tolerances per NOTE [Gradient-check tolerance]; this is the
  // tightest check there (worst element at ~0.5 of the tolerance, truncation-dominated).
  gradcheck::RandomizeParameters(block, 5, 0.0f, 0.5f);
  absl::StatusOr<gradcheck::Report> r =
      gradcheck::CheckModule(block, gradcheck::RandomTensor({2, 3, 8}, 6), {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok()) << r->ToString();
  EXPECT_EQ(r->num_checked, 48 + block.NumParameterElements());
  EXPECT_GT(r->max_abs_numeric, 0.5);
}

using fused_layers::CountingHook;
using fused_layers::StepBits;

// NOTE [Block forwards]: with no hooks on the children the Mlp and the block run fused
// ops; a hook on the fused children makes them call the children instead, and fire the
// hooks. Both give the same bits: outputs, input gradients, parameter gradients.
TEST(FusedLayersTest, MlpGivesTheSameBitsFusedAndThroughItsChildren) {
  Mlp mlp(16, 1);
  gradcheck::RandomizeParameters(mlp, 2, 0.0f, 0.5f);
  const core::Tensor x = gradcheck::RandomTensor({2, 5, 16}, 3);
  const core::Tensor gy = gradcheck::RandomTensor({2, 5, 16}, 4);
  const auto fused = StepBits(mlp, x, gy);
  ASSERT_EQ(fused.size(), 2u + 4u);
  // The fused Forward bypassed gelu: it has no Forward for a Backward to follow.
  ASSERT_TRUE(mlp.Forward(x).ok());
  EXPECT_EQ(mlp.gelu()->Backward(gy).status().code(), absl::StatusCode::kFailedPrecondition);
  for (const char* hooked : {"fc", "gelu"}) {
    SCOPED_TRACE(hooked);
    int calls = 0;
    core::HookHandle h =
        CountingHook(std::string(hooked) == "fc" ? static_cast<core::Module&>(*mlp.fc())
                                                 : static_cast<core::Module&>(*mlp.gelu()),
                     &calls);
    EXPECT_EQ(StepBits(mlp, x, gy), fused);
    EXPECT_EQ(calls, 1) << "the hooked child's Forward ran";
  }
  int calls = 0;
  {
    core::HookHandle h = CountingHook(*mlp.gelu(), &calls);
    ASSERT_TRUE(mlp.Forward(x).ok());
  }
  EXPECT_EQ(calls, 1);
  // The hook is gone again: the next step is fused and still the same bits.
  EXPECT_EQ(StepBits(mlp, x, gy), fused);
  EXPECT_EQ(calls, 1) << "no hook left to fire";
}

TEST(FusedLayersTest, BlockGivesTheSameBitsFusedAndThroughItsChildren) {
  TransformerBlock block(16, 4, 1);
  gradcheck::RandomizeParameters(block, 2, 0.0f, 0.5f);
  const core::Tensor x = gradcheck::RandomTensor({2, 6, 16}, 3);
  const core::Tensor gy = gradcheck::RandomTensor({2, 6, 16}, 4);
  const auto fused = StepBits(block, x, gy);
  ASSERT_EQ(fused.size(), 2u + 12u);
  ASSERT_TRUE(block.Forward(x).ok());
  EXPECT_EQ(block.mlp()->gelu()->Backward(gy).status().code(),
            absl::StatusCode::kFailedPrecondition)
      << "the block's Mlp ran fused";
  int calls = 0;
  core::HookHandle h1 = CountingHook(*block.ln_1(), &calls);
  core::HookHandle h2 = CountingHook(*block.ln_2(), &calls);
  core::HookHandle h3 = CountingHook(*block.mlp()->gelu(), &calls);
  EXPECT_EQ(StepBits(block, x, gy), fused);
  EXPECT_EQ(calls, 3);
  // Hooks on the Mlp and on attention themselves: the block calls their Forward and adds
  // the residuals after them.
  int own_calls = 0;
  core::HookHandle h4 = CountingHook(*block.mlp(), &own_calls);
  core::HookHandle h5 = CountingHook(*block.attn(), &own_calls);
  EXPECT_EQ(StepBits(block, x, gy), fused);
  EXPECT_EQ(own_calls, 2);
}

// A forward-only pass (NoGradScope) keeps no caches, also in the children the block ran
// fused outside their own Forward: none of them can run a Backward after it.
TEST(FusedLayersTest, AForwardOnlyPassOfAFusedBlockKeepsNoCaches) {
  TransformerBlock block(16, 4, 1);
  const core::Tensor x = gradcheck::RandomTensor({2, 6, 16}, 3);
  const core::Tensor g = gradcheck::RandomTensor({2, 6, 16}, 4);
  {
    core::NoGradScope no_grad;
    ASSERT_TRUE(block.Forward(x).ok());
  }
  for (core::Module* m :
       {static_cast<core::Module*>(block.ln_1().get()),
        static_cast<core::Module*>(block.ln_2().get()),
        static_cast<core::Module*>(block.attn().get()),
        static_cast<core::Module*>(block.mlp().get()), static_cast<core::Module*>(&block)}) {
    EXPECT_FALSE(m->Backward(g).ok()) << m->Describe() << " kept a cache";
  }
  // With gradients on, the same Forward leaves what the Backward needs.
  ASSERT_TRUE(block.Forward(x).ok());
  EXPECT_TRUE(block.Backward(g).ok());
}

// NOTE [Block forwards]: the graph records what the forward ran, so a hook registered between a
// forward and its backward changes neither; the next forward calls the hooked child.
TEST(FusedLayersTest, AHookAddedBetweenAForwardAndItsBackwardActsFromTheNextForward) {
  Mlp mlp(8, 1);
  const core::Tensor x = gradcheck::RandomTensor({3, 8}, 3);
  const core::Tensor g = gradcheck::RandomTensor({3, 8}, 4);
  ASSERT_TRUE(mlp.Forward(x).ok());
  int calls = 0;
  core::HookHandle h = CountingHook(*mlp.gelu(), &calls);
  absl::StatusOr<core::Tensor> inline_gx = mlp.Backward(g);
  ASSERT_TRUE(inline_gx.ok()) << inline_gx.status();
  EXPECT_EQ(calls, 0);
  // With the hook in place from the start, Forward and Backward run through the children, with
  // the same bits.
  ASSERT_TRUE(mlp.Forward(x).ok());
  absl::StatusOr<core::Tensor> called_gx = mlp.Backward(g);
  ASSERT_TRUE(called_gx.ok()) << called_gx.status();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(called_gx->ToVector(), inline_gx->ToVector());
}

TEST(TransformerBlockTest, BadShapesNameTheFailingChild) {
  TransformerBlock block(8, 2, 1);
  absl::StatusOr<core::Tensor> y = block.Forward(core::Tensor::Zeros({2, 3, 6}));
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(y.status().message()), HasSubstr("ln_1 (LayerNorm)"));
  y = block.Forward(core::Tensor::Zeros({3, 8}));  // LayerNorm accepts it, attention does not
  EXPECT_THAT(std::string(y.status().message()), HasSubstr("attn (CausalSelfAttention)"));
  Mlp bad(0);
  EXPECT_THAT(std::string(bad.Forward(core::Tensor::Zeros({1})).status().message()),
              HasSubstr("n_embd"));
}

}  // namespace
}  // namespace nn
