// CPU tests of the device-dispatching tensor ops (nn/tensor_ops.h): the batched,
// strided, mixed-dtype GEMM against a naive double reference, bounds checks, and the row
// ops' defining properties. The CUDA side is compared with these in cuda_layers_test.
#include "nn/tensor_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/random.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu.h"
#include "kernels/elementwise.h"
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

// ---- The vectorised CPU loops (FSDP_CPU_CLONES) against the scalar bodies and double
// references, at lengths around the vector widths (4 and 8 floats, 2 and 4 doubles).

const int64_t kLengths[] = {1, 3, 7, 8, 9, 16, 31, 33, 256, 1001};

// The loops run the clone this CPU supports: x86-64-v3 (AVX2 + FMA) on this machine.
TEST(CpuLoopsTest, TheCloneForThisCpuIsSelected) {
#if FSDP_CPU_HAS_CLONES
  const bool v3 = __builtin_cpu_supports("x86-64-v3");
  EXPECT_STREQ(CpuLoopIsa(), v3 ? "x86-64-v3" : "default");
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("movbe")) {
    EXPECT_STREQ(CpuLoopIsa(), "x86-64-v3");
  }
#else
  EXPECT_STREQ(CpuLoopIsa(), "default");
#endif
}

// Elementwise loops compute every element bit for bit as the scalar body does (no FMA
// contraction, no reassociation), at every length.
TEST(CpuLoopsTest, ElementwiseLoopsMatchTheScalarBodiesBitForBit) {
  namespace k = ::kernels;
  for (int64_t n : kLengths) {
    SCOPED_TRACE(n);
    const core::Tensor x = Normal(n, 10 + n), g = Normal(n, 20 + n);
    // Spread GELU's input over its whole range (tails and the clamp of FastTanh).
    float* px = x.data<float>();
    for (int64_t i = 0; i < n; ++i) px[i] *= 4.0f;
    const std::vector<float> xv = x.ToVector(), gv = g.ToVector();
    core::Tensor y = core::Tensor::Empty({n});
    ASSERT_TRUE(GeluForward("t", x, y).ok());
    std::vector<float> out = y.ToVector();
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(out[i], k::GeluTanhForward(xv[i])) << "gelu " << i;
      const double xd = xv[i];
      const double exact =
          0.5 * xd * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (xd + 0.044715 * xd * xd * xd)));
      ASSERT_NEAR(out[i], exact, 1e-6 * (1.0 + std::abs(xd))) << "gelu vs exact " << i;
    }
    ASSERT_TRUE(GeluBackward("t", x, g, y).ok());
    out = y.ToVector();
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], k::GeluTanhBackward(xv[i], gv[i])) << i;
    ASSERT_TRUE(ReluForward("t", x, y).ok());
    out = y.ToVector();
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], xv[i] > 0 ? xv[i] : 0.0f) << i;
    ASSERT_TRUE(ReluBackward("t", x, g, y).ok());
    out = y.ToVector();
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], xv[i] > 0 ? gv[i] : 0.0f) << i;
    ASSERT_TRUE(AddTensors("t", x, g, y).ok());
    out = y.ToVector();
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], xv[i] + gv[i]) << i;
    // In place, as the residual adds run.
    ASSERT_TRUE(AddTensors("t", y, g, y).ok());
    const std::vector<float> twice = y.ToVector();
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(twice[i], out[i] + gv[i]) << i;
  }
}

TEST(CpuLoopsTest, BiasAddMatchesTheScalarBodyForFp32AndBf16Bias) {
  for (int64_t cols : kLengths) {
    SCOPED_TRACE(cols);
    const int64_t rows = 3;
    const core::Tensor x = Normal(rows * cols, 30 + cols), b = Normal(cols, 40 + cols);
    const core::Tensor b16 = b.ToDType(core::DType::kBFloat16, core::MemoryTag::kOther).value();
    const std::vector<float> xv = x.ToVector();
    for (const core::Tensor* bias : {&b, &b16}) {
      const std::vector<float> bv =
          bias->ToDType(core::DType::kFloat32, core::MemoryTag::kOther).value().ToVector();
      core::Tensor y = core::Tensor::Empty({rows * cols});
      ASSERT_TRUE(BiasAdd("t", x, *bias, y).ok());
      const std::vector<float> out = y.ToVector();
      for (int64_t i = 0; i < rows * cols; ++i) ASSERT_EQ(out[i], xv[i] + bv[i % cols]) << i;
    }
  }
}

