#include "nn/functional/fused.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/autograd.h"
#include "core/module.h"
#include "core/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/functional/elementwise.h"
#include "nn/functional/gradcheck.h"
#include "nn/functional/internal/layer_test_util.h"
#include "nn/functional/linear.h"
#include "nn/functional/norm.h"
#include "nn/layer_norm.h"
#include "nn/testing/gradcheck.h"
#include "nn/to_device.h"
#include "nn/transformer.h"

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

double GeluRef(double v) {
  return 0.5 * v *
         (1.0 + std::tanh(std::sqrt(2.0 / 3.14159265358979323846) * (v + 0.044715 * v * v * v)));
}

// y[r, o] = r_term + b[o] + sum_i x[r, i] w[o, i], in double.
std::vector<double> LinearRef(const Tensor& x, const Tensor& w, const Tensor& b,
                              const Tensor& residual = Tensor()) {
  const int64_t out = w.size(0), in = w.size(1), rows = x.numel() / in;
  std::vector<double> y(rows * out);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      double acc = b.defined() ? b.data<float>()[o] : 0.0;
      if (residual.defined()) acc += residual.data<float>()[r * out + o];
      for (int64_t i = 0; i < in; ++i)
        acc += double{x.data<float>()[r * in + i]} * w.data<float>()[o * in + i];
      y[r * out + o] = acc;
    }
  }
  return y;
}

TEST(FusedLinearTest, ValuesMatchADoubleReference) {
  const Tensor x = Random({2, 3, 4}, 1), w = Random({5, 4}, 2), b = Random({5}, 3);
  const Tensor r = Random({2, 3, 5}, 4);
  const std::vector<double> pre = LinearRef(x, w, b);
  absl::StatusOr<Tensor> y = LinearForGemm(x, w, b);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->dtype(), DType::kFloat32);
  ExpectNear(*y, pre, 1e-5);
  absl::StatusOr<std::vector<Tensor>> hp = LinearGelu(x, w, b);
  ASSERT_TRUE(hp.ok()) << hp.status();
  ExpectNear((*hp)[1], pre, 1e-5);
  std::vector<double> h(pre.size());
  for (size_t i = 0; i < pre.size(); ++i) h[i] = GeluRef(pre[i]);
  ExpectNear((*hp)[0], h, 1e-5);
  const Tensor w2 = Random({3, 5}, 5), b2 = Random({3}, 6), r2 = Random({2, 3, 3}, 7);
  absl::StatusOr<Tensor> out = GeluLinear((*hp)[0], (*hp)[1], w2, b2, r2);
  ASSERT_TRUE(out.ok()) << out.status();
  ExpectNear(*out, LinearRef((*hp)[0], w2, b2, r2), 1e-5);
  absl::StatusOr<Tensor> no_bias = GeluLinear((*hp)[0], (*hp)[1], w2);
  ASSERT_TRUE(no_bias.ok()) << no_bias.status();
  ExpectNear(*no_bias, LinearRef((*hp)[0], w2, Tensor()), 1e-5);
  absl::StatusOr<Tensor> res = LinearResidual(x, w, b, r);
  ASSERT_TRUE(res.ok()) << res.status();
  ExpectNear(*res, LinearRef(x, w, b, r), 1e-5);
  absl::StatusOr<Tensor> res_no_bias = LinearResidual(x, w, Tensor(), r);
  ASSERT_TRUE(res_no_bias.ok()) << res_no_bias.status();
  ExpectNear(*res_no_bias, LinearRef(x, w, Tensor(), r), 1e-5);
}

