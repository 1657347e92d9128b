#include "nn/functional/elementwise.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/autograd.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_runtime.h"
#include "nn/functional/gradcheck.h"
#include "nn/functional/internal/tensor_test_util.h"

namespace nn {
namespace functional {
namespace {

using core::Shape;
using core::Tensor;
using gradcheck::RandomTensor;
using tensor_test_util::ExpectGradients;
using tensor_test_util::ExpectInvalid;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

using BinaryFn = absl::StatusOr<Tensor> (*)(core::Arg, core::Arg);

// Values of `shape` from `seed`, at least `floor` away from 0 (divisors; ReLU away from its
// kink, where central differences do not apply).
Tensor AwayFromZero(const Shape& shape, uint64_t seed, float floor) {
  std::vector<float> v = RandomTensor(shape, seed).ToVector();
  for (float& x : v) x = x < 0 ? x - floor : x + floor;
  return Tensor::FromVector(v, shape).value();
}

// The element of a [2, 3, 4] output that operand `shape` (broadcast) reads at flat i.
int64_t Source(const Shape& shape, int64_t i) {
  const int64_t c[3] = {i / 12, (i / 4) % 3, i % 4};
  int64_t off = 0;
  const size_t lead = 3 - shape.size();
  for (size_t d = lead; d < 3; ++d) off = off * shape[d - lead] + (shape[d - lead] == 1 ? 0 : c[d]);
  return off;
}

TEST(ElementwiseTest, BinaryOpsBroadcastLikeNumPy) {
  const struct {
    BinaryFn fn;
    std::function<double(double, double)> ref;
  } ops[] = {{Add, [](double a, double b) { return a + b; }},
             {Sub, [](double a, double b) { return a - b; }},
             {Mul, [](double a, double b) { return a * b; }},
             {Div, [](double a, double b) { return a / b; }}};
  const Shape shapes[][2] = {{{2, 3, 4}, {2, 3, 4}},
                             {{2, 3, 4}, {3, 1}},
                             {{1, 3, 1}, {2, 1, 4}},
                             {{4}, {2, 3, 4}},
                             {{2, 3, 4}, {}}};
  for (const auto& op : ops) {
    for (const auto& s : shapes) {
      const Tensor a = RandomTensor(s[0], 1), b = AwayFromZero(s[1], 2, 0.5f);
      absl::StatusOr<Tensor> y = op.fn(a, b);
      ASSERT_TRUE(y.ok()) << y.status();
      ASSERT_THAT(y->shape(), ElementsAre(2, 3, 4));
      const std::vector<float> yv = y->ToVector(), av = a.ToVector(), bv = b.ToVector();
      for (int64_t i = 0; i < 24; ++i) {
        const double want = op.ref(av[Source(s[0], i)], bv[Source(s[1], i)]);
        EXPECT_NEAR(yv[i], want, 1e-6 * (1 + std::fabs(want))) << i;
      }
    }
  }
}

TEST(ElementwiseTest, BroadcastOperandsGetTheGradientSummedOverTheStretchedDims) {
  Tensor a = core::Leaf(RandomTensor({2, 3}, 3)), b = core::Leaf(RandomTensor({3}, 4));
  absl::StatusOr<Tensor> y = Mul(a, b);
  ASSERT_TRUE(y.ok()) << y.status();
  ASSERT_TRUE(core::Backward({*y}, {Tensor::FromVector({1, 1, 1, 2, 2, 2}, {2, 3}).value()}).ok());
  const std::vector<float> av = a.ToVector();
  const std::vector<float> gb = core::LeafGrad(b).ToVector();
  for (int j = 0; j < 3; ++j) EXPECT_FLOAT_EQ(gb[j], av[j] + 2 * av[3 + j]);
  for (BinaryFn fn : {Add, Sub, Mul, Div}) {
    ExpectGradients(
        [fn](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
          ASSIGN_OR_RETURN(Tensor out, fn(in[0], in[1]));
          ASSIGN_OR_RETURN(Tensor same, fn(in[1], in[2]));  // no broadcasting
          return std::vector<Tensor>{out, same};
        },
        {RandomTensor({2, 1, 4}, 5), AwayFromZero({3, 1}, 6, 0.5f), AwayFromZero({3, 1}, 7, 0.5f)});
  }
}

TEST(ElementwiseTest, BadOperandsNameTheOpAndTheirShapes) {
  const Tensor a = RandomTensor({2, 3}, 8);
  absl::Status s = Add(a, RandomTensor({4}, 9)).status();
  ExpectInvalid(s, "Add", "[2, 3]");
  EXPECT_THAT(s.message(), HasSubstr("[4]"));
  ExpectInvalid(Mul(a, Tensor::FromInts({1}, {1}).value()).status(), "Mul", "b must be float32");
  ExpectInvalid(Div(Tensor(), a).status(), "Div", "a is undefined");
  ExpectInvalid(Gelu(Tensor::FromInts({1}, {1}).value()).status(), "Gelu", "float32");
  const absl::StatusOr<Tensor> bad = absl::InvalidArgumentError("Earlier: broke");
  EXPECT_EQ(Sub(a, bad).status(), bad.status());
  EXPECT_EQ(Tanh(bad).status(), bad.status());
}

TEST(ElementwiseTest, ScalarOpsAndTheirGradients) {
  const Tensor x = Tensor::FromVector({1, -2, 0.5f}, {3}).value();
  EXPECT_THAT(AddScalar(x, 1.5f)->ToVector(), ElementsAre(2.5f, -0.5f, 2.0f));
  EXPECT_THAT(MulScalar(x, -2.0f)->ToVector(), ElementsAre(-2.0f, 4.0f, -1.0f));
  EXPECT_THAT(Neg(x)->ToVector(), ElementsAre(-1.0f, 2.0f, -0.5f));
  ExpectGradients(
      [](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor a, AddScalar(in[0], 3.0f));
        ASSIGN_OR_RETURN(Tensor b, MulScalar(in[0], -1.5f));
        ASSIGN_OR_RETURN(Tensor c, Neg(in[0]));
        return std::vector<Tensor>{a, b, c};
      },
      {RandomTensor({2, 3}, 10)});
}

TEST(ElementwiseTest, UnaryActivationsMatchTheirDefinitionsAndDerivatives) {
  const Tensor x = AwayFromZero({3, 7}, 11, 0.05f);
  const std::vector<float> xv = x.ToVector();
  const std::vector<float> gelu = Gelu(x)->ToVector(), relu = Relu(x)->ToVector();
  const std::vector<float> silu = Silu(x)->ToVector(), tanh = Tanh(x)->ToVector();
  for (size_t i = 0; i < xv.size(); ++i) {
    const double v = xv[i];
    const double inner = std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v);
    EXPECT_NEAR(gelu[i], 0.5 * v * (1 + std::tanh(inner)), 1e-6) << v;
    EXPECT_EQ(relu[i], v > 0 ? xv[i] : 0.0f) << v;
    EXPECT_NEAR(silu[i], v / (1 + std::exp(-v)), 1e-6) << v;
    EXPECT_NEAR(tanh[i], std::tanh(v), 1e-6) << v;
  }
  using UnaryFn = absl::StatusOr<Tensor> (*)(core::Arg);
  for (UnaryFn fn : {Gelu, Relu, Silu, Tanh}) {
    ExpectGradients(
        [fn](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
          ASSIGN_OR_RETURN(Tensor y, fn(in[0]));
          return std::vector<Tensor>{y};
        },
        {x});
  }
}

// Softplus, log(1 + e^x): the values at both ends, where log(1 + exp(x)) computed as written
// overflows (x = 100) or rounds e^x away (x = -20, -80), and the derivative against the gradient
// checker.
TEST(ElementwiseTest, SoftplusIsExactAtBothEndsAndPassesTheGradientChecker) {
  const std::vector<float> xs = {-80, -20, -1, 0, 1, 20, 100};
  const std::vector<float> y = Softplus(Tensor::FromVector(xs, {7}).value())->ToVector();
  for (size_t i = 0; i < xs.size(); ++i) {
    const double v = xs[i];
    const double want = std::max(v, 0.0) + std::log1p(std::exp(-std::abs(v)));
    EXPECT_NEAR(y[i], want, 1e-6 * want) << v;
  }
  absl::StatusOr<gradcheck::Report> report = gradcheck::CheckGradients(
      [](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor y, Softplus(in[0]));
        return std::vector<Tensor>{y};
      },
      {gradcheck::RandomTensor({4, 8}, /*seed=*/1)});
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->ok()) << report->ToString();
}

