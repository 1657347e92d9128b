#include "nn/functional/loss.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/autograd.h"
#include "core/op_profile.h"
#include "core/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/functional/fused.h"
#include "nn/functional/gradcheck.h"
#include "nn/functional/internal/layer_test_util.h"
#include "nn/losses.h"

namespace nn {
namespace functional {
namespace {

using core::DType;
using core::Tensor;
using layer_test_util::ExpectSameBits;
using layer_test_util::Ids;
using layer_test_util::Random;
using ::testing::Each;
using ::testing::HasSubstr;

uint32_t Bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof(b));
  return b;
}

// The loss's value and the gradient at `logits` (a leaf of `x`) for a seed of `seed`.
struct Result {
  float loss = 0;
  Tensor grad;
};
Result RunCrossEntropy(const Tensor& x, const Tensor& targets, int64_t ignore_index = -100,
                       float seed = 1.0f) {
  const Tensor logits = core::Leaf(x);
  absl::StatusOr<Tensor> loss = CrossEntropy(logits, targets, ignore_index);
  EXPECT_TRUE(loss.ok()) << loss.status();
  if (!loss.ok()) return {};
  EXPECT_EQ(loss->shape(), core::Shape{});
  EXPECT_TRUE(core::Backward({*loss}, {Tensor::FromVector({seed}, {}).value()}).ok());
  return {loss->data<float>()[0], core::LeafGrad(logits)};
}

// NOTE [Functional losses]: with no target ignored, the loss and the logits' gradient are
// nn::CrossEntropyLoss's bits, for fp32 and bf16 logits.
TEST(CrossEntropyTest, MatchesTheFusedLossBitForBit) {
  const Tensor targets = Ids({3, 0, 36, 7, 7, 12, 1, 30, 2, 5, 9, 11, 0, 35, 20}, {3, 5});
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(core::DTypeName(dtype));
    const Tensor x =
        Random({3, 5, 37}, 1, 2.0f).ToDType(dtype, core::MemoryTag::kActivation).value();
    absl::StatusOr<LossResult> want = CrossEntropyLoss(x, targets);
    ASSERT_TRUE(want.ok()) << want.status();
    const Result got = RunCrossEntropy(x, targets);
    EXPECT_EQ(Bits(got.loss), Bits(want->loss));
    ExpectSameBits(got.grad, want->grad, "logits gradient");
  }
}

// Ignored rows drop out of the mean: the loss and the kept rows' gradient are those of
// nn::CrossEntropyLoss over the kept rows alone, the ignored rows' gradient is 0.
TEST(CrossEntropyTest, IgnoredTargetsDropOutOfTheMean) {
  const Tensor x = Random({6, 9}, 2, 2.0f);
  const Tensor targets = Ids({4, -100, 0, 8, -100, 2}, {6});
  const std::vector<int64_t> kept = {0, 2, 3, 5};
  Tensor kept_x = Tensor::Zeros({4, 9});
  for (size_t i = 0; i < kept.size(); ++i) {
    ASSERT_TRUE(kept_x.View(9 * i, {9}).value().CopyFrom(x.View(9 * kept[i], {9}).value()).ok());
  }
  absl::StatusOr<LossResult> want = CrossEntropyLoss(kept_x, Ids({4, 0, 8, 2}, {4}));
  ASSERT_TRUE(want.ok()) << want.status();
  const Result got = RunCrossEntropy(x, targets);
  EXPECT_EQ(Bits(got.loss), Bits(want->loss));
  for (int64_t r = 0; r < 6; ++r) {
    const Tensor row = got.grad.View(9 * r, {9}).value();
    const auto it = std::find(kept.begin(), kept.end(), r);
    if (it == kept.end()) {
      EXPECT_THAT(row.ToVector(), Each(0.0f)) << "row " << r;
    } else {
      ExpectSameBits(row, want->grad.View(9 * (it - kept.begin()), {9}).value(),
                     absl::StrCat("row ", r));
    }
  }
}

TEST(CrossEntropyTest, AllIgnoredGivesZeroLossAndGradient) {
  const Result got =
      RunCrossEntropy(Random({2, 3, 4}, 3), Ids({1, 1, 1, 1, 1, 1}, {2, 3}), /*ignore_index=*/1);
  EXPECT_EQ(got.loss, 0.0f);
  EXPECT_THAT(got.grad.ToVector(), Each(0.0f));
  const Result empty = RunCrossEntropy(Tensor::Zeros({0, 4}), Ids({}, {0}));
  EXPECT_EQ(empty.loss, 0.0f);
  EXPECT_EQ(empty.grad.shape(), (core::Shape{0, 4}));
}

TEST(CrossEntropyTest, TheBackwardScalesTheKeptGradientByTheIncomingOne) {
  const Tensor x = Random({4, 6}, 4);
  const Tensor targets = Ids({0, 5, 2, 2}, {4});
  const Result one = RunCrossEntropy(x, targets);
  const Result scaled = RunCrossEntropy(x, targets, -100, 2.5f);
  const std::vector<float> a = one.grad.ToVector(), b = scaled.grad.ToVector();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(b[i], a[i] * 2.5f) << i;
}

