#include "nn/functional/norm.h"

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/autograd.h"
#include "core/module.h"
#include "core/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/functional/gradcheck.h"
#include "nn/functional/internal/layer_test_util.h"
#include "nn/layer_norm.h"
#include "nn/rms_norm.h"
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

// Each row of x [rows, C] normalised in double: centred (LayerNorm) or not (RMSNorm), then
// times w (plus b when given).
std::vector<double> NormReference(const Tensor& x, const Tensor& w, const Tensor* b, bool centered,
                                  double eps) {
  const int64_t C = w.numel(), rows = x.numel() / C;
  const float* px = x.data<float>();
  std::vector<double> y(x.numel());
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, sq = 0;
    for (int64_t j = 0; j < C; ++j) mean += px[r * C + j];
    mean = centered ? mean / C : 0.0;
    for (int64_t j = 0; j < C; ++j) sq += (px[r * C + j] - mean) * (px[r * C + j] - mean);
    const double rstd = 1.0 / std::sqrt(sq / C + eps);
    for (int64_t j = 0; j < C; ++j) {
      y[r * C + j] = (px[r * C + j] - mean) * rstd * w.data<float>()[j] +
                     (b != nullptr ? b->data<float>()[j] : 0.0);
    }
  }
  return y;
}

void ExpectNear(const Tensor& got, const std::vector<double>& want) {
  const std::vector<float> g = got.ToVector();
  ASSERT_EQ(g.size(), want.size());
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], want[i], 2e-5) << "element " << i;
}

TEST(LayerNormTest, MatchesADoubleReference) {
  const Tensor x = Random({2, 3, 8}, 1), w = Random({8}, 2), b = Random({8}, 3);
  absl::StatusOr<Tensor> y = LayerNorm(x, w, b);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->shape(), x.shape());
  ExpectNear(*y, NormReference(x, w, &b, /*centered=*/true, 1e-5));
  // A row of one element normalises to 0: the output is the bias.
  absl::StatusOr<Tensor> one = LayerNorm(Random({3, 1}, 4), Random({1}, 5), b.View(0, {1}).value());
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_THAT(one->ToVector(), ::testing::Each(b.data<float>()[0]));
}

TEST(RmsNormTest, MatchesADoubleReference) {
  const Tensor x = Random({4, 8}, 1), w = Random({8}, 2);
  absl::StatusOr<Tensor> y = RmsNorm(x, w, 1e-6f);
  ASSERT_TRUE(y.ok()) << y.status();
  ExpectNear(*y, NormReference(x, w, nullptr, /*centered=*/false, 1e-6));
}

// NOTE [Functional norms]: output and gradients with the layers' bits, for fp32 and bf16
// weights held as parameters or as plain leaves.
TEST(NormTest, MatchesTheLayersBitForBit) {
  for (bool centered : {true, false}) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      for (bool parameters : {true, false}) {
        SCOPED_TRACE(absl::StrCat(centered ? "LayerNorm " : "RmsNorm ", core::DTypeName(dtype),
                                  parameters ? " parameters" : " leaves"));
        std::shared_ptr<core::Module> layer;
        if (centered) {
          layer = std::make_shared<nn::LayerNorm>(45);
        } else {
          layer = std::make_shared<nn::RmsNorm>(45);
        }
        const std::vector<core::NamedParameter> named = layer->NamedParameters();
        for (size_t i = 0; i < named.size(); ++i) {
          ASSERT_TRUE(named[i].second->data.CopyFrom(Random({45}, 3 + i)).ok());
        }
        ASSERT_TRUE(ConvertParameters(*layer, dtype).ok());
        const Tensor x = Random({3, 5, 45}, 1), g = Random({3, 5, 45}, 2);
        absl::StatusOr<Tensor> want_y = layer->Forward(x);
        ASSERT_TRUE(want_y.ok()) << want_y.status();
        absl::StatusOr<Tensor> want_gx = layer->Backward(g);
        ASSERT_TRUE(want_gx.ok()) << want_gx.status();

        std::vector<core::ParameterPtr> params;
        std::vector<Tensor> leaves;
        for (const auto& [name, p] : named) {
          params.push_back(core::Parameter::Make(p->data));
          leaves.push_back(core::Leaf(p->data));
        }
        auto arg = [&](int i) { return parameters ? core::Arg(params[i]) : core::Arg(leaves[i]); };
        const Tensor xl = core::Leaf(x);
        absl::StatusOr<Tensor> y =
            centered ? LayerNorm(xl, arg(0), arg(1)) : RmsNorm(xl, arg(0), 1e-6f);
        ASSERT_TRUE(y.ok()) << y.status();
        ExpectSameBits(*y, *want_y, "output");
        ASSERT_TRUE(core::Backward({*y}, {g}).ok());
        ExpectSameBits(core::LeafGrad(xl), *want_gx, "input gradient");
        for (size_t i = 0; i < named.size(); ++i) {
          ExpectSameBits(parameters ? params[i]->grad : core::LeafGrad(leaves[i]),
                         named[i].second->grad, named[i].first);
        }
      }
    }
  }
}

