#include "nn/functional/shape.h"

#include <cstdint>
#include <vector>

#include "core/autograd.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/tensor_kernels.h"
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
using tensor_test_util::Ints;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// The value at flat index `i` of a row-major tensor of `shape` read at coordinates `c`.
int64_t Flat(const Shape& shape, const std::vector<int64_t>& c) {
  int64_t i = 0;
  for (size_t d = 0; d < shape.size(); ++d) i = i * shape[d] + c[d];
  return i;
}

// The coordinates of flat index i in `shape`.
std::vector<int64_t> Coords(const Shape& shape, int64_t i) {
  std::vector<int64_t> c(shape.size());
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    c[d] = i % shape[d];
    i /= shape[d];
  }
  return c;
}

std::vector<Tensor> One(const Tensor& t) { return {t}; }

TEST(ShapeTest, ReshapeAliasesInfersMinusOneAndReshapesTheGradient) {
  const Tensor x = RandomTensor({2, 3, 2}, 1);
  absl::StatusOr<Tensor> y = Reshape(x, {3, -1});
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_THAT(y->shape(), ElementsAre(3, 4));
  EXPECT_TRUE(y->SharesStorage(x));
  EXPECT_EQ(y->ToVector(), x.ToVector());
  ExpectGradients(
      [](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor y, Reshape(in[0], {4, 3}));
        return One(y);
      },
      {x});
  ExpectInvalid(Reshape(x, {-1, -1}).status(), "Reshape", "[-1, -1]");
  ExpectInvalid(Reshape(x, {5, -1}).status(), "Reshape", "12 elements");
  ExpectInvalid(Reshape(x, {2, 2}).status(), "Reshape", "[2, 2]");
  EXPECT_THAT(Reshape(Tensor::Zeros({0, 3}), {-1, 3})->shape(), ElementsAre(0, 3));
}

TEST(ShapeTest, PermuteAndTransposeMoveElementsAndInvertTheGradient) {
  const Shape shape = {2, 3, 4};
  const Tensor x = RandomTensor(shape, 2);
  const std::vector<float> xv = x.ToVector();
  absl::StatusOr<Tensor> p = Permute(x, {2, 0, -2});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->shape(), ElementsAre(4, 2, 3));
  const std::vector<float> pv = p->ToVector();
  for (int64_t i = 0; i < p->numel(); ++i) {
    const std::vector<int64_t> c = Coords(p->shape(), i);  // (k, i, j) = x[i, j, k]
    EXPECT_EQ(pv[i], xv[Flat(shape, {c[1], c[2], c[0]})]);
  }
  absl::StatusOr<Tensor> t = Transpose(x, -1, 0);  // [4, 3, 2]
  ASSERT_TRUE(t.ok()) << t.status();
  const std::vector<float> tv = t->ToVector();
  for (int64_t i = 0; i < t->numel(); ++i) {
    const std::vector<int64_t> c = Coords(t->shape(), i);
    EXPECT_EQ(tv[i], xv[Flat(shape, {c[2], c[1], c[0]})]);
  }
  ExpectGradients(
      [](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor y, Permute(in[0], {1, 2, 0}));
        ASSIGN_OR_RETURN(Tensor z, Transpose(in[1], 0, 1));
        return std::vector<Tensor>{y, z};
      },
      {x, RandomTensor({3, 5}, 3)});
  ExpectInvalid(Permute(x, {0, 0, 1}).status(), "Permute", "[0, 0, 1]");
  ExpectInvalid(Permute(x, {0, 1}).status(), "Permute", "[2, 3, 4]");
  ExpectInvalid(Transpose(x, 3, 0).status(), "Transpose", "dim0 3");
}

TEST(ShapeTest, SliceClampsLikePythonAndScattersTheGradientIntoZeros) {
  const Tensor x = Tensor::FromVector({0, 1, 2, 3, 4}, {5}).value();
  EXPECT_THAT(Slice(x, 0, -3, 100)->ToVector(), ElementsAre(2, 3, 4));
  EXPECT_THAT(Slice(x, -1, -100, 2)->ToVector(), ElementsAre(0, 1));
  EXPECT_THAT(Slice(x, 0, 4, 2)->shape(), ElementsAre(0));  // empty, not an error
  const Tensor m = RandomTensor({3, 4}, 4);
  absl::StatusOr<Tensor> cols = Slice(m, 1, 1, 3);
  ASSERT_TRUE(cols.ok()) << cols.status();
  EXPECT_THAT(cols->shape(), ElementsAre(3, 2));
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 2; ++c) {
      EXPECT_EQ(cols->ToVector()[r * 2 + c], m.ToVector()[r * 4 + c + 1]);
    }
  }
  Tensor leaf = core::Leaf(m);
  absl::StatusOr<Tensor> s = Slice(leaf, 0, 1, 2);
  ASSERT_TRUE(core::Backward({*s}, {Tensor::FromVector({1, 2, 3, 4}, {1, 4}).value()}).ok());
  EXPECT_THAT(core::LeafGrad(leaf).ToVector(), ElementsAre(0, 0, 0, 0, 1, 2, 3, 4, 0, 0, 0, 0));
  ExpectGradients(
      [](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor y, Slice(in[0], -2, 1, -1));
        return One(y);
      },
      {RandomTensor({2, 4, 3}, 5)});
  ExpectInvalid(Slice(m, 2, 0, 1).status(), "Slice", "dim 2");
}

