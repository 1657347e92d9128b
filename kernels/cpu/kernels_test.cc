// Tests of the CPU launchers (kernels/cpu/kernels.h): the vectorised FSDP_CPU_CLONES loops
// against the scalar bodies and double references, LaneSum's fixed order, bit-identical
// results for any thread count, and fsdp's gradient arithmetic. The tensor-level checks
// around them are tested in nn/tensor_ops_test.cc and fsdp/device_ops_test.cc.
#include "kernels/cpu/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/bf16_hd.h"
#include "core/dtype.h"
#include "core/random.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "kernels/cpu.h"
#include "kernels/cpu_runtime.h"
#include "kernels/elementwise.h"

namespace kernels {
namespace {

namespace k = ::kernels;
namespace kcpu = ::kernels::cpu;

core::Tensor Normal(int64_t n, uint64_t seed) {
  core::Tensor t = core::Tensor::Empty({n});
  core::Rng rng(seed);
  float* p = t.data<float>();
  for (int64_t i = 0; i < n; ++i) p[i] = rng.Normal(0.0f, 1.0f);
  return t;
}

float* P(const core::Tensor& t) { return t.data<float>(); }
bool IsBf16(const core::Tensor& t) { return t.dtype() == core::DType::kBFloat16; }

// LayerNorm's whole backward as nn::LayerNormBackward runs it on the CPU: the weight and
// bias gradients in one pass over g and x, then the input gradient; and xhat into h (for
// the tests that compare it).
void LayerNormBackward(const core::Tensor& g, const core::Tensor& x, const core::Tensor& mean,
                       const core::Tensor& rstd, const core::Tensor& w, const core::Tensor& h,
                       const core::Tensor& gx, const core::Tensor& gw, const core::Tensor& gb,
                       int64_t rows, int64_t cols) {
  kcpu::NormParamGrads(P(g), P(x), P(mean), P(rstd), P(gw), P(gb), rows, cols);
  kcpu::LayerNormBackwardInput(P(g), P(x), P(mean), P(rstd), w.raw_data(), IsBf16(w), P(gx), rows,
                               cols);
  kcpu::LayerNormHat(P(x), P(mean), P(rstd), P(h), rows, cols);
}

// The mean cross-entropy loss as nn::CrossEntropyForwardBackward adds it: row losses in
// row order, times 1/n; writes grad.
double CrossEntropyLoss(const core::Tensor& logits, const std::vector<int32_t>& targets,
                        const core::Tensor& grad) {
  const int64_t n = static_cast<int64_t>(targets.size());
  const int64_t V = logits.numel() / n;
  const double inv_n = 1.0 / static_cast<double>(n);
  std::vector<double> row_loss(targets.size());
  kcpu::CrossEntropy(P(logits), targets.data(), n, V, inv_n, P(grad), row_loss.data());
  double total = 0.0;
  for (double l : row_loss) total += l;
  return total * inv_n;
}

// ---- The vectorised launchers (FSDP_CPU_CLONES) against the scalar bodies and double
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
  for (int64_t n : kLengths) {
    SCOPED_TRACE(n);
    const core::Tensor x = Normal(n, 10 + n), g = Normal(n, 20 + n);
    // Spread GELU's input over its whole range (tails and the clamp of FastTanh).
    float* px = x.data<float>();
    for (int64_t i = 0; i < n; ++i) px[i] *= 4.0f;
    const std::vector<float> xv = x.ToVector(), gv = g.ToVector();
    core::Tensor y = core::Tensor::Empty({n});
    kcpu::GeluForward(P(x), P(y), n);
    std::vector<float> out = y.ToVector();
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(out[i], k::GeluTanhForward(xv[i])) << "gelu " << i;
      const double xd = xv[i];
      const double exact =
          0.5 * xd * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (xd + 0.044715 * xd * xd * xd)));
      ASSERT_NEAR(out[i], exact, 1e-6 * (1.0 + std::abs(xd))) << "gelu vs exact " << i;
    }
    kcpu::GeluBackward(P(x), P(g), P(y), n);
    out = y.ToVector();
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], k::GeluTanhBackward(xv[i], gv[i])) << i;
    kcpu::ReluForward(P(x), P(y), n);
    out = y.ToVector();
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], xv[i] > 0 ? xv[i] : 0.0f) << i;
    kcpu::ReluBackward(P(x), P(g), P(y), n);
    out = y.ToVector();
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], xv[i] > 0 ? gv[i] : 0.0f) << i;
    kcpu::Add(P(x), P(g), P(y), n);
    out = y.ToVector();
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], xv[i] + gv[i]) << i;
    // In place, as the residual adds run.
    kcpu::Add(P(y), P(g), P(y), n);
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
      kcpu::BiasAdd(P(x), bias->raw_data(), IsBf16(*bias), P(y), rows, cols);
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
    kcpu::ColumnSums(P(x), nullptr, P(plain), rows, cols);
    kcpu::ColumnSums(P(x), P(y), P(product), rows, cols);
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

