#include "nn/linear.h"

#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/tensor_ops.h"
#include "nn/testing/gradcheck.h"
#include "nn/to_device.h"

namespace nn {
namespace {

using ::testing::HasSubstr;

core::Tensor T(std::vector<float> v, core::Shape s) {
  return core::Tensor::FromVector(v, s).value();
}

// The gradcheck defaults, spelled out; see NOTE [Gradient-check tolerance] in
// nn/testing/gradcheck.h for why they suit fp32.
gradcheck::Options GradOptions() {
  gradcheck::Options o;
  o.eps = 1e-2;
  o.atol = 1e-3;
  o.rtol = 1e-2;
  return o;
}

TEST(LinearTest, ForwardMatchesHandComputedValues) {
  Linear fc(3, 2);
  // W = [[1, 0, -1], [2, 1, 0]], b = [0.5, -1].
  ASSERT_TRUE(fc.weight()->data.CopyFrom(T({1, 0, -1, 2, 1, 0}, {2, 3})).ok());
  ASSERT_TRUE(fc.bias()->data.CopyFrom(T({0.5f, -1}, {2})).ok());
  // x0 = [1, 2, 3]:  y0 = [1 - 3 + 0.5, 2 + 2 - 1] = [-1.5, 3]
  // x1 = [0, 1, -1]: y1 = [0 + 1 + 0.5, 0 + 1 - 1] = [1.5, 0]
  absl::StatusOr<core::Tensor> y = fc.Forward(T({1, 2, 3, 0, 1, -1}, {2, 1, 3}));
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->shape(), (core::Shape{2, 1, 2}));
  EXPECT_EQ(y->ToVector(), (std::vector<float>{-1.5f, 3.0f, 1.5f, 0.0f}));
  EXPECT_EQ(y->storage()->tag(), core::MemoryTag::kActivation);
}

TEST(LinearTest, NoBiasHasOnlyWeight) {
  Linear fc(3, 2, /*bias=*/false);
  EXPECT_EQ(fc.bias(), nullptr);
  ASSERT_EQ(fc.NamedParameters().size(), 1u);
  EXPECT_EQ(fc.NamedParameters()[0].first, "weight");
  ASSERT_TRUE(fc.weight()->data.CopyFrom(T({1, 0, -1, 2, 1, 0}, {2, 3})).ok());
  EXPECT_EQ(fc.Forward(T({1, 2, 3}, {3})).value().ToVector(), (std::vector<float>{-2, 4}));
}

TEST(LinearTest, InitIsPyTorchKaimingUniformAndSeeded) {
  const int64_t in = 64, out = 128;
  Linear a(in, out, true, 5), b(in, out, true, 5), c(in, out, true, 6);
  EXPECT_EQ(a.NamedParameters()[0].first, "weight");
  EXPECT_EQ(a.NamedParameters()[1].first, "bias");
  EXPECT_EQ(a.weight()->data.shape(), (core::Shape{out, in}));
  EXPECT_EQ(a.bias()->data.shape(), (core::Shape{out}));
  EXPECT_EQ(a.weight()->data.ToVector(), b.weight()->data.ToVector());
  EXPECT_EQ(a.bias()->data.ToVector(), b.bias()->data.ToVector());
  EXPECT_NE(a.weight()->data.ToVector(), c.weight()->data.ToVector());
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  double s2 = 0.0;
  for (float v : a.weight()->data.ToVector()) {
    ASSERT_GE(v, -bound);
    ASSERT_LE(v, bound);
    s2 += static_cast<double>(v) * v;
  }
  for (float v : a.bias()->data.ToVector()) {
    ASSERT_GE(v, -bound);
    ASSERT_LE(v, bound);
  }
  // U(-b, b) has std b / sqrt(3); over 8192 draws the estimate's relative error is
  // ~0.5%, so 5% is a 10-sigma bound.
  EXPECT_NEAR(std::sqrt(s2 / (in * out)), bound / std::sqrt(3.0), 0.05 * bound / std::sqrt(3.0));
}

TEST(LinearTest, BackwardMatchesFiniteDifferences) {
  for (bool bias : {true, false}) {
    Linear fc(5, 4, bias, 3);
    absl::StatusOr<gradcheck::Report> r =
        gradcheck::CheckModule(fc, gradcheck::RandomTensor({2, 3, 5}, 11), GradOptions());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->ok()) << r->ToString();
    EXPECT_EQ(r->num_checked, 30 + 20 + (bias ? 4 : 0));
    EXPECT_GT(r->max_abs_numeric, 0.5);
  }
}

TEST(LinearTest, BackwardAccumulatesAndSkipsFrozenParameters) {
  Linear fc(3, 2, true, 1);
  const core::Tensor x = gradcheck::RandomTensor({4, 3}, 2);
  const core::Tensor g = gradcheck::RandomTensor({4, 2}, 3);
  ASSERT_TRUE(fc.Forward(x).ok());
  ASSERT_TRUE(fc.Backward(g).ok());
  const std::vector<float> once_w = fc.weight()->grad.ToVector();
  const std::vector<float> once_b = fc.bias()->grad.ToVector();
  ASSERT_TRUE(fc.Forward(x).ok());
  ASSERT_TRUE(fc.Backward(g).ok());
  for (size_t i = 0; i < once_w.size(); ++i)
    EXPECT_FLOAT_EQ(fc.weight()->grad.ToVector()[i], 2 * once_w[i]);
  for (size_t i = 0; i < once_b.size(); ++i)
    EXPECT_FLOAT_EQ(fc.bias()->grad.ToVector()[i], 2 * once_b[i]);

  Linear frozen(3, 2, true, 1);
  frozen.weight()->requires_grad = false;
  ASSERT_TRUE(frozen.Forward(x).ok());
  absl::StatusOr<core::Tensor> gx = frozen.Backward(g);
  ASSERT_TRUE(gx.ok()) << gx.status();
  EXPECT_FALSE(frozen.weight()->grad.defined());
  EXPECT_TRUE(frozen.bias()->grad.defined());
  EXPECT_EQ(gx->shape(), (core::Shape{4, 3}));
}

