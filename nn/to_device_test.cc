// ToDevice / ConvertParameters on the CPU, and the layers with bf16 weights on the CPU
// (widened exactly, so they equal the fp32 layers with bf16-rounded weights bit for bit).
#include "nn/to_device.h"

#include <memory>
#include <vector>

#include "core/random.h"
#include "core/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/gpt.h"
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

TEST(ToDeviceTest, Bf16GptEqualsFp32GptWithRoundedWeightsExactly) {
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
  EXPECT_EQ(y_ref->ToVector(), y_low->ToVector());
  absl::StatusOr<LossResult> l_ref = CrossEntropyLoss(*y_ref, targets);
  absl::StatusOr<LossResult> l_low = CrossEntropyLoss(*y_low, targets);
  ASSERT_TRUE(l_ref.ok() && l_low.ok());
  ASSERT_TRUE((*ref)->Backward(l_ref->grad).ok());
  ASSERT_TRUE((*low)->Backward(l_low->grad).ok());
  const auto pr = (*ref)->NamedParameters();
  const auto pl = (*low)->NamedParameters();
  ASSERT_EQ(pr.size(), pl.size());
  for (size_t i = 0; i < pr.size(); ++i) {
    ASSERT_TRUE(pl[i].second->grad.defined()) << pl[i].first;
    // Gradients stay fp32 when the weights are bf16.
    EXPECT_EQ(pl[i].second->grad.dtype(), core::DType::kFloat32) << pl[i].first;
    EXPECT_EQ(pr[i].second->grad.ToVector(), pl[i].second->grad.ToVector()) << pr[i].first;
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