TEST(ShapeTest, CatJoinsAlongADimAndSlicesTheGradientBack) {
  const Tensor a = RandomTensor({2, 1, 3}, 6), b = RandomTensor({2, 2, 3}, 7);
  absl::StatusOr<Tensor> c = Cat({a, b}, -2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->shape(), ElementsAre(2, 3, 3));
  const std::vector<float> cv = c->ToVector(), av = a.ToVector(), bv = b.ToVector();
  for (int64_t i = 0; i < c->numel(); ++i) {
    const std::vector<int64_t> k = Coords(c->shape(), i);
    const float want = k[1] == 0 ? av[Flat(a.shape(), {k[0], 0, k[2]})]
                                 : bv[Flat(b.shape(), {k[0], k[1] - 1, k[2]})];
    EXPECT_EQ(cv[i], want);
  }
  ExpectGradients(
      [](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor y, Cat({in[0], in[1], in[0]}, 1));  // a used twice
        return One(y);
      },
      {a, b});
  // An empty piece joins as nothing.
  EXPECT_EQ(Cat({a, Tensor::Zeros({2, 0, 3})}, 1)->ToVector(), av);
  ExpectInvalid(Cat({a, RandomTensor({2, 2, 4}, 8)}, 1).status(), "Cat", "tensor 1");
  ExpectInvalid(Cat({}, 0).status(), "Cat", "at least one");
}

TEST(ShapeTest, SplitCutsPiecesAndJoinsTheirGradientsWithZerosForUnusedOnes) {
  const Tensor x = RandomTensor({2, 5}, 9);
  absl::StatusOr<std::vector<Tensor>> parts = Split(x, {2, 0, 3}, -1);
  ASSERT_TRUE(parts.ok()) << parts.status();
  ASSERT_EQ(parts->size(), 3u);
  EXPECT_EQ((*parts)[0].ToVector(), Slice(x, 1, 0, 2)->ToVector());
  EXPECT_THAT((*parts)[1].shape(), ElementsAre(2, 0));
  EXPECT_EQ((*parts)[2].ToVector(), Slice(x, 1, 2, 5)->ToVector());
  ExpectGradients([](const std::vector<Tensor>& in) { return Split(in[0], {1, 4}, 1); }, {x});
  Tensor leaf = core::Leaf(x);
  absl::StatusOr<std::vector<Tensor>> used = Split(leaf, {2, 3}, 1);
  ASSERT_TRUE(used.ok());
  Tensor ones = Tensor::Zeros({2, 2});
  ones.Fill(1.0f);
  ASSERT_TRUE(core::Backward({(*used)[0]}, {ones}).ok());  // the second piece unused
  EXPECT_THAT(core::LeafGrad(leaf).ToVector(), ElementsAre(1, 1, 0, 0, 0, 1, 1, 0, 0, 0));
  ExpectInvalid(Split(x, {2, 2}, 1).status(), "Split", "sum to 5");
  ExpectInvalid(Split(x, {6, -1}, 1).status(), "Split", "non-negative");
}

