#include "nn/functional/linear.h"

#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/functional/gradcheck.h"
#include "nn/functional/internal/layer_test_util.h"
#include "nn/linear.h"
#include "nn/to_device.h"

namespace nn {
namespace functional {
namespace {

using core::DType;
using core::Tensor;
using layer_test_util::ExpectInvalid;
using layer_test_util::ExpectSameBits;
using layer_test_util::Random;
using ::testing::HasSubstr;

// c[i, r, j] = sum_k a[i, r, k] b[(i), k, j] in double, b shared when 2-D.
std::vector<double> MatMulReference(const Tensor& a, const Tensor& b) {
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1), batch = a.numel() / (m * k);
  std::vector<double> c(batch * m * n, 0.0);
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  for (int64_t i = 0; i < batch; ++i) {
    const float* bi = pb + (b.dim() == 2 ? 0 : i * k * n);
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t t = 0; t < k; ++t) {
          c[(i * m + r) * n + j] += double{pa[(i * m + r) * k + t]} * bi[t * n + j];
        }
      }
    }
  }
  return c;
}

void ExpectNear(const Tensor& got, const std::vector<double>& want) {
  const std::vector<float> g = got.ToVector();
  ASSERT_EQ(g.size(), want.size());
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], want[i], 1e-5) << "element " << i;
}

TEST(MatMulTest, MatchesADoubleReferenceForPlainBatchedAndSharedOperands) {
  const Tensor a2 = Random({4, 6}, 1), b2 = Random({6, 3}, 2);
  const Tensor a3 = Random({2, 3, 4, 6}, 3), b3 = Random({2, 3, 6, 5}, 4);
  for (const auto& [a, b] : std::vector<std::pair<Tensor, Tensor>>{{a2, b2}, {a3, b3}, {a3, b2}}) {
    absl::StatusOr<Tensor> c = MatMul(a, b);
    ASSERT_TRUE(c.ok()) << c.status();
    core::Shape want = a.shape();
    want.back() = b.size(-1);
    EXPECT_EQ(c->shape(), want);
    ExpectNear(*c, MatMulReference(a, b));
  }
}

TEST(MatMulTest, GradientsPassTheCheckForEveryOperandLayout) {
  const std::vector<std::pair<core::Shape, core::Shape>> cases = {
      {{4, 6}, {6, 3}}, {{2, 3, 5}, {2, 5, 4}}, {{2, 3, 4, 5}, {5, 2}}, {{1, 1}, {1, 1}}};
  for (const auto& [sa, sb] : cases) {
    absl::StatusOr<gradcheck::Report> r = gradcheck::CheckGradients(
        [](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
          ASSIGN_OR_RETURN(Tensor c, MatMul(in[0], in[1]));
          return std::vector<Tensor>{c};
        },
        {Random(sa, 1), Random(sb, 2)}, {}, {}, {"a", "b"});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->ok()) << r->ToString();
    EXPECT_GT(r->max_abs_numeric, 0.1);
  }
}

TEST(MatMulTest, AnEmptyInnerDimensionGivesZeros) {
  absl::StatusOr<Tensor> c = MatMul(Tensor::Zeros({2, 0}), Tensor::Zeros({0, 3}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->ToVector(), ::testing::Each(0.0f));
  absl::StatusOr<Tensor> empty = MatMul(Tensor::Zeros({0, 4, 2}), Tensor::Zeros({0, 2, 3}));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->shape(), (core::Shape{0, 4, 3}));
}

TEST(MatMulTest, BadOperandsAreInvalidArgumentNamingThem) {
  ExpectInvalid(MatMul(Tensor::Zeros({3}), Tensor::Zeros({3, 2})).status(), "MatMul: a must be");
  ExpectInvalid(MatMul(Tensor::Zeros({2, 3}), Tensor::Zeros({3})).status(), "MatMul: b must be");
  ExpectInvalid(MatMul(Tensor::Zeros({2, 3}), Tensor::Zeros({4, 2})).status(), "has 3 columns");
  ExpectInvalid(MatMul(Tensor::Zeros({2, 2, 3}), Tensor::Zeros({3, 3, 2})).status(),
                "leading dimensions [2]");
  ExpectInvalid(MatMul(Tensor::Zeros({2, 3}), Tensor::Zeros({3, 2}, DType::kInt32)).status(),
                "MatMul: b must be float32 or bfloat16");
  ExpectInvalid(MatMul(Tensor(), Tensor::Zeros({3, 2})).status(), "MatMul: a is undefined");
  const absl::StatusOr<Tensor> earlier = absl::InternalError("Earlier: failed");
  EXPECT_EQ(MatMul(earlier, Tensor::Zeros({3, 2})).status(), earlier.status());
}

