#include "nn/ops.h"

#include <omp.h>

#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "core/random.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace nn {
namespace {

// Element (i, j) of a row-major matrix with row stride ld, optionally transposed.
float At(const std::vector<float>& m, int64_t ld, bool trans, int64_t i, int64_t j) {
  return trans ? m[j * ld + i] : m[i * ld + j];
}

std::vector<float> RandomVector(int64_t n, uint64_t seed) {
  core::Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = rng.Normal(0.0f, 1.0f);
  return v;
}

// Sums of up to 7 products of N(0,1) values (|terms| mostly < 10) in fp32 differ from
// the double reference by a few ulp of the largest partial sum: 1e-4 absolute is ~100x
// that, yet far below any indexing or transpose mistake (which gives O(1) errors).
constexpr float kGemmTol = 1e-4f;

TEST(GemmTest, AllTransposeCombinationsMatchNaiveProductWithBeta) {
  const int64_t m = 3, n = 4, k = 5;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const std::vector<float> a = RandomVector(m * k, 1);
      const std::vector<float> b = RandomVector(k * n, 2);
      const std::vector<float> c0 = RandomVector(m * n, 3);
      std::vector<float> c = c0;
      const float alpha = 0.5f, beta = 2.0f;
      ASSERT_TRUE(Gemm(ta, tb, m, n, k, alpha, a.data(), b.data(), beta, c.data()).ok());
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double ref = 0.0;
          for (int64_t p = 0; p < k; ++p) {
            ref += static_cast<double>(At(a, ta ? m : k, ta, i, p)) * At(b, tb ? k : n, tb, p, j);
          }
          ref = alpha * ref + beta * c0[i * n + j];
          EXPECT_NEAR(c[i * n + j], ref, kGemmTol)
              << "ta=" << ta << " tb=" << tb << " " << i << "," << j;
        }
      }
    }
  }
}

TEST(GemmTest, BetaZeroIgnoresGarbageAndStridesAddressBlocks) {
  // A is the column block [2, 5) of a [3, 7] buffer; C is the block [1, 3) of [3, 4].
  const int64_t m = 3, n = 2, k = 3;
  const std::vector<float> abuf = RandomVector(3 * 7, 4);
  const std::vector<float> b = RandomVector(k * n, 5);
  std::vector<float> cbuf(3 * 4, std::nanf(""));
  ASSERT_TRUE(
      Gemm(false, false, m, n, k, 1.0f, abuf.data() + 2, 7, b.data(), n, 0.0f, cbuf.data() + 1, 4)
          .ok());
  for (int64_t i = 0; i < m; ++i) {
    EXPECT_TRUE(std::isnan(cbuf[i * 4 + 0]));  // outside the block: untouched
    EXPECT_TRUE(std::isnan(cbuf[i * 4 + 3]));
    for (int64_t j = 0; j < n; ++j) {
      double ref = 0.0;
      for (int64_t p = 0; p < k; ++p) ref += abuf[i * 7 + 2 + p] * b[p * n + j];
      EXPECT_NEAR(cbuf[i * 4 + 1 + j], ref, kGemmTol);
    }
  }
}

TEST(GemmTest, EmptyInnerDimensionScalesByBeta) {
  std::vector<float> c = {1.0f, 2.0f};
  ASSERT_TRUE(Gemm(false, false, 1, 2, 0, 1.0f, nullptr, nullptr, 3.0f, c.data()).ok());
  EXPECT_EQ(c, (std::vector<float>{3.0f, 6.0f}));
  ASSERT_TRUE(Gemm(false, false, 1, 2, 0, 1.0f, nullptr, nullptr, 0.0f, c.data()).ok());
  EXPECT_EQ(c, (std::vector<float>{0.0f, 0.0f}));
}

// Double-precision reference of alpha * op(A) * op(B) + beta * C0 on dense matrices.
std::vector<double> ReferenceGemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                                  const std::vector<float>& a, const std::vector<float>& b,
                                  float beta, const std::vector<float>& c0) {
  std::vector<double> out(m * n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double ref = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        ref += static_cast<double>(At(a, ta ? m : k, ta, i, p)) * At(b, tb ? k : n, tb, p, j);
      }
      out[i * n + j] = alpha * ref + (beta == 0.0f ? 0.0 : beta * c0[i * n + j]);
    }
  }
  return out;
}

