#include "nn/functional/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/op_profile.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/functional/gradcheck.h"
#include "nn/functional/internal/layer_test_util.h"

namespace nn {
namespace functional {
namespace {

using core::DType;
using core::Tensor;
using layer_test_util::ExpectInvalid;
using layer_test_util::Random;

constexpr float kInf = std::numeric_limits<float>::infinity();

struct Dims {
  int64_t B, H, Hkv, T, S, D;
};

// An fp32 or int32 mask's entry for (b, h, t, s), broadcast from its own shape.
double MaskAt(const Tensor& m, int64_t b, int64_t h, int64_t t, int64_t s) {
  const int64_t idx[4] = {b, h, t, s};
  int64_t flat = 0;
  for (int64_t i = 0; i < m.dim(); ++i) {
    const int64_t size = m.size(i);
    flat = flat * size + (size == 1 ? 0 : idx[4 - m.dim() + i]);
  }
  return m.dtype() == DType::kInt32 ? m.data<int32_t>()[flat] : m.data<float>()[flat];
}

// NOTE [Attention masks] in double: masked positions leave the softmax; a row with none left
// is 0.
std::vector<double> Reference(const Tensor& q, const Tensor& k, const Tensor& v, const Dims& d,
                              bool causal, const Tensor& mask, double scale) {
  std::vector<double> y(q.numel(), 0.0);
  const float *qp = q.data<float>(), *kp = k.data<float>(), *vp = v.data<float>();
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t h = 0; h < d.H; ++h) {
      const int64_t g = h / (d.H / d.Hkv);
      for (int64_t t = 0; t < d.T; ++t) {
        const float* qr = qp + ((b * d.H + h) * d.T + t) * d.D;
        std::vector<double> score(d.S);
        std::vector<bool> kept(d.S, true);
        double max = -std::numeric_limits<double>::infinity();
        for (int64_t s = 0; s < d.S; ++s) {
          const float* kr = kp + ((b * d.Hkv + g) * d.S + s) * d.D;
          double dot = 0;
          for (int64_t j = 0; j < d.D; ++j) dot += double{qr[j]} * kr[j];
          score[s] = scale * dot;
          if (causal && s > t) kept[s] = false;
          if (mask.defined()) {
            const double m = MaskAt(mask, b, h, t, s);
            if (mask.dtype() == DType::kInt32) {
              kept[s] = kept[s] && m != 0;
            } else {
              kept[s] = kept[s] && m > -1e30;
              score[s] += m;
            }
          }
          if (kept[s]) max = std::max(max, score[s]);
        }
        double sum = 0;
        for (int64_t s = 0; s < d.S; ++s) sum += kept[s] ? std::exp(score[s] - max) : 0.0;
        double* out = y.data() + ((b * d.H + h) * d.T + t) * d.D;
        for (int64_t s = 0; s < d.S; ++s) {
          if (!kept[s]) continue;
          const double p = std::exp(score[s] - max) / sum;
          const float* vr = vp + ((b * d.Hkv + g) * d.S + s) * d.D;
          for (int64_t j = 0; j < d.D; ++j) out[j] += p * vr[j];
        }
      }
    }
  }
  return y;
}

struct Case {
  std::string name;
  Dims d;
  bool causal = false;
  Tensor mask;
  float scale = 0.0f;  // 0: the default
};

// An fp32 mask of N(0, 1) entries with every third one -inf and every seventh at
// kMaskedScore.
Tensor AdditiveMask(const core::Shape& shape, uint64_t seed) {
  Tensor m = Random(shape, seed);
  for (int64_t i = 0; i < m.numel(); ++i) {
    if (i % 3 == 1) m.data<float>()[i] = -kInf;
    if (i % 7 == 5) m.data<float>()[i] = -1e30f;
  }
  return m;
}

// An int32 mask of 0s and 1s from `bits`, repeated.
Tensor IntMask(const core::Shape& shape, const std::vector<int32_t>& bits) {
  Tensor m = Tensor::Zeros(shape, DType::kInt32);
  for (int64_t i = 0; i < m.numel(); ++i) m.data<int32_t>()[i] = bits[i % bits.size()];
  return m;
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  cases.push_back({"plain", {2, 2, 2, 5, 5, 8}});
  cases.push_back({"causal", {2, 2, 2, 6, 6, 8}, true});
  cases.push_back({"causal T < S", {1, 2, 2, 3, 7, 4}, true});
  cases.push_back({"causal T > S", {1, 2, 2, 7, 3, 4}, true});
  cases.push_back({"grouped causal", {2, 6, 2, 5, 5, 4}, true});
  cases.push_back(
      {"multi-query, additive [T, S]", {2, 4, 1, 4, 6, 4}, false, AdditiveMask({4, 6}, 11)});
  cases.push_back(
      {"key padding fp32 [B, 1, 1, S]", {2, 2, 1, 3, 5, 4}, false, AdditiveMask({2, 1, 1, 5}, 12)});
  cases.push_back({"int32 [B, 1, T, S]",
                   {2, 2, 2, 4, 5, 4},
                   false,
                   IntMask({2, 1, 4, 5}, {1, 0, 1, 1, 0, 0, 1})});
  cases.push_back({"causal and int32 [H, T, 1]",
                   {1, 3, 3, 4, 4, 4},
                   true,
                   IntMask({3, 4, 1}, {1, 1, 0, 1, 0})});
  cases.push_back({"scale 0.3", {1, 2, 1, 3, 4, 4}, false, Tensor(), 0.3f});
  return cases;
}

AttentionOptions Options(const Case& c) {
  AttentionOptions o;
  o.causal = c.causal;
  o.mask = c.mask;
  if (c.scale != 0.0f) o.scale = c.scale;
  return o;
}

double Scale(const Case& c) { return c.scale != 0.0f ? c.scale : 1.0 / std::sqrt(c.d.D); }

TEST(AttentionTest, MatchesADoubleReference) {
  uint64_t seed = 1;
  for (const Case& c : Cases()) {
    const Dims& d = c.d;
    const Tensor q = Random({d.B, d.H, d.T, d.D}, seed++),
                 k = Random({d.B, d.Hkv, d.S, d.D}, seed++),
                 v = Random({d.B, d.Hkv, d.S, d.D}, seed++);
    absl::StatusOr<Tensor> y = ScaledDotProductAttention(q, k, v, Options(c));
    ASSERT_TRUE(y.ok()) << c.name << ": " << y.status();
    EXPECT_EQ(y->shape(), q.shape()) << c.name;
    const std::vector<double> want = Reference(q, k, v, d, c.causal, c.mask, Scale(c));
    const std::vector<float> got = y->ToVector();
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], 1e-5 * (1 + std::abs(want[i]))) << c.name << " element " << i;
    }
  }
}

