// CPU tests of the FSDP_HD kernel bodies (kernels/) against straightforward references
// written out here in double: the same functions run on the GPU, so these pin down the
// math both devices compute.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/bf16_hd.h"
#include "core/dtype.h"
#include "gtest/gtest.h"
#include "kernels/elementwise.h"
#include "kernels/math.h"
#include "kernels/optim.h"
#include "kernels/rowwise.h"

namespace kernels {
namespace {

// Relative closeness with a floor, for fp32 results against double references.
void ExpectNear(double actual, double expected, double rel, const char* what) {
  EXPECT_LE(std::abs(actual - expected), rel * std::max(1.0, std::abs(expected)))
      << what << ": " << actual << " vs " << expected;
}

TEST(KernelsTest, Bf16ConversionMatchesCoreBFloat16BitForBit) {
  const float values[] = {0.0f,     -0.0f,  1.0f,    1.00390625f, 1.005859375f, -3.14159f,
                          65504.0f, 1e-30f, 3.0e38f, INFINITY,    -INFINITY,    NAN};
  for (float v : values) {
    const uint16_t bits = core::FloatToBf16Bits(v);
    EXPECT_EQ(bits, core::BFloat16::FromFloat(v).bits) << v;
    core::BFloat16 h;
    h.bits = bits;
    const float back = core::Bf16BitsToFloat(bits);
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(back));
    } else {
      EXPECT_EQ(back, h.ToFloat()) << v;
      // Round to nearest: within half a bf16 ulp (2^-8 relative) of the input.
      if (std::isfinite(v)) {
        EXPECT_LE(std::abs(back - v), std::abs(v) * 0x1p-8f) << v;
      }
    }
  }
  const uint16_t w[] = {core::FloatToBf16Bits(2.5f)};
  const float f[] = {2.5f};
  EXPECT_EQ(Load(w, 0), 2.5f);
  EXPECT_EQ(Load(f, 0), 2.5f);
}

TEST(KernelsTest, GeluMatchesTheTanhFormulaAndItsDerivative) {
  for (double x = -6.0; x <= 6.0; x += 0.37) {
    const double inner = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
    const double ref = 0.5 * x * (1.0 + std::tanh(inner));
    ExpectNear(GeluTanhForward(static_cast<float>(x)), ref, 1e-6, "gelu");
    // Central difference of the double reference.
    auto f = [](double z) {
      return 0.5 * z * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (z + 0.044715 * z * z * z)));
    };
    const double h = 1e-5;
    const double dref = (f(x + h) - f(x - h)) / (2 * h);
    ExpectNear(GeluTanhDerivative(static_cast<float>(x)), dref, 1e-5, "gelu'");
    ExpectNear(GeluTanhBackward(static_cast<float>(x), 2.0f), 2.0 * dref, 1e-5, "gelu bwd");
  }
}

// FastTanh and the GELU built on it against the exact tanh form in double, densely over
// [-12, 12]: the bound the faster GELU promises.
TEST(KernelsTest, FastTanhAndGeluStayWithinTheirErrorBoundOfTheExactForm) {
  double worst_tanh = 0, worst_gelu = 0, worst_grad = 0;
  for (double xd = -12.0; xd <= 12.0; xd += 1.0 / 4096) {
    const float x = static_cast<float>(xd);
    worst_tanh = std::max(worst_tanh, std::abs(FastTanh(x) - std::tanh(static_cast<double>(x))));
    const double inner = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
    const double t = std::tanh(inner);
    const double gelu = 0.5 * x * (1.0 + t);
    const double dinner = std::sqrt(2.0 / M_PI) * (1.0 + 3.0 * 0.044715 * x * x);
    const double grad = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * dinner;
    worst_gelu = std::max(worst_gelu, std::abs(GeluTanhForward(x) - gelu) / (1.0 + std::abs(x)));
    worst_grad = std::max(worst_grad, std::abs(GeluTanhDerivative(x) - grad) / (1.0 + std::abs(x)));
  }
  EXPECT_LE(worst_tanh, 5e-7);
  EXPECT_LE(worst_gelu, 1e-6);
  EXPECT_LE(worst_grad, 1e-6);
  EXPECT_TRUE(std::isnan(FastTanh(NAN)));
  EXPECT_EQ(FastTanh(0.0f), 0.0f);
  EXPECT_EQ(FastTanh(1e-5f), 1e-5f);
  EXPECT_NEAR(FastTanh(100.0f), 1.0f, 1e-6);
  EXPECT_NEAR(FastTanh(-100.0f), -1.0f, 1e-6);
}

