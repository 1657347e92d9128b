// The consumer's op checked as a user's op should be: forward values on hand-computed
// elements, its derivative against the library's gradient checker (which, a second test
// shows, refuses a wrong derivative), and InvalidArgument for the inputs it does not take.
#include "squared_relu.h"

#include <cmath>
#include <vector>

#include "absl/status/status.h"
#include "core/autograd.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/functional/gradcheck.h"

namespace consumer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

core::Tensor T(const std::vector<float>& v, const core::Shape& shape) {
  return core::Tensor::FromVector(v, shape).value();
}

// N(0, 1) draws with every element at least 0.1 away from the kink at 0: there the second
// derivative jumps, and a central difference of step eps straddling it is off by up to eps/2
// (NOTE [Gradient-check tolerance] in nn/functional/gradcheck.h assumes a smooth function).
core::Tensor AwayFromZero(const core::Shape& shape, uint64_t seed) {
  core::Tensor x = nn::gradcheck::RandomTensor(shape, seed);
  float* p = x.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (std::abs(p[i]) < 0.1f) p[i] = p[i] < 0 ? p[i] - 0.1f : p[i] + 0.1f;
  }
  return x;
}

nn::gradcheck::Function Op(std::function<absl::StatusOr<core::Tensor>(const core::Tensor&)> op) {
  return [op](const std::vector<core::Tensor>& in) -> absl::StatusOr<std::vector<core::Tensor>> {
    ASSIGN_OR_RETURN(core::Tensor y, op(in[0]));
    return std::vector<core::Tensor>{y};
  };
}

TEST(SquaredReluTest, ForwardOnHandComputedElements) {
  absl::StatusOr<core::Tensor> y = SquaredRelu(T({-2.0f, -0.5f, 0.0f, 0.5f, 3.0f, 1.5f}, {2, 3}));
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->shape(), (core::Shape{2, 3}));
  EXPECT_EQ(y->dtype(), core::DType::kFloat32);
  EXPECT_THAT(y->ToVector(), ElementsAre(0.0f, 0.0f, 0.0f, 0.25f, 9.0f, 2.25f));
}

TEST(SquaredReluTest, BackwardIsTheGradientTimesTwiceThePositivePart) {
  const core::Tensor x = core::Leaf(T({-2.0f, 0.0f, 0.5f, 3.0f}, {4}));
  absl::StatusOr<core::Tensor> y = SquaredRelu(x);
  ASSERT_TRUE(y.ok()) << y.status();
  ASSERT_TRUE(core::RequiresGrad(*y));
  // dL/dx = g * 2 max(x, 0): {0, 0, 2 * 0.5 * 1, 0.5 * 2 * 3}.
  ASSERT_TRUE(core::Backward({*y}, {T({7.0f, 7.0f, 1.0f, 0.5f}, {4})}).ok());
  EXPECT_THAT(core::LeafGrad(x).ToVector(), ElementsAre(0.0f, 0.0f, 1.0f, 3.0f));
}

TEST(SquaredReluTest, RecordsNothingWithoutGradMode) {
  core::NoGradScope no_grad;
  absl::StatusOr<core::Tensor> y = SquaredRelu(core::Leaf(T({1.0f, -1.0f}, {2})));
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_FALSE(core::RequiresGrad(*y));
}

TEST(SquaredReluTest, GradientMatchesTheGradientChecker) {
  absl::StatusOr<nn::gradcheck::Report> r =
      nn::gradcheck::CheckGradients(Op([](const core::Tensor& x) { return SquaredRelu(x); }),
                                    {AwayFromZero({4, 8}, 3)}, {}, {}, {"x"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok()) << r->ToString();
  EXPECT_EQ(r->num_checked, 32);
  EXPECT_GT(r->max_abs_numeric, 0.5);  // gradients checked were not all ~0
}

// SquaredRelu's forward with the derivative max(x, 0): the factor 2 missing.
absl::StatusOr<core::Tensor> WrongDerivative(const core::Tensor& x) {
  ASSIGN_OR_RETURN(core::Tensor y, SquaredRelu(core::Detach(x)));  // no record
  RETURN_IF_ERROR(core::RecordFunction(
      "SquaredReluWrong", {x}, {&y}, {x},
      [](const core::BackwardContext& ctx) -> absl::StatusOr<std::vector<core::Tensor>> {
        const core::Tensor& g = ctx.grad(0);
        core::Tensor gx = core::Tensor::Zeros(g.shape());
        for (int64_t i = 0; i < g.numel(); ++i) {
          const float xi = ctx.saved(0).data<float>()[i];
          gx.data<float>()[i] = xi > 0 ? g.data<float>()[i] * xi : 0.0f;
        }
        return std::vector<core::Tensor>{gx};
      }));
  return y;
}

TEST(SquaredReluTest, TheCheckerCatchesAWrongDerivative) {
  const core::Tensor x = AwayFromZero({4, 8}, 3);
  absl::StatusOr<nn::gradcheck::Report> r =
      nn::gradcheck::CheckGradients(Op(WrongDerivative), {x}, {}, {}, {"x"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->ok());
  // Every positive element is off by half its gradient; the negative ones agree (0).
  int64_t positive = 0;
  for (float v : x.ToVector()) positive += v > 0;
  ASSERT_GT(positive, 0);
  EXPECT_EQ(static_cast<int64_t>(r->failures.size()), positive) << r->ToString();
  EXPECT_EQ(r->worst.tensor, "x");
  EXPECT_NEAR(r->worst.analytic, r->worst.numeric / 2, 1e-2 * std::abs(r->worst.numeric));
}

TEST(SquaredReluTest, RefusesInputsThatAreNotFp32OnTheCpu) {
  const absl::Status bf16 = SquaredRelu(core::Tensor::Zeros({2}, core::DType::kBFloat16)).status();
  EXPECT_EQ(bf16.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bf16.message(), HasSubstr("SquaredRelu: input x must be float32"));
  EXPECT_THAT(bf16.message(), HasSubstr("bfloat16"));

  const absl::Status ints = SquaredRelu(core::Tensor::FromInts({1, 2}, {2}).value()).status();
  EXPECT_EQ(ints.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ints.message(), HasSubstr("SquaredRelu: input x must be float32"));

  // A tensor standing for one on a GPU (meta: no storage, so no GPU is needed to make it).
  const absl::Status gpu =
      SquaredRelu(core::Tensor::Meta({2}, core::DType::kFloat32, core::Device::Cuda(0))).status();
  EXPECT_EQ(gpu.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(gpu.message(), HasSubstr("SquaredRelu: input x must be on the CPU"));
  EXPECT_THAT(gpu.message(), HasSubstr("cuda:0"));

  const absl::Status undefined = SquaredRelu(core::Tensor()).status();
  EXPECT_EQ(undefined.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(undefined.message(), HasSubstr("SquaredRelu: input x is undefined"));

  const absl::Status meta = SquaredRelu(core::Tensor::Meta({2})).status();
  EXPECT_EQ(meta.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(meta.message(), HasSubstr("SquaredRelu: input x has no storage"));

  // An earlier op's error passes through unchanged.
  const absl::StatusOr<core::Tensor> earlier = absl::NotFoundError("earlier op");
  EXPECT_EQ(SquaredRelu(earlier).status(), absl::NotFoundError("earlier op"));
}

}  // namespace
}  // namespace consumer
