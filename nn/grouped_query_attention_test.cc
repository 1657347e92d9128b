#include "nn/grouped_query_attention.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "core/op_profile.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/tensor_ops.h"
#include "nn/testing/fused_layers.h"
#include "nn/testing/gradcheck.h"
#include "nn/to_device.h"

namespace nn {
namespace {

using ::testing::HasSubstr;

// ||a - b||_2 / ||b||_2.
double RelErr(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, w = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    w += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(d / w);
}

// Rows of x [rows, in] times W^T (W [out, in] row-major), in double.
std::vector<double> Project(const std::vector<double>& x, const std::vector<float>& w, int64_t in,
                            int64_t out) {
  const int64_t rows = static_cast<int64_t>(x.size()) / in;
  std::vector<double> y(rows * out, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t i = 0; i < in; ++i) y[r * out + o] += x[r * in + i] * w[o * in + i];
    }
  }
  return y;
}

// The layer's definition written out in double: projections, the rotary embedding
// (rotate_half), per query head h the causal softmax attention over kv head
// h / (H / KV), the output projection.
std::vector<double> Reference(GroupedQueryAttention& m, const core::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), C = m.hidden(), H = m.n_head(), KV = m.n_kv_head(),
                D = C / H, half = D / 2;
  const std::vector<float> xf = x.ToVector();
  const std::vector<double> xd(xf.begin(), xf.end());
  std::vector<double> q = Project(xd, m.q_proj()->weight()->data.ToVector(), C, H * D);
  std::vector<double> k = Project(xd, m.k_proj()->weight()->data.ToVector(), C, KV * D);
  const std::vector<double> v = Project(xd, m.v_proj()->weight()->data.ToVector(), C, KV * D);
  auto rope = [&](std::vector<double>& t, int64_t heads) {
    const std::vector<double> in = t;
    for (int64_t r = 0; r < B * T; ++r) {
      for (int64_t h = 0; h < heads; ++h) {
        const double* head = &in[(r * heads + h) * D];
        for (int64_t j = 0; j < D; ++j) {
          const double angle = (r % T) / std::pow(m.rope_theta(), 2.0 * (j % half) / D);
          const double rotated = j < half ? -head[j + half] : head[j - half];
          t[(r * heads + h) * D + j] = head[j] * std::cos(angle) + rotated * std::sin(angle);
        }
      }
    }
  };
  rope(q, H);
  rope(k, KV);
  std::vector<double> y(B * T * C, 0.0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / KV);
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> p(t + 1);
        double max = -INFINITY, sum = 0.0;
        for (int64_t s = 0; s <= t; ++s) {
          double dot = 0.0;
          for (int64_t j = 0; j < D; ++j) {
            dot += q[((b * T + t) * H + h) * D + j] * k[((b * T + s) * KV + g) * D + j];
          }
          p[s] = dot / std::sqrt(static_cast<double>(D));
          max = std::max(max, p[s]);
        }
        for (double& e : p) sum += (e = std::exp(e - max));
        for (int64_t s = 0; s <= t; ++s) {
          for (int64_t j = 0; j < D; ++j) {
            y[(b * T + t) * C + h * D + j] += p[s] / sum * v[((b * T + s) * KV + g) * D + j];
          }
        }
      }
    }
  }
  return Project(y, m.o_proj()->weight()->data.ToVector(), C, C);
}

TEST(GroupedQueryAttentionTest, ProjectionsHaveHuggingFacesNamesAndShapesWithoutBiases) {
  GroupedQueryAttention attn(/*hidden=*/16, /*n_head=*/4, /*n_kv_head=*/2);
  std::vector<std::string> names;
  for (const auto& [name, p] : attn.NamedParameters()) {
    names.push_back(name);
    EXPECT_EQ(p->data.dim(), 2) << name;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"q_proj.weight", "k_proj.weight", "v_proj.weight",
                                             "o_proj.weight"}));
  EXPECT_EQ(attn.k_proj()->weight()->data.shape(), (core::Shape{8, 16}));  // 2 heads of 4
  EXPECT_EQ(attn.o_proj()->weight()->data.shape(), (core::Shape{16, 16}));
}