// FastExp against expl (long double) densely over each type's whole normal range, the
// bounds math.h states; then its ends: underflow to 0, overflow to +inf, NaN stays NaN.
TEST(KernelsTest, FastExpStaysWithinItsStatedRelativeErrorOfExp) {
  double worst_f = 0, worst_d = 0;
  for (double xd = -87.33; xd <= 88.37; xd += 1.0 / 4096) {
    const float x = static_cast<float>(xd);
    const long double ref = std::exp(static_cast<long double>(x));
    worst_f = std::max(worst_f, static_cast<double>(std::fabs((FastExp(x) - ref) / ref)));
  }
  for (double x = -708.39; x <= 709.08; x += 1.0 / 512) {
    const long double ref = std::exp(static_cast<long double>(x));
    worst_d = std::max(worst_d, static_cast<double>(std::fabs((FastExp(x) - ref) / ref)));
  }
  EXPECT_LE(worst_f, 1.5e-7);
  EXPECT_LE(worst_d, 3e-16);
  EXPECT_EQ(FastExp(0.0f), 1.0f);
  EXPECT_EQ(FastExp(0.0), 1.0);
  EXPECT_EQ(FastExp(-100.0f), 0.0f);
  EXPECT_EQ(FastExp(-INFINITY), 0.0f);
  EXPECT_EQ(FastExp(89.0f), INFINITY);
  EXPECT_EQ(FastExp(INFINITY), INFINITY);
  EXPECT_TRUE(std::isnan(FastExp(NAN)));
  EXPECT_EQ(FastExp(-1000.0), 0.0);
  EXPECT_EQ(FastExp(710.0), static_cast<double>(INFINITY));
  EXPECT_TRUE(std::isnan(FastExp(static_cast<double>(NAN))));
}

TEST(KernelsTest, ReluAddBiasAndEmbeddingElements) {
  EXPECT_EQ(ReluForward(2.5f), 2.5f);
  EXPECT_EQ(ReluForward(-1.0f), 0.0f);
  EXPECT_EQ(ReluBackward(2.5f, 3.0f), 3.0f);
  EXPECT_EQ(ReluBackward(0.0f, 3.0f), 0.0f);
  EXPECT_EQ(Add(1.5f, 2.25f), 3.75f);
  const float bias[] = {1.0f, -2.0f};
  const uint16_t bias16[] = {core::FloatToBf16Bits(1.0f), core::FloatToBf16Bits(-2.0f)};
  EXPECT_EQ(BiasAdd(0.5f, bias, 1), -1.5f);
  EXPECT_EQ(BiasAdd(0.5f, bias16, 1), -1.5f);
  const float table[] = {0, 1, 2, 10, 11, 12};  // [2, 3]
  EXPECT_EQ(EmbeddingGather(table, 1, 3, 2), 12.0f);
  EXPECT_EQ(EmbeddingGather(table, 0, 3, 1), 1.0f);
  EXPECT_TRUE(EmbeddingIdValid(1, 2));
  EXPECT_FALSE(EmbeddingIdValid(2, 2));
  EXPECT_FALSE(EmbeddingIdValid(-1, 2));
}

