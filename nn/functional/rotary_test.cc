#include "nn/functional/rotary.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_runtime.h"
#include "nn/functional/gradcheck.h"
#include "nn/functional/internal/layer_test_util.h"
#include "nn/functional/shape.h"
#include "nn/rotary.h"
#include "nn/tensor_ops.h"

namespace nn {
namespace functional {
namespace {

using core::DType;
using core::Tensor;
using layer_test_util::ExpectInvalid;
using layer_test_util::ExpectSameBits;
using layer_test_util::Ids;
using layer_test_util::Random;

RotaryTables Tables(int64_t positions, int64_t D, double theta = 10000.0) {
  return MakeRotaryTables(positions, D, theta, core::Device::Cpu()).value();
}

// Hugging Face's x cos + rotate_half(x) sin in double for x [L, T, D] (flattened), row
// (l, t) at position pos(l, t).
template <typename Pos>
std::vector<double> Reference(const Tensor& x, double theta, Pos pos) {
  const int64_t D = x.size(-1), T = x.size(-2), L = x.numel() / (T * D), half = D / 2;
  const float* p = x.data<float>();
  std::vector<double> y(x.numel());
  for (int64_t l = 0; l < L; ++l) {
    for (int64_t t = 0; t < T; ++t) {
      const float* row = p + (l * T + t) * D;
      for (int64_t j = 0; j < D; ++j) {
        const double angle = pos(l, t) / std::pow(theta, 2.0 * (j % half) / D);
        const double rotated = j < half ? -double{row[j + half]} : double{row[j - half]};
        y[(l * T + t) * D + j] = row[j] * std::cos(angle) + rotated * std::sin(angle);
      }
    }
  }
  return y;
}

void ExpectNear(const Tensor& got, const std::vector<double>& want, const std::string& what) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size())) << what;
  for (int64_t i = 0; i < got.numel(); ++i) {
    // Tables rounded to fp32 (and fp32 products): a few 1e-7 of the values.
    EXPECT_NEAR(got.data<float>()[i], want[i], 1e-6 * (1 + std::abs(want[i])))
        << what << " element " << i;
  }
}

TEST(RotaryTest, MatchesHuggingFacesFormulaAtOffsetsAndPositions) {
  const Tensor x = Random({2, 3, 5, 8}, 1, 2.0f);
  for (int64_t offset : {0, 4}) {
    absl::StatusOr<Tensor> y = Rotary(x, Tables(12, 8), offset);
    ASSERT_TRUE(y.ok()) << y.status();
    EXPECT_EQ(y->shape(), x.shape());
    ExpectNear(*y, Reference(x, 1e4, [&](int64_t, int64_t t) { return offset + t; }),
               "offset " + std::to_string(offset));
  }
  // Each sequence its own positions: [B, T] for x [B, H, T, D].
  const std::vector<int32_t> pos = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3};
  absl::StatusOr<Tensor> y = Rotary(x, Tables(10, 8), Ids(pos, {2, 5}));
  ASSERT_TRUE(y.ok()) << y.status();
  ExpectNear(*y, Reference(x, 1e4, [&](int64_t l, int64_t t) { return pos[(l / 3) * 5 + t]; }),
             "positions [B, T]");
  // One row of positions for every block; a 2-D x [T, D]; another theta.
  const std::vector<int32_t> row = {7, 0, 2, 2, 11};
  y = Rotary(x, Tables(12, 8), Ids(row, {5}));
  ASSERT_TRUE(y.ok()) << y.status();
  ExpectNear(*y, Reference(x, 1e4, [&](int64_t, int64_t t) { return row[t]; }), "positions [T]");
  const Tensor x2 = Random({6, 4}, 2);
  y = Rotary(x2, /*offset=*/3, /*theta=*/500000.0);
  ASSERT_TRUE(y.ok()) << y.status();
  ExpectNear(*y, Reference(x2, 5e5, [](int64_t, int64_t t) { return 3 + t; }), "theta 5e5");
}

