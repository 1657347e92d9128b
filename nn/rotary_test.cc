// The rotary embedding: its tables against the definition, the rotary packing of grouped
// q, k, v (nn::RotaryPackQkv) against Hugging Face's formula (apply_rotary_pos_emb with
// rotate_half, repeat_kv), its backward as the rotation by the negative angle and by
// finite differences.
#include "nn/rotary.h"

#include <cmath>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/op_profile.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/tensor_ops.h"
#include "nn/testing/gradcheck.h"

namespace nn {
namespace {

using ::testing::HasSubstr;

constexpr char kWhat[] = "rotary_test";

TEST(RotaryTest, TablesAreTheCosinesAndSinesOfPositionTimesInverseFrequency) {
  for (double theta : {10000.0, 500000.0}) {
    absl::StatusOr<RotaryTables> t = MakeRotaryTables(7, 8, theta, core::Device::Cpu());
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->positions(), 7);
    EXPECT_EQ(t->cos.shape(), (core::Shape{7, 4}));
    const std::vector<float> c = t->cos.ToVector(), s = t->sin.ToVector();
    for (int64_t pos = 0; pos < 7; ++pos) {
      for (int64_t i = 0; i < 4; ++i) {
        // inv_freq = 1 / theta^(2i / d), each value rounded once from double.
        const double angle = pos / std::pow(theta, 2.0 * i / 8);
        EXPECT_EQ(c[pos * 4 + i], static_cast<float>(std::cos(angle))) << pos << " " << i;
        EXPECT_EQ(s[pos * 4 + i], static_cast<float>(std::sin(angle))) << pos << " " << i;
      }
    }
  }
  for (auto [positions, head_dim, theta] :
       {std::make_tuple(0, 8, 1e4), std::make_tuple(4, 7, 1e4), std::make_tuple(4, 8, -1.0)}) {
    EXPECT_EQ(MakeRotaryTables(positions, head_dim, theta, core::Device::Cpu()).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

struct Shape {
  int64_t B, T, H, KV, D;
};

struct Packed {
  core::Tensor q, k, v, qkv;
  RotaryTables tables;
};

Packed Pack(const Shape& s, uint64_t seed) {
  Packed p;
  p.q = gradcheck::RandomTensor({s.B, s.T, s.H * s.D}, seed);
  p.k = gradcheck::RandomTensor({s.B, s.T, s.KV * s.D}, seed + 1);
  p.v = gradcheck::RandomTensor({s.B, s.T, s.KV * s.D}, seed + 2);
  p.qkv = core::Tensor::Zeros({s.B, s.T, 3 * s.H * s.D});
  p.tables = MakeRotaryTables(s.T + 3, s.D, 10000.0, core::Device::Cpu()).value();  // extra rows
  const absl::Status st =
      RotaryPackQkv(kWhat, p.q, p.k, p.v, p.tables.cos, p.tables.sin, s.H, s.KV, p.qkv);
  EXPECT_TRUE(st.ok()) << st;
  return p;
}

TEST(RotaryTest, PackingIsHuggingFacesRotateHalfFormulaWithRepeatedKvHeads) {
  const Shape s{2, 5, 4, 2, 6};
  const Packed p = Pack(s, 1);
  const std::vector<float> q = p.q.ToVector(), k = p.k.ToVector(), v = p.v.ToVector();
  const std::vector<float> out = p.qkv.ToVector();
  const int64_t C = s.H * s.D, KW = s.KV * s.D, half = s.D / 2;
  // q * cos + rotate_half(q) * sin, cos = cat(freqs, freqs).cos(), in double.
  auto rope = [&](const float* head, int64_t t, int64_t j) {
    const double angle = t / std::pow(10000.0, 2.0 * (j % half) / s.D);
    const double rotated = j < half ? -double{head[j + half]} : double{head[j - half]};
    return head[j] * std::cos(angle) + rotated * std::sin(angle);
  };
  for (int64_t r = 0; r < s.B * s.T; ++r) {
    const int64_t t = r % s.T;
    for (int64_t h = 0; h < s.H; ++h) {
      const int64_t g = h / (s.H / s.KV);  // repeat_kv: query head h reads kv head h / 2
      for (int64_t j = 0; j < s.D; ++j) {
        const int64_t o = r * 3 * C + h * s.D + j;
        EXPECT_NEAR(out[o], rope(&q[r * C + h * s.D], t, j), 1e-6);
        EXPECT_NEAR(out[o + C], rope(&k[r * KW + g * s.D], t, j), 1e-6);
        EXPECT_EQ(out[o + 2 * C], v[r * KW + g * s.D + j]);
      }
    }
  }
  // Position 0 is not turned at all.
  for (int64_t j = 0; j < C; ++j) EXPECT_EQ(out[j], q[j]);
}

// With n_kv_head == n_head nothing is summed: the backward of the packed tensor itself
// turns q and k back by the negative angle (cos^2 + sin^2 = 1 up to rounding) and gives v.
TEST(RotaryTest, BackwardIsTheRotationByTheNegativeAngle) {
  const Shape s{2, 6, 3, 3, 8};
  const Packed p = Pack(s, 4);
  core::Tensor gq = core::Tensor::Zeros(p.q.shape()), gk = core::Tensor::Zeros(p.k.shape()),
               gv = core::Tensor::Zeros(p.v.shape());
  ASSERT_TRUE(
      RotaryPackQkvBackward(kWhat, p.qkv, p.tables.cos, p.tables.sin, s.H, s.KV, gq, gk, gv).ok());
  for (const auto& [got, want] : {std::make_pair(gq, p.q), std::make_pair(gk, p.k)}) {
    const std::vector<float> a = got.ToVector(), b = want.ToVector();
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-6) << i;
  }
  EXPECT_EQ(gv.ToVector(), p.v.ToVector());
}

// d/dq, d/dk, d/dv of L = sum(pack(q, k, v) * R) by central differences, with two query
// heads per kv head (the k and v gradients sum over the group).
TEST(RotaryTest, BackwardMatchesFiniteDifferences) {
  const Shape s{2, 4, 4, 2, 4};
  Packed p = Pack(s, 7);
  const core::Tensor R = gradcheck::RandomTensor(p.qkv.shape(), 10);
  core::Tensor gq = core::Tensor::Zeros(p.q.shape()), gk = core::Tensor::Zeros(p.k.shape()),
               gv = core::Tensor::Zeros(p.v.shape());
  ASSERT_TRUE(
      RotaryPackQkvBackward(kWhat, R, p.tables.cos, p.tables.sin, s.H, s.KV, gq, gk, gv).ok());
  auto loss = [&](const core::Tensor&) -> absl::StatusOr<double> {
    core::Tensor out = core::Tensor::Zeros(p.qkv.shape());
    absl::Status st =
        RotaryPackQkv(kWhat, p.q, p.k, p.v, p.tables.cos, p.tables.sin, s.H, s.KV, out);
    if (!st.ok()) return st;
    const std::vector<float> o = out.ToVector(), r = R.ToVector();
    double l = 0.0;
    for (size_t i = 0; i < o.size(); ++i) l += double{o[i]} * r[i];
    return l;
  };
  for (const auto& [x, analytic, name] :
       {std::make_tuple(p.q, gq, "q"), std::make_tuple(p.k, gk, "k"),
        std::make_tuple(p.v, gv, "v")}) {
    absl::StatusOr<gradcheck::Report> r = gradcheck::CheckFunction(loss, x, analytic, name);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->ok()) << r->ToString();
    EXPECT_EQ(r->num_checked, x.numel());
    EXPECT_GT(r->max_abs_numeric, 0.5) << name;
  }
}

TEST(RotaryTest, BadShapesAreInvalidArgument) {
  const core::Tensor q = core::Tensor::Zeros({1, 4, 12}), kv = core::Tensor::Zeros({1, 4, 6});
  const RotaryTables t = MakeRotaryTables(4, 6, 1e4, core::Device::Cpu()).value();
  const RotaryTables short_t = MakeRotaryTables(3, 6, 1e4, core::Device::Cpu()).value();
  const core::Tensor out = core::Tensor::Zeros({1, 4, 36});
  EXPECT_TRUE(RotaryPackQkv(kWhat, q, kv, kv, t.cos, t.sin, 2, 1, out).ok());
  struct Bad {
    absl::Status status;
    const char* message;
  };
  for (const Bad& b :
       {Bad{RotaryPackQkv(kWhat, q, kv, kv, t.cos, t.sin, 2, 3, out), "n_kv_head"},
        Bad{RotaryPackQkv(kWhat, q, kv, kv, t.cos, t.sin, 4, 2, out), "D even"},
        Bad{RotaryPackQkv(kWhat, q, q, kv, t.cos, t.sin, 2, 1, out), "k must be [1, 4, 6]"},
        Bad{RotaryPackQkv(kWhat, q, kv, kv, short_t.cos, short_t.sin, 2, 1, out),
            "at least 4 rows"},
        Bad{RotaryPackQkv(kWhat, q, kv, kv, t.cos, t.sin, 2, 1, q), "q, k and v must be"}}) {
    EXPECT_EQ(b.status.code(), absl::StatusCode::kInvalidArgument) << b.status;
    EXPECT_THAT(std::string(b.status.message()), HasSubstr(b.message));
  }
}

// NOTE [GEMM epilogues]: the packed q, k, v and each of the backward's gradients may be
// stored bf16 (the fp32 values rounded once, for bf16 GEMMs; half the bytes in the ops'
// recorded costs); any other output dtype is InvalidArgument naming the tensor.
TEST(RotaryTest, OutputsAreFp32OrBf16) {
  const Shape s{2, 5, 4, 2, 6};
  const int64_t rows = s.B * s.T, C = s.H * s.D, KW = s.KV * s.D;
  const Packed p = Pack(s, 11);
  auto bf16 = [](const core::Tensor& t) {
    return t.ToDType(core::DType::kBFloat16, core::MemoryTag::kOther).value().ToVector();
  };
  auto like = [](const core::Tensor& t, core::DType dtype) {
    return core::Tensor::Zeros(t.shape(), dtype, core::MemoryTag::kActivation);
  };
  const core::Tensor gq = like(p.q, core::DType::kFloat32), gk = like(p.k, core::DType::kFloat32),
                     gv = like(p.v, core::DType::kFloat32);
  ASSERT_TRUE(
      RotaryPackQkvBackward(kWhat, p.qkv, p.tables.cos, p.tables.sin, s.H, s.KV, gq, gk, gv).ok());
  const core::Tensor qkv16 = like(p.qkv, core::DType::kBFloat16);
  const core::Tensor gq16 = like(p.q, core::DType::kBFloat16),
                     gk2 = like(p.k, core::DType::kFloat32),
                     gv16 = like(p.v, core::DType::kBFloat16);
  core::OpProfile profile;
  {
    core::ScopedOpProfile on(&profile);
    ASSERT_TRUE(
        RotaryPackQkv(kWhat, p.q, p.k, p.v, p.tables.cos, p.tables.sin, s.H, s.KV, qkv16).ok());
    ASSERT_TRUE(
        RotaryPackQkvBackward(kWhat, p.qkv, p.tables.cos, p.tables.sin, s.H, s.KV, gq16, gk2, gv16)
            .ok());
  }
  ASSERT_EQ(profile.records().size(), 2u);
  EXPECT_EQ(profile.records()[0].cost.bytes, rows * (4 * (C + 2 * KW) + 2 * 3 * C));
  EXPECT_EQ(profile.records()[1].cost.bytes, rows * (4 * 3 * C + 2 * C + 4 * KW + 2 * KW));
  EXPECT_EQ(qkv16.ToVector(), bf16(p.qkv));
  EXPECT_EQ(gq16.ToVector(), bf16(gq));
  EXPECT_EQ(gk2.ToVector(), gk.ToVector());
  EXPECT_EQ(gv16.ToVector(), bf16(gv));
  struct Bad {
    absl::Status status;
    const char* message;
  };
  const core::Tensor ints = like(p.qkv, core::DType::kInt32);
  const core::Tensor kints = like(p.k, core::DType::kInt32);
  for (const Bad& b :
       {Bad{RotaryPackQkv(kWhat, p.q, p.k, p.v, p.tables.cos, p.tables.sin, s.H, s.KV, ints),
            "q, k and v must be float32 or bfloat16"},
        Bad{RotaryPackQkv(kWhat, like(p.q, core::DType::kBFloat16), p.k, p.v, p.tables.cos,
                          p.tables.sin, s.H, s.KV, qkv16),
            "q must be float32"},
        Bad{RotaryPackQkvBackward(kWhat, p.qkv, p.tables.cos, p.tables.sin, s.H, s.KV, gq, kints,
                                  gv),
            "k gradient must be float32 or bfloat16"},
        Bad{RotaryPackQkvBackward(kWhat, qkv16, p.tables.cos, p.tables.sin, s.H, s.KV, gq, gk, gv),
            "q, k and v gradient must be float32"}}) {
    EXPECT_EQ(b.status.code(), absl::StatusCode::kInvalidArgument) << b.status;
    EXPECT_THAT(std::string(b.status.message()), HasSubstr(b.message));
  }
}

}  // namespace
}  // namespace nn
