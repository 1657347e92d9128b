#include "nn/functional/llama_fused.h"

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/autograd.h"
#include "core/module.h"
#include "core/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/functional/fused.h"
#include "nn/functional/gradcheck.h"
#include "nn/functional/internal/layer_test_util.h"
#include "nn/functional/linear.h"
#include "nn/functional/norm.h"
#include "nn/llama.h"
#include "nn/rms_norm.h"
#include "nn/rotary.h"
#include "nn/testing/gradcheck.h"
#include "nn/to_device.h"

namespace nn {
namespace functional {
namespace {

using core::DType;
using core::Tensor;
using layer_test_util::Bf16;
using layer_test_util::ExpectGradientsPass;
using layer_test_util::ExpectInvalid;
using layer_test_util::ExpectNear;
using layer_test_util::ExpectSameBits;
using layer_test_util::Random;

// ---- Each op: values, gradients, dtypes.

// t's bf16 rounding widened back to fp32: the values a bf16 GEMM computes on.
Tensor Rounded(const Tensor& t) {
  return Bf16(t).ToDType(DType::kFloat32, core::MemoryTag::kOther).value();
}

// y[r, o] = sum_i x[r, i] w[o, i], in double.
std::vector<double> ProjectRef(const Tensor& x, const Tensor& w) {
  const int64_t out = w.size(0), in = w.size(1), rows = x.numel() / in;
  const std::vector<float> xv = x.ToVector(), wv = w.ToVector();
  std::vector<double> y(rows * out, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t i = 0; i < in; ++i) y[r * out + o] += double{xv[r * in + i]} * wv[o * in + i];
    }
  }
  return y;
}

TEST(LlamaFusedNormTest, ValuesAndPassThrough) {
  const Tensor x = Random({3, 8}, 1), w = Random({8}, 2);
  FusedRmsNormOptions options;
  options.eps = 1e-5f;
  absl::StatusOr<std::vector<Tensor>> got = ResidualRmsNorm(x, w, options);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE((*got)[0].SharesStorage(x));
  EXPECT_EQ((*got)[0].shape(), x.shape());
  const std::vector<float> xv = x.ToVector(), wv = w.ToVector();
  std::vector<double> want(xv.size());
  for (int64_t r = 0; r < 3; ++r) {
    double ms = 0;
    for (int64_t c = 0; c < 8; ++c) ms += double{xv[r * 8 + c]} * xv[r * 8 + c] / 8;
    for (int64_t c = 0; c < 8; ++c) want[r * 8 + c] = xv[r * 8 + c] / std::sqrt(ms + 1e-5) * wv[c];
  }
  ExpectNear((*got)[1], want, 1e-5);
  absl::StatusOr<Tensor> plain = RmsNorm(x, w, 1e-5f);
  ASSERT_TRUE(plain.ok()) << plain.status();
  ExpectSameBits((*got)[1], *plain, "normed against F::RmsNorm");
}

// RmsNorm::ForwardForGemm: normed is stored bf16 under a bf16 weight (unless asked not to), the
// fp32 norm rounded once.
TEST(LlamaFusedNormTest, Bf16WeightsStoreNormedBf16ForAGemm) {
  const Tensor x = Random({3, 8}, 1), w = Bf16(Random({8}, 3));
  absl::StatusOr<Tensor> fp32 = RmsNorm(x, w);
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  absl::StatusOr<std::vector<Tensor>> got = ResidualRmsNorm(x, w);
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSameBits((*got)[1], Bf16(*fp32), "normed for a GEMM");
  FusedRmsNormOptions plain;
  plain.normed_for_gemm = false;
  got = ResidualRmsNorm(x, w, plain);
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSameBits((*got)[1], *fp32, "normed, fp32");
}

// The gradient of x is RmsNorm'(g_normed) + g_x_out from one pass: what RmsNorm::BackwardAdd
// gives, bit for bit, and its weight gradient, for fp32 and bf16 weights.
TEST(LlamaFusedNormTest, BackwardMatchesTheLayersFusedBackward) {
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(core::DTypeName(dtype));
    nn::RmsNorm norm(8);
    gradcheck::RandomizeParameters(norm, 3, 1.0f, 0.5f);
    ASSERT_TRUE(nn::ConvertParameters(norm, dtype).ok());
    const Tensor x = Random({3, 8}, 1), g = Random({3, 8}, 4), g_stream = Random({3, 8}, 5);
    absl::StatusOr<Tensor> want_y = norm.ForwardForGemm(x);
    ASSERT_TRUE(want_y.ok()) << want_y.status();
    absl::StatusOr<Tensor> want_gx = norm.BackwardAdd(g, g_stream);
    ASSERT_TRUE(want_gx.ok()) << want_gx.status();
    core::ParameterPtr w = core::Parameter::Make(norm.weight()->data);
    const Tensor xl = core::Leaf(x);
    absl::StatusOr<std::vector<Tensor>> out = ResidualRmsNorm(xl, w);
    ASSERT_TRUE(out.ok()) << out.status();
    ExpectSameBits((*out)[1], *want_y, "normed");
    ASSERT_TRUE(core::Backward(*out, {g_stream, g}).ok());
    ExpectSameBits(core::LeafGrad(xl), *want_gx, "gradient of x");
    ExpectSameBits(w->grad, norm.weight()->grad, "weight gradient");
  }
}