TEST(LinearTest, TiedSharesTheParameterAndAccumulatesFromBothUses) {
  Linear base(4, 3, false, 2);
  std::shared_ptr<Linear> tied = Linear::Tied(base.weight(), /*bias=*/false);
  EXPECT_EQ(tied->weight(), base.weight());  // the same Parameter object
  EXPECT_EQ(tied->in_features(), 4);
  EXPECT_EQ(tied->out_features(), 3);
  const core::Tensor x = gradcheck::RandomTensor({2, 4}, 5);
  const core::Tensor g = gradcheck::RandomTensor({2, 3}, 6);
  ASSERT_TRUE(base.Forward(x).ok());
  ASSERT_TRUE(base.Backward(g).ok());
  const std::vector<float> one = base.weight()->grad.ToVector();
  ASSERT_TRUE(tied->Forward(x).ok());
  ASSERT_TRUE(tied->Backward(g).ok());
  const std::vector<float> two = base.weight()->grad.ToVector();
  for (size_t i = 0; i < one.size(); ++i) EXPECT_FLOAT_EQ(two[i], 2 * one[i]);

  std::shared_ptr<Linear> with_bias = Linear::Tied(base.weight(), /*bias=*/true);
  EXPECT_EQ(with_bias->bias()->data.ToVector(), (std::vector<float>{0, 0, 0}));
}

TEST(LinearTest, BadInputsNameTheModuleAndShapes) {
  Linear fc(3, 2);
  absl::StatusOr<core::Tensor> y = fc.Forward(core::Tensor::Zeros({2, 4}));
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(y.status().message()), HasSubstr("<root> (Linear)"));
  EXPECT_THAT(std::string(y.status().message()), HasSubstr("[2, 4]"));
  EXPECT_THAT(std::string(y.status().message()), HasSubstr("3"));

  y = fc.Forward(core::Tensor::Zeros({2, 3}, core::DType::kInt32));
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(y.status().message()), HasSubstr("float32"));

  EXPECT_EQ(fc.Backward(core::Tensor::Zeros({2, 2})).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(fc.Forward(core::Tensor::Zeros({2, 3})).ok());
  absl::StatusOr<core::Tensor> gx = fc.Backward(core::Tensor::Zeros({2, 3}));
  EXPECT_EQ(gx.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(gx.status().message()), HasSubstr("grad_output shape [2, 3]"));

  Linear bad(0, 2);
  y = bad.Forward(core::Tensor::Zeros({1, 0}));
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(y.status().message()), HasSubstr("in_features"));

  std::shared_ptr<Linear> null_tied = Linear::Tied(nullptr, false);
  EXPECT_EQ(null_tied->Forward(core::Tensor::Zeros({1})).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LinearTest, ReshapedParameterIsRejectedNotReadOutOfBounds) {
  Linear fc(3, 2);
  // What FSDP leaves outside forward: a 1-D local shard.
  fc.weight()->data = core::Tensor::Zeros({2});
  absl::StatusOr<core::Tensor> y = fc.Forward(core::Tensor::Zeros({1, 3}));
  EXPECT_EQ(y.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(y.status().message()), HasSubstr("'weight'"));
}

// After a bf16 Forward the layer takes grad_output in bf16 (GradOutputDType) and gives
// the bits the fp32 gradient gives when that gradient is exactly representable in bf16
// (here: already rounded), bias gradient included.
TEST(LinearTest, Bf16GradOutputGivesTheBitsOfItsFp32Value) {
  Linear a(6, 5, true, 4), b(6, 5, true, 4);
  EXPECT_EQ(a.GradOutputDType(), core::DType::kFloat32);
  for (Linear* m : {&a, &b}) ASSERT_TRUE(ConvertParameters(*m, core::DType::kBFloat16).ok());
  std::vector<float> xs(3 * 6), gs(3 * 5);
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = std::cos(0.7f * i);
  for (size_t i = 0; i < gs.size(); ++i) gs[i] = std::sin(1.3f * i) / 3;
  const core::Tensor x = core::Tensor::FromVector(xs, {3, 6}).value();
  const core::Tensor g16 = core::Tensor::FromVector(gs, {3, 5})
                               .value()
                               .ToDType(core::DType::kBFloat16, core::MemoryTag::kOther)
                               .value();
  const core::Tensor g32 = g16.ToDType(core::DType::kFloat32, core::MemoryTag::kOther).value();
  ASSERT_TRUE(a.Forward(x).ok() && b.Forward(x).ok());
  EXPECT_EQ(b.GradOutputDType(), core::DType::kBFloat16);
  absl::StatusOr<core::Tensor> ga = a.Backward(g32), gb = b.Backward(g16);
  ASSERT_TRUE(ga.ok() && gb.ok()) << gb.status();
  EXPECT_EQ(ga->ToVector(), gb->ToVector());
  EXPECT_EQ(a.weight()->grad.ToVector(), b.weight()->grad.ToVector());
  EXPECT_EQ(a.bias()->grad.ToVector(), b.bias()->grad.ToVector());
  EXPECT_EQ(b.GradOutputDType(), core::DType::kFloat32);  // the cache is released

  Linear f32(6, 5, true, 4);
  ASSERT_TRUE(f32.Forward(x).ok());
  absl::StatusOr<core::Tensor> refused = f32.Backward(g16);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("grad_output"));
}

}  // namespace
}  // namespace nn