// NOTE [GEMM epilogues]: under a bf16 weight the outputs a bf16 GEMM takes are stored bf16, each
// the fp32 value rounded once.
TEST(FusedLinearTest, Bf16WeightsStoreTheGemmInputsBf16) {
  const Tensor x = Random({3, 4}, 1), w = Bf16(Random({5, 4}, 2)), b = Bf16(Random({5}, 3));
  absl::StatusOr<Tensor> y = LinearForGemm(x, w, b);
  ASSERT_TRUE(y.ok()) << y.status();
  absl::StatusOr<Tensor> fp32 = Linear(x, w, b);
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  ExpectSameBits(*y, Bf16(*fp32), "LinearForGemm's bf16 output");
  absl::StatusOr<std::vector<Tensor>> hp = LinearGelu(x, w, b);
  ASSERT_TRUE(hp.ok()) << hp.status();
  ExpectSameBits((*hp)[1], Bf16(*fp32), "pre");
  EXPECT_EQ((*hp)[0].dtype(), DType::kBFloat16);
}

TEST(FusedLinearTest, GradientsPassTheCheck) {
  ExpectGradientsPass(
      [](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor y, LinearForGemm(in[0], in[1], in[2]));
        return std::vector<Tensor>{y};
      },
      {Random({2, 3, 4}, 1), Random({5, 4}, 2), Random({5}, 3)}, {"x", "w", "b"});
  // Both outputs weighted: pre's gradient plus GELU' times h's (the "LinearGelu.h" node).
  ExpectGradientsPass([](const std::vector<Tensor>& in) { return LinearGelu(in[0], in[1], in[2]); },
                      {Random({2, 3, 4}, 4), Random({5, 4}, 5), Random({5}, 6)}, {"x", "w", "b"});
  // LinearGelu into GeluLinear, h also used directly: dL/dpre sums GeluLinear's gradient and h's.
  ExpectGradientsPass(
      [](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(const std::vector<Tensor> hp, LinearGelu(in[0], in[1], in[2]));
        ASSIGN_OR_RETURN(Tensor y, GeluLinear(hp[0], hp[1], in[3], in[4], in[5]));
        return std::vector<Tensor>{y, hp[0]};
      },
      {Random({2, 3, 4}, 7), Random({6, 4}, 8), Random({6}, 9), Random({3, 6}, 10), Random({3}, 11),
       Random({2, 3, 3}, 12)},
      {"x", "fc w", "fc b", "proj w", "proj b", "residual"});
  // h from F::Gelu of a plain input: GeluLinear's gradient reaches pre alone.
  ExpectGradientsPass(
      [](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor y, GeluLinear(Gelu(in[0]), in[0], in[1]));
        return std::vector<Tensor>{y};
      },
      {Random({4, 6}, 13), Random({3, 6}, 14)}, {"pre", "w"});
  ExpectGradientsPass(
      [](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor y, LinearResidual(in[0], in[1], in[2], in[3]));
        return std::vector<Tensor>{y};
      },
      {Random({2, 3, 4}, 15), Random({5, 4}, 16), Random({5}, 17), Random({2, 3, 5}, 18)},
      {"x", "w", "b", "residual"});
}

// Weights that are parameters get their gradients added into Parameter::grad (beta 1); the fused
// ops give F::Linear's bits for the shared Linear steps.
TEST(FusedLinearTest, ParameterGradientsAccumulateAsFLinearsDo) {
  const Tensor x = Random({5, 6}, 1), g = Random({5, 4}, 2), prior = Random({4, 6}, 3);
  const Tensor r = Random({5, 4}, 4);
  core::ParameterPtr w1 = core::Parameter::Make(Random({4, 6}, 5));
  core::ParameterPtr b1 = core::Parameter::Make(Random({4}, 6));
  core::ParameterPtr w2 = core::Parameter::Make(w1->data), b2 = core::Parameter::Make(b1->data);
  w1->grad = prior.Clone(core::MemoryTag::kGrad);
  w2->grad = prior.Clone(core::MemoryTag::kGrad);
  const Tensor x1 = core::Leaf(x), x2 = core::Leaf(x);
  absl::StatusOr<Tensor> y1 = LinearResidual(x1, w1, b1, r);
  absl::StatusOr<Tensor> y2 = Add(Linear(x2, w2, b2), r);
  ASSERT_TRUE(y1.ok() && y2.ok());
  ASSERT_TRUE(core::Backward({*y1}, {g}).ok());
  ASSERT_TRUE(core::Backward({*y2}, {g}).ok());
  ExpectSameBits(core::LeafGrad(x1), core::LeafGrad(x2), "input gradient");
  ExpectSameBits(w1->grad, w2->grad, "accumulated weight gradient");
  ExpectSameBits(b1->grad, b2->grad, "bias gradient");
}