// qkv[b, t] from q, k, v = x w^T: q and k heads turned by position t (pairs i, i + D/2), each kv
// head repeated for its group, in double.
std::vector<double> RotaryQkvRef(const Tensor& x, const Tensor& q_w, const Tensor& k_w,
                                 const Tensor& v_w, int64_t H, int64_t KV, double theta) {
  const int64_t B = x.size(0), T = x.size(1), D = q_w.size(0) / H, C = H * D, half = D / 2;
  const std::vector<double> q = ProjectRef(x, q_w), k = ProjectRef(x, k_w), v = ProjectRef(x, v_w);
  std::vector<double> qkv(B * T * 3 * C);
  for (int64_t r = 0; r < B * T; ++r) {
    const int64_t t = r % T;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / KV);
      for (int64_t i = 0; i < D; ++i) {
        const int64_t pair = i % half;
        const double angle = t * std::pow(theta, -2.0 * pair / D);
        const double c = std::cos(angle), s = std::sin(angle);
        const auto turn = [&](const std::vector<double>& src, int64_t width, int64_t head) {
          const double* p = &src[r * width + head * D];
          return i < half ? p[i] * c - p[i + half] * s : p[i] * c + p[i - half] * s;
        };
        double* out = &qkv[r * 3 * C + h * D + i];
        out[0] = turn(q, C, h);
        out[C] = turn(k, KV * D, g);
        out[2 * C] = v[r * KV * D + g * D + i];
      }
    }
  }
  return qkv;
}

nn::RotaryTables Tables(int64_t positions, int64_t head_dim) {
  return nn::MakeRotaryTables(positions, head_dim, 10000.0, core::Device::Cpu()).value();
}

TEST(LlamaFusedAttentionTest, RotaryQkvMatchesADoubleReference) {
  // 4 query heads of width 4 over 2 kv heads.
  const Tensor x = Random({2, 5, 6}, 1), q_w = Random({16, 6}, 2), k_w = Random({8, 6}, 3);
  const Tensor v_w = Random({8, 6}, 4);
  absl::StatusOr<Tensor> qkv = RotaryQkv(x, q_w, k_w, v_w, Tables(8, 4), 4, 2);
  ASSERT_TRUE(qkv.ok()) << qkv.status();
  EXPECT_EQ(qkv->shape(), (core::Shape{2, 5, 48}));
  EXPECT_EQ(qkv->dtype(), DType::kFloat32);
  ExpectNear(*qkv, RotaryQkvRef(x, q_w, k_w, v_w, 4, 2, 10000.0), 1e-5);
}