// n_kv_head == n_head is multi-head attention (with the rotary embedding); fewer kv heads
// share each one among a group of query heads. Both against the definition in double.
TEST(GroupedQueryAttentionTest, ForwardMatchesTheDefinitionForMultiHeadAndGroupedHeads) {
  struct Case {
    int64_t H, KV;
    double theta;
  };
  for (const Case& c : {Case{3, 3, 10000.0}, Case{4, 2, 10000.0}, Case{4, 1, 100.0}}) {
    SCOPED_TRACE(testing::Message() << c.H << " heads, " << c.KV << " kv heads");
    GroupedQueryAttention attn(c.H * 4, c.H, c.KV, c.theta, 5);
    gradcheck::RandomizeParameters(attn, 6, 0.0f, 0.4f);
    const core::Tensor x = gradcheck::RandomTensor({2, 7, c.H * 4}, 7);
    absl::StatusOr<core::Tensor> y = attn.Forward(x);
    ASSERT_TRUE(y.ok()) << y.status();
    const std::vector<double> want = Reference(attn, x);
    const std::vector<float> got = y->ToVector();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5) << i;
  }
}

// NOTE [Grouped-query attention]: a layer with 2 kv heads for 4 query heads computes what a
// 4-kv-head layer computes when each kv head's projection rows are repeated for its group:
// the same output and input gradient (to fp32 rounding of the GEMMs), the same q and o
// weight gradients, and each kv head's weight gradient the sum of its group's.
TEST(GroupedQueryAttentionTest, EqualsMultiHeadAttentionWithRepeatedKvWeights) {
  const int64_t H = 4, KV = 2, D = 4, C = H * D;
  GroupedQueryAttention gqa(C, H, KV, 10000.0, 1), mha(C, H, H, 10000.0, 2);
  gradcheck::RandomizeParameters(gqa, 3, 0.0f, 0.4f);
  ASSERT_TRUE(mha.q_proj()->weight()->data.CopyFrom(gqa.q_proj()->weight()->data).ok());
  ASSERT_TRUE(mha.o_proj()->weight()->data.CopyFrom(gqa.o_proj()->weight()->data).ok());
  for (auto [from, to] :
       {std::make_pair(gqa.k_proj(), mha.k_proj()), std::make_pair(gqa.v_proj(), mha.v_proj())}) {
    const std::vector<float> w = from->weight()->data.ToVector();  // [KV * D, C]
    std::vector<float> repeated;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / KV);
      repeated.insert(repeated.end(), w.begin() + g * D * C, w.begin() + (g + 1) * D * C);
    }
    ASSERT_TRUE(
        to->weight()->data.CopyFrom(core::Tensor::FromVector(repeated, {H * D, C}).value()).ok());
  }
  const core::Tensor x = gradcheck::RandomTensor({2, 6, C}, 4),
                     g = gradcheck::RandomTensor({2, 6, C}, 5);
  std::vector<std::vector<float>> out;
  for (GroupedQueryAttention* m : {&gqa, &mha}) {
    absl::StatusOr<core::Tensor> y = m->Forward(x);
    ASSERT_TRUE(y.ok()) << y.status();
    absl::StatusOr<core::Tensor> gx = m->Backward(g);
    ASSERT_TRUE(gx.ok()) << gx.status();
    out.push_back(y->ToVector());
    out.push_back(gx->ToVector());
    out.push_back(m->q_proj()->weight()->grad.ToVector());
    out.push_back(m->o_proj()->weight()->grad.ToVector());
  }
  for (int i = 0; i < 4; ++i) EXPECT_LE(RelErr(out[i], out[4 + i]), 1e-6) << i;
  for (auto [grouped, expanded] :
       {std::make_pair(gqa.k_proj(), mha.k_proj()), std::make_pair(gqa.v_proj(), mha.v_proj())}) {
    const std::vector<float> ge = expanded->weight()->grad.ToVector();
    std::vector<float> summed(KV * D * C, 0.0f);
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < D * C; ++i) summed[(h / (H / KV)) * D * C + i] += ge[h * D * C + i];
    }
    EXPECT_LE(RelErr(grouped->weight()->grad.ToVector(), summed), 1e-6);
  }
}