TEST(LinearTest, MatchesADoubleReference) {
  const Tensor x = Random({2, 3, 4}, 1), w = Random({5, 4}, 2), b = Random({5}, 3);
  absl::StatusOr<Tensor> y = Linear(x, w, b);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->shape(), (core::Shape{2, 3, 5}));
  std::vector<double> want(30);
  for (int64_t r = 0; r < 6; ++r) {
    for (int64_t o = 0; o < 5; ++o) {
      double acc = b.data<float>()[o];
      for (int64_t i = 0; i < 4; ++i)
        acc += double{x.data<float>()[r * 4 + i]} * w.data<float>()[o * 4 + i];
      want[r * 5 + o] = acc;
    }
  }
  ExpectNear(*y, want);
  // Without a bias, and on a 1-D input.
  absl::StatusOr<Tensor> y1 = Linear(Tensor::FromVector({1, 2}, {2}).value(),
                                     Tensor::FromVector({1, 1, 3, -1}, {2, 2}).value());
  ASSERT_TRUE(y1.ok()) << y1.status();
  EXPECT_THAT(y1->ToVector(), ::testing::ElementsAre(3, 1));
}

// NOTE [Functional Linear]: the output, dL/dx and the parameter gradients have nn::Linear's
// bits, for an fp32 and a bf16 weight and bias, whether the weight and bias are parameters
// (gradients added into Parameter::grad) or plain leaves (gradients returned).
TEST(LinearTest, MatchesTheLayerBitForBit) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (bool parameters : {true, false}) {
      SCOPED_TRACE(absl::StrCat(core::DTypeName(dtype), parameters ? " parameters" : " leaves"));
      nn::Linear layer(45, 23, /*bias=*/true, /*seed=*/7);
      ASSERT_TRUE(ConvertParameters(layer, dtype).ok());
      const Tensor x = Random({3, 5, 45}, 1), g = Random({3, 5, 23}, 2);
      absl::StatusOr<Tensor> want_y = layer.Forward(x);
      ASSERT_TRUE(want_y.ok()) << want_y.status();
      absl::StatusOr<Tensor> want_gx = layer.Backward(g);
      ASSERT_TRUE(want_gx.ok()) << want_gx.status();

      core::ParameterPtr w =
          core::Parameter::Make(layer.weight()->data.Clone(core::MemoryTag::kParam));
      core::ParameterPtr b =
          core::Parameter::Make(layer.bias()->data.Clone(core::MemoryTag::kParam));
      const Tensor xl = core::Leaf(x);
      const Tensor wl = core::Leaf(w->data), bl = core::Leaf(b->data);
      absl::StatusOr<Tensor> y = parameters ? Linear(xl, w, b) : Linear(xl, wl, bl);
      ASSERT_TRUE(y.ok()) << y.status();
      ExpectSameBits(*y, *want_y, "output");
      ASSERT_TRUE(core::Backward({*y}, {g}).ok());
      ExpectSameBits(core::LeafGrad(xl), *want_gx, "input gradient");
      ExpectSameBits(parameters ? w->grad : core::LeafGrad(wl), layer.weight()->grad,
                     "weight gradient");
      ExpectSameBits(parameters ? b->grad : core::LeafGrad(bl), layer.bias()->grad,
                     "bias gradient");
    }
  }
}

// Gradients add into what Parameter::grad holds (beta 1), as the layer's do, and a frozen
// parameter (no requires_grad) is left alone.
TEST(LinearTest, ParameterGradientsAccumulateAndFrozenOnesAreLeftAlone) {
  nn::Linear layer(6, 4, /*bias=*/true, /*seed=*/3);
  const Tensor x = Random({5, 6}, 1), g = Random({5, 4}, 2), prior = Random({4, 6}, 9);
  layer.weight()->grad = prior.Clone(core::MemoryTag::kGrad);
  ASSERT_TRUE(layer.Forward(x).ok());
  ASSERT_TRUE(layer.Backward(g).ok());

  core::ParameterPtr w = core::Parameter::Make(layer.weight()->data);
  core::ParameterPtr b = core::Parameter::Make(layer.bias()->data, /*requires_grad=*/false);
  w->grad = prior.Clone(core::MemoryTag::kGrad);
  absl::StatusOr<Tensor> y = Linear(x, w, b);
  ASSERT_TRUE(y.ok()) << y.status();
  ASSERT_TRUE(core::Backward({*y}, {g}).ok());
  ExpectSameBits(w->grad, layer.weight()->grad, "accumulated weight gradient");
  EXPECT_FALSE(b->grad.defined());
}