// The three ways of naming the same positions give the same bits, and so does the tail of
// a longer sequence (the tables' rows do not depend on how many there are).
TEST(RotaryTest, OffsetsPositionsAndTablesAgreeBitForBit) {
  const Tensor x = Random({2, 2, 6, 16}, 3);
  absl::StatusOr<Tensor> by_offset = Rotary(x, Tables(20, 16), 5);
  ASSERT_TRUE(by_offset.ok()) << by_offset.status();
  absl::StatusOr<Tensor> fresh = Rotary(x, 5);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  ExpectSameBits(*fresh, *by_offset, "tables made for the call");
  absl::StatusOr<Tensor> by_positions = Rotary(x, Tables(11, 16), Ids({5, 6, 7, 8, 9, 10}, {6}));
  ASSERT_TRUE(by_positions.ok()) << by_positions.status();
  ExpectSameBits(*by_positions, *by_offset, "positions");
  const Tensor longer = Tensor::Zeros({2, 2, 11, 16});
  for (int64_t b = 0; b < 4; ++b) {
    std::memcpy(longer.data<float>() + (b * 11 + 5) * 16, x.data<float>() + b * 6 * 16,
                6 * 16 * sizeof(float));
  }
  absl::StatusOr<Tensor> tail = Slice(Rotary(longer), 2, 5, 11);
  ASSERT_TRUE(tail.ok()) << tail.status();
  ExpectSameBits(*tail, *by_offset, "tail of a longer sequence");
}

// With the same tables, F::Rotary of q [B, H, T, D] gives the bits nn::RotaryPackQkv writes
// for q [B, T, H, D], and its gradient those of nn::RotaryPackQkvBackward.
TEST(RotaryTest, IsBitForBitTheLlamaLayersRotation) {
  const int64_t B = 2, T = 7, H = 3, D = 10, C = H * D;
  const RotaryTables tables = Tables(T, D);
  const Tensor q = Random({B, T, H, D}, 4), v = Random({B, T, H, D}, 5);
  const Tensor qkv = Tensor::Zeros({B, T, 3 * C});
  const Tensor q3 = q.Reshape({B, T, C}).value(), v3 = v.Reshape({B, T, C}).value();
  const absl::Status packed =
      RotaryPackQkv("rotary_test", q3, q3, v3, tables.cos, tables.sin, H, H, qkv);
  ASSERT_TRUE(packed.ok()) << packed;
  const Tensor qh = core::Leaf(Permute(q, {0, 2, 1, 3}).value());
  absl::StatusOr<Tensor> y = Permute(Rotary(qh, tables), {0, 2, 1, 3});
  ASSERT_TRUE(y.ok()) << y.status();
  for (int64_t r = 0; r < B * T; ++r) {
    for (int64_t part : {0, 1}) {  // q's and k's columns: both q turned
      EXPECT_EQ(std::memcmp(y->data<float>() + r * C, qkv.data<float>() + r * 3 * C + part * C,
                            C * sizeof(float)),
                0)
          << "row " << r << " part " << part;
    }
  }
  // Backward: a gradient in q's columns only, turned back by both.
  const Tensor g = Random({B, T, C}, 6);
  const Tensor gqkv = Tensor::Zeros({B, T, 3 * C});
  for (int64_t r = 0; r < B * T; ++r) {
    std::memcpy(gqkv.data<float>() + r * 3 * C, g.data<float>() + r * C, C * sizeof(float));
  }
  const Tensor gq = Tensor::Zeros({B, T, C}), gk = Tensor::Zeros({B, T, C}),
               gv = Tensor::Zeros({B, T, C});
  ASSERT_TRUE(
      RotaryPackQkvBackward("rotary_test", gqkv, tables.cos, tables.sin, H, H, gq, gk, gv).ok());
  ASSERT_TRUE(core::Backward({*y}, {g.Reshape({B, T, H, D}).value()}).ok());
  absl::StatusOr<Tensor> gx = Permute(core::LeafGrad(qh), {0, 2, 1, 3});
  ASSERT_TRUE(gx.ok()) << gx.status();
  ExpectSameBits(gx->Reshape({B, T, C}).value(), gq, "gradient");
}

TEST(RotaryTest, GradientsPassTheCheckAndUndoTheRotation) {
  const RotaryTables tables = Tables(9, 6);
  for (bool positions : {false, true}) {
    absl::StatusOr<gradcheck::Report> r = gradcheck::CheckGradients(
        [&](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
          ASSIGN_OR_RETURN(Tensor y,
                           positions ? Rotary(in[0], tables, in[1]) : Rotary(in[0], tables, 2));
          return std::vector<Tensor>{y};
        },
        {Random({2, 2, 4, 6}, 7), Ids({8, 0, 3, 3, 1, 2, 5, 7}, {2, 4})}, {}, {},
        {"x", "positions"});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->ok()) << positions << " " << r->ToString();
    EXPECT_GT(r->max_abs_numeric, 0.5);
  }
  // The gradient is the inverse rotation: the gradient of y taken at y itself gives x back.
  const Tensor x = core::Leaf(Random({3, 5, 6}, 8));
  absl::StatusOr<Tensor> y = Rotary(x, tables, 4);
  ASSERT_TRUE(y.ok()) << y.status();
  ASSERT_TRUE(core::Backward({*y}, {core::Detach(*y)}).ok());
  const std::vector<float> back = core::LeafGrad(x).ToVector(), want = x.ToVector();
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(back[i], want[i], 1e-6) << i;
}

