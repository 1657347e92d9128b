// Tests of the Llama layers' CPU launchers (kernels/cpu/kernels.h): RMSNorm, SwiGLU's
// silu(a) * b and the rotary packing of grouped q, k, v, against double references
// written out here, and bit-identical results for any thread count. nn/ tests the layers
// built on them (rms_norm_test, swiglu_test, grouped_query_attention_test).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

#include "core/bf16_hd.h"
#include "core/random.h"
#include "gtest/gtest.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu_runtime.h"
#include "kernels/elementwise.h"
#include "kernels/rowwise.h"

namespace kernels {
namespace {

namespace kcpu = ::kernels::cpu;

std::vector<float> Normal(int64_t n, uint64_t seed, float stddev = 1.0f) {
  core::Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = rng.Normal(0.0f, stddev);
  return v;
}

// |got - want| <= rel * max(1, |want|) elementwise.
void ExpectClose(const std::vector<float>& got, const std::vector<double>& want, double rel,
                 const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_LE(std::abs(got[i] - want[i]), rel * std::max(1.0, std::abs(want[i])))
        << what << " element " << i << ": " << got[i] << " vs " << want[i];
  }
}

// NOTE [GEMM epilogues]: with a bf16 output each element is the fp32 output rounded once,
// and rstd keeps its bits, for fp32 and bf16 weights, any row width.
TEST(CpuLlamaKernelsTest, RmsNormBf16OutputIsTheFp32OutputRoundedOnce) {
  for (int64_t cols : {1, 7, 8, 33, 256}) {
    for (bool bf16 : {false, true}) {
      const int64_t rows = 6;
      const std::vector<float> x = Normal(rows * cols, 4), w = Normal(cols, 5);
      std::vector<uint16_t> w16(w.size());
      for (size_t j = 0; j < w.size(); ++j) w16[j] = core::FloatToBf16Bits(w[j]);
      const void* wp = bf16 ? static_cast<const void*>(w16.data()) : w.data();
      std::vector<float> y(x.size()), rstd(rows), rstd2(rows);
      std::vector<uint16_t> y16(x.size());
      kcpu::RmsNormForward(x.data(), wp, bf16, 1e-6f, y.data(), rstd.data(), rows, cols);
      kcpu::RmsNormForward(x.data(), wp, bf16, 1e-6f, y16.data(), rstd2.data(), rows, cols,
                           /*y_bf16=*/true);
      for (size_t i = 0; i < y.size(); ++i) {
        ASSERT_EQ(y16[i], core::FloatToBf16Bits(y[i])) << "cols " << cols << " element " << i;
      }
      EXPECT_EQ(rstd2, rstd);
    }
  }
}

TEST(CpuLlamaKernelsTest, RmsNormMatchesADoubleReferenceWithFp32AndBf16Weights) {
  const float eps = 1e-6f;
  for (int64_t cols : {1, 7, 8, 33, 256}) {
    for (bool bf16 : {false, true}) {
      const int64_t rows = 5;
      const std::vector<float> x = Normal(rows * cols, 1), g = Normal(rows * cols, 2);
      std::vector<float> w = Normal(cols, 3);
      std::vector<uint16_t> w16(w.size());
      for (size_t j = 0; j < w.size(); ++j) {
        w16[j] = core::FloatToBf16Bits(w[j]);
        if (bf16) w[j] = core::Bf16BitsToFloat(w16[j]);  // the values the kernel sees
      }
      const void* wp = bf16 ? static_cast<const void*>(w16.data()) : w.data();
      std::vector<float> y(x.size()), xhat(x.size()), rstd(rows), gx(x.size());
      kcpu::RmsNormForward(x.data(), wp, bf16, eps, y.data(), rstd.data(), rows, cols);
      kcpu::LayerNormBackwardInput(g.data(), x.data(), nullptr, rstd.data(), wp, bf16, gx.data(),
                                   rows, cols);
      // The backward's xhat, made again from x and rstd, is the one the forward multiplied by
      // w: y is xhat * w bit for bit.
      kcpu::LayerNormHat(x.data(), nullptr, rstd.data(), xhat.data(), rows, cols);
      for (int64_t i = 0; i < rows * cols; ++i) {
        ASSERT_EQ(y[i], xhat[i] * w[i % cols]) << "cols " << cols << " element " << i;
      }
      std::vector<double> y_ref(x.size()), gx_ref(x.size());
      for (int64_t r = 0; r < rows; ++r) {
        double ms = 0.0;
        for (int64_t j = 0; j < cols; ++j) ms += double{x[r * cols + j]} * x[r * cols + j];
        const double rs = 1.0 / std::sqrt(ms / cols + eps);
        // dL/dx_j = rs (g_j w_j - x_j rs^2 mean_k(g_k w_k x_k)).
        double dot = 0.0;
        for (int64_t j = 0; j < cols; ++j) dot += double{g[r * cols + j]} * w[j] * x[r * cols + j];
        for (int64_t j = 0; j < cols; ++j) {
          const int64_t i = r * cols + j;
          y_ref[i] = x[i] * rs * w[j];
          gx_ref[i] = rs * (g[i] * w[j] - x[i] * rs * rs * dot / cols);
        }
        EXPECT_NEAR(rstd[r], rs, 1e-6 * rs);
      }
      ExpectClose(y, y_ref, 2e-6, "rmsnorm y");
      ExpectClose(gx, gx_ref, 1e-5, "rmsnorm dx");
    }
  }
}

// The bits of every element, so -0.0 and 0.0 differ.
std::vector<uint32_t> Bits(const std::vector<float>& v) {
  std::vector<uint32_t> bits(v.size());
  std::memcpy(bits.data(), v.data(), v.size() * sizeof(float));
  return bits;
}

// NOTE [Fused ops]: the fused loop gives the bits of the RMSNorm input gradient then Add (residual
// first, as the decoder layer adds), and its bf16 copy is that sum rounded once, for fp32
// and bf16 weights and rows of 1, 8 lanes and widths that are not multiples of 8 or 32.
TEST(CpuLlamaKernelsTest, RmsNormBackwardAddIsTheInputGradientPlusTheResidualBitForBit) {
  for (int64_t cols : {1, 7, 8, 33, 100, 256}) {
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE(testing::Message() << "cols " << cols << (bf16 ? " bf16" : " fp32"));
      const int64_t rows = 6, n = rows * cols;
      const std::vector<float> x = Normal(n, 21), g = Normal(n, 22), res = Normal(n, 23),
                               w = Normal(cols, 24);
      std::vector<uint16_t> w16(w.size());
      for (size_t j = 0; j < w.size(); ++j) w16[j] = core::FloatToBf16Bits(w[j]);
      const void* wp = bf16 ? static_cast<const void*>(w16.data()) : w.data();
      std::vector<float> y(n), rstd(rows), gx(n), want(n);
      kcpu::RmsNormForward(x.data(), wp, bf16, 1e-6f, y.data(), rstd.data(), rows, cols);
      kcpu::LayerNormBackwardInput(g.data(), x.data(), nullptr, rstd.data(), wp, bf16, gx.data(),
                                   rows, cols);
      kcpu::Add(res.data(), gx.data(), want.data(), n);
      std::vector<float> sum(n, -1.0f), sum2(n, -1.0f);
      std::vector<uint16_t> sum16(n, 0);
      kcpu::LayerNormBackwardInputAdd(g.data(), x.data(), nullptr, rstd.data(), wp, bf16,
                                      res.data(), sum.data(), rows, cols);
      kcpu::LayerNormBackwardInputAdd(g.data(), x.data(), nullptr, rstd.data(), wp, bf16,
                                      res.data(), sum2.data(), rows, cols, sum16.data());
      EXPECT_EQ(Bits(sum), Bits(want));
      EXPECT_EQ(Bits(sum2), Bits(want));
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(sum16[i], core::FloatToBf16Bits(want[i])) << "element " << i;
      }
    }
  }
}