// h = silu(x gate^T) * (x up^T), in double.
std::vector<double> SwiGluRef(const Tensor& x, const Tensor& gate_w, const Tensor& up_w) {
  const std::vector<double> a = ProjectRef(x, gate_w), b = ProjectRef(x, up_w);
  std::vector<double> h(a.size());
  for (size_t i = 0; i < a.size(); ++i) h[i] = a[i] / (1.0 + std::exp(-a[i])) * b[i];
  return h;
}

TEST(LlamaFusedMlpTest, SwiGluMatchesADoubleReference) {
  const Tensor x = Random({2, 3, 6}, 1), gate_w = Random({10, 6}, 2), up_w = Random({10, 6}, 3);
  absl::StatusOr<Tensor> h = SwiGlu(x, gate_w, up_w);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->shape(), (core::Shape{2, 3, 10}));
  EXPECT_EQ(h->dtype(), DType::kFloat32);
  ExpectNear(*h, SwiGluRef(x, gate_w, up_w), 1e-5);
}

// NOTE [GEMM epilogues]: under bf16 weights qkv and h are stored bf16, each the fp32 value of the
// bf16 GEMMs (those on the rounded operands) rounded once; SwiGlu's h fp32 when asked.
TEST(LlamaFusedTest, Bf16WeightsStoreTheGemmInputsBf16) {
  const Tensor x = Random({2, 5, 6}, 1), q_w = Random({16, 6}, 2), k_w = Random({8, 6}, 3);
  const Tensor v_w = Random({8, 6}, 4);
  const nn::RotaryTables tables = Tables(5, 4);
  absl::StatusOr<Tensor> qkv16 = RotaryQkv(x, Bf16(q_w), Bf16(k_w), Bf16(v_w), tables, 4, 2);
  ASSERT_TRUE(qkv16.ok()) << qkv16.status();
  absl::StatusOr<Tensor> qkv32 =
      RotaryQkv(Rounded(x), Rounded(q_w), Rounded(k_w), Rounded(v_w), tables, 4, 2);
  ASSERT_TRUE(qkv32.ok()) << qkv32.status();
  ExpectSameBits(*qkv16, Bf16(*qkv32), "qkv");

  const Tensor gate_w = Random({10, 6}, 5), up_w = Random({10, 6}, 6);
  absl::StatusOr<Tensor> h16 = SwiGlu(x, Bf16(gate_w), Bf16(up_w));
  ASSERT_TRUE(h16.ok()) << h16.status();
  absl::StatusOr<Tensor> h32 = SwiGlu(Rounded(x), Rounded(gate_w), Rounded(up_w));
  ASSERT_TRUE(h32.ok()) << h32.status();
  ExpectSameBits(*h16, Bf16(*h32), "h");
  SwiGluOptions plain;
  plain.h_for_gemm = false;
  absl::StatusOr<Tensor> h_fp32 = SwiGlu(Bf16(x), Bf16(gate_w), Bf16(up_w), plain);
  ASSERT_TRUE(h_fp32.ok()) << h_fp32.status();
  ExpectSameBits(*h_fp32, *h32, "h, fp32");
}