TEST(GroupedQueryAttentionTest, OutputAtTDependsOnlyOnInputsUpToT) {
  GroupedQueryAttention attn(16, 4, 2, 10000.0, 3);
  gradcheck::RandomizeParameters(attn, 4, 0.0f, 0.5f);
  const int64_t B = 2, T = 6, C = 16, t0 = 3;
  core::Tensor x = gradcheck::RandomTensor({B, T, C}, 5);
  const std::vector<float> before = attn.Forward(x).value().ToVector();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = (b * T + t0 + 1) * C; i < (b + 1) * T * C; ++i) x.data<float>()[i] += 1.5f;
  }
  const std::vector<float> after = attn.Forward(x).value().ToVector();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      bool same = true;
      for (int64_t c = 0; c < C; ++c)
        same &= after[(b * T + t) * C + c] == before[(b * T + t) * C + c];
      EXPECT_EQ(same, t <= t0) << "b=" << b << " t=" << t;
    }
  }
}

// Layers sharing one set of rotary tables (as Llama's do): a longer sequence in one layer
// grows them in place, and another layer's pending backward (shorter T) still gives the
// bits of a layer with tables of its own.
TEST(GroupedQueryAttentionTest, SharedRotaryTablesGrowAndServeEveryLayer) {
  GroupedQueryAttention a(16, 4, 2, 10000.0, 1), b(16, 4, 2, 10000.0, 2),
      alone(16, 4, 2, 10000.0, 1);
  b.set_rotary_tables(a.rotary_tables());
  const core::Tensor x = gradcheck::RandomTensor({2, 3, 16}, 3),
                     g = gradcheck::RandomTensor({2, 3, 16}, 4);
  std::vector<std::vector<float>> out;
  for (GroupedQueryAttention* m : {&a, &alone}) {
    absl::StatusOr<core::Tensor> y = m->Forward(x);
    ASSERT_TRUE(y.ok()) << y.status();
    if (m == &a) {
      ASSERT_TRUE(b.Forward(gradcheck::RandomTensor({1, 7, 16}, 5)).ok());
      EXPECT_EQ(a.rotary_tables()->positions(), 7);
    }
    absl::StatusOr<core::Tensor> gx = m->Backward(g);
    ASSERT_TRUE(gx.ok()) << gx.status();
    out.push_back(y->ToVector());
    out.push_back(gx->ToVector());
    out.push_back(m->q_proj()->weight()->grad.ToVector());
  }
  for (int i = 0; i < 3; ++i) EXPECT_EQ(out[i], out[3 + i]) << i;
  EXPECT_EQ(alone.rotary_tables()->positions(), 3);
}

TEST(GroupedQueryAttentionTest, BackwardMatchesFiniteDifferences) {
  for (auto [H, KV] : {std::make_pair(4, 2), std::make_pair(2, 2), std::make_pair(2, 1)}) {
    SCOPED_TRACE(testing::Message() << H << " heads, " << KV << " kv heads");
    GroupedQueryAttention attn(H * 4, H, KV, 10000.0, 8);
    gradcheck::RandomizeParameters(attn, 9, 0.0f, 0.5f);
    absl::StatusOr<gradcheck::Report> r =
        gradcheck::CheckModule(attn, gradcheck::RandomTensor({2, 5, H * 4}, 10), {});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->ok()) << r->ToString();
    EXPECT_EQ(r->num_checked, 2 * 5 * H * 4 + attn.NumParameterElements());
    EXPECT_GT(r->max_abs_numeric, 0.5);
  }
}