TEST(CpuLoopsTest, ColumnSumsMatchADoubleReference) {
  for (int64_t cols : kLengths) {
    SCOPED_TRACE(cols);
    const int64_t rows = 37;
    const core::Tensor x = Normal(rows * cols, 50 + cols), y = Normal(rows * cols, 60 + cols);
    const std::vector<float> xv = x.ToVector(), yv = y.ToVector();
    core::Tensor plain = core::Tensor::Zeros({cols}), product = core::Tensor::Zeros({cols});
    ASSERT_TRUE(AccumulateColumnSums("t", x, core::Tensor(), plain).ok());
    ASSERT_TRUE(AccumulateColumnSums("t", x, y, product).ok());
    const std::vector<float> p = plain.ToVector(), q = product.ToVector();
    for (int64_t j = 0; j < cols; ++j) {
      double sp = 0, sq = 0;
      for (int64_t r = 0; r < rows; ++r) {
        sp += xv[r * cols + j];
        sq += static_cast<double>(xv[r * cols + j]) * yv[r * cols + j];
      }
      // Double accumulation rounded once to float.
      EXPECT_EQ(p[j], static_cast<float>(sp)) << j;
      EXPECT_EQ(q[j], static_cast<float>(sq)) << j;
    }
  }
}

TEST(CpuLoopsTest, LayerNormForwardAndBackwardMatchADoubleReference) {
  const float eps = 1e-5f;
  for (int64_t cols : kLengths) {
    for (core::DType wdt : {core::DType::kFloat32, core::DType::kBFloat16}) {
      SCOPED_TRACE(testing::Message() << cols << " " << core::DTypeName(wdt));
      const int64_t rows = 5;
      const core::Tensor x = Normal(rows * cols, 70 + cols);
      float* px = x.data<float>();
      for (int64_t i = 0; i < rows * cols; ++i) px[i] = 3.0f + 2.0f * px[i];  // mean 3
      const core::Tensor w = Normal(cols, 80 + cols).ToDType(wdt, core::MemoryTag::kOther).value();
      const core::Tensor b = Normal(cols, 90 + cols).ToDType(wdt, core::MemoryTag::kOther).value();
      const std::vector<float> wv =
          w.ToDType(core::DType::kFloat32, core::MemoryTag::kOther).value().ToVector();
      const std::vector<float> bv =
          b.ToDType(core::DType::kFloat32, core::MemoryTag::kOther).value().ToVector();
      core::Tensor y = core::Tensor::Empty({rows * cols}), h = core::Tensor::Empty({rows * cols});
      core::Tensor rstd = core::Tensor::Empty({rows});
      ASSERT_TRUE(LayerNormForward("t", x, w, b, eps, y, h, rstd).ok());
      const core::Tensor g = Normal(rows * cols, 100 + cols);
      core::Tensor gx = core::Tensor::Empty({rows * cols});
      core::Tensor gw = core::Tensor::Zeros({cols}), gb = core::Tensor::Zeros({cols});
      ASSERT_TRUE(LayerNormBackward("t", g, h, rstd, w, gx, gw, gb).ok());
      const std::vector<float> xv = x.ToVector(), yv = y.ToVector(), hv = h.ToVector(),
                               rv = rstd.ToVector(), gv = g.ToVector(), gxv = gx.ToVector(),
                               gwv = gw.ToVector(), gbv = gb.ToVector();
      std::vector<double> gw_ref(cols, 0.0), gb_ref(cols, 0.0);
      for (int64_t r = 0; r < rows; ++r) {
        const float* xr = &xv[r * cols];
        double mean = 0, var = 0;
        for (int64_t j = 0; j < cols; ++j) mean += xr[j];
        mean /= cols;
        for (int64_t j = 0; j < cols; ++j) var += (xr[j] - mean) * (xr[j] - mean);
        var /= cols;
        const double rs = 1.0 / std::sqrt(var + eps);
        ASSERT_NEAR(rv[r], rs, 2e-6 * rs) << r;
        std::vector<double> xhat(cols), gh(cols);
        double mean_gh = 0, mean_gh_h = 0;
        for (int64_t j = 0; j < cols; ++j) {
          xhat[j] = (xr[j] - mean) * rs;
          ASSERT_NEAR(hv[r * cols + j], xhat[j], 2e-6 * (1 + std::abs(xhat[j]))) << j;
          const double yref = xhat[j] * wv[j] + bv[j];
          ASSERT_NEAR(yv[r * cols + j], yref, 4e-6 * (1 + std::abs(yref))) << j;
          gh[j] = static_cast<double>(gv[r * cols + j]) * wv[j];
          mean_gh += gh[j] / cols;
          mean_gh_h += gh[j] * xhat[j] / cols;
          gw_ref[j] += gv[r * cols + j] * xhat[j];
          gb_ref[j] += gv[r * cols + j];
        }
        for (int64_t j = 0; j < cols; ++j) {
          const double ref = rs * (gh[j] - mean_gh - xhat[j] * mean_gh_h);
          ASSERT_NEAR(gxv[r * cols + j], ref, 4e-6 * (1 + std::abs(ref))) << j;
        }
      }
      for (int64_t j = 0; j < cols; ++j) {
        EXPECT_NEAR(gwv[j], gw_ref[j], 4e-6 * (1 + std::abs(gw_ref[j]))) << j;
        EXPECT_NEAR(gbv[j], gb_ref[j], 1e-6 * (1 + std::abs(gb_ref[j]))) << j;
      }
    }
  }
}

