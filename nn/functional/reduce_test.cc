#include "nn/functional/reduce.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/autograd.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_runtime.h"
#include "kernels/tensor.h"
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
using ::testing::IsEmpty;

// x [2, 3, 4] summed in double over the dims marked in `reduced`, in the kept dims' order.
std::vector<double> ReferenceSums(const Tensor& x, const std::vector<bool>& reduced) {
  const std::vector<float> v = x.ToVector();
  std::vector<double> out;
  const int n[3] = {2, 3, 4};
  int kept[3];
  for (int d = 0; d < 3; ++d) kept[d] = reduced[d] ? 1 : n[d];
  out.assign(kept[0] * kept[1] * kept[2], 0.0);
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) {
      for (int k = 0; k < 4; ++k) {
        const int o = ((reduced[0] ? 0 : i) * kept[1] + (reduced[1] ? 0 : j)) * kept[2] +
                      (reduced[2] ? 0 : k);
        out[o] += v[(i * 3 + j) * 4 + k];
      }
    }
  }
  return out;
}

void ExpectNear(const Tensor& got, const std::vector<double>& want, double scale = 1.0) {
  const std::vector<float> g = got.ToVector();
  ASSERT_EQ(g.size(), want.size());
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], want[i] * scale, 1e-5) << i;
}

TEST(ReduceTest, SumAndMeanOfAllElementsAreScalars) {
  const Tensor x = RandomTensor({2, 3, 4}, 1);
  absl::StatusOr<Tensor> s = Sum(x), m = Mean(x);
  ASSERT_TRUE(s.ok() && m.ok()) << s.status() << m.status();
  EXPECT_THAT(s->shape(), IsEmpty());
  ExpectNear(*s, ReferenceSums(x, {true, true, true}));
  ExpectNear(*m, ReferenceSums(x, {true, true, true}), 1.0 / 24);
  ExpectGradients(
      [](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor a, Sum(in[0]));
        ASSIGN_OR_RETURN(Tensor b, Mean(in[0]));
        return std::vector<Tensor>{a, b};
      },
      {x});
  EXPECT_TRUE(std::isnan(Mean(Tensor::Zeros({0, 3}))->ToVector()[0]));
  EXPECT_EQ(Sum(Tensor::Zeros({0}))->ToVector()[0], 0.0f);
}

TEST(ReduceTest, SumAndMeanOverDimsKeepOrDropThem) {
  const Tensor x = RandomTensor({2, 3, 4}, 2);
  absl::StatusOr<Tensor> s = Sum(x, {0, -1});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(s->shape(), ElementsAre(3));
  ExpectNear(*s, ReferenceSums(x, {true, false, true}));
  absl::StatusOr<Tensor> k = Sum(x, {0, 2}, /*keepdim=*/true);
  EXPECT_THAT(k->shape(), ElementsAre(1, 3, 1));
  absl::StatusOr<Tensor> m = Mean(x, {1}, /*keepdim=*/true);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_THAT(m->shape(), ElementsAre(2, 1, 4));
  ExpectNear(*m, ReferenceSums(x, {false, true, false}), 1.0 / 3);
  ExpectGradients(
      [](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor a, Sum(in[0], {1}));
        ASSIGN_OR_RETURN(Tensor b, Mean(in[0], {-1, 0}, true));
        return std::vector<Tensor>{a, b};
      },
      {x});
  ExpectInvalid(Sum(x, {}).status(), "Sum", "dims is empty");
  ExpectInvalid(Mean(x, {1, -2}).status(), "Mean", "twice");
  ExpectInvalid(Sum(x, {3}).status(), "Sum", "dim 3");
  ExpectInvalid(Sum(Tensor::FromInts({1}, {1}).value()).status(), "Sum", "float32");
}

// NOTE [Sum order], as the CUDA kernel runs it: per chunk the lanes' sums (SumLane) added
// in lane order (CombineLanes), the chunks added in order, scaled and rounded once.
float OrderedSum(const float* x, int64_t base, const kernels::StridedIter<1>& terms, double scale) {
  const int64_t R = kernels::IterSize(terms);
  double total = 0.0;
  for (int64_t c = 0; c < kernels::SumChunks(R); ++c) {
    const int64_t begin = c * kernels::kSumChunk, end = std::min(R, begin + kernels::kSumChunk);
    double lanes[kernels::kSumLanes];
    for (int l = 0; l < kernels::kSumLanes; ++l) {
      lanes[l] = kernels::SumLane(x, base, terms, begin, end, l);
    }
    total = c == 0 ? kernels::CombineLanes(lanes) : total + kernels::CombineLanes(lanes);
  }
  return static_cast<float>(total * scale);
}