TEST(ShapeTest, IndexSelectPicksSlicesAndAddsRepeatedGradients) {
  const Tensor x = RandomTensor({4, 3}, 10);
  const std::vector<float> xv = x.ToVector();
  absl::StatusOr<Tensor> rows = IndexSelect(x, 0, Ints({2, 0, 2}, {3}));
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_THAT(rows->shape(), ElementsAre(3, 3));
  const int src[] = {2, 0, 2};
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 3; ++c) EXPECT_EQ(rows->ToVector()[r * 3 + c], xv[src[r] * 3 + c]);
  }
  absl::StatusOr<Tensor> cols = IndexSelect(x, -1, Ints({1, 1}, {2}));
  ASSERT_TRUE(cols.ok()) << cols.status();
  EXPECT_THAT(cols->shape(), ElementsAre(4, 2));
  EXPECT_EQ(cols->ToVector()[5], xv[2 * 3 + 1]);
  ExpectGradients(
      [](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor a, IndexSelect(in[0], 0, in[1]));
        ASSIGN_OR_RETURN(Tensor b, IndexSelect(in[0], 1, Ints({2, 0, 2, 2}, {4})));
        return std::vector<Tensor>{a, b};
      },
      {x, Ints({3, 3, 1, 3, 0}, {5})});
  ExpectInvalid(IndexSelect(x, 0, Ints({0, 4}, {2})).status(), "IndexSelect",
                "index value 4 at flat position 1");
  ExpectInvalid(IndexSelect(x, 0, Ints({0}, {1, 1})).status(), "IndexSelect", "1-D");
  ExpectInvalid(IndexSelect(x, 0, Tensor::Zeros({2})).status(), "IndexSelect", "int32");
}

TEST(ShapeTest, GatherReadsAlongADimAndScattersItsGradient) {
  const Tensor x = RandomTensor({3, 4}, 11);
  const std::vector<float> xv = x.ToVector();
  const Tensor index = Ints({3, 0, 1, 1, 2, 2}, {3, 2});
  absl::StatusOr<Tensor> g1 = Gather(x, 1, index);
  ASSERT_TRUE(g1.ok()) << g1.status();
  const std::vector<float> gv = g1->ToVector();
  const std::vector<float> iv = index.ToVector();
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 2; ++j) {
      EXPECT_EQ(gv[i * 2 + j], xv[i * 4 + static_cast<int>(iv[i * 2 + j])]);  // x[i, idx[i, j]]
    }
  }
  const Tensor index0 = Ints({2, 0, 1, 2, 2, 2}, {2, 3});  // smaller than x in dim 1
  absl::StatusOr<Tensor> g0 = Gather(x, 0, index0);
  ASSERT_TRUE(g0.ok()) << g0.status();
  const std::vector<float> i0 = index0.ToVector();
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) {
      EXPECT_EQ(g0->ToVector()[i * 3 + j], xv[static_cast<int>(i0[i * 3 + j]) * 4 + j]);
    }
  }
  ExpectGradients(
      [](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor a, Gather(in[0], 1, in[1]));
        ASSIGN_OR_RETURN(Tensor b, Gather(in[0], 0, in[2]));
        return std::vector<Tensor>{a, b};
      },
      {x, index, index0});
  ExpectInvalid(Gather(x, 1, Ints({0, 5}, {1, 2})).status(), "Gather", "index value 5");
  ExpectInvalid(Gather(x, 0, Ints(std::vector<int32_t>(10, 0), {2, 5})).status(), "Gather",
                "larger than input");
  ExpectInvalid(Gather(x, 0, Ints({0, 1}, {2})).status(), "Gather", "rank");
}

TEST(ShapeTest, ScatterAddAddsSourceAtIndexAndGathersTheSourceGradient) {
  const Tensor x = RandomTensor({3, 4}, 12), src = RandomTensor({3, 3}, 13);
  const Tensor index = Ints({3, 3, 0, 1, 1, 1}, {2, 3});  // rows 0 and 1 of src only
  absl::StatusOr<Tensor> y = ScatterAdd(x, 1, index, src);
  ASSERT_TRUE(y.ok()) << y.status();
  const std::vector<float> xv = x.ToVector();
  std::vector<double> want(xv.begin(), xv.end());
  const std::vector<float> sv = src.ToVector(), iv = index.ToVector();
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) want[i * 4 + static_cast<int>(iv[i * 3 + j])] += sv[i * 3 + j];
  }
  const std::vector<float> yv = y->ToVector();
  for (int i = 0; i < 12; ++i) EXPECT_NEAR(yv[i], want[i], 1e-6) << i;
  ExpectGradients(
      [](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor out, ScatterAdd(in[0], 1, in[2], in[1]));
        return One(out);
      },
      {x, src, index});
  ExpectGradients(
      [](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor out, ScatterAdd(in[0], 0, in[2], in[1]));
        return One(out);
      },
      {x, src, Ints({2, 0, 2, 2, 2, 0}, {2, 3})});
  ExpectInvalid(ScatterAdd(x, 1, Ints({4}, {1, 1}), src).status(), "ScatterAdd", "index value 4");
  ExpectInvalid(ScatterAdd(x, 1, Ints(std::vector<int32_t>(8, 0), {2, 4}), src).status(),
                "ScatterAdd", "larger than src");
}