// core::Backward(loss)'s seed 1 (core::IsUnitSeed) hands the kept gradient on as it is: the bits
// of an explicit seed 1 (which scales it, times 1), with one op fewer.
TEST(CrossEntropyTest, BackwardOfTheLossHandsTheKeptGradientOn) {
  const Tensor x = Random({4, 6}, 5), targets = Ids({0, 5, 2, 2}, {4});
  const Result explicit_one = RunCrossEntropy(x, targets);
  const Tensor logits = core::Leaf(x);
  absl::StatusOr<Tensor> loss = CrossEntropy(logits, targets);
  ASSERT_TRUE(loss.ok()) << loss.status();
  core::OpProfile profile;
  {
    core::ScopedOpProfile on(&profile);
    ASSERT_TRUE(core::Backward(*loss).ok());
  }
  ExpectSameBits(core::LeafGrad(logits), explicit_one.grad, "logits gradient");
  for (const core::OpRecord& r : profile.records()) {
    EXPECT_NE(r.name, "cross_entropy.backward");
  }
  EXPECT_FALSE(core::IsUnitSeed(Tensor::FromVector({1.0f}, {}).value()));  // outside a Backward
}

// NOTE [bf16 logits]: logits made by an op that takes their gradient in bf16 (a head with a bf16
// weight) get it bf16, nn::CrossEntropyLoss's grad_dtype bf16 bits; the head's weight gradient is
// then the bits of the head run on that gradient.
TEST(CrossEntropyTest, ABf16HeadGetsTheLogitsGradientInBf16) {
  const Tensor h = Random({5, 8}, 6), targets = Ids({1, 2, 3, 0, 9}, {5});
  const Tensor w = Random({10, 8}, 7).ToDType(DType::kBFloat16, core::MemoryTag::kOther).value();
  const Tensor w_leaf = core::Leaf(w);
  absl::StatusOr<Tensor> logits = LinearForGemm(h, w_leaf);
  ASSERT_TRUE(logits.ok()) << logits.status();
  absl::StatusOr<LossResult> want =
      CrossEntropyLoss(*logits, targets, DType::kBFloat16, /*defer_read=*/false);
  ASSERT_TRUE(want.ok()) << want.status();
  absl::StatusOr<Tensor> loss = CrossEntropy(*logits, targets);
  ASSERT_TRUE(loss.ok()) << loss.status();
  ASSERT_TRUE(core::Backward(*loss).ok());
  const Tensor via_loss = core::LeafGrad(w_leaf);
  const Tensor w_ref = core::Leaf(w);
  absl::StatusOr<Tensor> logits_ref = LinearForGemm(h, w_ref);
  ASSERT_TRUE(logits_ref.ok());
  ASSERT_TRUE(core::Backward({*logits_ref}, {want->grad}).ok());
  ExpectSameBits(via_loss, core::LeafGrad(w_ref), "head weight gradient");
  EXPECT_EQ(Bits(loss->data<float>()[0]), Bits(want->loss));
}

// CrossEntropyOptions::read_loss defers the value (the tensor holds NaN; no read is recorded until
// read_loss runs) and reads what the undeferred tensor holds; the gradient is the same either way.
TEST(CrossEntropyTest, ReadLossDefersTheLossValue) {
  const Tensor x = Random({3, 7}, 8), targets = Ids({6, 0, 3}, {3});
  for (const Tensor& t : {targets, Ids({6, -100, 3}, {3})}) {
    const Result want = RunCrossEntropy(x, t);
    std::function<absl::StatusOr<double>()> read;
    CrossEntropyOptions options;
    options.read_loss = &read;
    const Tensor logits = core::Leaf(x);
    core::OpProfile profile;
    absl::StatusOr<Tensor> loss;
    {
      core::ScopedOpProfile on(&profile);
      loss = CrossEntropy(logits, t, options);
    }
    ASSERT_TRUE(loss.ok()) << loss.status();
    EXPECT_TRUE(std::isnan(loss->data<float>()[0]));
    for (const core::OpRecord& r : profile.records())
      EXPECT_NE(r.name, "cross_entropy.loss_to_host");
    ASSERT_TRUE(read != nullptr);
    absl::StatusOr<double> value = read();
    ASSERT_TRUE(value.ok()) << value.status();
    EXPECT_EQ(*value, static_cast<double>(want.loss));
    ASSERT_TRUE(core::Backward(*loss).ok());
    ExpectSameBits(core::LeafGrad(logits), want.grad, "logits gradient");
  }
}

TEST(CrossEntropyTest, GradientsPassTheCheckWithAndWithoutIgnoredTargets) {
  for (const Tensor& targets :
       {Ids({1, 0, 4, 2, 3, 3}, {2, 3}), Ids({1, -100, 4, 2, -100, 3}, {2, 3})}) {
    absl::StatusOr<gradcheck::Report> r = gradcheck::CheckGradients(
        [&targets](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
          ASSIGN_OR_RETURN(Tensor loss, CrossEntropy(in[0], targets));
          return std::vector<Tensor>{loss};
        },
        {Random({2, 3, 5}, 5)}, {}, {}, {"logits"});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->ok()) << r->ToString();
    EXPECT_GT(r->max_abs_numeric, 0.01);
  }
}