TEST(FusedNormTest, ValuesAndPassThrough) {
  const Tensor x = Random({3, 8}, 1), a = Random({3, 8}, 2);
  const Tensor w = Random({8}, 3), b = Random({8}, 4);
  absl::StatusOr<Tensor> want = LayerNorm(x, w, b);
  ASSERT_TRUE(want.ok()) << want.status();
  absl::StatusOr<std::vector<Tensor>> got = ResidualLayerNorm(x, w, b);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE((*got)[0].SharesStorage(x));
  EXPECT_EQ((*got)[0].shape(), x.shape());
  ExpectSameBits((*got)[1], *want, "normed");

  absl::StatusOr<Tensor> sum = Add(x, a);
  ASSERT_TRUE(sum.ok()) << sum.status();
  absl::StatusOr<Tensor> want2 = LayerNorm(*sum, w, b);
  ASSERT_TRUE(want2.ok()) << want2.status();
  absl::StatusOr<std::vector<Tensor>> got2 = AddLayerNorm(x, a, w, b);
  ASSERT_TRUE(got2.ok()) << got2.status();
  ExpectSameBits((*got2)[0], *sum, "sum");
  ExpectSameBits((*got2)[1], *want2, "normed");
}

// LayerNorm::ForwardForGemm: normed is stored bf16 under a bf16 weight (unless asked not to), the
// fp32 LayerNorm rounded once.
TEST(FusedNormTest, Bf16WeightsStoreNormedBf16ForAGemm) {
  const Tensor x = Random({3, 8}, 1), w = Bf16(Random({8}, 3)), b = Bf16(Random({8}, 4));
  absl::StatusOr<Tensor> fp32 = LayerNorm(x, w, b);
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  absl::StatusOr<std::vector<Tensor>> got = ResidualLayerNorm(x, w, b);
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSameBits((*got)[1], Bf16(*fp32), "normed for a GEMM");
  FusedNormOptions plain;
  plain.normed_for_gemm = false;
  got = ResidualLayerNorm(x, w, b, plain);
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSameBits((*got)[1], *fp32, "normed, fp32");
}

TEST(FusedNormTest, GradientsPassTheCheck) {
  const std::vector<std::string> names = {"x", "w", "b"};
  ExpectGradientsPass(
      [](const std::vector<Tensor>& in) { return ResidualLayerNorm(in[0], in[1], in[2]); },
      {Random({2, 3, 8}, 1), Random({8}, 2), Random({8}, 3)}, names);
  // x_out unused: its gradient counts as zeros.
  ExpectGradientsPass(
      [](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(const std::vector<Tensor> out, ResidualLayerNorm(in[0], in[1], in[2]));
        return std::vector<Tensor>{out[1]};
      },
      {Random({4, 6}, 4), Random({6}, 5), Random({6}, 6)}, names);
  ExpectGradientsPass(
      [](const std::vector<Tensor>& in) { return AddLayerNorm(in[0], in[1], in[2], in[3]); },
      {Random({2, 3, 8}, 7), Random({2, 3, 8}, 8), Random({8}, 9), Random({8}, 10)},
      {"a", "b", "w", "bias"});
}