TEST(CpuLoopsTest, CausalSoftmaxForwardAndBackwardMatchADoubleReference) {
  for (int64_t T : kLengths) {
    if (T > 256) continue;
    SCOPED_TRACE(T);
    const int64_t rows = 2 * T;
    const core::Tensor scores = Normal(rows * T, 110 + T);
    float* ps = scores.data<float>();
    for (int64_t i = 0; i < rows * T; ++i) ps[i] *= 3.0f;
    const std::vector<float> sv = scores.ToVector();
    ASSERT_TRUE(CausalSoftmaxForward("t", scores, T).ok());
    const std::vector<float> p = scores.ToVector();
    const core::Tensor g = Normal(rows * T, 120 + T);
    const std::vector<float> gv = g.ToVector();
    const float scale = 0.125f;
    ASSERT_TRUE(CausalSoftmaxBackward("t", scores, g, T, scale).ok());
    const std::vector<float> gs = g.ToVector();
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = r % T;
      double max = sv[r * T];
      for (int64_t s = 0; s <= t; ++s) max = std::max<double>(max, sv[r * T + s]);
      double sum = 0;
      for (int64_t s = 0; s <= t; ++s) sum += std::exp(sv[r * T + s] - max);
      double dot = 0;
      for (int64_t s = 0; s <= t; ++s) dot += gv[r * T + s] * std::exp(sv[r * T + s] - max) / sum;
      for (int64_t s = 0; s < T; ++s) {
        if (s > t) {
          ASSERT_EQ(p[r * T + s], 0.0f);
          ASSERT_EQ(gs[r * T + s], 0.0f);
          continue;
        }
        const double pref = std::exp(sv[r * T + s] - max) / sum;
        ASSERT_NEAR(p[r * T + s], pref, 1e-6 * pref + 1e-9) << r << " " << s;
        const double gref = scale * pref * (gv[r * T + s] - dot);
        ASSERT_NEAR(gs[r * T + s], gref, 2e-6 * (pref + std::abs(gref)) + 1e-9) << r << " " << s;
      }
    }
  }
}

