#include "nn/testing/gradcheck.h"

#include <cmath>
#include <string>

#include "core/module.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"

namespace nn {
namespace gradcheck {
namespace {

// y = w * x^2 elementwise with a per-element weight w; `bug` scales the returned input
// gradient and `wbug` the weight gradient, so the checker can be shown to catch both.
class SquareScale : public core::Module {
 public:
  SquareScale(int64_t n, float bug, float wbug) : bug_(bug), wbug_(wbug) {
    w_ = RegisterParameter("w", RandomTensor({n}, 7));
  }
  std::string TypeName() const override { return "SquareScale"; }

 protected:
  absl::StatusOr<core::Tensor> ForwardImpl(const core::Tensor& x) override {
    x_ = x.Clone(core::MemoryTag::kActivation);
    core::Tensor y = core::Tensor::Empty(x.shape());
    for (int64_t i = 0; i < x.numel(); ++i) {
      const float v = x.data<float>()[i];
      y.data<float>()[i] = w_->data.data<float>()[i] * v * v;
    }
    return y;
  }
  absl::StatusOr<core::Tensor> BackwardImpl(const core::Tensor& g) override {
    RETURN_IF_ERROR(w_->EnsureGrad());
    core::Tensor gx = core::Tensor::Empty(g.shape());
    for (int64_t i = 0; i < g.numel(); ++i) {
      const float v = x_.data<float>()[i];
      gx.data<float>()[i] = bug_ * g.data<float>()[i] * 2.0f * w_->data.data<float>()[i] * v;
      w_->grad.data<float>()[i] += wbug_ * g.data<float>()[i] * v * v;
    }
    return gx;
  }

 private:
  float bug_, wbug_;
  core::ParameterPtr w_;
  core::Tensor x_;
};

TEST(GradCheckTest, CorrectBackwardPasses) {
  SquareScale m(6, 1.0f, 1.0f);
  core::Tensor x = RandomTensor({6}, 3);
  const std::vector<float> before = x.ToVector();
  absl::StatusOr<Report> r = CheckModule(m, x, {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok()) << r->ToString();
  EXPECT_EQ(r->num_checked, 12);  // 6 input + 6 weight elements
  EXPECT_GT(r->max_abs_numeric, 0.1);
  EXPECT_EQ(x.ToVector(), before);  // restored bit for bit
}

TEST(GradCheckTest, WrongInputGradientIsCaught) {
  SquareScale m(6, 1.1f, 1.0f);  // 10% off
  absl::StatusOr<Report> r = CheckModule(m, RandomTensor({6}, 3), {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->ok());
  ASSERT_FALSE(r->failures.empty());
  EXPECT_EQ(r->failures[0].tensor, "input");
  EXPECT_EQ(r->worst.tensor, "input");
}

TEST(GradCheckTest, WrongParameterGradientIsCaught) {
  SquareScale m(6, 1.0f, 0.0f);  // weight gradient missing
  absl::StatusOr<Report> r = CheckModule(m, RandomTensor({6}, 3), {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->ok());
  for (const Mismatch& f : r->failures) EXPECT_EQ(f.tensor, "w");
}

TEST(GradCheckTest, SamplingChecksRequestedCountAndCheckFunctionWorks) {
  SquareScale m(50, 1.0f, 1.0f);
  Options o;
  o.max_per_tensor = 7;
  absl::StatusOr<Report> r = CheckModule(m, RandomTensor({50}, 3), o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->num_checked, 14);

  // f(x) = sum x^3 has gradient 3 x^2.
  core::Tensor x = RandomTensor({5}, 9);
  core::Tensor g = core::Tensor::Empty({5});
  for (int i = 0; i < 5; ++i) g.data<float>()[i] = 3.0f * x.data<float>()[i] * x.data<float>()[i];
  auto f = [](const core::Tensor& t) -> absl::StatusOr<double> {
    double s = 0.0;
    for (float v : t.ToVector()) s += static_cast<double>(v) * v * v;
    return s;
  };
  absl::StatusOr<Report> rf = CheckFunction(f, x, g, "x", {});
  ASSERT_TRUE(rf.ok()) << rf.status();
  EXPECT_TRUE(rf->ok()) << rf->ToString();
  g.data<float>()[2] += 0.5f;
  rf = CheckFunction(f, x, g, "x", {});
  ASSERT_TRUE(rf.ok());
  ASSERT_EQ(rf->failures.size(), 1u);
  EXPECT_EQ(rf->failures[0].index, 2);
}

}  // namespace
}  // namespace gradcheck
}  // namespace nn