// NOTE [Fused attention] on the CPU through the grouped heads: at head width 64 with bf16
// weights the layer takes the fused path, which agrees with the unfused bf16 path within 4
// bf16 unit roundoffs normwise, as CausalSelfAttention's does.
TEST(GroupedQueryAttentionTest, FusedBf16PathMatchesTheUnfusedOne) {
  constexpr double kBf16Unit = 1.0 / 256;
  const int64_t H = 4, KV = 2, C = H * 64, B = 2, T = 70;
  GroupedQueryAttention fused(C, H, KV, 10000.0, 11), unfused(C, H, KV, 10000.0, 11);
  unfused.set_fused(false);
  for (GroupedQueryAttention* m : {&fused, &unfused}) {
    ASSERT_TRUE(ConvertParameters(*m, core::DType::kBFloat16).ok());
  }
  const core::Tensor x = gradcheck::RandomTensor({B, T, C}, 12);
  const core::Tensor g = gradcheck::RandomTensor({B, T, C}, 13);
  core::OpProfile profile;
  std::vector<std::vector<float>> out;
  for (GroupedQueryAttention* m : {&fused, &unfused}) {
    core::ScopedOpProfile on(m == &fused ? &profile : nullptr);
    absl::StatusOr<core::Tensor> y = m->Forward(x);
    ASSERT_TRUE(y.ok()) << y.status();
    absl::StatusOr<core::Tensor> dx = m->Backward(g);
    ASSERT_TRUE(dx.ok()) << dx.status();
    out.push_back(y->ToVector());
    out.push_back(dx->ToVector());
    out.push_back(m->k_proj()->weight()->grad.ToVector());
  }
  for (int i = 0; i < 3; ++i) EXPECT_LE(RelErr(out[i], out[3 + i]), 4 * kBf16Unit) << i;
  int fused_ops = 0;
  for (const core::OpRecord& r : profile.records()) {
    fused_ops += absl::StartsWith(r.name, "fused_attention");
  }
  EXPECT_EQ(fused_ops, 2);
}

// NOTE [bf16 GEMMs] (nn/linear.h): with bf16 weights and no hooks on the projections, x is
// rounded once for q, k and v, and the three keep that one copy for their weight
// gradients; a hook on one of them makes each round x and keep its own copy. Both give the
// same bits (output, input gradient, every parameter gradient); the shared path runs two
// conversions fewer in the forward and holds exactly two bf16 copies of x fewer after it.
TEST(GroupedQueryAttentionTest, TheProjectionsShareOneBf16CopyOfTheirInput) {
  const int64_t H = 4, KV = 2, C = H * 64, B = 2, T = 9;
  GroupedQueryAttention m(C, H, KV, 10000.0, 21);
  ASSERT_TRUE(ConvertParameters(m, core::DType::kBFloat16).ok());
  const core::Tensor x = gradcheck::RandomTensor({B, T, C}, 22);
  const core::Tensor gy = gradcheck::RandomTensor({B, T, C}, 23);
  const fused_layers::HookComparison c =
      fused_layers::ExpectSameBitsWithHookOn(m, *m.k_proj(), x, gy);
  EXPECT_EQ(c.plain_cost.converts, 1);   // x once (the packed q, k, v are stored bf16)
  EXPECT_EQ(c.hooked_cost.converts, 3);  // x by each projection
  const int64_t held_more =
      c.hooked_cost.held_activation_bytes - c.plain_cost.held_activation_bytes;
  EXPECT_EQ(held_more, 2 * B * T * C * 2);
}