// Without a weight gradient the bias's is the column sums of the output gradient alone.
TEST(LinearTest, OnlyTheBiasGetsAGradientWhenOnlyItNeedsOne) {
  const Tensor x = Random({4, 3}, 1), w = Random({2, 3}, 2), g = Random({4, 2}, 3);
  const Tensor b = core::Leaf(Random({2}, 4));
  absl::StatusOr<Tensor> y = Linear(x, w, b);
  ASSERT_TRUE(y.ok()) << y.status();
  ASSERT_TRUE(core::Backward({*y}, {g}).ok());
  const std::vector<float> gb = core::LeafGrad(b).ToVector();
  for (int64_t o = 0; o < 2; ++o) {
    double sum = 0;
    for (int64_t r = 0; r < 4; ++r) sum += g.data<float>()[r * 2 + o];
    EXPECT_NEAR(gb[o], sum, 1e-6) << o;
  }
}

// bf16 operands are widened exactly: the product of their fp32 values.
TEST(MatMulTest, Bf16OperandsGiveTheProductOfTheirValues) {
  const Tensor a = Random({3, 4, 5}, 1).ToDType(DType::kBFloat16, core::MemoryTag::kOther).value();
  const Tensor b = Random({5, 2}, 2).ToDType(DType::kBFloat16, core::MemoryTag::kOther).value();
  absl::StatusOr<Tensor> c = MatMul(a, b);
  ASSERT_TRUE(c.ok()) << c.status();
  ExpectNear(*c, MatMulReference(a.ToDType(DType::kFloat32, core::MemoryTag::kOther).value(),
                                 b.ToDType(DType::kFloat32, core::MemoryTag::kOther).value()));
}

TEST(LinearTest, GradientsPassTheCheckAsInputsAndAsParameters) {
  absl::StatusOr<gradcheck::Report> r = gradcheck::CheckGradients(
      [](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor y, Linear(in[0], in[1], in[2]));
        return std::vector<Tensor>{y};
      },
      {Random({2, 3, 4}, 1), Random({5, 4}, 2), Random({5}, 3)}, {}, {}, {"x", "w", "b"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok()) << r->ToString();
  EXPECT_GT(r->max_abs_numeric, 0.1);

  core::ParameterPtr w = core::Parameter::Make(Random({3, 4}, 4));
  core::ParameterPtr b = core::Parameter::Make(Random({3}, 5));
  r = gradcheck::CheckGradients(
      [&](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor y, Linear(in[0], w, b));
        return std::vector<Tensor>{y};
      },
      {Random({6, 4}, 6)}, {}, {{"weight", w}, {"bias", b}}, {"x"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok()) << r->ToString();
  EXPECT_EQ(r->num_checked, 24 + 12 + 3);
}

TEST(LinearTest, BadArgumentsAreInvalidArgumentNamingThem) {
  const Tensor x = Tensor::Zeros({2, 4}), w = Tensor::Zeros({3, 4});
  ExpectInvalid(Linear(Tensor::Zeros({2, 5}), w).status(), "Linear: input");
  ExpectInvalid(Linear(Tensor::Zeros({}), w).status(), "must have last dimension 4");
  ExpectInvalid(Linear(x, Tensor::Zeros({12})).status(), "Linear: weight must be 2-D");
  ExpectInvalid(Linear(x, w, Tensor::Zeros({4})).status(), "Linear: bias must be [3]");
  ExpectInvalid(Linear(x, w, Tensor::Zeros({3}, DType::kInt32)).status(), "Linear: bias must be");
  ExpectInvalid(Linear(Tensor::Zeros({2, 4}, DType::kBFloat16), w).status(),
                "bfloat16 only with a bfloat16 weight");
  ExpectInvalid(Linear(Tensor(), w).status(), "Linear: input is undefined");
  const absl::StatusOr<Tensor> earlier = absl::InvalidArgumentError("Earlier: failed");
  EXPECT_EQ(Linear(x, w, earlier).status(), earlier.status());
}

TEST(LinearTest, NoGradScopeRecordsNothing) {
  core::ParameterPtr w = core::Parameter::Make(Random({3, 4}, 1));
  core::NoGradScope no_grad;
  absl::StatusOr<Tensor> y = Linear(core::Leaf(Random({2, 4}, 2)), w);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_FALSE(core::RequiresGrad(*y));
}

}  // namespace
}  // namespace functional
}  // namespace nn