TEST(CpuLlamaKernelsTest, SiluMulAndItsGradientsMatchADoubleReference) {
  std::vector<float> a = Normal(1001, 4, 3.0f);
  a[0] = 100.0f;  // sigmoid saturates at 1 and 0: no NaN, no inf
  a[1] = -100.0f;
  a[2] = 0.0f;
  const std::vector<float> b = Normal(1001, 5), gh = Normal(1001, 6);
  std::vector<float> h(a.size()), ga(a.size()), gb(a.size());
  kcpu::SiluMulForward(a.data(), b.data(), h.data(), 1001);
  kcpu::SiluMulBackward(a.data(), b.data(), gh.data(), ga.data(), gb.data(), 1001);
  std::vector<double> h_ref(a.size()), ga_ref(a.size()), gb_ref(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const double s = 1.0 / (1.0 + std::exp(-double{a[i]}));
    h_ref[i] = a[i] * s * b[i];
    ga_ref[i] = gh[i] * b[i] * (s + a[i] * s * (1.0 - s));
    gb_ref[i] = gh[i] * a[i] * s;
    // Each element is its scalar body's, bit for bit.
    ASSERT_EQ(h[i], SiluMulForward(a[i], b[i])) << i;
    ASSERT_EQ(ga[i], SiluMulGradGate(a[i], b[i], gh[i])) << i;
    ASSERT_EQ(gb[i], SiluMulGradUp(a[i], gh[i])) << i;
  }
  ExpectClose(h, h_ref, 1e-6, "silu(a) * b");
  ExpectClose(ga, ga_ref, 1e-6, "d/da");
  ExpectClose(gb, gb_ref, 1e-6, "d/db");
}