// NOTE [GEMM epilogues]: with bf16 weights the rotary packing stores q, k, v bf16 for the
// attention's GEMMs, and its backward stores each projection's gradient bf16 for that
// projection's GEMMs, each the fp32 value rounded once as the projection would round it. A
// hook on a projection makes the backward write its gradient fp32, rounded by the
// projection: the same bits, one conversion more in the backward, whose only conversion is
// otherwise o_proj's grad_output. (The forward's packed q, k, v never pass a hook: bf16
// whenever q_proj's weight is.)
TEST(GroupedQueryAttentionTest, TheProjectionsGradientsReachThemInBf16) {
  const int64_t H = 4, KV = 2, C = H * 64, B = 2, T = 9;
  GroupedQueryAttention m(C, H, KV, 10000.0, 41);
  ASSERT_TRUE(ConvertParameters(m, core::DType::kBFloat16).ok());
  const core::Tensor x = gradcheck::RandomTensor({B, T, C}, 42);
  const core::Tensor gy = gradcheck::RandomTensor({B, T, C}, 43);
  for (Linear* proj : {m.q_proj().get(), m.k_proj().get(), m.v_proj().get()}) {
    SCOPED_TRACE(proj->Path());
    const fused_layers::HookComparison c = fused_layers::ExpectSameBitsWithHookOn(m, *proj, x, gy);
    EXPECT_EQ(c.plain_cost.converts, 1);       // x
    EXPECT_EQ(c.plain_backward_converts, 1);   // o_proj's grad_output
    EXPECT_EQ(c.hooked_backward_converts, 2);  // and the hooked projection's gradient
  }
}

// With bf16 weights and no hook on o_proj, the fused kernel stores the heads' output y bf16
// for o_proj's GEMM and o_proj's backward stores the heads' gradient bf16 for the fused
// backward: two rounding passes fewer. A hook on o_proj makes y fp32, rounded by o_proj
// (the same bf16 values: the output and o_proj's weight gradient keep their bits), and the
// fused backward's row sums delta = rowsum(dy * y) then read the fp32 y: v's gradient keeps
// its bits (dV = P^T dy needs no delta), q's and k's move within a few bf16 units.
TEST(GroupedQueryAttentionTest, TheHeadsOutputReachesOProjInBf16) {
  constexpr double kBf16Unit = 1.0 / 256;
  const int64_t H = 4, KV = 2, C = H * 64, B = 2, T = 70;
  GroupedQueryAttention m(C, H, KV, 10000.0, 24);
  ASSERT_TRUE(ConvertParameters(m, core::DType::kBFloat16).ok());
  const core::Tensor x = gradcheck::RandomTensor({B, T, C}, 25);
  const core::Tensor gy = gradcheck::RandomTensor({B, T, C}, 26);
  auto converts = [&]() {
    core::OpProfile profile;
    {
      core::ScopedOpProfile on(&profile);
      absl::StatusOr<core::Tensor> y = m.Forward(x);
      EXPECT_TRUE(y.ok()) << y.status();
      if (y.ok()) {
        EXPECT_TRUE(m.Backward(gy).ok());
      }
    }
    int n = 0;
    for (const core::OpRecord& r : profile.records()) n += r.name == "convert";
    return n;
  };
  const int bf16_converts = converts();
  const auto bf16 = fused_layers::StepBits(m, x, gy);
  int calls = 0;
  core::HookHandle h = fused_layers::CountingHook(*m.o_proj(), &calls);
  const int fp32_converts = converts();
  const auto fp32 = fused_layers::StepBits(m, x, gy);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(fp32_converts - bf16_converts, 2);  // y, and the heads' gradient
  // StepBits: output, input gradient, then q, k, v, o weight gradients.
  const std::vector<std::string> names = {"output", "input gradient", "q_proj",
                                          "k_proj", "v_proj",         "o_proj"};
  ASSERT_EQ(bf16.size(), names.size());
  ASSERT_EQ(fp32.size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    const bool same_bits = names[i] == "output" || names[i] == "v_proj" || names[i] == "o_proj";
    if (same_bits) {
      EXPECT_EQ(bf16[i], fp32[i]) << names[i];
      continue;
    }
    std::vector<float> a(bf16[i].size()), b(fp32[i].size());
    std::memcpy(a.data(), bf16[i].data(), a.size() * sizeof(float));
    std::memcpy(b.data(), fp32[i].data(), b.size() * sizeof(float));
    EXPECT_LE(RelErr(a, b), 4 * kBf16Unit) << names[i];
    EXPECT_NE(bf16[i], fp32[i]) << names[i] << ": delta read the bf16 y";
  }
}

