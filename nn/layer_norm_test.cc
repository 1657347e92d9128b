#include "nn/layer_norm.h"

#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/testing/gradcheck.h"

namespace nn {
namespace {

using ::testing::HasSubstr;

TEST(LayerNormTest, ForwardMatchesHandComputedValues) {
  LayerNorm ln(4);
  EXPECT_EQ(ln.weight()->data.ToVector(), (std::vector<float>{1, 1, 1, 1}));
  EXPECT_EQ(ln.bias()->data.ToVector(), (std::vector<float>{0, 0, 0, 0}));
  ASSERT_TRUE(ln.weight()->data.CopyFrom(core::Tensor::FromVector({1, 2, 1, 1}, {4}).value()).ok());
  ASSERT_TRUE(ln.bias()->data.CopyFrom(core::Tensor::FromVector({0, 0, 0, 3}, {4}).value()).ok());
  // Row [1, 2, 3, 4]: mean 2.5, biased variance (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25.
  // Row [2, 2, 2, 2]: variance 0, so the output is the bias (x - mean = 0).
  absl::StatusOr<core::Tensor> y =
      ln.Forward(core::Tensor::FromVector({1, 2, 3, 4, 2, 2, 2, 2}, {2, 4}).value());
  ASSERT_TRUE(y.ok()) << y.status();
  const double inv = 1.0 / std::sqrt(1.25 + 1e-5);
  const double expected[] = {-1.5 * inv, 2 * -0.5 * inv, 0.5 * inv, 1.5 * inv + 3, 0, 0, 0, 3};
  const std::vector<float> out = y->ToVector();
  // fp32 rounding of values of magnitude <= 4.4: 1e-6 is a few ulp.
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(out[i], expected[i], 1e-6) << i;
}

TEST(LayerNormTest, EpsIsUsed) {
  LayerNorm ln(2, /*eps=*/1.0f);
  // Row [1, -1]: variance 1, so y = x / sqrt(1 + 1).
  absl::StatusOr<core::Tensor> y = ln.Forward(core::Tensor::FromVector({1, -1}, {2}).value());
  ASSERT_TRUE(y.ok());
  EXPECT_NEAR(y->ToVector()[0], 1.0 / std::sqrt(2.0), 1e-6);
}

TEST(LayerNormTest, BackwardMatchesFiniteDifferences) {
  LayerNorm ln(6);
  // Random affine parameters, so the check does not run at weight 1 / bias 0.
  gradcheck::RandomizeParameters(ln, 4, 0.5f, 1.0f);
  // Inputs N(0, 1): per-row std ~1, so the map's curvature is O(1) and the
  // truncation error of eps = 1e-2 differences is ~1e-5. Tolerances per NOTE [Gradient-check
  // tolerance].
  gradcheck::Options o;
  absl::StatusOr<gradcheck::Report> r =
      gradcheck::CheckModule(ln, gradcheck::RandomTensor({2, 3, 6}, 5), o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok()) << r->ToString();
  EXPECT_EQ(r->num_checked, 36 + 12);
  EXPECT_GT(r->max_abs_numeric, 0.5);
}

TEST(LayerNormTest, FrozenParametersGetNoGradient) {
  LayerNorm ln(3);
  ln.bias()->requires_grad = false;
  ASSERT_TRUE(ln.Forward(gradcheck::RandomTensor({2, 3}, 1)).ok());
  ASSERT_TRUE(ln.Backward(gradcheck::RandomTensor({2, 3}, 2)).ok());
  EXPECT_TRUE(ln.weight()->grad.defined());
  EXPECT_FALSE(ln.bias()->grad.defined());
}

TEST(LayerNormTest, BadInputsNameTheModule) {
  LayerNorm ln(4);
  absl::StatusOr<core::Tensor> y = ln.Forward(core::Tensor::Zeros({2, 3}));
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(y.status().message()), HasSubstr("<root> (LayerNorm)"));
  EXPECT_THAT(std::string(y.status().message()), HasSubstr("[2, 3]"));
  LayerNorm bad(4, -1.0f);
  EXPECT_THAT(std::string(bad.Forward(core::Tensor::Zeros({4})).status().message()),
              HasSubstr("eps"));
}

}  // namespace
}  // namespace nn