struct PackShape {
  int64_t B, T, H, KV, D;
};

// cos/sin [T, D / 2] of HF's default rotary embedding with theta 10000, in double.
void Tables(const PackShape& p, std::vector<double>* cos, std::vector<double>* sin) {
  const int64_t half = p.D / 2;
  for (int64_t t = 0; t < p.T; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = t * std::pow(10000.0, -2.0 * i / p.D);
      cos->push_back(std::cos(angle));
      sin->push_back(std::sin(angle));
    }
  }
}

std::vector<float> ToFloat(const std::vector<double>& v) { return {v.begin(), v.end()}; }

TEST(CpuLlamaKernelsTest, RotaryPackIsTheDirectFormulaAndItsBackwardItsTranspose) {
  for (const PackShape& p :
       {PackShape{2, 5, 4, 2, 8}, PackShape{1, 3, 3, 3, 4}, PackShape{2, 4, 6, 1, 6}}) {
    const int64_t rows = p.B * p.T, C = p.H * p.D, KW = p.KV * p.D, half = p.D / 2;
    const int64_t group = p.H / p.KV;
    std::vector<double> cosd, sind;
    Tables(p, &cosd, &sind);
    const std::vector<float> cos = ToFloat(cosd), sin = ToFloat(sind);
    const std::vector<float> q = Normal(rows * C, 7), k = Normal(rows * KW, 8),
                             v = Normal(rows * KW, 9), g = Normal(rows * 3 * C, 10);
    std::vector<float> qkv(rows * 3 * C), gq(rows * C), gk(rows * KW), gv(rows * KW);
    kcpu::RotaryPackQkv(q.data(), k.data(), v.data(), cos.data(), sin.data(), qkv.data(), rows, p.T,
                        p.H, p.KV, p.D);
    kcpu::RotaryPackQkvBackward(g.data(), cos.data(), sin.data(), gq.data(), gk.data(), gv.data(),
                                rows, p.T, p.H, p.KV, p.D);
    // y = x cos + rotate_half(x) sin, rotate_half(x) = (-x[half:], x[:half]).
    auto rotated = [&](const float* head, int64_t t, int64_t j) {
      const int64_t i = j % half;
      const double rot = j < half ? -double{head[j + half]} : double{head[j - half]};
      return head[j] * cosd[t * half + i] + rot * sind[t * half + i];
    };
    std::vector<double> want(qkv.size());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t h = 0; h < p.H; ++h) {
        const int64_t kv = h / group;
        for (int64_t j = 0; j < p.D; ++j) {
          const int64_t out = r * 3 * C + h * p.D + j;
          want[out] = rotated(&q[r * C + h * p.D], r % p.T, j);
          want[out + C] = rotated(&k[r * KW + kv * p.D], r % p.T, j);
          want[out + 2 * C] = v[r * KW + kv * p.D + j];
        }
      }
    }
    ExpectClose(qkv, want, 1e-6, "packed q, k, v");
    // The backward is the transpose of the (linear) packing: <pack(q, k, v), g> equals
    // <q, gq> + <k, gk> + <v, gv>.
    double lhs = 0.0, rhs = 0.0, scale = 0.0;
    for (size_t i = 0; i < qkv.size(); ++i) {
      lhs += double{qkv[i]} * g[i];
      scale += std::abs(double{qkv[i]} * g[i]);
    }
    for (size_t i = 0; i < gq.size(); ++i) rhs += double{q[i]} * gq[i];
    for (size_t i = 0; i < gk.size(); ++i) rhs += double{k[i]} * gk[i] + double{v[i]} * gv[i];
    EXPECT_NEAR(lhs, rhs, 1e-6 * scale) << p.H << " heads, " << p.KV << " kv heads";
  }
}