// q, k and v in every mode, the mode's mask fixed (its -inf and kMaskedScore entries have
// no finite difference); then an fp32 mask's own gradient, on a mask of finite entries with
// the causal cut and an int32-style key mask folded in.
TEST(AttentionTest, GradientsPassTheCheckInEveryMode) {
  uint64_t seed = 100;
  for (const Case& c : Cases()) {
    const Dims& d = c.d;
    absl::StatusOr<gradcheck::Report> r = gradcheck::CheckGradients(
        [&c](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
          ASSIGN_OR_RETURN(Tensor y, ScaledDotProductAttention(in[0], in[1], in[2], Options(c)));
          return std::vector<Tensor>{y};
        },
        {Random({d.B, d.H, d.T, d.D}, seed), Random({d.B, d.Hkv, d.S, d.D}, seed + 1),
         Random({d.B, d.Hkv, d.S, d.D}, seed + 2)},
        {}, {}, {"q", "k", "v"});
    seed += 3;
    ASSERT_TRUE(r.ok()) << c.name << ": " << r.status();
    EXPECT_TRUE(r->ok()) << c.name << ": " << r->ToString();
    EXPECT_GT(r->max_abs_numeric, 0.1) << c.name;
  }
  for (const core::Shape& mask_shape : std::vector<core::Shape>{{2, 3, 4, 5}, {3, 1, 5}}) {
    absl::StatusOr<gradcheck::Report> r = gradcheck::CheckGradients(
        [](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
          AttentionOptions o;
          o.causal = true;
          o.mask = in[3];
          ASSIGN_OR_RETURN(Tensor y, ScaledDotProductAttention(in[0], in[1], in[2], o));
          return std::vector<Tensor>{y};
        },
        {Random({2, 3, 4, 4}, 1), Random({2, 1, 5, 4}, 2), Random({2, 1, 5, 4}, 3),
         Random(mask_shape, 4)},
        {}, {}, {"q", "k", "v", "mask"});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->ok()) << r->ToString();
  }
}