// The norms' parameter gradients in one pass give the bits of xhat written first
// (LayerNormHat, with no mean RMSNorm's) and then summed by ColumnSums, for LayerNorm
// (weight and bias, each alone and both) and RMSNorm (weight), at widths around the vector
// widths.
TEST(CpuLoopsTest, NormParamGradsAreTheColumnSumsOverXhatBitForBit) {
  for (int64_t cols : kLengths) {
    SCOPED_TRACE(testing::Message() << "cols " << cols);
    const int64_t rows = 13, n = rows * cols;
    const core::Tensor g = Normal(n, 31), x = Normal(n, 32), mean = Normal(rows, 33);
    core::Tensor rstd = Normal(rows, 34);
    for (int64_t r = 0; r < rows; ++r) P(rstd)[r] = 0.5f + std::abs(P(rstd)[r]);
    core::Tensor h = core::Tensor::Empty({n});
    for (const bool rms : {false, true}) {
      const float* mu = rms ? nullptr : P(mean);
      if (rms) {
        kcpu::LayerNormHat(P(x), nullptr, P(rstd), P(h), rows, cols);
      } else {
        kcpu::LayerNormHat(P(x), P(mean), P(rstd), P(h), rows, cols);
      }
      for (int which = 1; which <= (rms ? 1 : 3); ++which) {  // 1 weight, 2 bias, 3 both
        const bool want_w = which & 1, want_b = which & 2;
        core::Tensor gw = Normal(cols, 35), gb = Normal(cols, 36);
        core::Tensor gw_ref = gw.Clone(core::MemoryTag::kOther);
        core::Tensor gb_ref = gb.Clone(core::MemoryTag::kOther);
        if (want_w) kcpu::ColumnSums(P(g), P(h), P(gw_ref), rows, cols);
        if (want_b) kcpu::ColumnSums(P(g), nullptr, P(gb_ref), rows, cols);
        kcpu::NormParamGrads(P(g), P(x), mu, P(rstd), want_w ? P(gw) : nullptr,
                             want_b ? P(gb) : nullptr, rows, cols);
        EXPECT_EQ(std::memcmp(P(gw), P(gw_ref), cols * sizeof(float)), 0)
            << (rms ? "RMSNorm" : "LayerNorm") << " case " << which;
        EXPECT_EQ(std::memcmp(P(gb), P(gb_ref), cols * sizeof(float)), 0)
            << (rms ? "RMSNorm" : "LayerNorm") << " case " << which;
      }
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
      core::Tensor mean_out = core::Tensor::Empty({rows}), rstd = core::Tensor::Empty({rows});
      kcpu::LayerNormForward(P(x), w.raw_data(), b.raw_data(), IsBf16(w), eps, P(y), P(mean_out),
                             P(rstd), rows, cols);
      const core::Tensor g = Normal(rows * cols, 100 + cols);
      core::Tensor gx = core::Tensor::Empty({rows * cols});
      core::Tensor gw = core::Tensor::Zeros({cols}), gb = core::Tensor::Zeros({cols});
      LayerNormBackward(g, x, mean_out, rstd, w, h, gx, gw, gb, rows, cols);
      const std::vector<float> xv = x.ToVector(), yv = y.ToVector(), hv = h.ToVector(),
                               mv = mean_out.ToVector(), rv = rstd.ToVector(), gv = g.ToVector(),
                               gxv = gx.ToVector(), gwv = gw.ToVector(), gbv = gb.ToVector();
      std::vector<double> gw_ref(cols, 0.0), gb_ref(cols, 0.0);
      for (int64_t r = 0; r < rows; ++r) {
        const float* xr = &xv[r * cols];
        double mean = 0, var = 0;
        for (int64_t j = 0; j < cols; ++j) mean += xr[j];
        mean /= cols;
        for (int64_t j = 0; j < cols; ++j) var += (xr[j] - mean) * (xr[j] - mean);
        var /= cols;
        const double rs = 1.0 / std::sqrt(var + eps);
        ASSERT_NEAR(mv[r], mean, 2e-6 * (1 + std::abs(mean))) << r;
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

// NOTE [bf16 attention] in nn/attention.h: the bf16 outputs are the fp32 results rounded
// once, and a bf16 p is read exactly as its widened fp32 values.
TEST(CpuLoopsTest, CausalSoftmaxBf16VariantsRoundTheFp32ResultsOnce) {
  for (int64_t T : {1, 7, 33, 256}) {
    SCOPED_TRACE(T);
    const int64_t rows = 2 * T, n = rows * T;
    const core::Tensor scores = Normal(n, 130 + T);
    const std::vector<float> sv = scores.ToVector();
    std::vector<uint16_t> p16(n, 0xffff);
    std::vector<float> scratch = sv;
    kcpu::CausalSoftmaxForward(scratch.data(), rows, T, p16.data());
    std::vector<float> p32 = sv;
    kcpu::CausalSoftmaxForward(p32.data(), rows, T);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(p16[i], core::FloatToBf16Bits(p32[i])) << i;

    // The backward from the bf16 p equals the fp32 backward from p16 widened.
    std::vector<float> p16_wide(n);
    for (int64_t i = 0; i < n; ++i) p16_wide[i] = core::Bf16BitsToFloat(p16[i]);
    const std::vector<float> gv = Normal(n, 140 + T).ToVector();
    std::vector<float> g_ref = gv;
    kcpu::CausalSoftmaxBackward(p16_wide.data(), false, g_ref.data(), rows, T, 0.125f);
    std::vector<float> g = gv;
    std::vector<uint16_t> out16(n, 0xffff);
    kcpu::CausalSoftmaxBackward(p16.data(), true, g.data(), rows, T, 0.125f, out16.data());
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(out16[i], core::FloatToBf16Bits(g_ref[i])) << i;
    }
    std::vector<float> g_in_place = gv;
    kcpu::CausalSoftmaxBackward(p16.data(), true, g_in_place.data(), rows, T, 0.125f);
    EXPECT_EQ(g_in_place, g_ref);
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
    kcpu::CausalSoftmaxForward(P(scores), rows, T);
    const std::vector<float> p = scores.ToVector();
    const core::Tensor g = Normal(rows * T, 120 + T);
    const std::vector<float> gv = g.ToVector();
    const float scale = 0.125f;
    kcpu::CausalSoftmaxBackward(P(scores), false, P(g), rows, T, scale);
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
    const core::Tensor grad = core::Tensor::Empty({n * V});
    const double loss = CrossEntropyLoss(logits, tgi, grad);
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
    EXPECT_NEAR(loss, ref / n, 1e-12);
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
    const float want = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) +
                       ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
    const float got = kernels::LaneSum<float>(n, [&](int64_t j) { return x[j]; });
    EXPECT_EQ(std::memcmp(&got, &want, sizeof(float)), 0)
        << "n " << n << ": " << got << " vs " << want;
    double dl[4] = {0, 0, 0, 0};
    for (int64_t j = 0; j < n; ++j) dl[j % 4] += xd[j];
    const double dwant = (dl[0] + dl[2]) + (dl[1] + dl[3]);
    const double dgot = kernels::LaneSum<double>(n, [&](int64_t j) { return xd[j]; });
    EXPECT_EQ(std::memcmp(&dgot, &dwant, sizeof(double)), 0) << "n " << n;
  }
}

TEST(CpuLoopsTest, ResultsAreBitIdenticalForAnyThreadCount) {
  const int saved = IntraOpThreads();
  auto run = [](int threads) {
    EXPECT_TRUE(SetIntraOpThreads(threads).ok());
    std::vector<std::vector<float>> out;
    const int64_t n = 70001, rows = 301, cols = 257, T = 64, srows = 1100, V = 333, ce_rows = 200;
    const core::Tensor x = Normal(n, 1), g = Normal(n, 2);
    core::Tensor y = core::Tensor::Empty({n});
    kcpu::GeluForward(P(x), P(y), n);
    out.push_back(y.ToVector());
    kcpu::GeluBackward(P(x), P(g), P(y), n);
    out.push_back(y.ToVector());
    kcpu::Add(P(x), P(g), P(y), n);
    out.push_back(y.ToVector());
    const core::Tensor a = Normal(rows * cols, 3), ga = Normal(rows * cols, 4);
    const core::Tensor w = Normal(cols, 5), b = Normal(cols, 6);
    core::Tensor ya = core::Tensor::Empty({rows * cols}), h = core::Tensor::Empty({rows * cols});
    core::Tensor rstd = core::Tensor::Empty({rows}), gx = core::Tensor::Empty({rows * cols});
    core::Tensor mean = core::Tensor::Empty({rows});
    core::Tensor gw = core::Tensor::Zeros({cols}), gb = core::Tensor::Zeros({cols});
    kcpu::BiasAdd(P(a), P(b), false, P(ya), rows, cols);
    out.push_back(ya.ToVector());
    kcpu::LayerNormForward(P(a), P(w), P(b), false, 1e-5f, P(ya), P(mean), P(rstd), rows, cols);
    out.push_back(ya.ToVector());
    out.push_back(mean.ToVector());
    out.push_back(rstd.ToVector());
    LayerNormBackward(ga, a, mean, rstd, w, h, gx, gw, gb, rows, cols);
    out.push_back(h.ToVector());
    out.push_back(gx.ToVector());
    out.push_back(gw.ToVector());
    out.push_back(gb.ToVector());
    core::Tensor pre = core::Tensor::Empty({rows * cols}), sum = core::Tensor::Empty({rows * cols});
    // NOTE [GEMM epilogues]: bias + GELU storing the pre-activation, then GELU'.
    kcpu::GemmEpilogue(P(a), k::kGemmEpilogueBiasGelu, P(b), false, P(pre), P(ya), false, rows,
                       cols);
    out.push_back(pre.ToVector());
    out.push_back(ya.ToVector());
    kcpu::GemmEpilogue(P(ga), k::kGemmEpilogueDGelu, nullptr, false, P(pre), P(gx), false, rows,
                       cols);
    out.push_back(gx.ToVector());
    kcpu::GemmEpilogue(P(a), k::kGemmEpilogueBiasResidual, P(b), false, P(ga), P(ya), false, rows,
                       cols);  // bias + residual
    out.push_back(ya.ToVector());
    kcpu::AddLayerNormForward(P(a), P(ga), P(sum), P(w), P(b), false, 1e-5f, P(ya), P(mean),
                              P(rstd), rows, cols);
    out.push_back(sum.ToVector());
    out.push_back(ya.ToVector());
    out.push_back(rstd.ToVector());
    kcpu::LayerNormBackwardInputAdd(P(ga), P(sum), P(mean), P(rstd), P(w), false, P(a), P(gx), rows,
                                    cols);
    kcpu::LayerNormHat(P(sum), P(mean), P(rstd), P(h), rows, cols);
    kcpu::ColumnSums(P(ga), P(h), P(gw), rows, cols);
    kcpu::ColumnSums(P(ga), nullptr, P(gb), rows, cols);
    out.push_back(gx.ToVector());
    out.push_back(gw.ToVector());
    const core::Tensor s = Normal(srows * T, 7), gs = Normal(srows * T, 8);
    kcpu::CausalSoftmaxForward(P(s), srows, T);
    out.push_back(s.ToVector());
    kcpu::CausalSoftmaxBackward(P(s), false, P(gs), srows, T, 0.125f);
    out.push_back(gs.ToVector());
    const core::Tensor logits = Normal(ce_rows * V, 9), grad = core::Tensor::Empty({ce_rows * V});
    std::vector<int32_t> tg(ce_rows);
    for (int64_t i = 0; i < ce_rows; ++i) tg[i] = static_cast<int32_t>((i * 11) % V);
    const double loss = CrossEntropyLoss(logits, tg, grad);
    out.push_back(grad.ToVector());
    out.push_back({static_cast<float>(loss), static_cast<float>(loss - static_cast<float>(loss))});
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

// fsdp's gradient arithmetic: each element as its body computes it (bf16 widened
// exactly), and the sum of squares added in index order in double.
TEST(CpuGradTest, AddIntoScaleAndSumOfSquaresFollowTheBodies) {
  const int64_t n = 1001;
  const core::Tensor dst = Normal(n, 1), src = Normal(n, 2);
  std::vector<uint16_t> src16(n);
  for (int64_t i = 0; i < n; ++i) src16[i] = core::FloatToBf16Bits(P(src)[i]);
  const std::vector<float> d0 = dst.ToVector(), sv = src.ToVector();
  kcpu::AddInto(P(dst), P(src), /*src_bf16=*/false, n);
  std::vector<float> out = dst.ToVector();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], d0[i] + sv[i]) << i;
  kcpu::AddInto(P(dst), src16.data(), /*src_bf16=*/true, n);
  const std::vector<float> twice = dst.ToVector();
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(twice[i], out[i] + core::Bf16BitsToFloat(src16[i])) << i;
  }
  kcpu::Scale(P(dst), n, 0.5f);
  out = dst.ToVector();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], twice[i] * 0.5f) << i;
  double want = 0;
  for (int64_t i = 0; i < n; ++i) want += static_cast<double>(out[i]) * out[i];
  const double got = kcpu::SumOfSquares(P(dst), n);
  EXPECT_EQ(std::memcmp(&got, &want, sizeof(double)), 0) << got << " vs " << want;
  EXPECT_EQ(kcpu::SumOfSquares(P(dst), 0), 0.0);
}

}  // namespace
}  // namespace kernels