// Elements as bf16 bits: each fp32 value rounded once.
std::vector<uint16_t> Rounded(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = core::FloatToBf16Bits(v[i]);
  return out;
}

// NOTE [GEMM epilogues]: silu(a) * b and its gradients stored bf16 are the fp32 outputs
// rounded once, each output by its own flag (the other keeps its fp32 bits), for any length
// (the vector loops' tails included).
TEST(CpuLlamaKernelsTest, SiluMulBf16OutputsAreTheFp32OutputsRoundedOnce) {
  for (int64_t n : {1, 7, 16, 33, 1001}) {
    SCOPED_TRACE(testing::Message() << n << " elements");
    const std::vector<float> a = Normal(n, 21, 3.0f), b = Normal(n, 22), gh = Normal(n, 23);
    std::vector<float> h(n), ga(n), gb(n);
    kcpu::SiluMulForward(a.data(), b.data(), h.data(), n);
    kcpu::SiluMulBackward(a.data(), b.data(), gh.data(), ga.data(), gb.data(), n);
    std::vector<uint16_t> h16(n);
    kcpu::SiluMulForward(a.data(), b.data(), h16.data(), n, /*h_bf16=*/true);
    EXPECT_EQ(h16, Rounded(h));
    for (bool ga_bf16 : {false, true}) {
      for (bool gb_bf16 : {false, true}) {
        std::vector<float> ga32(n), gb32(n);
        std::vector<uint16_t> ga16(n), gb16(n);
        void* gap = ga_bf16 ? static_cast<void*>(ga16.data()) : ga32.data();
        void* gbp = gb_bf16 ? static_cast<void*>(gb16.data()) : gb32.data();
        kcpu::SiluMulBackward(a.data(), b.data(), gh.data(), gap, gbp, n, ga_bf16, gb_bf16);
        if (ga_bf16) {
          EXPECT_EQ(ga16, Rounded(ga)) << "gate, up bf16 " << gb_bf16;
        } else {
          EXPECT_EQ(ga32, ga) << "gate, up bf16 " << gb_bf16;
        }
        if (gb_bf16) {
          EXPECT_EQ(gb16, Rounded(gb)) << "up, gate bf16 " << ga_bf16;
        } else {
          EXPECT_EQ(gb32, gb) << "up, gate bf16 " << ga_bf16;
        }
      }
    }
  }
}