TEST(LayerNormTest, GradientsPassTheCheck) {
  absl::StatusOr<gradcheck::Report> r = gradcheck::CheckGradients(
      [](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor y, LayerNorm(in[0], in[1], in[2]));
        return std::vector<Tensor>{y};
      },
      {Random({2, 3, 6}, 1), Random({6}, 2), Random({6}, 3)}, {}, {}, {"x", "w", "b"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok()) << r->ToString();
  EXPECT_GT(r->max_abs_numeric, 0.1);
}

TEST(RmsNormTest, GradientsPassTheCheckWithAParameterWeight) {
  core::ParameterPtr w = core::Parameter::Make(Random({6}, 2));
  absl::StatusOr<gradcheck::Report> r = gradcheck::CheckGradients(
      [&w](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor y, RmsNorm(in[0], w));
        return std::vector<Tensor>{y};
      },
      {Random({4, 6}, 1)}, {}, {{"weight", w}}, {"x"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok()) << r->ToString();
  EXPECT_EQ(r->num_checked, 24 + 6);
  EXPECT_GT(r->max_abs_numeric, 0.1);
}

TEST(LayerNormTest, EmptyRowsGiveEmptyResultsAndGradients) {
  const Tensor x = core::Leaf(Tensor::Zeros({0, 4}));
  const Tensor w = core::Leaf(Random({4}, 1));
  absl::StatusOr<Tensor> y = LayerNorm(x, w, Tensor::Zeros({4}));
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->shape(), (core::Shape{0, 4}));
  ASSERT_TRUE(core::Backward({*y}, {Tensor::Zeros({0, 4})}).ok());
  EXPECT_THAT(core::LeafGrad(w).ToVector(), ::testing::ElementsAre(0, 0, 0, 0));
}

TEST(LayerNormTest, BadArgumentsAreInvalidArgumentNamingThem) {
  const Tensor x = Tensor::Zeros({2, 4}), w = Tensor::Zeros({4}), b = Tensor::Zeros({4});
  ExpectInvalid(LayerNorm(x, Tensor::Zeros({3}), b).status(), "LayerNorm: weight must be [4]");
  ExpectInvalid(LayerNorm(x, w, Tensor::Zeros({4}, DType::kBFloat16)).status(),
                "LayerNorm: bias must be like weight");
  ExpectInvalid(LayerNorm(x, w, Tensor()).status(), "LayerNorm: bias is undefined");
  ExpectInvalid(LayerNorm(Tensor::Zeros({}), w, b).status(), "LayerNorm: input must be at least");
  ExpectInvalid(LayerNorm(Tensor::Zeros({2, 4}, DType::kInt32), w, b).status(),
                "LayerNorm: input must be float32");
  ExpectInvalid(LayerNorm(x, w, b, -1.0f).status(), "LayerNorm: eps must be finite");
  ExpectInvalid(RmsNorm(x, Tensor::Zeros({4}, DType::kInt32)).status(),
                "RmsNorm: weight must be float32 or bfloat16");
  ExpectInvalid(RmsNorm(x, w, NAN).status(), "RmsNorm: eps must be finite");
  const absl::StatusOr<Tensor> earlier = absl::InvalidArgumentError("Earlier: failed");
  EXPECT_EQ(RmsNorm(earlier, w).status(), earlier.status());
}

TEST(LayerNormTest, NoGradScopeRecordsNothing) {
  core::NoGradScope no_grad;
  absl::StatusOr<Tensor> y =
      LayerNorm(core::Leaf(Random({2, 4}, 1)), Random({4}, 2), Random({4}, 3));
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_FALSE(core::RequiresGrad(*y));
}

}  // namespace
}  // namespace functional
}  // namespace nn