// The contiguous and broadcast loops, split over threads, give each element's single
// rounding, whatever the thread count.
TEST(ElementwiseTest, LargeOperandsGiveEachElementsBitsForAnyThreadCount) {
  const Tensor a = RandomTensor({300, 257}, 12), b = RandomTensor({300, 257}, 13);
  const Tensor row = RandomTensor({257}, 14);
  const std::vector<float> av = a.ToVector(), bv = b.ToVector(), rv = row.ToVector();
  for (int threads : {1, 2}) {
    ASSERT_TRUE(kernels::SetIntraOpThreads(threads).ok());
    const std::vector<float> sum = Add(a, b)->ToVector(), prod = Mul(a, row)->ToVector();
    const std::vector<float> quot = Div(row, a)->ToVector();  // the row stretched as a
    for (size_t i = 0; i < av.size(); ++i) {
      ASSERT_EQ(sum[i], av[i] + bv[i]) << i;
      ASSERT_EQ(prod[i], av[i] * rv[i % 257]) << i;
      ASSERT_EQ(quot[i], rv[i % 257] / av[i]) << i;
    }
  }
  ASSERT_TRUE(kernels::SetIntraOpThreads(1).ok());
}

// ToDType rounds fp32 to nearest even bf16 (widening back is exact) and hands the gradient on as
// it arrives; the same dtype returns x itself, another dtype is refused.
TEST(ElementwiseTest, ToDTypeRoundsToBf16AndPassesTheGradient) {
  // 1 + 2^-8 + 2^-9 rounds up to 1 + 2^-7; 1 + 2^-9 ties to even (1).
  const Tensor x = core::Leaf(
      Tensor::FromVector({1.0f + 0x1p-8f + 0x1p-9f, 1.0f + 0x1p-9f, -3.5f}, {3}).value());
  absl::StatusOr<Tensor> y = ToDType(x, core::DType::kBFloat16);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->dtype(), core::DType::kBFloat16);
  EXPECT_THAT(y->ToVector(), ElementsAre(1.0f + 0x1p-7f, 1.0f, -3.5f));
  absl::StatusOr<Tensor> back = ToDType(*y, core::DType::kFloat32);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->dtype(), core::DType::kFloat32);
  EXPECT_EQ(back->ToVector(), y->ToVector());
  const Tensor seed = Tensor::FromVector({0.5f, -2.0f, 3.0f}, {3}).value();
  ASSERT_TRUE(core::Backward({*back}, {seed}).ok());
  EXPECT_EQ(core::LeafGrad(x).ToVector(), seed.ToVector());
  absl::StatusOr<Tensor> same = ToDType(x, core::DType::kFloat32);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->data<float>(), x.data<float>());
  ExpectInvalid(ToDType(x, core::DType::kInt32).status(), "ToDType", "dtype must be float32");
  ExpectInvalid(ToDType(Tensor::Zeros({2}, core::DType::kInt32), core::DType::kFloat32).status(),
                "ToDType", "input");
}

TEST(ElementwiseTest, EmptyTensorsAndNoGradScope) {
  EXPECT_THAT(Add(Tensor::Zeros({0, 3}), Tensor::Zeros({3}))->shape(), ElementsAre(0, 3));
  EXPECT_THAT(Silu(Tensor::Zeros({0}))->shape(), ElementsAre(0));
  const Tensor x = core::Leaf(RandomTensor({4}, 15));
  {
    core::NoGradScope no_grad;
    EXPECT_FALSE(core::RequiresGrad(Mul(x, x).value()));
    EXPECT_FALSE(core::RequiresGrad(Gelu(x).value()));
  }
  EXPECT_TRUE(core::RequiresGrad(Sub(x, x).value()));
}

}  // namespace
}  // namespace functional
}  // namespace nn