// The packing stored bf16 is the fp32 packing rounded once; the backward's gq, gk and gv
// each by their own flag likewise (the others keep their fp32 bits), for multi-head,
// grouped and multi-query heads, odd T and head widths down to 2. The fp32 backward is its
// scalar bodies' bit for bit (the CUDA kernel's: k::RotaryGroupSum, k::RotaryRotate).
TEST(CpuLlamaKernelsTest, RotaryPackBf16OutputsAreTheFp32OutputsRoundedOnce) {
  for (const PackShape& p :
       {PackShape{2, 5, 4, 2, 8}, PackShape{1, 3, 3, 3, 4}, PackShape{2, 4, 6, 1, 6},
        PackShape{3, 7, 6, 2, 2}, PackShape{1, 9, 3, 1, 10}}) {
    SCOPED_TRACE(testing::Message()
                 << p.H << " heads, " << p.KV << " kv heads, D " << p.D << ", T " << p.T);
    const int64_t rows = p.B * p.T, C = p.H * p.D, KW = p.KV * p.D, half = p.D / 2;
    const int64_t group = p.H / p.KV;
    std::vector<double> cosd, sind;
    Tables(p, &cosd, &sind);
    const std::vector<float> cos = ToFloat(cosd), sin = ToFloat(sind);
    const std::vector<float> q = Normal(rows * C, 24), k = Normal(rows * KW, 25),
                             v = Normal(rows * KW, 26), g = Normal(rows * 3 * C, 27);
    std::vector<float> qkv(rows * 3 * C), gq(rows * C), gk(rows * KW), gv(rows * KW);
    kcpu::RotaryPackQkv(q.data(), k.data(), v.data(), cos.data(), sin.data(), qkv.data(), rows, p.T,
                        p.H, p.KV, p.D);
    kcpu::RotaryPackQkvBackward(g.data(), cos.data(), sin.data(), gq.data(), gk.data(), gv.data(),
                                rows, p.T, p.H, p.KV, p.D);
    std::vector<uint16_t> qkv16(qkv.size());
    kcpu::RotaryPackQkv(q.data(), k.data(), v.data(), cos.data(), sin.data(), qkv16.data(), rows,
                        p.T, p.H, p.KV, p.D, /*qkv_bf16=*/true);
    EXPECT_EQ(qkv16, Rounded(qkv));
    for (int64_t r = 0; r < rows; ++r) {
      const float* c = &cos[(r % p.T) * half];
      const float* s = &sin[(r % p.T) * half];
      const float* gr = &g[r * 3 * C];
      for (int64_t j = 0; j < p.D; ++j) {
        const bool first = j < half;
        const int64_t i = first ? j : j - half, partner = first ? j + half : j - half;
        for (int64_t h = 0; h < p.H; ++h) {
          ASSERT_EQ(gq[r * C + h * p.D + j],
                    RotaryRotate(gr[h * p.D + j], gr[h * p.D + partner], c[i], -s[i], first));
        }
        for (int64_t kv = 0; kv < p.KV; ++kv) {
          const float* gk0 = gr + C + kv * group * p.D;
          ASSERT_EQ(gk[r * KW + kv * p.D + j],
                    RotaryRotate(RotaryGroupSum(gk0, j, group, p.D),
                                 RotaryGroupSum(gk0, partner, group, p.D), c[i], -s[i], first));
          ASSERT_EQ(gv[r * KW + kv * p.D + j],
                    RotaryGroupSum(gr + 2 * C + kv * group * p.D, j, group, p.D));
        }
      }
    }
    for (int mask = 1; mask < 8; ++mask) {
      const bool q16 = mask & 1, k16 = mask & 2, v16 = mask & 4;
      std::vector<float> gq32(gq.size()), gk32(gk.size()), gv32(gv.size());
      std::vector<uint16_t> gq16(gq.size()), gk16(gk.size()), gv16(gv.size());
      auto out = [](bool bf16, std::vector<uint16_t>& b, std::vector<float>& f) {
        return bf16 ? static_cast<void*>(b.data()) : static_cast<void*>(f.data());
      };
      kcpu::RotaryPackQkvBackward(g.data(), cos.data(), sin.data(), out(q16, gq16, gq32),
                                  out(k16, gk16, gk32), out(v16, gv16, gv32), rows, p.T, p.H, p.KV,
                                  p.D, q16, k16, v16);
      SCOPED_TRACE(testing::Message() << "bf16 mask " << mask);
      for (const auto& [bf16, got16, got32, want] :
           {std::make_tuple(q16, &gq16, &gq32, &gq), std::make_tuple(k16, &gk16, &gk32, &gk),
            std::make_tuple(v16, &gv16, &gv32, &gv)}) {
        if (bf16) {
          EXPECT_EQ(*got16, Rounded(*want));
        } else {
          EXPECT_EQ(*got32, *want);
        }
      }
    }
  }
}

