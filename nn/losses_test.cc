#include "nn/losses.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/op_profile.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/testing/gradcheck.h"

namespace nn {
namespace {

using ::testing::HasSubstr;

core::Tensor Ids(std::vector<int32_t> v, core::Shape s) {
  return core::Tensor::FromInts(v, s).value();
}

TEST(CrossEntropyTest, UniformLogitsGiveLogV) {
  const int64_t V = 7;
  const core::Tensor logits = core::Tensor::Zeros({2, 3, V});
  absl::StatusOr<LossResult> r = CrossEntropyLoss(logits, Ids({0, 1, 2, 3, 4, 6}, {2, 3}));
  ASSERT_TRUE(r.ok()) << r.status();
  // log 7 = 1.9459; the loss is rounded once to fp32 (ulp ~1.2e-7).
  EXPECT_NEAR(r->loss, std::log(7.0), 1e-6);
  // Gradient (1/V - onehot) / N with N = 6 tokens.
  const std::vector<float> g = r->grad.ToVector();
  EXPECT_NEAR(g[0], (1.0 / 7 - 1) / 6, 1e-7);
  EXPECT_NEAR(g[1], 1.0 / 7 / 6, 1e-7);
  EXPECT_EQ(r->grad.shape(), logits.shape());
}

TEST(CrossEntropyTest, MatchesHandComputedValueAndIsStable) {
  // -log softmax([1, 2, 3])[2] = log(e + e^2 + e^3) - 3 = 0.40760596.
  absl::StatusOr<LossResult> r =
      CrossEntropyLoss(core::Tensor::FromVector({1, 2, 3}, {1, 3}).value(), Ids({2}, {1}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(r->loss, std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)) - 3.0, 1e-6);
  // Large logits overflow a naive exp; the max-subtracted form gives -log sigmoid(-1000)
  // = 1000 for the wrong class and ~0 for the right one.
  r = CrossEntropyLoss(core::Tensor::FromVector({1000, 0, 1000, 0}, {2, 2}).value(),
                       Ids({1, 0}, {2}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(r->loss, 500.0, 1e-3);  // (1000 + 0) / 2, fp32 at 500 has ulp 3e-5
  for (float v : r->grad.ToVector()) EXPECT_TRUE(std::isfinite(v));
}

TEST(CrossEntropyTest, GradientMatchesFiniteDifferences) {
  const core::Tensor logits = gradcheck::RandomTensor({3, 2, 5}, 4, 2.0f);
  const core::Tensor targets = Ids({0, 4, 2, 2, 1, 3}, {3, 2});
  absl::StatusOr<LossResult> r = CrossEntropyLoss(logits, targets);
  ASSERT_TRUE(r.ok()) << r.status();
  auto f = [&targets](const core::Tensor& x) -> absl::StatusOr<double> {
    absl::StatusOr<LossResult> l = CrossEntropyLoss(x, targets);
    if (!l.ok()) return l.status();
    return static_cast<double>(l->loss);
  };
  // The loss (~2) is returned in fp32: rounding 1.2e-7 / eps 1e-2 ~ 1e-5 of noise; the
  // gradients are <= 1/6. atol 1e-4 is 10x the noise and ~1% of a typical entry.
  gradcheck::Options o;
  o.atol = 1e-4;
  absl::StatusOr<gradcheck::Report> rep = gradcheck::CheckFunction(f, logits, r->grad, "logits", o);
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_TRUE(rep->ok()) << rep->ToString();
  EXPECT_EQ(rep->num_checked, 30);
}

TEST(CrossEntropyTest, BadArgumentsAreNamed) {
  absl::StatusOr<LossResult> r = CrossEntropyLoss(core::Tensor::Zeros({2, 3}), Ids({0, 3}, {2}));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("target 3"));
  r = CrossEntropyLoss(core::Tensor::Zeros({2, 3}), Ids({0, 1, 2}, {3}));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("[2, 3]"));
  r = CrossEntropyLoss(core::Tensor::Zeros({2, 3}), core::Tensor::Zeros({2}));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("int32"));
}

// grad_dtype bf16: the same loss, and each gradient value the fp32 one rounded once to
// bf16 (round to nearest even), bit for bit; any other dtype is refused by name.
TEST(CrossEntropyTest, Bf16GradientIsTheRoundedFp32Gradient) {
  std::vector<float> values(3 * 50);
  for (size_t i = 0; i < values.size(); ++i) values[i] = std::sin(0.37f * i) * 4.0f;
  const core::Tensor logits = core::Tensor::FromVector(values, {3, 50}).value();
  const core::Tensor targets = core::Tensor::FromInts({4, 49, 0}, {3}).value();
  absl::StatusOr<LossResult> f32 = CrossEntropyLoss(logits, targets);
  absl::StatusOr<LossResult> b16 = CrossEntropyLoss(logits, targets, core::DType::kBFloat16);
  ASSERT_TRUE(f32.ok() && b16.ok()) << b16.status();
  EXPECT_EQ(f32->loss, b16->loss);
  ASSERT_EQ(b16->grad.dtype(), core::DType::kBFloat16);
  ASSERT_EQ(b16->grad.shape(), f32->grad.shape());
  const core::Tensor rounded =
      f32->grad.ToDType(core::DType::kBFloat16, core::MemoryTag::kOther).value();
  const uint16_t* want = static_cast<const uint16_t*>(rounded.raw_data());
  const uint16_t* got = static_cast<const uint16_t*>(b16->grad.raw_data());
  for (int64_t i = 0; i < rounded.numel(); ++i) ASSERT_EQ(got[i], want[i]) << i;

  absl::StatusOr<LossResult> bad = CrossEntropyLoss(logits, targets, core::DType::kInt32);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("grad_dtype"));
}

