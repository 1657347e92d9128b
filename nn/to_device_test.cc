// ToDevice / ConvertParameters on the CPU, and the layers with bf16 weights on the CPU:
// a Linear with a bf16 weight computes every GEMM on bf16-rounded operands (NOTE [bf16
// GEMMs] in nn/linear.h), widened exactly, so it equals an fp32 Linear with the rounded
// weight fed rounded operands bit for bit; a bf16 GPT stays within the rounding bound of
// the fp32 GPT with rounded weights.
#include "nn/to_device.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "core/random.h"
#include "core/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/gpt.h"
#include "nn/linear.h"
#include "nn/losses.h"
#include "nn/ops.h"

namespace nn {
namespace {

// Rounds every parameter of `m` to bf16 and back, keeping fp32 storage.
void RoundParametersToBf16(core::Module& m) {
  for (const auto& [name, p] : m.NamedParameters()) {
    float* d = p->data.data<float>();
    for (int64_t i = 0; i < p->data.numel(); ++i) {
      d[i] = core::BFloat16::FromFloat(d[i]).ToFloat();
    }
  }
}

// `t` (fp32) rounded to bf16 and widened back.
core::Tensor Rounded(const core::Tensor& t) {
  absl::StatusOr<core::Tensor> low = t.ToDType(core::DType::kBFloat16, core::MemoryTag::kOther);
  EXPECT_TRUE(low.ok()) << low.status();
  absl::StatusOr<core::Tensor> back = low->ToDType(core::DType::kFloat32, core::MemoryTag::kOther);
  EXPECT_TRUE(back.ok()) << back.status();
  return *back;
}

core::Tensor Random(const core::Shape& shape, uint64_t seed) {
  core::Tensor t = core::Tensor::Zeros(shape);
  core::Rng rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) {
    t.data<float>()[i] = static_cast<float>(rng.NextU64() % 2001) / 1000.0f - 1.0f + 1e-4f;
  }
  return t;
}

core::Tensor Tokens(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  core::Tensor t = core::Tensor::Zeros({B, T}, core::DType::kInt32);
  core::Rng rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) {
    t.data<int32_t>()[i] = static_cast<int32_t>(rng.NextU64() % static_cast<uint64_t>(V));
  }
  return t;
}

TEST(ToDeviceTest, CpuToCpuKeepsTheParameterObjectsAndData) {
  GptConfig config;
  config.n_layer = 1;
  absl::StatusOr<std::shared_ptr<Gpt>> gpt = Gpt::Create(config);
  ASSERT_TRUE(gpt.ok()) << gpt.status();
  const std::vector<core::ParameterPtr> before = (*gpt)->Parameters();
  std::vector<const void*> ptrs;
  for (const auto& p : before) ptrs.push_back(p->data.raw_data());
  ASSERT_TRUE(ToDevice(**gpt, core::Device::Cpu()).ok());
  const std::vector<core::ParameterPtr> after = (*gpt)->Parameters();
  ASSERT_EQ(before.size(), after.size());
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_EQ(before[i].get(), after[i].get());
    EXPECT_EQ(after[i]->data.raw_data(), ptrs[i]);  // already there: not copied
  }
}

TEST(ToDeviceTest, Bf16LinearComputesEveryGemmOnRoundedOperandsExactly) {
  // y = r(x) r(W)^T, dx = r(g) r(W), dW = r(g)^T r(x), r rounding to bf16: an fp32 Linear
  // with the rounded weight, fed r(x) and r(g), gives the same bits.
  Linear low(5, 3, /*bias=*/false, 7), ref(5, 3, /*bias=*/false, 7);
  RoundParametersToBf16(ref);
  ASSERT_TRUE(ConvertParameters(low, core::DType::kBFloat16).ok());
  const core::Tensor x = Random({4, 5}, 1), g = Random({4, 3}, 2);
  ASSERT_NE(Rounded(x).ToVector(), x.ToVector());  // the rounding is visible
  absl::StatusOr<core::Tensor> y_low = low.Forward(x);
  absl::StatusOr<core::Tensor> y_ref = ref.Forward(Rounded(x));
  ASSERT_TRUE(y_low.ok() && y_ref.ok());
  EXPECT_EQ(y_low->dtype(), core::DType::kFloat32);
  EXPECT_EQ(y_low->ToVector(), y_ref->ToVector());
  absl::StatusOr<core::Tensor> gx_low = low.Backward(g);
  absl::StatusOr<core::Tensor> gx_ref = ref.Backward(Rounded(g));
  ASSERT_TRUE(gx_low.ok() && gx_ref.ok());
  EXPECT_EQ(gx_low->ToVector(), gx_ref->ToVector());
  EXPECT_EQ(low.weight()->grad.dtype(), core::DType::kFloat32);
  EXPECT_EQ(low.weight()->grad.ToVector(), ref.weight()->grad.ToVector());
}