TEST(CpuLoopsTest, CrossEntropyMatchesADoubleReferenceAtEveryVocabularySize) {
  for (int64_t V : kLengths) {
    SCOPED_TRACE(V);
    const int64_t n = 5;
    const core::Tensor logits = Normal(n * V, 130 + V);
    float* pl = logits.data<float>();
    for (int64_t i = 0; i < n * V; ++i) pl[i] *= 4.0f;
    std::vector<int32_t> tgi(n);
    for (int64_t i = 0; i < n; ++i) tgi[i] = static_cast<int32_t>((i * 7 + 3) % V);
    const core::Tensor targets = core::Tensor::FromInts(tgi, {n}).value();
    const core::Tensor grad = core::Tensor::Empty({n * V});
    absl::StatusOr<double> loss = CrossEntropyForwardBackward("t", logits, targets, grad);
    ASSERT_TRUE(loss.ok()) << loss.status();
    const std::vector<float> x = logits.ToVector(), gr = grad.ToVector();
    double ref = 0;
    for (int64_t i = 0; i < n; ++i) {
      double z = 0;
      for (int64_t j = 0; j < V; ++j) z += std::exp(static_cast<double>(x[i * V + j]));
      ref += std::log(z) - x[i * V + tgi[i]];
      for (int64_t j = 0; j < V; ++j) {
        const double gref = (std::exp(static_cast<double>(x[i * V + j])) / z - (j == tgi[i])) / n;
        ASSERT_NEAR(gr[i * V + j], gref, 1e-7) << i << " " << j;
      }
    }
    EXPECT_NEAR(*loss, ref / n, 1e-12);
  }
}

// Rows and elements split over OpenMP threads (calls of >= 64K elements): results are bit
// for bit the same for 1, 2 and 3 threads.
// LaneSum's order is the code's: lane l sums j = l, l + 8, ... and the lanes combine
// pairwise, so the result has the same bits whether the compiler vectorised it or not
// (clones, -O levels, sanitizers). A plain scalar loop in that order must match exactly.
TEST(CpuLoopsTest, LaneSumHasTheBitsOfItsFixedLaneOrder) {
  std::vector<float> x(1003);
  std::vector<double> xd(1003);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)) * 1e3 + 1e-3 * i);
    xd[i] = std::cos(0.11 * static_cast<double>(i)) * 1e8 + i;
  }
  for (int64_t n : {0, 1, 7, 8, 9, 31, 1003}) {
    float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t j = 0; j < n; ++j) lanes[j % 8] += x[j];
    const float want =
        ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
    const float got = kernels::LaneSum<float>(n, [&](int64_t j) { return x[j]; });
    EXPECT_EQ(std::memcmp(&got, &want, sizeof(float)), 0) << "n " << n << ": " << got << " vs " << want;
    double dl[4] = {0, 0, 0, 0};
    for (int64_t j = 0; j < n; ++j) dl[j % 4] += xd[j];
    const double dwant = (dl[0] + dl[2]) + (dl[1] + dl[3]);
    const double dgot = kernels::LaneSum<double>(n, [&](int64_t j) { return xd[j]; });
    EXPECT_EQ(std::memcmp(&dgot, &dwant, sizeof(double)), 0) << "n " << n;
  }
}

// The bits of every element, so -0.0 and 0.0 differ.
std::vector<uint32_t> Bits(const core::Tensor& t) {
  const std::vector<float> v = t.ToVector();
  std::vector<uint32_t> bits(v.size());
  std::memcpy(bits.data(), v.data(), v.size() * sizeof(float));
  return bits;
}