TEST(KernelsTest, LayerNormBodiesMatchTheDefinition) {
  const std::vector<float> x = {0.5f, -1.25f, 2.0f, 0.75f, -0.3f};
  const std::vector<float> w = {1.5f, 0.5f, -1.0f, 2.0f, 1.0f};
  const std::vector<float> b = {0.1f, 0.2f, 0.3f, -0.4f, 0.0f};
  const std::vector<float> g = {0.3f, -0.7f, 1.1f, 0.2f, -0.5f};
  const int n = 5;
  double mean = 0, var = 0;
  for (float v : x) mean += v;
  mean /= n;
  for (float v : x) var += (v - mean) * (v - mean);
  var /= n;
  const double eps = 1e-5;
  const double rstd = LayerNormRstd(var, eps);
  ExpectNear(rstd, 1.0 / std::sqrt(var + eps), 1e-12, "rstd");
  std::vector<float> xhat(n);
  std::vector<double> y_ref(n);
  for (int j = 0; j < n; ++j) {
    const float y = LayerNormApply(x[j], mean, rstd, w.data(), b.data(), j);
    xhat[j] = LayerNormHat(x[j], mean, rstd);
    y_ref[j] = (x[j] - mean) / std::sqrt(var + eps) * w[j] + b[j];
    ExpectNear(y, y_ref[j], 1e-6, "layernorm y");
    ExpectNear(xhat[j], (x[j] - mean) * rstd, 1e-6, "xhat");
    // The output is the made-again xhat times w plus b: the backward's xhat is the forward's.
    EXPECT_EQ(y, xhat[j] * w[j] + b[j]);
  }
  // Backward against a central difference of L = sum_j g_j y_j with respect to x_i.
  double sum_gh = 0, sum_gh_h = 0;
  for (int j = 0; j < n; ++j) {
    const double gh = LayerNormGradHat<double>(g[j], w.data(), j);
    EXPECT_EQ(gh, static_cast<double>(g[j]) * w[j]);
    sum_gh += gh;
    sum_gh_h += gh * xhat[j];
  }
  auto loss = [&](std::vector<double> xs) {
    double m = 0, v = 0;
    for (double e : xs) m += e;
    m /= n;
    for (double e : xs) v += (e - m) * (e - m);
    v /= n;
    double l = 0;
    for (int j = 0; j < n; ++j) l += g[j] * ((xs[j] - m) / std::sqrt(v + eps) * w[j] + b[j]);
    return l;
  };
  for (int i = 0; i < n; ++i) {
    std::vector<double> xp(x.begin(), x.end()), xm(x.begin(), x.end());
    xp[i] += 1e-6;
    xm[i] -= 1e-6;
    const double numeric = (loss(xp) - loss(xm)) / 2e-6;
    const float gx =
        LayerNormBackwardInput(g[i], w.data(), i, xhat[i], rstd, sum_gh / n, sum_gh_h / n);
    ExpectNear(gx, numeric, 1e-4, "layernorm dx");
  }
}

TEST(KernelsTest, CausalSoftmaxBodiesMatchTheDefinition) {
  const std::vector<float> scores = {0.3f, -1.2f, 2.0f, 0.7f};
  const int t = 2;  // row t of a T = 4 row: entry 3 is masked
  EXPECT_FALSE(CausalMasked(t, 2));
  EXPECT_TRUE(CausalMasked(t, 3));
  float max = scores[0];
  for (int s = 1; s <= t; ++s) max = std::max(max, scores[s]);
  double sum = 0;
  std::vector<float> e(t + 1);
  for (int s = 0; s <= t; ++s) sum += e[s] = SoftmaxExp(scores[s], max);
  double ref_sum = 0;
  for (int s = 0; s <= t; ++s) ref_sum += std::exp(static_cast<double>(scores[s]));
  std::vector<float> p(t + 1);
  for (int s = 0; s <= t; ++s) {
    p[s] = SoftmaxNormalize(e[s], static_cast<float>(1.0 / sum));
    ExpectNear(p[s], std::exp(static_cast<double>(scores[s])) / ref_sum, 1e-6, "softmax");
  }
  // dL/dscore_s = scale * p_s (g_s - sum_r g_r p_r).
  const std::vector<float> g = {0.5f, -1.0f, 0.25f};
  double dot = 0;
  for (int s = 0; s <= t; ++s) dot += static_cast<double>(g[s]) * p[s];
  const float scale = 0.5f;
  for (int s = 0; s <= t; ++s) {
    double ref = 0;  // the Jacobian written out: dp_r/dz_s = p_r (delta_rs - p_s)
    for (int r = 0; r <= t; ++r) ref += g[r] * p[r] * ((r == s ? 1.0 : 0.0) - p[s]);
    ExpectNear(SoftmaxBackward(p[s], g[s], dot, scale), scale * ref, 1e-6, "softmax bwd");
  }
}

TEST(KernelsTest, CrossEntropyBodiesMatchTheDefinition) {
  const std::vector<float> x = {1.0f, -0.5f, 3.0f, 0.25f};
  const int target = 1;
  const double inv_n = 0.25;
  double max = 3.0, sum = 0;
  for (float v : x) sum += CrossEntropyExp(v, max);
  double ref_lse = 0;
  for (float v : x) ref_lse += std::exp(static_cast<double>(v));
  ref_lse = std::log(ref_lse);
  ExpectNear(CrossEntropyRowLoss(sum, max, x[target]), ref_lse - x[target], 1e-12, "loss");
  const double log_sum = std::log(sum);
  double grad_sum = 0;
  for (int j = 0; j < 4; ++j) {
    const float gj = CrossEntropyGrad(x[j], max, log_sum, j == target, inv_n);
    const double ref = (std::exp(x[j] - ref_lse) - (j == target ? 1 : 0)) * inv_n;
    ExpectNear(gj, ref, 1e-6, "ce grad");
    grad_sum += gj;
  }
  EXPECT_NEAR(grad_sum, 0.0, 1e-7);  // softmax sums to one
  // The float accumulator form used on CUDA agrees.
  ExpectNear(CrossEntropyGrad<float>(x[2], 3.0f, static_cast<float>(log_sum), false, 0.25f),
             (std::exp(x[2] - ref_lse)) * inv_n, 1e-6, "ce grad float");
}