// The gradient of x is LN'(g_normed) + g_x_out from one pass: what LayerNorm::BackwardAdd gives,
// bit for bit, and its parameter gradients.
TEST(FusedNormTest, BackwardMatchesTheLayersFusedBackward) {
  nn::LayerNorm ln(8);
  gradcheck::RandomizeParameters(ln, 3, 0.0f, 1.0f);
  const Tensor x = Random({3, 8}, 1), a = Random({3, 8}, 2);
  const Tensor g = Random({3, 8}, 4), g_stream = Random({3, 8}, 5);
  for (bool add : {false, true}) {
    SCOPED_TRACE(add ? "AddLayerNorm" : "ResidualLayerNorm");
    ln.ZeroGrad(true);
    Tensor sum;
    absl::StatusOr<Tensor> want_y = add ? ln.ForwardAdd(x, a, &sum) : ln.ForwardForGemm(x);
    ASSERT_TRUE(want_y.ok()) << want_y.status();
    absl::StatusOr<Tensor> want_gx = ln.BackwardAdd(g, g_stream);
    ASSERT_TRUE(want_gx.ok()) << want_gx.status();
    core::ParameterPtr w = core::Parameter::Make(ln.weight()->data);
    core::ParameterPtr b = core::Parameter::Make(ln.bias()->data);
    const Tensor xl = core::Leaf(x), al = core::Leaf(a);
    absl::StatusOr<std::vector<Tensor>> out =
        add ? AddLayerNorm(xl, al, w, b) : ResidualLayerNorm(xl, w, b);
    ASSERT_TRUE(out.ok()) << out.status();
    ExpectSameBits((*out)[1], *want_y, "normed");
    ASSERT_TRUE(core::Backward(*out, {g_stream, g}).ok());
    ExpectSameBits(core::LeafGrad(xl), *want_gx, "gradient of x");
    if (add) ExpectSameBits(core::LeafGrad(al), *want_gx, "gradient of a");
    ExpectSameBits(w->grad, ln.weight()->grad, "weight gradient");
    ExpectSameBits(b->grad, ln.bias()->grad, "bias gradient");
  }
}

// y[b, t, h*hd + d] = sum_{s <= t} softmax_s(q_t . k_s / sqrt(hd)) v_s[d], in double.
std::vector<double> AttentionRef(const Tensor& qkv, int64_t H) {
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, hd = C / H;
  const float* p = qkv.data<float>();
  std::vector<double> y(B * T * C, 0.0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> s(t + 1);
        double max = -1e300, z = 0;
        for (int64_t j = 0; j <= t; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < hd; ++d) {
            dot += double{p[(b * T + t) * 3 * C + h * hd + d]} *
                   p[(b * T + j) * 3 * C + C + h * hd + d];
          }
          s[j] = dot / std::sqrt(static_cast<double>(hd));
          max = std::max(max, s[j]);
        }
        for (double& v : s) z += (v = std::exp(v - max));
        for (int64_t j = 0; j <= t; ++j) {
          for (int64_t d = 0; d < hd; ++d) {
            y[(b * T + t) * C + h * hd + d] +=
                s[j] / z * p[(b * T + j) * 3 * C + 2 * C + h * hd + d];
          }
        }
      }
    }
  }
  return y;
}

TEST(FusedAttentionCoreTest, MatchesADoubleReferenceAndPassesTheGradientCheck) {
  const Tensor qkv = Random({2, 5, 12}, 1);
  absl::StatusOr<Tensor> y = CausalSelfAttentionCore(qkv, 2);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->shape(), (core::Shape{2, 5, 4}));
  ExpectNear(*y, AttentionRef(qkv, 2), 1e-5);
  ExpectGradientsPass(
      [](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor out, CausalSelfAttentionCore(in[0], 2));
        return std::vector<Tensor>{out};
      },
      {Random({2, 5, 12}, 2)}, {"qkv"});
}

// The core's caches live in the record: a retained graph runs its backward again (the same
// gradient, so a leaf's doubles exactly), and the record frees them after the last run.
TEST(FusedAttentionCoreTest, ARetainedGraphRunsTwice) {
  const Tensor qkv = core::Leaf(Random({1, 4, 6}, 1)), g = Random({1, 4, 2}, 2);
  absl::StatusOr<Tensor> y = CausalSelfAttentionCore(qkv, 1);
  ASSERT_TRUE(y.ok()) << y.status();
  core::BackwardOptions keep;
  keep.retain_graph = true;
  ASSERT_TRUE(core::Backward({*y}, {g}, keep).ok());
  const std::vector<float> once = core::LeafGrad(qkv).ToVector();
  ASSERT_TRUE(core::Backward({*y}, {g}).ok());
  const std::vector<float> twice = core::LeafGrad(qkv).ToVector();
  for (size_t i = 0; i < once.size(); ++i) EXPECT_EQ(twice[i], 2 * once[i]) << i;
  EXPECT_EQ(core::Backward({*y}, {g}).code(), absl::StatusCode::kFailedPrecondition);
}