// NOTE [Attention masks]: a row with every position masked gives 0 and passes no
// gradient, whether an int32 0 or an fp32 -inf masks it.
TEST(AttentionTest, FullyMaskedRowsAreZeroWithoutNaN) {
  const Dims d{1, 2, 2, 3, 4, 4};
  Tensor fmask = Random({3, 4}, 1);
  for (int64_t s = 0; s < 4; ++s) fmask.data<float>()[1 * 4 + s] = -kInf;  // row 1
  Tensor imask = IntMask({3, 4}, {1});
  for (int64_t s = 0; s < 4; ++s) imask.data<int32_t>()[1 * 4 + s] = 0;
  for (const Tensor& mask : {fmask, imask}) {
    const Tensor q = core::Leaf(Random({d.B, d.H, d.T, d.D}, 2));
    const Tensor k = core::Leaf(Random({d.B, d.Hkv, d.S, d.D}, 3));
    const Tensor v = core::Leaf(Random({d.B, d.Hkv, d.S, d.D}, 4));
    const Tensor m = mask.dtype() == DType::kFloat32 ? core::Leaf(mask) : mask;
    AttentionOptions o;
    o.mask = m;
    absl::StatusOr<Tensor> y = ScaledDotProductAttention(q, k, v, o);
    ASSERT_TRUE(y.ok()) << y.status();
    ASSERT_TRUE(core::Backward({*y}, {Random(y->shape(), 5)}).ok());
    for (int64_t h = 0; h < d.H; ++h) {
      for (int64_t t = 0; t < d.T; ++t) {
        for (int64_t j = 0; j < d.D; ++j) {
          const int64_t i = (h * d.T + t) * d.D + j;
          EXPECT_TRUE(std::isfinite(y->data<float>()[i])) << i;
          EXPECT_TRUE(std::isfinite(core::LeafGrad(q).data<float>()[i])) << i;
          if (t == 1) {
            EXPECT_EQ(y->data<float>()[i], 0.0f) << i;
            EXPECT_EQ(core::LeafGrad(q).data<float>()[i], 0.0f) << i;
          }
        }
      }
    }
    for (float g : core::LeafGrad(k).ToVector()) EXPECT_TRUE(std::isfinite(g));
    for (float g : core::LeafGrad(v).ToVector()) EXPECT_TRUE(std::isfinite(g));
    if (mask.dtype() == DType::kFloat32) {
      const std::vector<float> gm = core::LeafGrad(m).ToVector();
      for (size_t i = 0; i < gm.size(); ++i) {
        EXPECT_TRUE(std::isfinite(gm[i])) << i;
        if (i / 4 == 1) {
          EXPECT_EQ(gm[i], 0.0f) << i;
        } else {
          EXPECT_NE(gm[i], 0.0f) << i;
        }
      }
    }
  }
}

// The names of the ops `fn` records.
template <typename Fn>
std::vector<std::string> OpsOf(Fn fn) {
  core::OpProfile profile;
  {
    core::ScopedOpProfile on(&profile);
    fn();
  }
  std::vector<std::string> names;
  for (const core::OpRecord& r : profile.records()) names.push_back(r.name);
  return names;
}

std::vector<float> Host(const Tensor& t) { return t.ToVector(); }

double RelErr(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (double{got[i]} - want[i]) * (double{got[i]} - want[i]);
    den += double{want[i]} * want[i];
  }
  return std::sqrt(num / den);
}

// An N(0, 1) tensor whose values bf16 holds exactly: the fused path's rounding of the
// inputs is then exact, and what differs is the rounding inside it.
Tensor Bf16Exact(const core::Shape& shape, uint64_t seed) {
  return Random(shape, seed)
      .ToDType(DType::kBFloat16, core::MemoryTag::kOther)
      .value()
      .ToDType(DType::kFloat32, core::MemoryTag::kOther)
      .value();
}