TEST(KernelsTest, AdamWUpdateFollowsTorchAdamWForSeveralSteps) {
  const double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
  float w = 0.5f, m = 0.0f, v = 0.0f;
  double rw = 0.5, rm = 0.0, rv = 0.0;
  const float grads[] = {0.3f, -0.2f, 0.05f, 1.5f};
  for (int t = 1; t <= 4; ++t) {
    const float g = grads[t - 1];
    AdamWUpdate(&w, &m, &v, g, MakeAdamWScalars(lr, b1, b2, eps, wd, t));
    rw *= 1 - lr * wd;
    rm = b1 * rm + (1 - b1) * g;
    rv = b2 * rv + (1 - b2) * g * g;
    const double mhat = rm / (1 - std::pow(b1, t)), vhat = rv / (1 - std::pow(b2, t));
    rw -= lr * mhat / (std::sqrt(vhat) + eps);
    ExpectNear(m, rm, 1e-6, "exp_avg");
    ExpectNear(v, rv, 1e-6, "exp_avg_sq");
    ExpectNear(w, rw, 1e-6, "weight");
  }
  EXPECT_EQ(TorchLerp(1.0f, 3.0f, 0.0f), 1.0f);
  EXPECT_EQ(TorchLerp(1.0f, 3.0f, 1.0f), 3.0f);
}

TEST(KernelsTest, SgdUpdateWithMomentumNesterovAndWeightDecay) {
  SgdScalars s;
  s.lr = 0.1f;
  s.weight_decay = 0.01f;
  s.momentum = 0.9f;
  s.one_minus_dampening = 1.0f;
  s.use_weight_decay = true;
  s.use_momentum = true;
  s.nesterov = true;
  s.first_step = true;
  float w = 1.0f, buf = 0.0f;
  SgdUpdate(&w, &buf, 0.5f, s);
  // g = 0.5 + 0.01 * 1 = 0.51; buf = g; nesterov g' = g + 0.9 buf = 0.969.
  EXPECT_NEAR(buf, 0.51f, 1e-7);
  EXPECT_NEAR(w, 1.0f - 0.1f * 0.969f, 1e-7);
  s.first_step = false;
  const float w1 = w, buf1 = buf;
  SgdUpdate(&w, &buf, 0.5f, s);
  const double g = 0.5 + 0.01 * w1, b = 0.9 * buf1 + g;
  EXPECT_NEAR(buf, b, 1e-6);
  EXPECT_NEAR(w, w1 - 0.1 * (g + 0.9 * b), 1e-6);
}

// The CUDA column sums' row split (kernels/cuda/kernels.h ColumnSums): one chunk for
// small inputs, enough blocks for a whole GPU on a GPT-2 activation gradient, chunks of
// at least 64 rows that cover every row.
TEST(KernelsTest, ColumnSumChunksSplitLargeInputsAndCoverEveryRow) {
  EXPECT_EQ(kernels::ColumnSumChunks(5, 8), 1);
  EXPECT_EQ(kernels::ColumnSumChunks(0, 8), 1);
  EXPECT_EQ(kernels::ColumnSumChunks(64, 768), 1);
  const int64_t gpt = kernels::ColumnSumChunks(16 * 1024, 768);
  EXPECT_EQ(gpt, 528 / 24);
  EXPECT_GE(gpt * 24, 500);  // blocks of 32 columns x chunks: about 4 per SM of 132
  for (int64_t rows : {1, 63, 64, 65, 1000, 16384, 1 << 20}) {
    for (int64_t cols : {1, 32, 33, 768, 3072, 50304}) {
      const int64_t chunks = kernels::ColumnSumChunks(rows, cols);
      const int64_t per = (rows + chunks - 1) / chunks;
      EXPECT_GE(chunks, 1);
      EXPECT_GE(per * chunks, rows) << rows << " x " << cols;
      if (chunks > 1) {
        EXPECT_GE(per, 64) << rows << " x " << cols;
      }
    }
  }
}

}  // namespace
}  // namespace kernels