// bf16 logits (a bf16 head's output) are widened exactly as they are read: the loss and the
// gradient, fp32 or bf16, are those of the same values in fp32, bit for bit, on rows enough
// to split over threads; int32 logits are refused by name.
TEST(CrossEntropyTest, Bf16LogitsGiveTheResultsOfTheirFp32Values) {
  const int64_t rows = 40, V = 3001;  // 120K logits: split over the intra-op threads
  std::vector<float> values(rows * V);
  for (size_t i = 0; i < values.size(); ++i) values[i] = std::sin(0.37f * i) * 6.0f;
  const core::Tensor logits16 = core::Tensor::FromVector(values, {4, rows / 4, V})
                                    .value()
                                    .ToDType(core::DType::kBFloat16, core::MemoryTag::kOther)
                                    .value();
  const core::Tensor logits32 =
      logits16.ToDType(core::DType::kFloat32, core::MemoryTag::kOther).value();
  std::vector<int32_t> tg(rows);
  for (int64_t i = 0; i < rows; ++i) tg[i] = static_cast<int32_t>((i * 977) % V);
  const core::Tensor targets = core::Tensor::FromInts(tg, {4, rows / 4}).value();
  for (const core::DType grad_dtype : {core::DType::kFloat32, core::DType::kBFloat16}) {
    absl::StatusOr<LossResult> a = CrossEntropyLoss(logits16, targets, grad_dtype);
    absl::StatusOr<LossResult> b = CrossEntropyLoss(logits32, targets, grad_dtype);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status();
    EXPECT_EQ(a->loss, b->loss);
    ASSERT_EQ(a->grad.dtype(), grad_dtype);
    ASSERT_EQ(a->grad.nbytes(), b->grad.nbytes());
    EXPECT_EQ(std::memcmp(a->grad.raw_data(), b->grad.raw_data(), a->grad.nbytes()), 0)
        << core::DTypeName(grad_dtype);
  }
  absl::StatusOr<LossResult> bad =
      CrossEntropyLoss(core::Tensor::Zeros({2, 3}, core::DType::kInt32),
                       core::Tensor::FromInts({0, 1}, {2}).value());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("float32 or bfloat16"));
}