TEST(ReduceTest, SumsHaveTheDocumentedOrderForAnyThreadCount) {
  const int64_t rows = 3 * kernels::kSumChunk + 77;  // several chunks
  const Tensor x = RandomTensor({rows, 3}, 3, 10.0f);
  kernels::StridedIter<1> all;
  all.rank = 1;
  all.sizes[0] = rows * 3;
  all.strides[0][0] = 1;
  kernels::StridedIter<1> column;  // dim 0 of [rows, 3]
  column.rank = 1;
  column.sizes[0] = rows;
  column.strides[0][0] = 3;
  for (int threads : {1, 2}) {
    ASSERT_TRUE(kernels::SetIntraOpThreads(threads).ok());
    EXPECT_EQ(Sum(x)->ToVector()[0], OrderedSum(x.data<float>(), 0, all, 1.0));
    EXPECT_EQ(Mean(x)->ToVector()[0], OrderedSum(x.data<float>(), 0, all, 1.0 / (rows * 3)));
    const std::vector<float> cols = Sum(x, {0})->ToVector();
    for (int j = 0; j < 3; ++j) EXPECT_EQ(cols[j], OrderedSum(x.data<float>(), j, column, 1.0));
  }
  ASSERT_TRUE(kernels::SetIntraOpThreads(1).ok());
}

TEST(ReduceTest, MaxFindsTheFirstMaximumAndRoutesItsGradientThere) {
  const Tensor x = Tensor::FromVector({1, 3, 3, -1, 5, 2, 0, 0, 0}, {3, 3}).value();
  absl::StatusOr<std::vector<Tensor>> m = Max(x, 1);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_THAT((*m)[0].ToVector(), ElementsAre(3, 5, 0));
  EXPECT_EQ((*m)[1].dtype(), core::DType::kInt32);
  EXPECT_THAT((*m)[1].ToVector(), ElementsAre(1, 1, 0));  // ties: the first
  absl::StatusOr<std::vector<Tensor>> k = Max(x, 0, /*keepdim=*/true);
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_THAT((*k)[0].shape(), ElementsAre(1, 3));
  EXPECT_THAT((*k)[0].ToVector(), ElementsAre(1, 5, 3));
  EXPECT_THAT((*k)[1].ToVector(), ElementsAre(0, 1, 0));
  Tensor leaf = core::Leaf(x);
  absl::StatusOr<std::vector<Tensor>> ml = Max(leaf, -1);
  ASSERT_TRUE(core::Backward({(*ml)[0]}, {Tensor::FromVector({1, 2, 3}, {3}).value()}).ok());
  EXPECT_THAT(core::LeafGrad(leaf).ToVector(), ElementsAre(0, 1, 0, 0, 2, 0, 3, 0, 0));
  ExpectGradients(
      [](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(std::vector<Tensor> a, Max(in[0], 1));
        ASSIGN_OR_RETURN(std::vector<Tensor> b, Max(in[0], 0, true));
        return std::vector<Tensor>{a[0], a[1], b[0]};
      },
      {RandomTensor({4, 5}, 4)});
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor with_nan = Tensor::FromVector({1, nan, 7, nan}, {4}).value();
  EXPECT_EQ(Max(with_nan, 0)->at(1).ToVector()[0], 1.0f);
  ExpectInvalid(Max(Tensor::Zeros({2, 0}), 1).status(), "Max", "empty along dim 1");
}

TEST(ReduceTest, SumToShapeAndBroadcastToUndoEachOther) {
  const Tensor x = RandomTensor({2, 3, 4}, 5);
  absl::StatusOr<Tensor> s = SumToShape(x, {3, 1});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(s->shape(), ElementsAre(3, 1));
  ExpectNear(*s, ReferenceSums(x, {true, false, true}));
  const Tensor b = RandomTensor({3, 1}, 6);
  absl::StatusOr<Tensor> e = BroadcastTo(b, {2, 3, 4});
  ASSERT_TRUE(e.ok()) << e.status();
  const std::vector<float> ev = e->ToVector(), bv = b.ToVector();
  for (int i = 0; i < 24; ++i) EXPECT_EQ(ev[i], bv[(i / 4) % 3]) << i;
  ExpectGradients(
      [](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor a, SumToShape(in[0], {1, 3, 1}));
        ASSIGN_OR_RETURN(Tensor c, BroadcastTo(in[1], {2, 3, 4}));
        return std::vector<Tensor>{a, c};
      },
      {x, b});
  ExpectInvalid(SumToShape(x, {2, 4}).status(), "SumToShape", "[2, 4]");
  ExpectInvalid(BroadcastTo(b, {3}).status(), "BroadcastTo", "[3, 1]");
}

TEST(ReduceTest, NoGradScopeRecordsNothingAndErrorsPassThrough) {
  const Tensor x = core::Leaf(RandomTensor({2, 3}, 7));
  {
    core::NoGradScope no_grad;
    EXPECT_FALSE(core::RequiresGrad(Sum(x).value()));
    EXPECT_FALSE(core::RequiresGrad(Max(x, 0).value()[0]));
  }
  EXPECT_TRUE(core::RequiresGrad(Mean(x, {1}).value()));
  const absl::StatusOr<Tensor> bad = absl::InvalidArgumentError("Earlier: broke");
  EXPECT_EQ(Sum(bad).status(), bad.status());
  EXPECT_EQ(Max(bad, 0).status(), bad.status());
}

}  // namespace
}  // namespace functional
}  // namespace nn