// Shapes large enough for oneDNN's blocked (JIT) kernels, with ragged edges, including the
// layers' three GEMM kinds (forward x * W^T, input grad g * W, weight grad g^T * x).
struct Shape3 {
  bool ta, tb;
  int64_t m, n, k;
};
const Shape3 kBigShapes[] = {
    {false, true, 67, 45, 129},
    {false, false, 130, 33, 70},
    {true, false, 40, 52, 300},
    {true, true, 17, 96, 64},
};

TEST(GemmTest, BetaZeroNeverReadsCAndBetaOneAccumulatesOnLargeShapes) {
  for (const Shape3& s : kBigShapes) {
    const std::vector<float> a = RandomVector(s.m * s.k, 11);
    const std::vector<float> b = RandomVector(s.k * s.n, 12);
    const std::vector<float> c0 = RandomVector(s.m * s.n, 13);
    // beta == 0 over NaN and over zeros: bitwise the same product, no NaN anywhere.
    std::vector<float> c_nan(s.m * s.n, std::nanf(""));
    std::vector<float> c_zero(s.m * s.n, 0.0f);
    ASSERT_TRUE(Gemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), b.data(), 0.0f, c_nan.data()).ok());
    ASSERT_TRUE(
        Gemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), b.data(), 0.0f, c_zero.data()).ok());
    EXPECT_EQ(std::memcmp(c_nan.data(), c_zero.data(), c_nan.size() * sizeof(float)), 0)
        << "m=" << s.m << " n=" << s.n << " k=" << s.k;
    const std::vector<double> product =
        ReferenceGemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a, b, 0.0f, c0);
    // Sums of up to 300 products of N(0,1) values (partial sums ~sqrt(300) ~ 17): fp32
    // rounding ~300 * 17 * 6e-8 ~ 3e-4 at worst; 2e-3 is well above that and far below
    // an indexing mistake.
    for (size_t i = 0; i < c_nan.size(); ++i) ASSERT_NEAR(c_nan[i], product[i], 2e-3) << i;
    // beta == 1 adds to C.
    std::vector<float> c = c0;
    ASSERT_TRUE(Gemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), b.data(), 1.0f, c.data()).ok());
    for (size_t i = 0; i < c.size(); ++i) ASSERT_NEAR(c[i], product[i] + c0[i], 2e-3) << i;
  }
}

TEST(GemmTest, RefusedCallReturnsErrorNamingTheShape) {
  // lda 2 < k 3 for an untransposed A: oneDNN refuses it.
  std::vector<float> a(12, 1.0f), b(12, 1.0f), c(4, 0.0f);
  const absl::Status status =
      Gemm(false, false, 2, 2, 3, 1.0f, a.data(), 2, b.data(), 2, 0.0f, c.data(), 2);
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("lda 2"));
  EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("A[2, 3]"));
}

TEST(GemmTest, LibraryNamesOneDnnAndItsIsa) {
  // e.g. "oneDNN 2.6.3 (isa avx2)": the version and the ISA without oneDNN's "cpu_isa_".
  EXPECT_THAT(GemmLibrary(),
              ::testing::MatchesRegex("oneDNN [0-9]+\\.[0-9]+\\.[0-9]+ \\(isa [a-z0-9_]+\\)"));
  EXPECT_THAT(GemmLibrary(), ::testing::Not(::testing::HasSubstr("cpu_isa_")));
}

TEST(IntraOpThreadsTest, RefusesCountsBelowOne) {
  ASSERT_TRUE(SetIntraOpThreads(1).ok());
  for (int n : {0, -3}) {
    const absl::Status status = SetIntraOpThreads(n);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("got " + std::to_string(n)));
    EXPECT_EQ(IntraOpThreads(), 1) << "a refused count must change nothing";
  }
  ASSERT_TRUE(SetIntraOpThreads(2).ok());
  EXPECT_EQ(IntraOpThreads(), 2);
  EXPECT_EQ(omp_get_max_threads(), 2);
}

TEST(IntraOpThreadsTest, GemmOnAnotherThreadUsesTheProcessCount) {
  // OpenMP's count belongs to each thread; a Gemm on a thread started later uses the
  // count SetIntraOpThreads set, not that thread's default.
  for (int n : {3, 1}) {
    ASSERT_TRUE(SetIntraOpThreads(n).ok());
    int seen = 0;
    std::thread t([&] {
      std::vector<float> a(64 * 64, 1.0f), c(64 * 64);
      ASSERT_TRUE(Gemm(false, false, 64, 64, 64, 1.0f, a.data(), a.data(), 0.0f, c.data()).ok());
      seen = omp_get_max_threads();
    });
    t.join();
    EXPECT_EQ(seen, n);
  }
}