TEST(LlamaFusedTest, GradientsPassTheCheck) {
  ExpectGradientsPass([](const std::vector<Tensor>& in) { return ResidualRmsNorm(in[0], in[1]); },
                      {Random({2, 3, 8}, 1), Random({8}, 2)}, {"x", "w"});
  // x_out unused: its gradient counts as zeros.
  ExpectGradientsPass(
      [](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(const std::vector<Tensor> out, ResidualRmsNorm(in[0], in[1]));
        return std::vector<Tensor>{out[1]};
      },
      {Random({4, 6}, 3), Random({6}, 4)}, {"x", "w"});
  const nn::RotaryTables tables = Tables(5, 4);
  ExpectGradientsPass(
      [&tables](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor qkv, RotaryQkv(in[0], in[1], in[2], in[3], tables, 4, 2));
        return std::vector<Tensor>{qkv};
      },
      {Random({2, 5, 6}, 5), Random({16, 6}, 6), Random({8, 6}, 7), Random({8, 6}, 8)},
      {"x", "q w", "k w", "v w"});
  ExpectGradientsPass(
      [](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor h, SwiGlu(in[0], in[1], in[2]));
        return std::vector<Tensor>{h};
      },
      {Random({2, 3, 6}, 9), Random({10, 6}, 10), Random({10, 6}, 11)}, {"x", "gate w", "up w"});
  // The attention sublayer composed: x + o(attention(RotaryQkv(normed))).
  ExpectGradientsPass(
      [&tables](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(const std::vector<Tensor> n, ResidualRmsNorm(in[0], in[1]));
        ASSIGN_OR_RETURN(Tensor y,
                         LinearResidual(CausalSelfAttentionCore(
                                            RotaryQkv(n[1], in[2], in[3], in[4], tables, 4, 2), 4),
                                        in[5], Tensor(), n[0]));
        return std::vector<Tensor>{y};
      },
      {Random({2, 5, 16}, 12), Random({16}, 13), Random({16, 16}, 14, 0.3f),
       Random({8, 16}, 15, 0.3f), Random({8, 16}, 16, 0.3f), Random({16, 16}, 17, 0.3f)},
      {"x", "norm w", "q w", "k w", "v w", "o w"});
}

// The steps for projections made elsewhere (a projection called with its hooks): PackRotaryQkv and
// SiluMul over F::Linear's outputs give RotaryQkv's and SwiGlu's bits, forward and backward, under
// fp32 and bf16 weights.
TEST(LlamaFusedTest, PackRotaryQkvAndSiluMulGiveTheFusedStepsBits) {
  const nn::RotaryTables tables = Tables(5, 4);
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(core::DTypeName(dtype));
    auto cast = [dtype](const Tensor& t) { return dtype == DType::kBFloat16 ? Bf16(t) : t; };
    const Tensor x = Random({2, 5, 6}, 1);
    const std::vector<Tensor> qkv_w = {cast(Random({16, 6}, 2)), cast(Random({8, 6}, 3)),
                                       cast(Random({8, 6}, 4))};
    const std::vector<Tensor> mlp_w = {cast(Random({10, 6}, 5)), cast(Random({10, 6}, 6))};
    using Step = std::function<absl::StatusOr<Tensor>(const std::vector<Tensor>& in)>;
    const Step fused_qkv = [&](const std::vector<Tensor>& in) {
      return RotaryQkv(in[0], in[1], in[2], in[3], tables, 4, 2);
    };
    const Step packed_qkv = [&](const std::vector<Tensor>& in) {
      return PackRotaryQkv(Linear(in[0], in[1]), Linear(in[0], in[2]), Linear(in[0], in[3]), tables,
                           4, 2, dtype);
    };
    const Step fused_mlp = [&](const std::vector<Tensor>& in) {
      return SwiGlu(in[0], in[1], in[2]);
    };
    const Step composed_mlp = [&](const std::vector<Tensor>& in) {
      return SiluMul(Linear(in[0], in[1]), Linear(in[0], in[2]), dtype);
    };
    // The output and every input's gradient (fp32 leaves, the weights widened exactly).
    auto run = [&](const Step& step, std::vector<Tensor> in) {
      std::vector<Tensor> leaves;
      for (Tensor& t : in) {
        leaves.push_back(core::Leaf(t));
        t = leaves.back();
      }
      std::vector<std::vector<float>> out;
      absl::StatusOr<Tensor> y = step(in);
      EXPECT_TRUE(y.ok()) << y.status();
      if (!y.ok()) return out;
      EXPECT_EQ(y->dtype(), dtype);
      out.push_back(y->ToVector());
      const Tensor seed = Random(y->shape(), 7);
      EXPECT_TRUE(core::Backward({*y}, {seed}).ok());
      for (const Tensor& leaf : leaves) out.push_back(core::LeafGrad(leaf).ToVector());
      return out;
    };
    EXPECT_EQ(run(fused_qkv, {x, qkv_w[0], qkv_w[1], qkv_w[2]}),
              run(packed_qkv, {x, qkv_w[0], qkv_w[1], qkv_w[2]}));
    EXPECT_EQ(run(fused_mlp, {x, mlp_w[0], mlp_w[1]}), run(composed_mlp, {x, mlp_w[0], mlp_w[1]}));
  }
  ExpectGradientsPass(
      [&tables](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor qkv, PackRotaryQkv(in[0], in[1], in[2], tables, 4, 2));
        return std::vector<Tensor>{qkv};
      },
      {Random({2, 5, 16}, 8), Random({2, 5, 8}, 9), Random({2, 5, 8}, 10)}, {"q", "k", "v"});
  ExpectGradientsPass(
      [](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor h, SiluMul(in[0], in[1]));
        return std::vector<Tensor>{h};
      },
      {Random({2, 3, 10}, 11), Random({2, 3, 10}, 12)}, {"gate", "up"});
}