// NOTE [Attention paths]: where the fused kernel applies (causal, no mask, T == S, head
// width 64 or 128; on the CPU its twin runs), `fused` takes it, and it agrees with the fp32
// composition within bf16 rounding: probabilities rounded to bf16 before the value product
// and the output gradient and score gradients before theirs (unit 2^-8 each, errors that
// partly cancel in the 2-norm); measured 1.0e-3 (output) to 2.4e-3 (dk), bound 1e-2.
TEST(AttentionTest, FusedAndCompositePathsAgreeWhereBothApply) {
  const Dims d{2, 4, 2, 70, 70, 64};  // two key tiles; two query heads per kv head
  const Tensor q = Bf16Exact({d.B, d.H, d.T, d.D}, 1), k = Bf16Exact({d.B, d.Hkv, d.S, d.D}, 2),
               v = Bf16Exact({d.B, d.Hkv, d.S, d.D}, 3), g = Random({d.B, d.H, d.T, d.D}, 4);
  std::vector<std::vector<float>> results[2];
  for (bool fused : {false, true}) {
    const Tensor ql = core::Leaf(q), kl = core::Leaf(k), vl = core::Leaf(v);
    AttentionOptions o;
    o.causal = true;
    o.fused = fused;
    absl::StatusOr<Tensor> y;
    const std::vector<std::string> ops = OpsOf([&] {
      y = ScaledDotProductAttention(ql, kl, vl, o);
      ASSERT_TRUE(y.ok()) << y.status();
      ASSERT_TRUE(core::Backward({*y}, {g}).ok());
    });
    EXPECT_EQ(std::count(ops.begin(), ops.end(), "fused_attention.forward"), fused ? 1 : 0);
    EXPECT_EQ(std::count(ops.begin(), ops.end(), "fused_attention.backward"), fused ? 1 : 0);
    EXPECT_EQ(std::count(ops.begin(), ops.end(), "softmax.forward"), fused ? 0 : 1);
    results[fused] = {Host(*y), Host(core::LeafGrad(ql)), Host(core::LeafGrad(kl)),
                      Host(core::LeafGrad(vl))};
  }
  const char* names[] = {"output", "dq", "dk", "dv"};
  for (int i = 0; i < 4; ++i) {
    EXPECT_LE(RelErr(results[1][i], results[0][i]), 1e-2) << names[i];
  }
}

// Where it does not apply, `fused` changes nothing: the fp32 composition runs.
TEST(AttentionTest, FusedFallsBackToTheCompositionWhereTheKernelDoesNotApply) {
  const Tensor q = Random({1, 2, 8, 64}, 1), k = Random({1, 2, 8, 64}, 2);
  AttentionOptions o;
  o.fused = true;
  o.causal = true;
  const struct {
    const char* name;
    Tensor q, k;
    bool causal;
    Tensor mask;
  } cases[] = {
      {"head width 32", Random({1, 2, 8, 32}, 3), Random({1, 2, 8, 32}, 4), true, Tensor()},
      {"not causal", q, k, false, Tensor()},
      {"a mask", q, k, true, IntMask({8, 8}, {1})},
      {"T != S", Random({1, 2, 4, 64}, 5), k, true, Tensor()},
  };
  for (const auto& c : cases) {
    o.causal = c.causal;
    o.mask = c.mask;
    const std::vector<std::string> ops =
        OpsOf([&] { EXPECT_TRUE(ScaledDotProductAttention(c.q, c.k, c.k, o).ok()) << c.name; });
    EXPECT_EQ(std::count(ops.begin(), ops.end(), "fused_attention.forward"), 0) << c.name;
    EXPECT_EQ(std::count(ops.begin(), ops.end(), "softmax.forward"), 1) << c.name;
  }
}

TEST(AttentionTest, NoGradScopeRecordsNothing) {
  core::NoGradScope no_grad;
  const Tensor q = core::Leaf(Random({1, 2, 3, 4}, 1));
  AttentionOptions o;
  o.causal = true;
  o.mask = core::Leaf(Random({3, 3}, 2));
  absl::StatusOr<Tensor> y = ScaledDotProductAttention(q, q, q, o);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_FALSE(core::RequiresGrad(*y));
}