// No rows give empty outputs and gradients (zero parameter gradients); one position gives attention
// that is v itself.
TEST(FusedOpsTest, EmptyAndSizeOneShapes) {
  core::ParameterPtr w = core::Parameter::Make(Random({3, 4}, 1));
  core::ParameterPtr b = core::Parameter::Make(Random({3}, 2));
  const Tensor x = core::Leaf(Tensor::Zeros({0, 4}));
  absl::StatusOr<std::vector<Tensor>> hp = LinearGelu(x, w, b);
  ASSERT_TRUE(hp.ok()) << hp.status();
  EXPECT_EQ((*hp)[0].shape(), (core::Shape{0, 3}));
  absl::StatusOr<Tensor> y = GeluLinear((*hp)[0], (*hp)[1], Random({2, 3}, 3));
  ASSERT_TRUE(y.ok()) << y.status();
  ASSERT_TRUE(core::Backward({*y}, {Tensor::Zeros({0, 2})}).ok());
  EXPECT_EQ(core::LeafGrad(x).shape(), (core::Shape{0, 4}));
  EXPECT_THAT(w->grad.ToVector(), ::testing::Each(0.0f));
  EXPECT_THAT(b->grad.ToVector(), ::testing::Each(0.0f));
  absl::StatusOr<std::vector<Tensor>> n =
      ResidualLayerNorm(Tensor::Zeros({0, 8}), Random({8}, 4), Random({8}, 5));
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ((*n)[1].shape(), (core::Shape{0, 8}));

  const Tensor qkv = Random({2, 1, 6}, 6);
  absl::StatusOr<Tensor> one = CausalSelfAttentionCore(qkv, 2);
  ASSERT_TRUE(one.ok()) << one.status();
  const std::vector<float> got = one->ToVector(), all = qkv.ToVector();
  for (int64_t r = 0; r < 2; ++r) {
    for (int64_t d = 0; d < 2; ++d) EXPECT_FLOAT_EQ(got[r * 2 + d], all[r * 6 + 4 + d]);
  }
}

TEST(FusedOpsTest, NoGradScopeRecordsNothing) {
  core::NoGradScope no_grad;
  const Tensor x = core::Leaf(Random({2, 4}, 1)), w = core::Leaf(Random({3, 4}, 2));
  const Tensor b = core::Leaf(Random({3}, 3)), r = core::Leaf(Random({2, 3}, 4));
  const Tensor nw = core::Leaf(Random({4}, 5)), nb = core::Leaf(Random({4}, 6));
  absl::StatusOr<std::vector<Tensor>> hp = LinearGelu(x, w, b);
  ASSERT_TRUE(hp.ok()) << hp.status();
  absl::StatusOr<std::vector<Tensor>> n1 = ResidualLayerNorm(x, nw, nb);
  absl::StatusOr<std::vector<Tensor>> n2 = AddLayerNorm(x, x, nw, nb);
  ASSERT_TRUE(n1.ok() && n2.ok());
  std::vector<Tensor> outs = {(*hp)[0],
                              (*hp)[1],
                              (*n1)[0],
                              (*n1)[1],
                              (*n2)[0],
                              (*n2)[1],
                              *LinearForGemm(x, w, b),
                              *LinearResidual(x, w, b, r),
                              *GeluLinear(x, x, Random({3, 4}, 7), b, r),
                              *CausalSelfAttentionCore(Random({1, 2, 6}, 8), 1)};
  for (const Tensor& t : outs) EXPECT_FALSE(core::RequiresGrad(t)) << t.ToString();
}

