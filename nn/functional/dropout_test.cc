#include "nn/functional/dropout.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_runtime.h"
#include "kernels/dropout.h"
#include "nn/functional/gradcheck.h"
#include "nn/functional/internal/layer_test_util.h"

namespace nn {
namespace functional {
namespace {

using core::DType;
using core::Tensor;
using layer_test_util::ExpectInvalid;
using layer_test_util::ExpectSameBits;
using layer_test_util::Random;

// Whether element `index` keeps under (seed, step, p), straight from the body.
bool Keeps(uint64_t seed, uint64_t step, double p, uint64_t index) {
  return kernels::DropoutBits(kernels::DropoutKey(seed, step), index) >=
         kernels::DropoutThreshold(p);
}

Tensor Ones(const core::Shape& shape) {
  Tensor t = Tensor::Zeros(shape);
  t.Fill(1.0f);
  return t;
}

// Each element is x * 1 / (1 - p) or 0, as the body's decision for offset + i says.
TEST(DropoutTest, EachElementIsTheBodysDecisionScaled) {
  const Tensor x = Random({37, 19}, 1);
  for (int64_t offset : {int64_t{0}, int64_t{12345}}) {
    absl::StatusOr<Tensor> y = Dropout(x, 0.3, /*seed=*/7, /*step=*/3, true, offset);
    ASSERT_TRUE(y.ok()) << y.status();
    ASSERT_EQ(y->shape(), x.shape());
    const float scale = static_cast<float>(1.0 / 0.7);
    for (int64_t i = 0; i < x.numel(); ++i) {
      const float want = Keeps(7, 3, 0.3, offset + i) ? x.data<float>()[i] * scale : 0.0f;
      ASSERT_EQ(y->data<float>()[i], want) << "element " << i << " offset " << offset;
    }
  }
}

// The kept fraction of 2^20 elements is within 5 binomial standard deviations of 1 - p:
// sqrt(p (1 - p) / 2^20) <= 4.9e-4, so the bound is <= 2.5e-3. The mask is a fixed function
// of the seed, so the test gives the same answer on every run; the bound is what a correct
// generator meets for all but ~1e-6 of seeds, and a biased one (a threshold off by a few
// percent, or low bits reused) misses it by far.
TEST(DropoutTest, KeptFractionIsNearOneMinusP) {
  const int64_t n = int64_t{1} << 20;
  const Tensor x = Ones({n});
  for (double p : {0.1, 0.5, 0.9}) {
    absl::StatusOr<Tensor> y = Dropout(x, p, /*seed=*/2024, /*step=*/0);
    ASSERT_TRUE(y.ok()) << y.status();
    int64_t kept = 0;
    for (int64_t i = 0; i < n; ++i) kept += y->data<float>()[i] != 0.0f;
    const double tolerance = 5 * std::sqrt(p * (1 - p) / static_cast<double>(n));
    EXPECT_NEAR(static_cast<double>(kept) / n, 1 - p, tolerance) << "p " << p;
  }
}

// Masks of neighbouring steps and seeds are independent: the two agree on an element with
// probability p^2 + (1 - p)^2 (5 standard deviations of 2^18 elements: <= 5e-3).
TEST(DropoutTest, NeighbouringStepsAndSeedsDrawIndependentMasks) {
  const int64_t n = int64_t{1} << 18;
  const double p = 0.5;
  const struct {
    uint64_t seed_a, step_a, seed_b, step_b;
  } pairs[] = {{1, 0, 1, 1}, {1, 5, 2, 5}, {0, 0, 1, 0}};
  for (const auto& c : pairs) {
    int64_t agree = 0;
    for (int64_t i = 0; i < n; ++i) {
      agree += Keeps(c.seed_a, c.step_a, p, i) == Keeps(c.seed_b, c.step_b, p, i);
    }
    const double want = p * p + (1 - p) * (1 - p);
    EXPECT_NEAR(static_cast<double>(agree) / n, want, 5 * std::sqrt(want * (1 - want) / n))
        << c.seed_a << "/" << c.step_a << " vs " << c.seed_b << "/" << c.step_b;
  }
}

// NOTE [Dropout offset]: pieces of a tensor, each with its elements' offset, draw the whole
// tensor's mask, for any split and any thread count.
TEST(DropoutTest, PiecesWithTheirOffsetsReproduceTheWholeMask) {
  const int64_t rows = 64, cols = 1031;  // > 64K elements: several OpenMP chunks
  const Tensor x = Random({rows, cols}, 3);
  absl::StatusOr<Tensor> whole = Dropout(x, 0.25, 11, 4);
  ASSERT_TRUE(whole.ok()) << whole.status();
  for (const std::vector<int64_t>& cuts :
       std::vector<std::vector<int64_t>>{{0, 64}, {0, 1, 64}, {0, 13, 40, 41, 64}}) {
    for (int threads : {1, 2}) {
      ASSERT_TRUE(kernels::SetIntraOpThreads(threads).ok());
      for (size_t c = 0; c + 1 < cuts.size(); ++c) {
        const int64_t r0 = cuts[c], r1 = cuts[c + 1];
        const Tensor piece = x.View(r0 * cols, {r1 - r0, cols}).value();
        absl::StatusOr<Tensor> y = Dropout(piece, 0.25, 11, 4, true, r0 * cols);
        ASSERT_TRUE(y.ok()) << y.status();
        ExpectSameBits(*y, whole->View(r0 * cols, {r1 - r0, cols}).value(),
                       "rows " + std::to_string(r0) + ".." + std::to_string(r1) + " threads " +
                           std::to_string(threads));
      }
    }
  }
  ASSERT_TRUE(kernels::SetIntraOpThreads(1).ok());
}

// The gradient uses the forward's mask and scale: the map is linear in x for a fixed
// (seed, step), and its derivative passes the check.
TEST(DropoutTest, GradientsPassTheCheckAndUseTheSameMask) {
  absl::StatusOr<gradcheck::Report> r = gradcheck::CheckGradients(
      [](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor y, Dropout(in[0], 0.4, 5, 9, true, 100));
        return std::vector<Tensor>{y};
      },
      {Random({6, 7}, 4)}, {}, {}, {"x"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok()) << r->ToString();
  EXPECT_GT(r->max_abs_numeric, 0.5);

  const Tensor x = core::Leaf(Random({5, 9}, 5));
  const Tensor g = Random({5, 9}, 6);
  absl::StatusOr<Tensor> y = Dropout(x, 0.4, 5, 9);
  ASSERT_TRUE(y.ok()) << y.status();
  ASSERT_TRUE(core::Backward({*y}, {g}).ok());
  absl::StatusOr<Tensor> want = Dropout(g, 0.4, 5, 9);
  ASSERT_TRUE(want.ok()) << want.status();
  ExpectSameBits(core::LeafGrad(x), *want, "gradient");
}

// p == 0 and evaluation return x itself: its storage and its record, no node.
TEST(DropoutTest, ZeroPAndEvaluationReturnTheInputItself) {
  const Tensor x = core::Leaf(Random({3, 4}, 7));
  for (bool training : {true, false}) {
    const double p = training ? 0.0 : 0.5;
    absl::StatusOr<Tensor> y = Dropout(x, p, 1, 1, training);
    ASSERT_TRUE(y.ok()) << y.status();
    EXPECT_EQ(y->raw_data(), x.raw_data());
    EXPECT_EQ(y->autograd_meta(), x.autograd_meta());
  }
}

TEST(DropoutTest, EmptyTensorsAndNoGradScope) {
  absl::StatusOr<Tensor> empty = Dropout(core::Leaf(Tensor::Zeros({0, 3})), 0.5, 1, 1);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->shape(), (core::Shape{0, 3}));