TEST(CpuLlamaKernelsTest, ResultsAreBitIdenticalForAnyThreadCount) {
  const int saved = IntraOpThreads();
  const PackShape p{4, 64, 8, 2, 32};  // 256 rows of 768 packed columns: several chunks
  const int64_t rows = p.B * p.T, C = p.H * p.D, KW = p.KV * p.D, cols = 300;
  std::vector<double> cosd, sind;
  Tables(p, &cosd, &sind);
  const std::vector<float> cos = ToFloat(cosd), sin = ToFloat(sind);
  auto run = [&](int threads) {
    EXPECT_TRUE(SetIntraOpThreads(threads).ok());
    std::vector<std::vector<float>> out;
    const std::vector<float> x = Normal(rows * cols, 11), g = Normal(rows * cols, 12),
                             w = Normal(cols, 13);
    std::vector<float> y(x.size()), xhat(x.size()), rstd(rows), gx(x.size());
    kcpu::RmsNormForward(x.data(), w.data(), false, 1e-6f, y.data(), rstd.data(), rows, cols);
    kcpu::LayerNormBackwardInput(g.data(), x.data(), nullptr, rstd.data(), w.data(), false,
                                 gx.data(), rows, cols);
    kcpu::LayerNormHat(x.data(), nullptr, rstd.data(), xhat.data(), rows, cols);
    out.insert(out.end(), {y, rstd, gx, xhat});
    std::vector<float> sum(x.size()), sum16_wide(x.size());
    std::vector<uint16_t> sum16(x.size());
    kcpu::LayerNormBackwardInputAdd(g.data(), x.data(), nullptr, rstd.data(), w.data(), false,
                                    x.data(), sum.data(), rows, cols, sum16.data());
    for (size_t i = 0; i < sum16.size(); ++i) sum16_wide[i] = core::Bf16BitsToFloat(sum16[i]);
    out.insert(out.end(), {sum, sum16_wide});
    std::vector<float> ga(x.size()), gb(x.size());
    kcpu::SiluMulForward(x.data(), g.data(), y.data(), rows * cols);
    kcpu::SiluMulBackward(x.data(), g.data(), xhat.data(), ga.data(), gb.data(), rows * cols);
    out.insert(out.end(), {y, ga, gb});
    const std::vector<float> q = Normal(rows * C, 14), k = Normal(rows * KW, 15),
                             v = Normal(rows * KW, 16), gqkv = Normal(rows * 3 * C, 17);
    std::vector<float> qkv(rows * 3 * C), gq(rows * C), gk(rows * KW), gv(rows * KW);
    kcpu::RotaryPackQkv(q.data(), k.data(), v.data(), cos.data(), sin.data(), qkv.data(), rows, p.T,
                        p.H, p.KV, p.D);
    kcpu::RotaryPackQkvBackward(gqkv.data(), cos.data(), sin.data(), gq.data(), gk.data(),
                                gv.data(), rows, p.T, p.H, p.KV, p.D);
    out.insert(out.end(), {qkv, gq, gk, gv});
    // The same outputs stored bf16 (as floats).
    std::vector<uint16_t> h16(x.size()), ga16(x.size()), gb16(x.size()), qkv16(qkv.size()),
        gq16(gq.size()), gk16(gk.size()), gv16(gv.size());
    kcpu::SiluMulForward(x.data(), g.data(), h16.data(), rows * cols, /*h_bf16=*/true);
    kcpu::SiluMulBackward(x.data(), g.data(), xhat.data(), ga16.data(), gb16.data(), rows * cols,
                          /*ga_bf16=*/true, /*gb_bf16=*/true);
    kcpu::RotaryPackQkv(q.data(), k.data(), v.data(), cos.data(), sin.data(), qkv16.data(), rows,
                        p.T, p.H, p.KV, p.D, /*qkv_bf16=*/true);
    kcpu::RotaryPackQkvBackward(gqkv.data(), cos.data(), sin.data(), gq16.data(), gk16.data(),
                                gv16.data(), rows, p.T, p.H, p.KV, p.D, true, true, true);
    for (const std::vector<uint16_t>* b : {&h16, &ga16, &gb16, &qkv16, &gq16, &gk16, &gv16}) {
      std::vector<float> f(b->size());
      for (size_t i = 0; i < b->size(); ++i) f[i] = core::Bf16BitsToFloat((*b)[i]);
      out.push_back(f);
    }
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
}  // namespace kernels
