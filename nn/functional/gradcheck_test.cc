#include "nn/functional/gradcheck.h"

#include <cmath>
#include <vector>

#include "core/autograd.h"
#include "core/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace nn {
namespace gradcheck {
namespace {

using ::testing::HasSubstr;

// y = sin(x) * w elementwise, with the derivative right or (wrong_by != 0) off by a term.
absl::StatusOr<core::Tensor> SinTimes(const core::Tensor& x, core::Arg w_arg, float wrong_by) {
  RETURN_IF_ERROR(w_arg.status());
  const core::Tensor w = w_arg.tensor();
  core::Tensor y = core::Tensor::Zeros(x.shape());
  for (int64_t i = 0; i < x.numel(); ++i) {
    y.data<float>()[i] = std::sin(x.data<float>()[i]) * w.data<float>()[i];
  }
  RETURN_IF_ERROR(core::RecordFunction(
      "SinTimes", {x, w}, {&y}, {x, w},
      [wrong_by](const core::BackwardContext& ctx) -> absl::StatusOr<std::vector<core::Tensor>> {
        const core::Tensor& g = ctx.grad(0);
        core::Tensor gx = core::Tensor::Zeros(g.shape()), gw = core::Tensor::Zeros(g.shape());
        for (int64_t i = 0; i < g.numel(); ++i) {
          const float x = ctx.saved(0).data<float>()[i], w = ctx.saved(1).data<float>()[i];
          gx.data<float>()[i] = g.data<float>()[i] * (std::cos(x) * w + wrong_by);
          gw.data<float>()[i] = g.data<float>()[i] * std::sin(x);
        }
        return std::vector<core::Tensor>{gx, gw};
      }));
  return y;
}

TEST(GradCheckTest, PassesACorrectDerivativeOfInputsAndParameters) {
  core::ParameterPtr w = core::Parameter::Make(RandomTensor({3, 4}, 2));
  const core::Tensor x = RandomTensor({3, 4}, 1);
  absl::StatusOr<Report> r = CheckGradients(
      [&w](const std::vector<core::Tensor>& in) -> absl::StatusOr<std::vector<core::Tensor>> {
        ASSIGN_OR_RETURN(core::Tensor y, SinTimes(in[0], w, 0.0f));
        return std::vector<core::Tensor>{y};
      },
      {x}, {}, {{"w", w}}, {"x"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok()) << r->ToString();
  EXPECT_EQ(r->num_checked, 24);
  EXPECT_GT(r->max_abs_numeric, 0.1);
  // The input is restored bit for bit.
  EXPECT_EQ(x.ToVector(), RandomTensor({3, 4}, 1).ToVector());
}

TEST(GradCheckTest, CatchesAWrongDerivative) {
  core::ParameterPtr w = core::Parameter::Make(RandomTensor({5}, 2));
  absl::StatusOr<Report> r = CheckGradients(
      [&w](const std::vector<core::Tensor>& in) -> absl::StatusOr<std::vector<core::Tensor>> {
        ASSIGN_OR_RETURN(core::Tensor y, SinTimes(in[0], w, 0.3f));
        return std::vector<core::Tensor>{y};
      },
      {RandomTensor({5}, 1)}, {}, {{"w", w}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->ok());
  EXPECT_EQ(r->failures.size(), 5u);  // every x element; w's are right
  EXPECT_EQ(r->worst.tensor, "input 0");
}

TEST(GradCheckTest, AnInputTheOutputDoesNotDependOnHasZeroGradient) {
  absl::StatusOr<Report> r = CheckGradients(
      [](const std::vector<core::Tensor>& in) -> absl::StatusOr<std::vector<core::Tensor>> {
        core::ParameterPtr one = core::Parameter::Make(core::Tensor::Zeros({2}));
        one->data.Fill(1.0f);
        ASSIGN_OR_RETURN(core::Tensor y, SinTimes(in[0], one, 0.0f));
        return std::vector<core::Tensor>{y};
      },
      {RandomTensor({2}, 1), RandomTensor({2}, 3)});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok()) << r->ToString();
  EXPECT_EQ(r->num_checked, 4);
}

TEST(GradCheckTest, RefusesNonCpuOrUndefinedInputs) {
  absl::StatusOr<Report> r =
      CheckGradients([](const std::vector<core::Tensor>& in) { return in; }, {core::Tensor()});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("input 0"));
}

}  // namespace
}  // namespace gradcheck
}  // namespace nn