TEST(LlamaFusedTest, PackRotaryQkvAndSiluMulNameTheirBadArguments) {
  const nn::RotaryTables tables = Tables(3, 2);
  const Tensor q = Tensor::Zeros({2, 3, 4}), kv = Tensor::Zeros({2, 3, 2});
  ExpectInvalid(PackRotaryQkv(q, q, kv, tables, 2, 1).status(),
                "PackRotaryQkv: k must be [2, 3, 2]");
  ExpectInvalid(PackRotaryQkv(q, kv, kv, tables, 2, 3).status(),
                "PackRotaryQkv: n_head (2) must be a positive multiple of n_kv_head (3)");
  ExpectInvalid(PackRotaryQkv(Tensor::Zeros({2, 3, 6}), kv, kv, tables, 2, 1).status(),
                "PackRotaryQkv: q must be [B, T, n_head * D] with D even");
  ExpectInvalid(PackRotaryQkv(Bf16(q), kv, kv, tables, 2, 1).status(), "PackRotaryQkv: q");
  ExpectInvalid(PackRotaryQkv(q, kv, kv, Tables(2, 2), 2, 1).status(),
                "PackRotaryQkv: the rotary tables (head width 2, 2 positions");
  ExpectInvalid(PackRotaryQkv(q, kv, kv, tables, 2, 1, DType::kInt32).status(),
                "PackRotaryQkv: dtype must be float32 or bfloat16");
  ExpectInvalid(SiluMul(q, kv).status(), "SiluMul: up must be like gate");
  ExpectInvalid(SiluMul(q, Bf16(q)).status(), "SiluMul: up");
  ExpectInvalid(SiluMul(q, q, DType::kInt32).status(), "SiluMul: dtype must be float32");
  const absl::StatusOr<Tensor> earlier = absl::InternalError("Earlier: failed");
  EXPECT_EQ(PackRotaryQkv(q, earlier, kv, tables, 2, 1).status(), earlier.status());
  EXPECT_EQ(SiluMul(earlier, q).status(), earlier.status());
}