// NOTE [Deferred loss]: the loss comes later, the same bits, and the host sync is recorded
// where the read happens.
TEST(CrossEntropyTest, ADeferredReadGivesTheSameLossWhenCalled) {
  const core::Tensor logits = gradcheck::RandomTensor({3, 2, 5}, 9, 2.0f);
  const core::Tensor targets = Ids({0, 4, 2, 1, 3, 3}, {3, 2});
  absl::StatusOr<LossResult> now = CrossEntropyLoss(logits, targets);
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_FALSE(now->read_loss);
  core::OpProfile at_call, at_read;
  absl::StatusOr<LossResult> later;
  {
    core::ScopedOpProfile on(&at_call);
    later = CrossEntropyLoss(logits, targets, core::DType::kFloat32, /*defer_read=*/true);
  }
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_TRUE(std::isnan(later->loss));
  ASSERT_TRUE(later->read_loss);
  EXPECT_EQ(later->grad.ToVector(), now->grad.ToVector());
  absl::StatusOr<double> read;
  {
    core::ScopedOpProfile on(&at_read);
    read = later->read_loss();
  }
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, static_cast<double>(now->loss));  // the same float, bit for bit
  // The loss's own read of the device; the call's one host sync is the targets' upload
  // (NOTE [Index uploads] in nn/tensor_ops.h).
  auto syncs = [](const core::OpProfile& p, const std::string& name) {
    int n = 0;
    for (const core::OpRecord& r : p.records()) {
      n += r.category == core::OpCategory::kHostSync && r.name == name;
    }
    return n;
  };
  EXPECT_EQ(syncs(at_call, "cross_entropy.loss_to_host"), 0);
  EXPECT_EQ(syncs(at_call, "copy"), 1);
  EXPECT_EQ(syncs(at_read, "cross_entropy.loss_to_host"), 1);
  EXPECT_EQ(at_read.Totals()[static_cast<int>(core::OpCategory::kHostSync)].ops, 1);
}

TEST(MseTest, MatchesHandComputedValueAndGradient) {
  // diffs [1, -2, 0, 3]: mean of squares (1 + 4 + 0 + 9) / 4 = 3.5; grad 2 d / 4.
  absl::StatusOr<LossResult> r = MseLoss(core::Tensor::FromVector({2, 0, 1, 4}, {2, 2}).value(),
                                         core::Tensor::FromVector({1, 2, 1, 1}, {2, 2}).value());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->loss, 3.5f);
  EXPECT_EQ(r->grad.ToVector(), (std::vector<float>{0.5f, -1.0f, 0.0f, 1.5f}));
  EXPECT_EQ(r->grad.shape(), (core::Shape{2, 2}));
}

TEST(MseTest, GradientMatchesFiniteDifferences) {
  const core::Tensor pred = gradcheck::RandomTensor({4, 3}, 1);
  const core::Tensor target = gradcheck::RandomTensor({4, 3}, 2);
  absl::StatusOr<LossResult> r = MseLoss(pred, target);
  ASSERT_TRUE(r.ok()) << r.status();
  auto f = [&target](const core::Tensor& x) -> absl::StatusOr<double> {
    absl::StatusOr<LossResult> l = MseLoss(x, target);
    if (!l.ok()) return l.status();
    return static_cast<double>(l->loss);
  };
  // Quadratic: central differences are exact but for fp32 rounding of the loss (~2e-7
  // / eps ~ 2e-5); atol 1e-4 as for cross-entropy.
  gradcheck::Options o;
  o.atol = 1e-4;
  absl::StatusOr<gradcheck::Report> rep = gradcheck::CheckFunction(f, pred, r->grad, "pred", o);
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_TRUE(rep->ok()) << rep->ToString();
}

TEST(MseTest, BadArgumentsAreNamed) {
  absl::StatusOr<LossResult> r = MseLoss(core::Tensor::Zeros({2, 2}), core::Tensor::Zeros({4}));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("MseLoss"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("[2, 2]"));
  r = MseLoss(core::Tensor::Zeros({0}), core::Tensor::Zeros({0}));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace nn