// Mixed weights (q_proj fp32, the rest bf16; e.g. q_proj left out of FSDP's mixed
// precision): q, k and v stay fp32 and the core computes in fp32, so o_proj hands it the
// heads' gradient in fp32, as with a hook on o_proj: the same bits either way.
TEST(GroupedQueryAttentionTest, AnFp32CoreTakesTheHeadsGradientInFp32UnderABf16OProj) {
  const int64_t H = 4, KV = 2, C = H * 64, B = 2, T = 9;
  GroupedQueryAttention m(C, H, KV, 10000.0, 27);
  ASSERT_TRUE(ConvertParameters(m, core::DType::kBFloat16).ok());
  ASSERT_TRUE(ConvertParameters(*m.q_proj(), core::DType::kFloat32).ok());
  const core::Tensor x = gradcheck::RandomTensor({B, T, C}, 28);
  const core::Tensor gy = gradcheck::RandomTensor({B, T, C}, 29);
  fused_layers::ExpectSameBitsWithHookOn(m, *m.o_proj(), x, gy);
}

TEST(GroupedQueryAttentionTest, BadConfigurationsNameTheArgument) {
  struct Bad {
    int64_t hidden, n_head, n_kv_head;
    double theta;
    const char* message;
  };
  for (const Bad& b :
       {Bad{0, 2, 1, 1e4, "hidden must be positive"}, Bad{16, 3, 1, 1e4, "divisible by n_head"},
        Bad{16, 4, 3, 1e4, "divisible by n_kv_head"}, Bad{12, 4, 2, 1e4, "must be even"},
        Bad{16, 4, 2, 0.0, "rope_theta"}}) {
    GroupedQueryAttention attn(b.hidden, b.n_head, b.n_kv_head, b.theta);
    absl::StatusOr<core::Tensor> y = attn.Forward(core::Tensor::Zeros({1, 2, 16}));
    EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument) << b.message;
    EXPECT_THAT(std::string(y.status().message()), HasSubstr(b.message));
  }
  GroupedQueryAttention attn(16, 4, 2);
  EXPECT_EQ(attn.Backward(core::Tensor::Zeros({1, 2, 16})).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(attn.Forward(core::Tensor::Zeros({1, 2, 8})).status().message()),
              HasSubstr("[B, T, 16]"));
}

// Inline, k's and v's input gradients each add the sum so far in the epilogue of their GEMM
// (F::RotaryQkv); a hook on k_proj or v_proj makes the layer call the projections one by one and
// the engine sum their three input gradients ("grad.add", twice): the same bits, with fp32 and
// bf16 weights.
TEST(GroupedQueryAttentionTest, TheInputGradientsAddInTheGemms) {
  const int64_t H = 4, KV = 2, C = H * 64, B = 2, T = 9;
  for (core::DType dtype : {core::DType::kFloat32, core::DType::kBFloat16}) {
    SCOPED_TRACE(core::DTypeName(dtype));
    GroupedQueryAttention m(C, H, KV, 10000.0, 21);
    ASSERT_TRUE(ConvertParameters(m, dtype).ok());
    const core::Tensor x = gradcheck::RandomTensor({B, T, C}, 22);
    const core::Tensor gy = gradcheck::RandomTensor({B, T, C}, 23);
    for (Linear* taker : {m.k_proj().get(), m.v_proj().get()}) {
      SCOPED_TRACE(taker->Path());
      const fused_layers::HookComparison c =
          fused_layers::ExpectSameBitsWithHookOn(m, *taker, x, gy);
      EXPECT_EQ(c.MoreOpsWithHook("grad.add"), 2);
    }
  }
}

}  // namespace
}  // namespace nn