// NOTE [Fused ops]: each fused op against the unfused ops it names, run one after the
// other on copies of the same inputs, for fp32 and bf16 weights, row lengths that are and
// are not a multiple of 8 lanes, and in place where the op allows it.
TEST(FusedOpsTest, EachGivesTheBitsOfTheUnfusedOps) {
  for (int64_t cols : {1, 8, 37, 256}) {
    for (core::DType wtype : {core::DType::kFloat32, core::DType::kBFloat16}) {
      SCOPED_TRACE(absl::StrCat("cols ", cols, " ", core::DTypeName(wtype)));
      const int64_t rows = 19, n = rows * cols;
      auto weight = [&](uint64_t seed) {
        return Normal(cols, seed).ToDType(wtype, core::MemoryTag::kOther).value();
      };
      const core::Tensor bias = weight(1), w = weight(2), lb = weight(3);
      const core::Tensor x = Normal(n, 4), a = Normal(n, 5), g = Normal(n, 6);
      auto empty = [&](int64_t k) { return core::Tensor::Empty({k}); };

      // BiasGeluForward, into a separate pre-activation and in place over its input.
      core::Tensor pre_ref = empty(n), y_ref = empty(n);
      ASSERT_TRUE(BiasAdd("t", x, bias, pre_ref).ok());
      ASSERT_TRUE(GeluForward("t", pre_ref, y_ref).ok());
      core::Tensor pre = empty(n), y = empty(n);
      ASSERT_TRUE(BiasGeluForward("t", x, bias, pre, y).ok());
      EXPECT_EQ(Bits(pre), Bits(pre_ref));
      EXPECT_EQ(Bits(y), Bits(y_ref));
      core::Tensor inplace = x.Clone(core::MemoryTag::kOther);
      ASSERT_TRUE(BiasGeluForward("t", inplace, bias, inplace, y).ok());
      EXPECT_EQ(Bits(inplace), Bits(pre_ref));
      EXPECT_EQ(Bits(y), Bits(y_ref));

      // GeluBackwardBiasGrad, with and without the bias gradient; gb starts non-zero.
      core::Tensor gx_ref = empty(n), gb_ref = Normal(cols, 7);
      ASSERT_TRUE(GeluBackward("t", pre_ref, g, gx_ref).ok());
      ASSERT_TRUE(AccumulateColumnSums("t", gx_ref, core::Tensor(), gb_ref).ok());
      core::Tensor gx = empty(n), gb = Normal(cols, 7);
      ASSERT_TRUE(GeluBackwardBiasGrad("t", pre_ref, g, gx, gb).ok());
      EXPECT_EQ(Bits(gx), Bits(gx_ref));
      EXPECT_EQ(Bits(gb), Bits(gb_ref));
      core::Tensor gx_only = empty(n);
      ASSERT_TRUE(GeluBackwardBiasGrad("t", pre_ref, g, gx_only, core::Tensor()).ok());
      EXPECT_EQ(Bits(gx_only), Bits(gx_ref));

      // AddLayerNormForward, into a separate sum and in place over either operand.
      core::Tensor h_ref = empty(n), ln_ref = empty(n), xhat_ref = empty(n), rstd_ref = empty(rows);
      ASSERT_TRUE(AddTensors("t", x, a, h_ref).ok());
      ASSERT_TRUE(LayerNormForward("t", h_ref, w, lb, 1e-5f, ln_ref, xhat_ref, rstd_ref).ok());
      for (int where = 0; where < 3; ++where) {
        SCOPED_TRACE(absl::StrCat("sum into ", where == 0 ? "a new tensor" : where == 1 ? "a" : "b"));
        core::Tensor ca = x.Clone(core::MemoryTag::kOther);
        core::Tensor cb = a.Clone(core::MemoryTag::kOther);
        core::Tensor h = where == 0 ? empty(n) : where == 1 ? ca : cb;
        core::Tensor ln = empty(n), xhat = empty(n), rstd = empty(rows);
        ASSERT_TRUE(AddLayerNormForward("t", ca, cb, w, lb, 1e-5f, h, ln, xhat, rstd).ok());
        EXPECT_EQ(Bits(h), Bits(h_ref));
        EXPECT_EQ(Bits(ln), Bits(ln_ref));
        EXPECT_EQ(Bits(xhat), Bits(xhat_ref));
        EXPECT_EQ(Bits(rstd), Bits(rstd_ref));
      }

      // LayerNormBackwardAdd: the LayerNorm gradient plus a residual, parameter grads too.
      core::Tensor lgx_ref = empty(n), gw_ref = Normal(cols, 8), glb_ref = Normal(cols, 9);
      ASSERT_TRUE(LayerNormBackward("t", g, xhat_ref, rstd_ref, w, lgx_ref, gw_ref, glb_ref).ok());
      ASSERT_TRUE(AddTensors("t", a, lgx_ref, lgx_ref).ok());
      core::Tensor lgx = empty(n), gw = Normal(cols, 8), glb = Normal(cols, 9);
      ASSERT_TRUE(LayerNormBackwardAdd("t", g, xhat_ref, rstd_ref, w, a, lgx, gw, glb).ok());
      EXPECT_EQ(Bits(lgx), Bits(lgx_ref));
      EXPECT_EQ(Bits(gw), Bits(gw_ref));
      EXPECT_EQ(Bits(glb), Bits(glb_ref));
    }
  }
}