TEST(RotaryTest, BitsDoNotDependOnTheThreadCount) {
  const Tensor x = Random({4, 8, 64, 64}, 9);  // 128K elements: several OpenMP chunks
  const RotaryTables tables = Tables(64, 64);
  std::vector<std::vector<float>> runs;
  for (int threads : {1, 2}) {
    ASSERT_TRUE(kernels::SetIntraOpThreads(threads).ok());
    absl::StatusOr<Tensor> y = Rotary(x, tables);
    ASSERT_TRUE(y.ok()) << y.status();
    runs.push_back(y->ToVector());
  }
  ASSERT_TRUE(kernels::SetIntraOpThreads(1).ok());
  EXPECT_EQ(std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * sizeof(float)), 0);
}

TEST(RotaryTest, EmptyTensorsAndNoGradScope) {
  absl::StatusOr<Tensor> empty = Rotary(core::Leaf(Tensor::Zeros({0, 3, 4})));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->shape(), (core::Shape{0, 3, 4}));
  empty = Rotary(core::Leaf(Tensor::Zeros({2, 0, 4})));
  ASSERT_TRUE(empty.ok()) << empty.status();

  core::NoGradScope no_grad;
  absl::StatusOr<Tensor> y = Rotary(core::Leaf(Random({3, 4}, 10)));
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_FALSE(core::RequiresGrad(*y));
}

TEST(RotaryTest, BadArgumentsAreInvalid) {
  const Tensor x = Tensor::Zeros({2, 5, 8});
  const RotaryTables tables = Tables(6, 8);
  ExpectInvalid(Rotary(Tensor::Zeros({2, 5, 7})).status(), "Rotary: input must be [..., T, D]");
  ExpectInvalid(Rotary(Tensor::Zeros({8})).status(), "Rotary: input must be [..., T, D]");
  ExpectInvalid(Rotary(Tensor::Zeros({2, 8}, DType::kInt32)).status(),
                "Rotary: input must be float32");
  ExpectInvalid(Rotary(Tensor()).status(), "Rotary: input is undefined");
  ExpectInvalid(Rotary(x, Tables(6, 4)).status(), "Rotary: tables must be");
  ExpectInvalid(Rotary(x, RotaryTables{}).status(), "Rotary: tables must be");
  ExpectInvalid(Rotary(x, tables, 2).status(), "need offset >= 0 and tables of at least 7");
  ExpectInvalid(Rotary(x, tables, -1).status(), "need offset >= 0");
  ExpectInvalid(Rotary(x, -1).status(), "Rotary: offset must be >= 0");
  ExpectInvalid(Rotary(x, 0, 0.0).status(), "theta finite and > 0");
  ExpectInvalid(Rotary(x, tables, Ids({0, 1, 2, 3}, {4})).status(),
                "Rotary: positions must be [T] or [N, T]");
  ExpectInvalid(Rotary(x, tables, Ids(std::vector<int32_t>(15, 0), {3, 5})).status(),
                "N dividing the 2 blocks");
  ExpectInvalid(Rotary(x, tables, Tensor::Zeros({5})).status(), "Rotary: positions must be int32");
  ExpectInvalid(Rotary(x, tables, Ids({0, 1, 6, 3, 4}, {5})).status(),
                "Rotary: position 6 at index 2");
  ExpectInvalid(Rotary(x, tables, Ids({0, -1, 2, 3, 4}, {5})).status(), "position -1");
  const absl::StatusOr<Tensor> earlier = absl::InvalidArgumentError("Earlier: failed");
  EXPECT_EQ(Rotary(earlier).status(), earlier.status());
  EXPECT_EQ(Rotary(x, tables, earlier).status(), earlier.status());
}

}  // namespace
}  // namespace functional
}  // namespace nn