// NOTE [Strided iteration]: coalescing walks the same offsets over fewer dims.
TEST(ShapeTest, CoalescedIterationsWalkTheSameOffsets) {
  kernels::StridedIter<2> it;  // [2, 1, 3, 4] contiguous, and broadcast along dim 2
  it.rank = 4;
  const int64_t sizes[] = {2, 1, 3, 4}, a[] = {12, 12, 4, 1}, b[] = {4, 4, 0, 1};
  for (int d = 0; d < 4; ++d) {
    it.sizes[d] = sizes[d];
    it.strides[0][d] = a[d];
    it.strides[1][d] = b[d];
  }
  kernels::StridedIter<2> merged = it;
  kernels::CoalesceDims(&merged);
  EXPECT_EQ(merged.rank, 3);  // the size-1 dim dropped; [2] and [3] not mergeable for b
  ASSERT_EQ(kernels::IterSize(merged), 24);
  for (int64_t i = 0; i < 24; ++i) {
    int64_t want[2], got[2];
    kernels::StridedOffsets(it, i, want);
    kernels::StridedOffsets(merged, i, got);
    EXPECT_EQ(got[0], want[0]) << i;
    EXPECT_EQ(got[1], want[1]) << i;
  }
  kernels::StridedIter<1> contiguous;
  contiguous.rank = 3;
  for (int d = 0; d < 3; ++d) contiguous.sizes[d] = 2;
  contiguous.strides[0][0] = 4;
  contiguous.strides[0][1] = 2;
  contiguous.strides[0][2] = 1;
  kernels::CoalesceDims(&contiguous);
  EXPECT_EQ(contiguous.rank, 1);
  EXPECT_EQ(contiguous.sizes[0], 8);
}

// NOTE [Gather and scatter]: the CUDA kernel sums each data element's sources with
// ScatterSumAt; the CPU loop must add the same terms in the same order (same bits).
TEST(ShapeTest, TheCpuScatterLoopHasTheBitsOfThePerElementBody) {
  const Shape data_shape = {3, 5, 2}, index_shape = {3, 40, 2};
  const Tensor src = RandomTensor(index_shape, 14, 100.0f);
  std::vector<int32_t> idx(3 * 40 * 2);
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int32_t>((i * 7 + i / 3) % 5);
  kernels::GatherScatter g;
  g.rank = 3;
  g.dim = 1;
  const int64_t strides[] = {80, 2, 1};
  for (int d = 0; d < 3; ++d) {
    g.sizes[d] = index_shape[d];
    g.data_sizes[d] = data_shape[d];
    g.index_strides[d] = g.other_strides[d] = strides[d];
  }
  const Tensor base = RandomTensor(data_shape, 15);
  std::vector<float> cpu = base.ToVector();
  kernels::cpu::ScatterAdd(src.data<float>(), idx.data(), cpu.data(), g);
  for (int64_t e = 0; e < base.numel(); ++e) {
    const float body =
        kernels::ScatterSumAt(g, src.data<float>(), idx.data(), e, base.data<float>()[e]);
    EXPECT_EQ(cpu[e], body) << e;
  }
}

TEST(ShapeTest, Int32TensorsMoveWithoutGradients) {
  const Tensor ids = Ints({1, 2, 3, 4, 5, 6}, {2, 3});
  absl::StatusOr<Tensor> t = Transpose(ids, 0, 1);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->dtype(), core::DType::kInt32);
  EXPECT_THAT(t->ToVector(), ElementsAre(1, 4, 2, 5, 3, 6));
  EXPECT_THAT(Cat({ids, ids}, 0)->ToVector(),
              ElementsAreArray({1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6}));
  ExpectInvalid(Gather(ids, 0, ids).status(), "Gather", "float32");
}

TEST(ShapeTest, NoGradScopeRecordsNothingAndErrorsPassThrough) {
  const Tensor x = core::Leaf(RandomTensor({2, 3}, 16));
  {
    core::NoGradScope no_grad;
    EXPECT_FALSE(core::RequiresGrad(Transpose(x, 0, 1).value()));
    EXPECT_FALSE(core::RequiresGrad(Split(x, {1, 2}, 1).value()[0]));
  }
  EXPECT_TRUE(core::RequiresGrad(Transpose(x, 0, 1).value()));
  const absl::StatusOr<Tensor> bad = absl::InvalidArgumentError("Earlier: broke");
  EXPECT_EQ(Transpose(bad, 0, 1).status(), bad.status());
  EXPECT_EQ(Cat({x, bad}, 0).status(), bad.status());
  ExpectInvalid(Transpose(Tensor(), 0, 1).status(), "Transpose", "input is undefined");
}

}  // namespace
}  // namespace functional
}  // namespace nn