// Every GEMM operand on the path from the tokens to the logits is rounded to bf16 once
// (relative error at most u = 2^-8): in each of the 2 blocks the inputs of qkv, proj, fc
// and fc2 and, in attention, q, k, v and the probabilities (NOTE [bf16 attention]); then
// lm_head's input: D = 13 roundings in sequence. To first order the logits then differ
// from the fp32 model's on the same rounded weights by at most D u relative to their
// size, normwise; the check allows 2 D u.
TEST(ToDeviceTest, Bf16GptStaysWithinTheActivationRoundingBoundOfTheFp32Gpt) {
  GptConfig config;
  config.vocab_size = 17;
  config.block_size = 6;
  config.n_embd = 8;
  config.n_layer = 2;
  config.n_head = 2;
  config.seed = 3;
  absl::StatusOr<std::shared_ptr<Gpt>> ref = Gpt::Create(config);
  absl::StatusOr<std::shared_ptr<Gpt>> low = Gpt::Create(config);
  ASSERT_TRUE(ref.ok() && low.ok());
  RoundParametersToBf16(**ref);
  ASSERT_TRUE(ConvertParameters(**low, core::DType::kBFloat16).ok());
  for (const auto& [name, p] : (*low)->NamedParameters()) {
    EXPECT_EQ(p->data.dtype(), core::DType::kBFloat16) << name;
  }
  // Tied lm_head still shares wte's Parameter (now bf16).
  EXPECT_EQ((*low)->lm_head()->weight().get(), (*low)->wte()->weight().get());

  const core::Tensor tokens = Tokens(2, 6, 17, 1), targets = Tokens(2, 6, 17, 2);
  absl::StatusOr<core::Tensor> y_ref = (*ref)->Forward(tokens);
  absl::StatusOr<core::Tensor> y_low = (*low)->Forward(tokens);
  ASSERT_TRUE(y_ref.ok()) << y_ref.status();
  ASSERT_TRUE(y_low.ok()) << y_low.status();
  const std::vector<float> a = y_ref->ToVector(), b = y_low->ToVector();
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - b[i]) * static_cast<double>(a[i] - b[i]);
    norm += a[i] * static_cast<double>(a[i]);
  }
  const double u = std::ldexp(1.0, -8), D = 13;
  EXPECT_GT(diff, 0.0);  // the activations really were rounded
  EXPECT_LE(std::sqrt(diff), 2 * D * u * std::sqrt(norm));
  absl::StatusOr<LossResult> l_low = CrossEntropyLoss(*y_low, targets);
  ASSERT_TRUE(l_low.ok());
  ASSERT_TRUE((*low)->Backward(l_low->grad).ok());
  for (const auto& [name, p] : (*low)->NamedParameters()) {
    ASSERT_TRUE(p->grad.defined()) << name;
    // Gradients stay fp32 when the weights are bf16.
    EXPECT_EQ(p->grad.dtype(), core::DType::kFloat32) << name;
  }
}

TEST(ToDeviceTest, ConvertParametersRejectsInt32) {
  GptConfig config;
  absl::StatusOr<std::shared_ptr<Gpt>> gpt = Gpt::Create(config);
  ASSERT_TRUE(gpt.ok());
  absl::Status s = ConvertParameters(**gpt, core::DType::kInt32);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("int32"));
}

}  // namespace
}  // namespace nn