TEST(CrossEntropyTest, BadArgumentsAreInvalidArgumentNamingThem) {
  const Tensor x = Tensor::Zeros({2, 3, 4});
  absl::Status s = CrossEntropy(x, Ids({0, 1, 2, 3, 4, -100}, {2, 3})).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("CrossEntropy: target 4 at flat position 4 of targets [2, 3] "
                                     "is outside [0, 4)"));
  s = CrossEntropy(x, Ids({0, 0, 0, 0, 0, -1}, {2, 3})).status();
  EXPECT_THAT(s.message(), HasSubstr("target -1 at flat position 5"));
  s = CrossEntropy(x, Ids({0, 0, 0}, {3})).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("with targets [...] of the leading shape"));
  s = CrossEntropy(x, Tensor::Zeros({2, 3})).status();
  EXPECT_THAT(s.message(), HasSubstr("CrossEntropy: targets must be int32"));
  s = CrossEntropy(Tensor::Zeros({2, 3}, DType::kInt32), Ids({0, 0}, {2})).status();
  EXPECT_THAT(s.message(), HasSubstr("CrossEntropy: logits must be float32 or bfloat16"));
  s = CrossEntropy(Tensor(), Ids({0, 0}, {2})).status();
  EXPECT_THAT(s.message(), HasSubstr("CrossEntropy: logits is undefined"));
}

TEST(MseTest, MatchesADoubleReferenceAndTheLossBitForBit) {
  const Tensor a = Random({3, 4}, 1), b = Random({3, 4}, 2);
  absl::StatusOr<LossResult> want = MseLoss(a, b);
  ASSERT_TRUE(want.ok()) << want.status();
  const Tensor al = core::Leaf(a), bl = core::Leaf(b);
  absl::StatusOr<Tensor> loss = Mse(al, bl);
  ASSERT_TRUE(loss.ok()) << loss.status();
  double sum = 0;
  for (int64_t i = 0; i < 12; ++i) {
    const double d = double{a.data<float>()[i]} - b.data<float>()[i];
    sum += d * d;
  }
  EXPECT_NEAR(loss->data<float>()[0], sum / 12, 1e-6);
  EXPECT_EQ(Bits(loss->data<float>()[0]), Bits(want->loss));
  ASSERT_TRUE(core::Backward(*loss).ok());
  ExpectSameBits(core::LeafGrad(al), want->grad, "gradient of a");
  const std::vector<float> ga = core::LeafGrad(al).ToVector(), gb = core::LeafGrad(bl).ToVector();
  for (size_t i = 0; i < ga.size(); ++i) EXPECT_EQ(gb[i], -ga[i]) << i;
}

TEST(MseTest, GradientsPassTheCheck) {
  absl::StatusOr<gradcheck::Report> r = gradcheck::CheckGradients(
      [](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor loss, Mse(in[0], in[1]));
        return std::vector<Tensor>{loss};
      },
      {Random({2, 5}, 1), Random({2, 5}, 2)}, {}, {}, {"a", "b"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok()) << r->ToString();
  EXPECT_GT(r->max_abs_numeric, 0.1);
}

TEST(MseTest, BadArgumentsAreInvalidArgumentNamingThem) {
  absl::Status s = Mse(Tensor::Zeros({2, 3}), Tensor::Zeros({3, 2})).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("Mse: a Tensor(float32, [2, 3], cpu) and b"));
  EXPECT_THAT(Mse(Tensor::Zeros({0}), Tensor::Zeros({0})).status().message(),
              HasSubstr("Mse: a Tensor(float32, [0], cpu) is empty"));
  EXPECT_THAT(Mse(Tensor::Zeros({2}), Tensor::Zeros({2}, DType::kBFloat16)).status().message(),
              HasSubstr("Mse: b must be float32"));
  const absl::StatusOr<Tensor> earlier = absl::InvalidArgumentError("Earlier: failed");
  EXPECT_EQ(Mse(Tensor::Zeros({2}), earlier).status(), earlier.status());
}

TEST(LossTest, NoGradScopeRecordsNothing) {
  core::NoGradScope no_grad;
  const Tensor x = core::Leaf(Tensor::Zeros({2, 3}));
  absl::StatusOr<Tensor> ce = CrossEntropy(x, Ids({0, 2}, {2}));
  ASSERT_TRUE(ce.ok()) << ce.status();
  EXPECT_FALSE(core::RequiresGrad(*ce));
  EXPECT_NEAR(ce->data<float>()[0], std::log(3.0), 1e-6);
  absl::StatusOr<Tensor> mse = Mse(x, Tensor::Zeros({2, 3}));
  ASSERT_TRUE(mse.ok()) << mse.status();
  EXPECT_FALSE(core::RequiresGrad(*mse));
}

}  // namespace
}  // namespace functional
}  // namespace nn