TEST(FusedOpsTest, BadArgumentsAreInvalidArgumentNamingThem) {
  const Tensor x = Tensor::Zeros({2, 4}), w = Tensor::Zeros({3, 4}), b = Tensor::Zeros({3});
  const Tensor r = Tensor::Zeros({2, 3}), nw = Tensor::Zeros({4}), nb = Tensor::Zeros({4});
  ExpectInvalid(LinearForGemm(Tensor::Zeros({2, 5}), w).status(), "LinearForGemm: input");
  ExpectInvalid(LinearForGemm(x, Tensor::Zeros({12})).status(),
                "LinearForGemm: weight must be 2-D");
  ExpectInvalid(LinearForGemm(Tensor::Zeros({2, 4}, DType::kBFloat16), w).status(),
                "bfloat16 only with a bfloat16 weight");
  ExpectInvalid(LinearGelu(x, w, core::Tensor()).status(), "LinearGelu: bias is undefined");
  ExpectInvalid(LinearGelu(x, w, Tensor::Zeros({4})).status(), "LinearGelu: bias must be [3]");
  ExpectInvalid(GeluLinear(x, Tensor::Zeros({2, 5}), w).status(), "GeluLinear: pre must be like h");
  ExpectInvalid(GeluLinear(x, x, w, b, Tensor::Zeros({2, 4})).status(),
                "GeluLinear: residual must be float32 [2, 3]");
  ExpectInvalid(GeluLinear(core::Leaf(x), x, w).status(), "requires gradients but pre does not");
  ExpectInvalid(LinearResidual(x, w, b, Tensor()).status(),
                "LinearResidual: residual is undefined");
  ExpectInvalid(LinearResidual(x, w, b, Tensor::Zeros({2, 3}, DType::kBFloat16)).status(),
                "LinearResidual: residual must be float32");
  ExpectInvalid(ResidualLayerNorm(x, Tensor::Zeros({5}), nb).status(),
                "ResidualLayerNorm: weight must be [4]");
  ExpectInvalid(ResidualLayerNorm(x, nw, Bf16(nb)).status(), "ResidualLayerNorm: bias must be");
  ExpectInvalid(
      ResidualLayerNorm(Tensor::Zeros({2, 0}), Tensor::Zeros({0}), Tensor::Zeros({0})).status(),
      "ResidualLayerNorm: input must be at least 1-D");
  FusedNormOptions bad_eps;
  bad_eps.eps = -1.0f;
  ExpectInvalid(ResidualLayerNorm(x, nw, nb, bad_eps).status(), "ResidualLayerNorm: eps");
  ExpectInvalid(AddLayerNorm(x, Tensor::Zeros({4, 2}), nw, nb).status(),
                "AddLayerNorm: b must be like a");
  ExpectInvalid(AddLayerNorm(x, Bf16(x), nw, nb).status(), "AddLayerNorm: b must be float32");
  ExpectInvalid(CausalSelfAttentionCore(Tensor::Zeros({2, 3, 8}), 2).status(),
                "CausalSelfAttentionCore: qkv must be [B, T, 3C]");
  ExpectInvalid(CausalSelfAttentionCore(Tensor::Zeros({2, 3, 12}), 3).status(),
                "CausalSelfAttentionCore: n_head (3)");
  ExpectInvalid(CausalSelfAttentionCore(Tensor::Zeros({2, 3, 12}, DType::kInt32), 1).status(),
                "CausalSelfAttentionCore: qkv must be float32 or bfloat16");
  const absl::StatusOr<Tensor> earlier = absl::InternalError("Earlier: failed");
  EXPECT_EQ(LinearGelu(earlier, w, b).status(), earlier.status());
  EXPECT_EQ(GeluLinear(x, x, w, b, earlier).status(), earlier.status());
  EXPECT_EQ(ResidualLayerNorm(x, earlier, nb).status(), earlier.status());
  EXPECT_EQ(CausalSelfAttentionCore(earlier, 1).status(), earlier.status());
}

}  // namespace
}  // namespace functional
}  // namespace nn
