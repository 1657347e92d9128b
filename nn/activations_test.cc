#include "nn/activations.h"

#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/testing/gradcheck.h"

namespace nn {
namespace {

using ::testing::HasSubstr;

TEST(GeluTest, ForwardMatchesHandComputedValues) {
  GELU gelu;
  absl::StatusOr<core::Tensor> y =
      gelu.Forward(core::Tensor::FromVector({0, 1, -1, 3}, {2, 2}).value());
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->shape(), (core::Shape{2, 2}));
  // 0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3))) in double:
  // x=1: tanh(0.7978845608 * 1.044715) = tanh(0.8335624) -> 0.8411919906
  // x=3: tanh(0.7978845608 * 4.207305) = tanh(3.3569) -> 2.9963625067
  const std::vector<float> out = y->ToVector();
  auto ref = [](double x) {
    return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
  };
  EXPECT_EQ(out[0], 0.0f);
  // fp32 evaluation of values <= 3: a few ulp, under 1e-6.
  EXPECT_NEAR(out[1], 0.8411919906, 1e-6);
  EXPECT_NEAR(out[2], ref(-1), 1e-6);
  EXPECT_NEAR(out[3], ref(3), 1e-6);
}

TEST(GeluTest, BackwardMatchesFiniteDifferences) {
  GELU gelu;
  // Inputs N(0, 2) cover both tails and the bend; |GELU'''| <= ~1.5, so with eps 1e-2
  // the truncation error is < 3e-5. Tolerances per NOTE [Gradient-check tolerance].
  absl::StatusOr<gradcheck::Report> r =
      gradcheck::CheckModule(gelu, gradcheck::RandomTensor({3, 7}, 1, 2.0f), {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok()) << r->ToString();
  EXPECT_EQ(r->num_checked, 21);
  EXPECT_GT(r->max_abs_numeric, 0.5);
}

TEST(ReluTest, ForwardAndBackward) {
  ReLU relu;
  absl::StatusOr<core::Tensor> y =
      relu.Forward(core::Tensor::FromVector({-2, 0, 3, -0.5f}, {4}).value());
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->ToVector(), (std::vector<float>{0, 0, 3, 0}));
  absl::StatusOr<core::Tensor> gx =
      relu.Backward(core::Tensor::FromVector({1, 2, 3, 4}, {4}).value());
  ASSERT_TRUE(gx.ok()) << gx.status();
  EXPECT_EQ(gx->ToVector(), (std::vector<float>{0, 0, 3, 0}));  // 0 at x == 0, as PyTorch
}

TEST(ReluTest, BackwardMatchesFiniteDifferencesAwayFromTheKink) {
  ReLU relu;
  // Inputs kept at |x| >= 0.1 > eps so no difference straddles the kink at 0; ReLU is
  // piecewise linear, so the differences are exact up to fp32 rounding.
  core::Tensor x = gradcheck::RandomTensor({4, 5}, 3);
  for (int64_t i = 0; i < x.numel(); ++i) {
    float& v = x.data<float>()[i];
    if (std::fabs(v) < 0.1f) v = v < 0 ? -0.1f - v : 0.1f + v;
  }
  absl::StatusOr<gradcheck::Report> r = gradcheck::CheckModule(relu, x, {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok()) << r->ToString();
  EXPECT_EQ(r->num_checked, 20);
}

TEST(ActivationsTest, BadInputsNameTheModule) {
  GELU gelu;
  absl::StatusOr<core::Tensor> y = gelu.Forward(core::Tensor::Zeros({2}, core::DType::kInt32));
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(y.status().message()), HasSubstr("<root> (GELU)"));
  ReLU relu;
  ASSERT_TRUE(relu.Forward(core::Tensor::Zeros({2})).ok());
  absl::StatusOr<core::Tensor> gx = relu.Backward(core::Tensor::Zeros({3}));
  EXPECT_EQ(gx.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(gx.status().message()), HasSubstr("<root> (ReLU)"));
}

}  // namespace
}  // namespace nn
