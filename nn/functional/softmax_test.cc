#include "nn/functional/softmax.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_runtime.h"
#include "nn/functional/gradcheck.h"
#include "nn/functional/internal/layer_test_util.h"

namespace nn {
namespace functional {
namespace {

using core::DType;
using core::Tensor;
using layer_test_util::Random;
using ::testing::HasSubstr;

using Op = absl::StatusOr<Tensor> (*)(core::Arg, int64_t);

// Softmax (log false) or log-softmax of each row of x [rows, cols] in double.
std::vector<double> Reference(const Tensor& x, bool log) {
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  const float* p = x.data<float>();
  std::vector<double> y(x.numel());
  for (int64_t r = 0; r < rows; ++r) {
    double max = p[r * cols], sum = 0;
    for (int64_t j = 0; j < cols; ++j) max = std::max(max, double{p[r * cols + j]});
    for (int64_t j = 0; j < cols; ++j) sum += std::exp(p[r * cols + j] - max);
    for (int64_t j = 0; j < cols; ++j) {
      const double z = p[r * cols + j] - max;
      y[r * cols + j] = log ? z - std::log(sum) : std::exp(z) / sum;
    }
  }
  return y;
}

TEST(SoftmaxTest, MatchesADoubleReferenceForShortLongAndShiftedRows) {
  for (bool log : {false, true}) {
    const Op op = log ? LogSoftmax : Softmax;
    for (const core::Shape& shape : std::vector<core::Shape>{{3, 1}, {2, 7}, {2, 3, 37}}) {
      Tensor x = Random(shape, 1, 3.0f);
      x.data<float>()[0] += 1000.0f;  // max-subtracted: no overflow
      absl::StatusOr<Tensor> y = op(x, -1);
      ASSERT_TRUE(y.ok()) << y.status();
      EXPECT_EQ(y->shape(), shape);
      const std::vector<double> want = Reference(x, log);
      const std::vector<float> got = y->ToVector();
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_NEAR(got[i], want[i], 1e-6 * (1 + std::abs(want[i]))) << log << " element " << i;
      }
    }
  }
}

TEST(SoftmaxTest, GradientsPassTheCheck) {
  for (bool log : {false, true}) {
    const Op op = log ? LogSoftmax : Softmax;
    absl::StatusOr<gradcheck::Report> r = gradcheck::CheckGradients(
        [op](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
          ASSIGN_OR_RETURN(Tensor y, op(in[0], 1));
          return std::vector<Tensor>{y};
        },
        {Random({4, 11}, 2)}, {}, {}, {"x"});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->ok()) << log << " " << r->ToString();
    EXPECT_GT(r->max_abs_numeric, 0.1);
  }
}

// Each row is summed in a fixed order: the bits do not depend on the thread count.
TEST(SoftmaxTest, BitsDoNotDependOnTheThreadCount) {
  const Tensor x = Random({512, 257}, 3);
  const Tensor g = Random({512, 257}, 4);
  for (bool log : {false, true}) {
    std::vector<std::vector<char>> runs;
    for (int threads : {1, 2}) {
      ASSERT_TRUE(kernels::SetIntraOpThreads(threads).ok());
      const Tensor xl = core::Leaf(x);
      absl::StatusOr<Tensor> y = log ? LogSoftmax(xl) : Softmax(xl);
      ASSERT_TRUE(y.ok()) << y.status();
      ASSERT_TRUE(core::Backward({*y}, {g}).ok());
      std::vector<char> bits(2 * x.nbytes());
      std::memcpy(bits.data(), y->raw_data(), x.nbytes());
      std::memcpy(bits.data() + x.nbytes(), core::LeafGrad(xl).raw_data(), x.nbytes());
      runs.push_back(bits);
    }
    EXPECT_EQ(runs[0], runs[1]) << log;
  }
  ASSERT_TRUE(kernels::SetIntraOpThreads(1).ok());
}

TEST(SoftmaxTest, EmptyTensorsGiveEmptyResults) {
  for (const core::Shape& shape : std::vector<core::Shape>{{0, 5}, {3, 0}}) {
    const Tensor x = core::Leaf(Tensor::Zeros(shape));
    absl::StatusOr<Tensor> y = Softmax(x);
    ASSERT_TRUE(y.ok()) << y.status();
    EXPECT_EQ(y->shape(), shape);
    ASSERT_TRUE(core::Backward({*y}, {Tensor::Zeros(shape)}).ok());
    EXPECT_EQ(core::LeafGrad(x).shape(), shape);
  }
}

TEST(SoftmaxTest, OnlyTheLastDimIsSupported) {
  const Tensor x = Tensor::Zeros({2, 3});
  EXPECT_TRUE(Softmax(x, 1).ok());
  absl::Status s = Softmax(x, 0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("Softmax: only the last dim"));
  s = LogSoftmax(x, -2).status();
  EXPECT_THAT(s.message(), HasSubstr("LogSoftmax: only the last dim"));
  s = Softmax(x, 2).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("dim 2 is outside [-2, 2)"));
  EXPECT_THAT(Softmax(Tensor::Zeros({})).status().message(), HasSubstr("at least 1-D"));
  EXPECT_THAT(Softmax(Tensor::Zeros({2}, DType::kInt32)).status().message(),
              HasSubstr("Softmax: input must be float32"));
  const absl::StatusOr<Tensor> earlier = absl::InvalidArgumentError("Earlier: failed");
  EXPECT_EQ(LogSoftmax(earlier).status(), earlier.status());
}

TEST(SoftmaxTest, NoGradScopeRecordsNothing) {
  core::NoGradScope no_grad;
  absl::StatusOr<Tensor> y = Softmax(core::Leaf(Tensor::Zeros({2, 3})));
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_FALSE(core::RequiresGrad(*y));
  EXPECT_THAT(y->ToVector(), ::testing::Each(::testing::FloatNear(1.0f / 3, 1e-7)));
}

}  // namespace
}  // namespace functional
}  // namespace nn