TEST(FusedOpsTest, BadArgumentsAreInvalidArgumentAndWriteNothing) {
  const int64_t rows = 4, cols = 6, n = rows * cols;
  const core::Tensor x = Normal(n, 1), bias = Normal(cols, 2), g = Normal(n, 3);
  core::Tensor y = core::Tensor::Zeros({n});
  // The output may not be the input: the loop would read what it just wrote.
  absl::Status s = BiasGeluForward("fc + gelu", x, bias, x, x);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("fc + gelu: output and input"));
  s = BiasGeluForward("fc + gelu", x, Normal(5, 4), y, core::Tensor::Zeros({n}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("does not tile"));
  EXPECT_EQ(y.ToVector(), std::vector<float>(n, 0.0f));
  s = GeluBackwardBiasGrad("fc + gelu", x, g, y, core::Tensor::Zeros({5}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(y.ToVector(), std::vector<float>(n, 0.0f));
  s = GeluBackwardBiasGrad("fc + gelu", x, g, g, core::Tensor());
  EXPECT_THAT(std::string(s.message()), HasSubstr("grad_input and grad_output"));
  const core::Tensor w = Normal(cols, 5), lb = Normal(cols, 6);
  core::Tensor h = core::Tensor::Zeros({n}), xhat = core::Tensor::Zeros({n});
  s = AddLayerNormForward("ln_2", x, g, w, lb, 1e-5f, h, x, xhat, core::Tensor::Zeros({rows}));
  EXPECT_THAT(std::string(s.message()), HasSubstr("ln_2: output and first operand"));
  s = AddLayerNormForward("ln_2", x, Normal(n - 1, 7), w, lb, 1e-5f, h, y, xhat,
                          core::Tensor::Zeros({rows}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(h.ToVector(), std::vector<float>(n, 0.0f));
  s = LayerNormBackwardAdd("ln_2", g, xhat, core::Tensor::Zeros({rows}), w, y, y, core::Tensor(),
                           core::Tensor());
  EXPECT_THAT(std::string(s.message()), HasSubstr("ln_2: grad_input and residual"));
}

TEST(CpuLoopsTest, ResultsAreBitIdenticalForAnyThreadCount) {
  const int saved = IntraOpThreads();
  auto run = [](int threads) {
    EXPECT_TRUE(SetIntraOpThreads(threads).ok());
    std::vector<std::vector<float>> out;
    const int64_t n = 70001, rows = 301, cols = 257, T = 64, srows = 1100, V = 333, ce_rows = 200;
    const core::Tensor x = Normal(n, 1), g = Normal(n, 2);
    core::Tensor y = core::Tensor::Empty({n});
    EXPECT_TRUE(GeluForward("t", x, y).ok());
    out.push_back(y.ToVector());
    EXPECT_TRUE(GeluBackward("t", x, g, y).ok());
    out.push_back(y.ToVector());
    EXPECT_TRUE(AddTensors("t", x, g, y).ok());
    out.push_back(y.ToVector());
    const core::Tensor a = Normal(rows * cols, 3), ga = Normal(rows * cols, 4);
    const core::Tensor w = Normal(cols, 5), b = Normal(cols, 6);
    core::Tensor ya = core::Tensor::Empty({rows * cols}), h = core::Tensor::Empty({rows * cols});
    core::Tensor rstd = core::Tensor::Empty({rows}), gx = core::Tensor::Empty({rows * cols});
    core::Tensor gw = core::Tensor::Zeros({cols}), gb = core::Tensor::Zeros({cols});
    EXPECT_TRUE(BiasAdd("t", a, b, ya).ok());
    out.push_back(ya.ToVector());
    EXPECT_TRUE(LayerNormForward("t", a, w, b, 1e-5f, ya, h, rstd).ok());
    out.push_back(ya.ToVector());
    out.push_back(rstd.ToVector());
    EXPECT_TRUE(LayerNormBackward("t", ga, h, rstd, w, gx, gw, gb).ok());
    out.push_back(gx.ToVector());
    out.push_back(gw.ToVector());
    out.push_back(gb.ToVector());
    core::Tensor pre = core::Tensor::Empty({rows * cols}), sum = core::Tensor::Empty({rows * cols});
    EXPECT_TRUE(BiasGeluForward("t", a, b, pre, ya).ok());
    out.push_back(pre.ToVector());
    out.push_back(ya.ToVector());
    EXPECT_TRUE(GeluBackwardBiasGrad("t", pre, ga, gx, gb).ok());
    out.push_back(gx.ToVector());
    out.push_back(gb.ToVector());
    EXPECT_TRUE(AddLayerNormForward("t", a, ga, w, b, 1e-5f, sum, ya, h, rstd).ok());
    out.push_back(sum.ToVector());
    out.push_back(ya.ToVector());
    out.push_back(rstd.ToVector());
    EXPECT_TRUE(LayerNormBackwardAdd("t", ga, h, rstd, w, a, gx, gw, gb).ok());
    out.push_back(gx.ToVector());
    out.push_back(gw.ToVector());
    const core::Tensor s = Normal(srows * T, 7), gs = Normal(srows * T, 8);
    EXPECT_TRUE(CausalSoftmaxForward("t", s, T).ok());
    out.push_back(s.ToVector());
    EXPECT_TRUE(CausalSoftmaxBackward("t", s, gs, T, 0.125f).ok());
    out.push_back(gs.ToVector());
    const core::Tensor logits = Normal(ce_rows * V, 9), grad = core::Tensor::Empty({ce_rows * V});
    std::vector<int32_t> tg(ce_rows);
    for (int64_t i = 0; i < ce_rows; ++i) tg[i] = static_cast<int32_t>((i * 11) % V);
    const absl::StatusOr<double> loss =
        CrossEntropyForwardBackward("t", logits, core::Tensor::FromInts(tg, {ce_rows}).value(),
                                    grad);
    EXPECT_TRUE(loss.ok());
    out.push_back(grad.ToVector());
    out.push_back(
        {static_cast<float>(*loss), static_cast<float>(*loss - static_cast<float>(*loss))});
    return out;
  };
  const std::vector<std::vector<float>> one = run(1);
  for (int threads : {2, 3}) {
    const std::vector<std::vector<float>> many = run(threads);
    ASSERT_EQ(many.size(), one.size());
    for (size_t i = 0; i < one.size(); ++i) {
      EXPECT_EQ(many[i], one[i]) << "output " << i << " with " << threads << " threads";
    }
  }
  ASSERT_TRUE(SetIntraOpThreads(saved).ok());
}


}  // namespace
}  // namespace nn