TEST(IntraOpThreadsTest, GemmRepeatsBitwiseAtOneCountAndAgreesAcrossCounts) {
  // oneDNN may split K between threads (measured here: 2 of these 7 shapes differ in the
  // last bits between 1 and 2 threads), so across counts the results agree within fp32
  // rounding, and at one count they repeat bitwise. The GPT benchmark's layer shapes
  // (forward, input grad, weight grad with a long K) and the shapes above.
  std::vector<Shape3> shapes(std::begin(kBigShapes), std::end(kBigShapes));
  shapes.push_back({false, true, 1024, 768, 256});
  shapes.push_back({false, false, 1024, 256, 768});
  shapes.push_back({true, false, 768, 256, 1024});
  for (const Shape3& s : shapes) {
    const std::vector<float> a = RandomVector(s.m * s.k, 21);
    const std::vector<float> b = RandomVector(s.k * s.n, 22);
    std::vector<std::vector<float>> c(4, std::vector<float>(s.m * s.n));
    for (int run = 0; run < 4; ++run) {
      ASSERT_TRUE(SetIntraOpThreads(run < 2 ? 1 : 2).ok());
      ASSERT_TRUE(
          Gemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), b.data(), 0.0f, c[run].data()).ok());
    }
    const size_t bytes = c[0].size() * sizeof(float);
    EXPECT_EQ(std::memcmp(c[0].data(), c[1].data(), bytes), 0) << "1 thread, m=" << s.m;
    EXPECT_EQ(std::memcmp(c[2].data(), c[3].data(), bytes), 0) << "2 threads, m=" << s.m;
    // Sums of <= 1024 products of N(0,1) values (|partial sums| ~ 32, ulp ~ 4e-6): two
    // summation orders differ by well under 1e-3.
    for (size_t i = 0; i < c[0].size(); ++i) {
      ASSERT_NEAR(c[0][i], c[2][i], 1e-3) << "m=" << s.m << " n=" << s.n << " k=" << s.k;
    }
  }
}

TEST(OpsTest, RowsAndLastDim) {
  EXPECT_EQ(RowsOf({2, 3, 4}), 6);
  EXPECT_EQ(RowsOf({5}), 1);
  EXPECT_EQ(RowsOf({}), 0);
  EXPECT_EQ(RowsOf({0, 4}), 0);
  EXPECT_EQ(WithLastDim({2, 3, 4}, 7), (core::Shape{2, 3, 7}));
  EXPECT_EQ(WithLastDim({}, 7), (core::Shape{7}));
}

TEST(OpsTest, Axpy) {
  const std::vector<float> x = {10, 20, 30};
  std::vector<float> y = {1, 1, 1};
  Axpy(3, 2.0f, x.data(), y.data());
  EXPECT_EQ(y, (std::vector<float>{21, 41, 61}));
}

TEST(OpsTest, FillsAreDeterministicAndDistributed) {
  core::Tensor a = core::Tensor::Empty({10000});
  core::Tensor b = core::Tensor::Empty({10000});
  core::Rng r1(3), r2(3);
  FillUniform(a, -2.0f, 2.0f, &r1);
  FillUniform(b, -2.0f, 2.0f, &r2);
  EXPECT_EQ(a.ToVector(), b.ToVector());
  double sum = 0.0;
  for (float v : a.ToVector()) {
    ASSERT_GE(v, -2.0f);
    ASSERT_LT(v, 2.0f);
    sum += v;
  }
  // Mean of 10^4 U(-2, 2) draws has std 4/sqrt(12)/100 ~ 0.0115; 0.06 is 5 sigma.
  EXPECT_NEAR(sum / 10000, 0.0, 0.06);
  core::Rng r3(4);
  FillNormal(a, 1.0f, 0.5f, &r3);
  double s = 0.0, s2 = 0.0;
  for (float v : a.ToVector()) {
    s += v;
    s2 += static_cast<double>(v) * v;
  }
  const double mean = s / 10000, stddev = std::sqrt(s2 / 10000 - mean * mean);
  // Standard errors: mean 0.005, std 0.0035; 5 sigma bounds.
  EXPECT_NEAR(mean, 1.0, 0.025);
  EXPECT_NEAR(stddev, 0.5, 0.018);
  EXPECT_NE(DeriveSeed(1, 0), DeriveSeed(1, 1));
  EXPECT_NE(DeriveSeed(1, 0), DeriveSeed(2, 0));
  EXPECT_EQ(DeriveSeed(5, 3), DeriveSeed(5, 3));
}

}  // namespace
}  // namespace nn