  core::NoGradScope no_grad;
  absl::StatusOr<Tensor> y = Dropout(core::Leaf(Random({4}, 8)), 0.5, 1, 1);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_FALSE(core::RequiresGrad(*y));
}

TEST(DropoutTest, BadArgumentsAreInvalid) {
  const Tensor x = Tensor::Zeros({2, 3});
  for (double p : {-0.1, 1.0, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    ExpectInvalid(Dropout(x, p, 1, 1).status(), "Dropout: p must be in [0, 1)");
    // Also in evaluation, where nothing would be dropped.
    ExpectInvalid(Dropout(x, p, 1, 1, false).status(), "Dropout: p must be in [0, 1)");
  }
  ExpectInvalid(Dropout(x, 0.5, 1, 1, true, -1).status(), "Dropout: offset must be >= 0");
  ExpectInvalid(Dropout(Tensor::Zeros({2}, DType::kInt32), 0.5, 1, 1).status(),
                "Dropout: input must be float32");
  ExpectInvalid(Dropout(Tensor(), 0.5, 1, 1).status(), "Dropout: input is undefined");
  const absl::StatusOr<Tensor> earlier = absl::InvalidArgumentError("Earlier: failed");
  EXPECT_EQ(Dropout(earlier, 0.5, 1, 1).status(), earlier.status());
}

}  // namespace
}  // namespace functional
}  // namespace nn
