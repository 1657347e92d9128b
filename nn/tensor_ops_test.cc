// CPU tests of the device-dispatching tensor ops (nn/tensor_ops.h): the batched,
// strided, mixed-dtype GEMM against a naive double reference, bounds checks, and the row
// ops' defining properties. The CUDA side is compared with these in cuda_layers_test.
#include "nn/tensor_ops.h"

#include <cmath>
#include <string>
#include <vector>

#include "core/random.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/ops.h"

namespace nn {
namespace {

using ::testing::HasSubstr;

core::Tensor Normal(int64_t n, uint64_t seed) {
  core::Tensor t = core::Tensor::Empty({n});
  core::Rng rng(seed);
  FillNormal(t, 0.0f, 1.0f, &rng);
  return t;
}

class MatMulTest : public ::testing::TestWithParam<std::pair<bool, bool>> {};

TEST_P(MatMulTest, BatchedStridedGemmMatchesNaiveReference) {
  const auto [ta, tb] = GetParam();
  const int64_t batch = 2, m = 5, n = 3, k = 7;
  const int64_t ra = ta ? k : m, ca = ta ? m : k, rb = tb ? n : k, cb = tb ? k : n;
  const int64_t lda = ca + 2, ldb = cb + 1, ldc = n + 3;
  const int64_t sa = ra * lda + 1, sb = rb * ldb, sc = m * ldc + 2;
  const core::Tensor a = Normal(3 + batch * sa, 1), b = Normal(batch * sb, 2);
  const core::Tensor c = Normal(batch * sc, 3);
  const std::vector<float> c0 = c.ToVector();
  GemmArgs g;
  g.trans_a = ta;
  g.trans_b = tb;
  g.batch = batch;
  g.m = m;
  g.n = n;
  g.k = k;
  g.alpha = 0.5f;
  g.beta = 2.0f;
  g.a = {a, 3, lda, sa};
  g.b = {b, 0, ldb, sb};
  g.c = {c, 0, ldc, sc};
  ASSERT_TRUE(MatMul("test", g).ok());
  const float* pa = a.data<float>() + 3;
  const float* pb = b.data<float>();
  const std::vector<float> got = c.ToVector();
  std::vector<bool> inside(got.size(), false);
  for (int64_t i = 0; i < batch; ++i) {
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t col = 0; col < n; ++col) {
        double s = 0;
        for (int64_t q = 0; q < k; ++q) {
          const double av = ta ? pa[i * sa + q * lda + r] : pa[i * sa + r * lda + q];
          const double bv = tb ? pb[i * sb + col * ldb + q] : pb[i * sb + q * ldb + col];
          s += av * bv;
        }
        const int64_t idx = i * sc + r * ldc + col;
        inside[idx] = true;
        EXPECT_NEAR(got[idx], 0.5 * s + 2.0 * c0[idx], 1e-5) << i << " " << r << " " << col;
      }
    }
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (!inside[i]) {
      EXPECT_EQ(got[i], c0[i]) << "padding element " << i << " was written";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTransposes, MatMulTest,
                         ::testing::Values(std::make_pair(false, false), std::make_pair(false, true),
                                           std::make_pair(true, false), std::make_pair(true, true)));

TEST(TensorOpsTest, Bf16OperandIsWidenedExactly) {
  const core::Tensor a = Normal(6, 4), b = Normal(6, 5);
  const core::Tensor b16 = b.ToDType(core::DType::kBFloat16, core::MemoryTag::kOther).value();
  const core::Tensor b_rounded =
      b16.ToDType(core::DType::kFloat32, core::MemoryTag::kOther).value();
  GemmArgs g;
  g.m = 2;
  g.n = 2;
  g.k = 3;
  g.a.tensor = a;
  g.b.tensor = b16;
  g.c.tensor = core::Tensor::Zeros({4});
  ASSERT_TRUE(MatMul("test", g).ok());
  const std::vector<float> got = g.c.tensor.ToVector();
  g.b.tensor = b_rounded;
  g.c.tensor = core::Tensor::Zeros({4});
  ASSERT_TRUE(MatMul("test", g).ok());
  EXPECT_EQ(got, g.c.tensor.ToVector());
}

TEST(TensorOpsTest, GemmOperandsOutsideTheirTensorAreInvalidArgument) {
  GemmArgs g;
  g.m = 2;
  g.n = 2;
  g.k = 3;
  g.a.tensor = Normal(6, 1);
  g.a.offset = 1;  // one past the end
  g.b.tensor = Normal(6, 2);
  g.c.tensor = core::Tensor::Zeros({4});
  absl::Status s = MatMul("blocks.0.attn (CausalSelfAttention)", g);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("blocks.0.attn"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("reaches outside"));
  g.a.offset = 0;
  g.c.tensor = core::Tensor::Zeros({4}, core::DType::kBFloat16);
  s = MatMul("x", g);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("float32"));
}

TEST(TensorOpsTest, ColumnSumsWithAndWithoutASecondFactor) {
  const core::Tensor x = core::Tensor::FromVector({1, 2, 3, 4, 5, 6}, {3, 2}).value();
  const core::Tensor y = core::Tensor::FromVector({2, 0, 1, 1, 0, 3}, {3, 2}).value();
  core::Tensor acc = core::Tensor::FromVector({10, 20}, {2}).value();
  ASSERT_TRUE(AccumulateColumnSums("t", x, core::Tensor(), acc).ok());
  EXPECT_EQ(acc.ToVector(), (std::vector<float>{19, 32}));
  ASSERT_TRUE(AccumulateColumnSums("t", x, y, acc).ok());
  EXPECT_EQ(acc.ToVector(), (std::vector<float>{19 + 2 + 3, 32 + 4 + 18}));
  EXPECT_EQ(AccumulateColumnSums("t", x, core::Tensor(), core::Tensor::Zeros({4})).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TensorOpsTest, CausalSoftmaxRowsSumToOneAndMaskTheFuture) {
  const int64_t T = 5;
  const core::Tensor s = Normal(2 * T * T, 6);
  ASSERT_TRUE(CausalSoftmaxForward("t", s, T).ok());
  const std::vector<float> p = s.ToVector();
  for (int64_t r = 0; r < 2 * T; ++r) {
    const int64_t t = r % T;
    double sum = 0;
    for (int64_t c = 0; c < T; ++c) {
      if (c > t) {
        EXPECT_EQ(p[r * T + c], 0.0f);
      }
      sum += p[r * T + c];
    }
    EXPECT_NEAR(sum, 1.0, 1e-6) << r;
  }
  // Backward of a constant upstream gradient is zero (softmax rows sum to one).
  core::Tensor g = core::Tensor::Empty({2 * T * T});
  g.Fill(3.0f);
  ASSERT_TRUE(CausalSoftmaxBackward("t", s, g, T, 0.5f).ok());
  for (float v : g.ToVector()) EXPECT_NEAR(v, 0.0f, 1e-6);
}

TEST(TensorOpsTest, CrossEntropyMatchesNaiveLogSoftmax) {
  const int64_t n = 3, V = 4;
  const core::Tensor logits = Normal(n * V, 7);
  const core::Tensor targets = core::Tensor::FromInts({3, 0, 2}, {n}).value();
  const core::Tensor grad = core::Tensor::Empty({n * V});
  absl::StatusOr<double> loss = CrossEntropyForwardBackward("t", logits, targets, grad);
  ASSERT_TRUE(loss.ok()) << loss.status();
  const std::vector<float> x = logits.ToVector(), g = grad.ToVector();
  double ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    double z = 0;
    for (int64_t j = 0; j < V; ++j) z += std::exp(static_cast<double>(x[i * V + j]));
    const int tg = targets.data<int32_t>()[i];
    ref += std::log(z) - x[i * V + tg];
    for (int64_t j = 0; j < V; ++j) {
      EXPECT_NEAR(g[i * V + j], (std::exp(x[i * V + j]) / z - (j == tg)) / n, 1e-7);
    }
  }
  EXPECT_NEAR(*loss, ref / n, 1e-12);
}

TEST(TensorOpsTest, ZeroAndEmbeddingScatter) {
  core::Tensor gw = Normal(6, 8);
  ASSERT_TRUE(ZeroTensor("t", gw).ok());
  EXPECT_EQ(gw.ToVector(), std::vector<float>(6, 0.0f));
  core::Tensor table = core::Tensor::FromVector({1, 2, 3, 4, 5, 6}, {3, 2}).value();
  const core::Tensor ids = core::Tensor::FromInts({2, 0, 2}, {3}).value();
  core::Tensor y = core::Tensor::Empty({6});
  ASSERT_TRUE(EmbeddingForward("t", table, ids, y).ok());
  EXPECT_EQ(y.ToVector(), (std::vector<float>{5, 6, 1, 2, 5, 6}));
  const core::Tensor gy = core::Tensor::FromVector({1, 1, 2, 2, 3, 3}, {6}).value();
  core::Tensor gw2 = core::Tensor::Zeros({3, 2});
  ASSERT_TRUE(EmbeddingBackward("t", ids, gy, gw2).ok());
  EXPECT_EQ(gw2.ToVector(), (std::vector<float>{2, 2, 0, 0, 4, 4}));
}

}  // namespace
}  // namespace nn