// Empty batches, queries or keys: outputs of q's shape (zeros without keys: every row is
// masked), gradients of the inputs' shapes.
TEST(AttentionTest, EmptySizesGiveEmptyOrZeroOutputs) {
  for (const Dims& d :
       std::vector<Dims>{{0, 2, 1, 3, 5, 4}, {1, 2, 1, 0, 5, 4}, {1, 2, 1, 3, 0, 4}}) {
    const Tensor q = core::Leaf(Random({d.B, d.H, d.T, d.D}, 1));
    const Tensor k = core::Leaf(Random({d.B, d.Hkv, d.S, d.D}, 2));
    for (bool causal : {false, true}) {
      AttentionOptions o;
      o.causal = causal;
      absl::StatusOr<Tensor> y = ScaledDotProductAttention(q, k, k, o);
      ASSERT_TRUE(y.ok()) << y.status();
      EXPECT_EQ(y->shape(), q.shape());
      for (float v : y->ToVector()) EXPECT_EQ(v, 0.0f);
      ASSERT_TRUE(core::Backward({*y}, {Tensor::Zeros(q.shape())}).ok());
      EXPECT_EQ(core::LeafGrad(q).shape(), q.shape());
    }
  }
}

TEST(AttentionTest, BadArgumentsAreInvalid) {
  const Tensor q = Tensor::Zeros({2, 4, 3, 8}), k = Tensor::Zeros({2, 2, 5, 8});
  auto sdpa = [](const Tensor& q, const Tensor& k, const Tensor& v, AttentionOptions o = {}) {
    return ScaledDotProductAttention(q, k, v, o).status();
  };
  EXPECT_TRUE(sdpa(q, k, k).ok());
  ExpectInvalid(sdpa(Tensor::Zeros({4, 3, 8}), k, k),
                "ScaledDotProductAttention: q must be 4-D [B, H, T, D], got");
  ExpectInvalid(sdpa(q, Tensor::Zeros({2, 5, 8}), k),
                "ScaledDotProductAttention: k must be 4-D [B, Hkv, S, D]");
  ExpectInvalid(sdpa(q, k, Tensor::Zeros({2, 2, 4, 8})), "k Tensor(float32, [2, 2, 5, 8]");
  ExpectInvalid(sdpa(q, k, Tensor::Zeros({2, 2, 4, 8})), "must have one shape");
  ExpectInvalid(sdpa(q, Tensor::Zeros({1, 2, 5, 8}), Tensor::Zeros({1, 2, 5, 8})),
                "must share B and D with q");
  ExpectInvalid(sdpa(q, Tensor::Zeros({2, 2, 5, 4}), Tensor::Zeros({2, 2, 5, 4})),
                "must share B and D with q");
  ExpectInvalid(sdpa(q, Tensor::Zeros({2, 3, 5, 8}), Tensor::Zeros({2, 3, 5, 8})),
                "the kv heads of k and v");
  ExpectInvalid(sdpa(Tensor::Zeros({2, 4, 3, 8}, DType::kInt32), k, k),
                "ScaledDotProductAttention: q must be float32");
  ExpectInvalid(sdpa(Tensor(), k, k), "ScaledDotProductAttention: q is undefined");
  AttentionOptions o;
  o.mask = Tensor::Zeros({3, 4});
  ExpectInvalid(sdpa(q, k, k, o),
                "mask Tensor(float32, [3, 4], cpu) does not broadcast to the scores");
  o.mask = Tensor::Zeros({1, 2, 4, 3, 5});
  ExpectInvalid(sdpa(q, k, k, o), "does not broadcast");
  o.mask = Tensor::Zeros({2, 1, 3, 5});
  EXPECT_TRUE(sdpa(q, k, k, o).ok());
  o.mask = Tensor::Zeros({3, 5}, DType::kBFloat16);
  ExpectInvalid(sdpa(q, k, k, o), "mask must be float32 or int32");
  o.mask = Tensor();
  o.scale = kInf;
  ExpectInvalid(sdpa(q, k, k, o), "scale must be finite");
  const absl::StatusOr<Tensor> earlier = absl::InvalidArgumentError("Earlier: failed");
  EXPECT_EQ(ScaledDotProductAttention(q, k, earlier).status(), earlier.status());
  AttentionOptions bad_mask;
  bad_mask.mask = earlier;
  EXPECT_EQ(ScaledDotProductAttention(q, k, k, bad_mask).status(), earlier.status());
}

}  // namespace
}  // namespace functional
}  // namespace nn