// No rows give empty outputs and gradients (zero parameter gradients); one position turns nothing,
// so qkv is q, k and v with each kv head repeated.
TEST(LlamaFusedTest, EmptyAndSizeOneShapes) {
  core::ParameterPtr gate_w = core::Parameter::Make(Random({5, 4}, 1));
  core::ParameterPtr up_w = core::Parameter::Make(Random({5, 4}, 2));
  const Tensor x = core::Leaf(Tensor::Zeros({0, 4}));
  absl::StatusOr<Tensor> h = SwiGlu(x, gate_w, up_w);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->shape(), (core::Shape{0, 5}));
  ASSERT_TRUE(core::Backward({*h}, {Tensor::Zeros({0, 5})}).ok());
  EXPECT_EQ(core::LeafGrad(x).shape(), (core::Shape{0, 4}));
  EXPECT_THAT(gate_w->grad.ToVector(), ::testing::Each(0.0f));
  EXPECT_THAT(up_w->grad.ToVector(), ::testing::Each(0.0f));
  absl::StatusOr<std::vector<Tensor>> n = ResidualRmsNorm(Tensor::Zeros({0, 8}), Random({8}, 3));
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ((*n)[1].shape(), (core::Shape{0, 8}));

  // 2 query heads of width 2 over 1 kv head, T = 1.
  const Tensor x1 = Random({3, 1, 4}, 4), q_w = Random({4, 4}, 5), k_w = Random({2, 4}, 6);
  const Tensor v_w = Random({2, 4}, 7);
  absl::StatusOr<Tensor> qkv = RotaryQkv(x1, q_w, k_w, v_w, Tables(1, 2), 2, 1);
  ASSERT_TRUE(qkv.ok()) << qkv.status();
  const std::vector<double> q = ProjectRef(x1, q_w), k = ProjectRef(x1, k_w),
                            v = ProjectRef(x1, v_w);
  std::vector<double> want;
  for (int64_t r = 0; r < 3; ++r) {
    for (int64_t i = 0; i < 4; ++i) want.push_back(q[r * 4 + i]);
    for (int64_t h = 0; h < 2; ++h) want.insert(want.end(), {k[r * 2], k[r * 2 + 1]});
    for (int64_t h = 0; h < 2; ++h) want.insert(want.end(), {v[r * 2], v[r * 2 + 1]});
  }
  ExpectNear(*qkv, want, 1e-5);
}

TEST(LlamaFusedTest, NoGradScopeRecordsNothing) {
  core::NoGradScope no_grad;
  const Tensor x = core::Leaf(Random({2, 3, 4}, 1)), nw = core::Leaf(Random({4}, 2));
  const Tensor q_w = core::Leaf(Random({4, 4}, 3)), k_w = core::Leaf(Random({2, 4}, 4));
  const Tensor v_w = core::Leaf(Random({2, 4}, 5)), gate_w = core::Leaf(Random({6, 4}, 6));
  const Tensor up_w = core::Leaf(Random({6, 4}, 7));
  absl::StatusOr<std::vector<Tensor>> n = ResidualRmsNorm(x, nw);
  absl::StatusOr<Tensor> qkv = RotaryQkv(x, q_w, k_w, v_w, Tables(3, 2), 2, 1);
  absl::StatusOr<Tensor> h = SwiGlu(x, gate_w, up_w);
  ASSERT_TRUE(n.ok() && qkv.ok() && h.ok());
  for (const Tensor& t : {(*n)[0], (*n)[1], *qkv, *h}) {
    EXPECT_FALSE(core::RequiresGrad(t)) << t.ToString();
  }
}

TEST(LlamaFusedTest, BadArgumentsAreInvalidArgumentNamingThem) {
  const Tensor x = Tensor::Zeros({2, 3, 4}), nw = Tensor::Zeros({4});
  ExpectInvalid(ResidualRmsNorm(x, Tensor::Zeros({5})).status(),
                "ResidualRmsNorm: weight must be [4]");
  ExpectInvalid(ResidualRmsNorm(Bf16(x), nw).status(), "ResidualRmsNorm: input must be float32");
  ExpectInvalid(ResidualRmsNorm(Tensor::Zeros({2, 0}), Tensor::Zeros({0})).status(),
                "ResidualRmsNorm: input must be at least 1-D");
  ExpectInvalid(ResidualRmsNorm(x, Tensor()).status(), "ResidualRmsNorm: weight is undefined");
  FusedRmsNormOptions bad_eps;
  bad_eps.eps = std::nanf("");
  ExpectInvalid(ResidualRmsNorm(x, nw, bad_eps).status(), "ResidualRmsNorm: eps");

  // 2 query heads of width 2 over 1 kv head.
  const Tensor q_w = Tensor::Zeros({4, 4}), kv_w = Tensor::Zeros({2, 4});
  const nn::RotaryTables tables = Tables(3, 2);
  ExpectInvalid(RotaryQkv(Tensor::Zeros({6, 4}), q_w, kv_w, kv_w, tables, 2, 1).status(),
                "RotaryQkv: input must be [B, T, C]");
  ExpectInvalid(RotaryQkv(Tensor::Zeros({2, 3, 5}), q_w, kv_w, kv_w, tables, 2, 1).status(),
                "RotaryQkv: input Tensor(float32, [2, 3, 5], cpu) must have last dimension 4");
  ExpectInvalid(RotaryQkv(x, q_w, kv_w, kv_w, tables, 2, 3).status(),
                "RotaryQkv: n_head (2) must be a positive multiple of n_kv_head (3)");
  ExpectInvalid(RotaryQkv(x, q_w, kv_w, kv_w, tables, 4, 1).status(),
                "RotaryQkv: q weight");  // head width 1 is odd
  ExpectInvalid(RotaryQkv(x, q_w, q_w, kv_w, tables, 2, 1).status(),
                "RotaryQkv: k weight must be [2, 4]");
  ExpectInvalid(RotaryQkv(x, q_w, kv_w, Tensor::Zeros({2, 5}), tables, 2, 1).status(),
                "(the in of v weight");
  ExpectInvalid(RotaryQkv(x, q_w, Bf16(kv_w), kv_w, tables, 2, 1).status(),
                "RotaryQkv: k weight must have the dtype of q weight");
  ExpectInvalid(RotaryQkv(Bf16(x), q_w, kv_w, kv_w, tables, 2, 1).status(),
                "bfloat16 only with bfloat16 weights");
  ExpectInvalid(RotaryQkv(x, q_w, kv_w, kv_w, Tables(2, 2), 2, 1).status(),
                "RotaryQkv: the rotary tables (head width 2, 2 positions");
  ExpectInvalid(RotaryQkv(x, q_w, kv_w, kv_w, Tables(3, 4), 2, 1).status(),
                "must be of head width 2");
  ExpectInvalid(RotaryQkv(x, q_w, kv_w, Tensor(), tables, 2, 1).status(),
                "RotaryQkv: v weight is undefined");

  ExpectInvalid(SwiGlu(x, Tensor::Zeros({6, 4}), Tensor::Zeros({5, 4})).status(),
                "SwiGlu: up weight must be like gate weight");
  ExpectInvalid(SwiGlu(x, Tensor::Zeros({6, 5}), Tensor::Zeros({6, 5})).status(),
                "SwiGlu: input Tensor(float32, [2, 3, 4], cpu) must have last dimension 5");
  ExpectInvalid(SwiGlu(x, Tensor::Zeros({24}), Tensor::Zeros({24})).status(),
                "SwiGlu: gate weight must be 2-D");
  ExpectInvalid(SwiGlu(x, Tensor::Zeros({6, 4}, DType::kInt32), Tensor::Zeros({6, 4})).status(),
                "SwiGlu: gate weight must be float32 or bfloat16");

  const absl::StatusOr<Tensor> earlier = absl::InternalError("Earlier: failed");
  EXPECT_EQ(ResidualRmsNorm(earlier, nw).status(), earlier.status());
  EXPECT_EQ(RotaryQkv(x, q_w, earlier, kv_w, tables, 2, 1).status(), earlier.status());
  EXPECT_EQ(SwiGlu(x, Tensor::Zeros({6, 4}), earlier).status(), earlier.status());
}

}  // namespace
}  // namespace functional
}  // namespace nn
