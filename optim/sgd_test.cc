#include "optim/sgd.h"

#include <cmath>
#include <memory>
#include <vector>

#include "core/allocator.h"
#include "core/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace optim {
namespace {

using core::MemoryTag;
using core::Parameter;
using core::ParameterPtr;
using core::Tensor;
using ::testing::HasSubstr;

// Expected values below are worked out by hand from torch.optim.SGD's documented rule
// (see sgd.h). The implementation computes in float32; every value here is at most 4 in
// magnitude and goes through at most a dozen roundings of 0.5 ulp (<= 2.4e-7 at 4), so
// 2e-6 bounds the float32 error with margin while still catching any wrong term (the
// smallest term tested, lr * dampened gradient, is 0.05).
constexpr float kTol = 2e-6f;

ParameterPtr MakeParam(std::vector<float> values) {
  return Parameter::Make(Tensor::FromVector(values, {static_cast<int64_t>(values.size())}).value());
}

void SetGrad(const ParameterPtr& p, std::vector<float> grad) {
  p->grad = Tensor::FromVector(grad, {static_cast<int64_t>(grad.size())}).value();
}

void ExpectValues(const Tensor& t, std::vector<float> expected) {
  const std::vector<float> got = t.ToVector();
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], kTol) << "at " << i;
}

std::unique_ptr<SGD> MakeSgd(std::vector<ParameterPtr> params, SgdOptions options) {
  absl::StatusOr<std::unique_ptr<SGD>> sgd = SGD::Create(std::move(params), options);
  EXPECT_TRUE(sgd.ok()) << sgd.status();
  return *std::move(sgd);
}

TEST(SgdTest, PlainStepIsParameterMinusLrTimesGradient) {
  ParameterPtr p = MakeParam({1.0f, -2.0f, 0.5f});
  SetGrad(p, {0.5f, 1.0f, -4.0f});
  SgdOptions o;
  o.lr = 0.1;
  auto sgd = MakeSgd({p}, o);
  EXPECT_TRUE(sgd->StateNames().empty());
  ASSERT_TRUE(sgd->Step().ok());
  // 1 - 0.1 * 0.5, -2 - 0.1 * 1, 0.5 + 0.1 * 4
  ExpectValues(p->data, {0.95f, -2.1f, 0.9f});
  ASSERT_TRUE(sgd->Step().ok());
  ExpectValues(p->data, {0.9f, -2.2f, 1.3f});
  EXPECT_EQ(sgd->step_count(), 2);
  EXPECT_TRUE(sgd->StateTensors().empty());
}

TEST(SgdTest, WeightDecayAddsDecayTimesParameterToTheGradient) {
  ParameterPtr p = MakeParam({1.0f, -2.0f});
  SetGrad(p, {0.5f, 1.0f});
  SgdOptions o;
  o.lr = 0.1;
  o.weight_decay = 0.1;
  auto sgd = MakeSgd({p}, o);
  ASSERT_TRUE(sgd->Step().ok());
  // d = g + 0.1 p = [0.6, 0.8]; p - 0.1 d = [0.94, -2.08]
  ExpectValues(p->data, {0.94f, -2.08f});
}

TEST(SgdTest, MomentumWithDampeningSkipsDampeningOnTheFirstStep) {
  ParameterPtr p = MakeParam({0.0f, 0.0f});
  SgdOptions o;
  o.lr = 0.1;
  o.momentum = 0.9;
  o.dampening = 0.5;
  auto sgd = MakeSgd({p}, o);
  // Step 1: buf = g = [1, -1] (PyTorch does not dampen the first step); p = [-0.1, 0.1].
  SetGrad(p, {1.0f, -1.0f});
  ASSERT_TRUE(sgd->Step().ok());
  ExpectValues(p->data, {-0.1f, 0.1f});
  // Step 2: buf = 0.9 [1, -1] + 0.5 [2, 0] = [1.9, -0.9]; p = [-0.29, 0.19].
  SetGrad(p, {2.0f, 0.0f});
  ASSERT_TRUE(sgd->Step().ok());
  ExpectValues(p->data, {-0.29f, 0.19f});
  // Step 3: buf = 0.9 [1.9, -0.9] + 0.5 [-1, 3] = [1.21, 0.69]; p = [-0.411, 0.121].
  SetGrad(p, {-1.0f, 3.0f});
  ASSERT_TRUE(sgd->Step().ok());
  ExpectValues(p->data, {-0.411f, 0.121f});
  const auto state = sgd->StateTensors();
  ASSERT_EQ(state.size(), 1u);
  EXPECT_EQ(state[0].first, "#0.momentum_buffer");
  ExpectValues(state[0].second, {1.21f, 0.69f});
}

TEST(SgdTest, NesterovAddsMomentumTimesBufferToTheGradient) {
  ParameterPtr p = MakeParam({1.0f});
  SgdOptions o;
  o.lr = 0.1;
  o.momentum = 0.9;
  o.nesterov = true;
  auto sgd = MakeSgd({p}, o);
  SetGrad(p, {1.0f});
  // Step 1: buf = 1; d = 1 + 0.9 * 1 = 1.9; p = 1 - 0.19 = 0.81.
  ASSERT_TRUE(sgd->Step().ok());
  ExpectValues(p->data, {0.81f});
  // Step 2: buf = 0.9 * 1 + 1 = 1.9; d = 1 + 0.9 * 1.9 = 2.71; p = 0.81 - 0.271 = 0.539.
  ASSERT_TRUE(sgd->Step().ok());
  ExpectValues(p->data, {0.539f});
}

TEST(SgdTest, WeightDecayEntersTheMomentumBuffer) {
  ParameterPtr p = MakeParam({2.0f});
  SetGrad(p, {0.0f});
  SgdOptions o;
  o.lr = 0.1;
  o.momentum = 0.9;
  o.weight_decay = 0.5;
  auto sgd = MakeSgd({p}, o);
  // Step 1: d = 0 + 0.5 * 2 = 1; buf = 1; p = 2 - 0.1 = 1.9.
  ASSERT_TRUE(sgd->Step().ok());
  ExpectValues(p->data, {1.9f});
  // Step 2: d = 0.5 * 1.9 = 0.95; buf = 0.9 + 0.95 = 1.85; p = 1.9 - 0.185 = 1.715.
  ASSERT_TRUE(sgd->Step().ok());
  ExpectValues(p->data, {1.715f});
}

TEST(SgdTest, AParametersFirstGradientStartsItsBufferUndampened) {
  ParameterPtr a = MakeParam({0.0f});
  ParameterPtr late = MakeParam({0.0f});
  SgdOptions o;
  o.lr = 1.0;
  o.momentum = 0.5;
  o.dampening = 0.5;
  auto sgd = MakeSgd({a, late}, o);
  SetGrad(a, {1.0f});
  ASSERT_TRUE(sgd->Step().ok());
  EXPECT_EQ(late->data.ToVector()[0], 0.0f) << "no gradient, no step";
  SetGrad(late, {1.0f});
  ASSERT_TRUE(sgd->Step().ok());
  // a: buf = 0.5 * 1 + 0.5 * 1 = 1, p = -1 - 1 = -2. late: first step, buf = 1, p = -1.
  ExpectValues(a->data, {-2.0f});
  ExpectValues(late->data, {-1.0f});
}

TEST(SgdTest, StepsOnlyTheSliceAParameterViews) {
  Tensor full = Tensor::FromVector({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {10}).value();
  ParameterPtr shard = Parameter::Make(full.View(3, {4}).value());
  SetGrad(shard, {1, 1, 1, 1});
  SgdOptions o;
  o.lr = 0.5;
  o.momentum = 0.9;
  auto sgd = MakeSgd({shard}, o);
  ASSERT_TRUE(sgd->Step().ok());
  ASSERT_TRUE(sgd->Step().ok());
  // Two steps: buf = 1 then 1.9, so each element moves by 0.5 * (1 + 1.9) = 1.45.
  const std::vector<float> v = full.ToVector();
  for (int i = 0; i < 10; ++i) {
    if (i >= 3 && i < 7) {
      EXPECT_NEAR(v[i], i - 1.45f, kTol) << "inside the slice at " << i;
    } else {
      EXPECT_EQ(v[i], static_cast<float>(i)) << "outside the slice at " << i;
    }
  }
  EXPECT_EQ(sgd->StateTensors()[0].second.numel(), 4);
}

TEST(SgdTest, SkipsFrozenParameters) {
  ParameterPtr frozen = MakeParam({3.0f});
  frozen->requires_grad = false;
  SetGrad(frozen, {1.0f});
  SgdOptions o;
  o.lr = 0.1;
  o.momentum = 0.9;
  auto sgd = MakeSgd({frozen}, o);
  ASSERT_TRUE(sgd->Step().ok());
  EXPECT_EQ(frozen->data.ToVector()[0], 3.0f);
  EXPECT_TRUE(sgd->StateTensors().empty());
}

TEST(SgdTest, MomentumBufferIsCountedUnderKOptim) {
  auto allocator = std::make_shared<core::Allocator>(core::Device::Cpu());
  core::ScopedAllocator scope(allocator);
  ParameterPtr w = Parameter::Make(Tensor::Zeros({4, 8}));
  ParameterPtr b = Parameter::Make(Tensor::Zeros({8}));
  ASSERT_TRUE(w->EnsureGrad().ok());
  ASSERT_TRUE(b->EnsureGrad().ok());
  SgdOptions o;
  o.momentum = 0.9;
  auto with_momentum = MakeSgd({w, b}, o);
  ASSERT_TRUE(with_momentum->Step().ok());
  // One float32 buffer per parameter: (32 + 8) * 4 bytes.
  EXPECT_EQ(allocator->Stats().current(MemoryTag::kOptim), (32 + 8) * 4);
  with_momentum.reset();
  EXPECT_EQ(allocator->Stats().current(MemoryTag::kOptim), 0);
  auto plain = MakeSgd({w, b}, SgdOptions());
  ASSERT_TRUE(plain->Step().ok());
  EXPECT_EQ(allocator->Stats().current(MemoryTag::kOptim), 0) << "plain SGD keeps no state";
}

TEST(SgdTest, ShardingAfterTheFirstStepIsReportedByParameterName) {
  ParameterPtr w = Parameter::Make(Tensor::Zeros({2, 4}));
  ASSERT_TRUE(w->EnsureGrad().ok());
  SgdOptions o;
  o.momentum = 0.9;
  auto sgd = SGD::Create(std::vector<core::NamedParameter>{{"fc1.weight", w}}, o).value();
  ASSERT_TRUE(sgd->Step().ok());
  w->data = w->data.Flat().View(0, {4}).value();
  w->grad = Tensor::Zeros({4});
  absl::Status s = sgd->Step();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("SGD"));
  EXPECT_THAT(s.message(), HasSubstr("'fc1.weight'"));
  EXPECT_THAT(s.message(), HasSubstr("momentum_buffer"));
  EXPECT_THAT(s.message(), HasSubstr("8 elements"));
}

TEST(SgdTest, RejectsBadOptionsNamingTheOption) {
  struct Case {
    const char* option;
    SgdOptions options;
  };
  std::vector<Case> cases;
  SgdOptions o;
  o.lr = -0.1;
  cases.push_back({"lr", o});
  o = SgdOptions();
  o.lr = std::nan("");
  cases.push_back({"lr", o});
  o = SgdOptions();
  o.momentum = -0.5;
  cases.push_back({"momentum", o});
  o = SgdOptions();
  o.dampening = INFINITY;
  cases.push_back({"dampening", o});
  o = SgdOptions();
  o.weight_decay = -1e-4;
  cases.push_back({"weight_decay", o});
  o = SgdOptions();
  o.nesterov = true;  // momentum 0
  cases.push_back({"nesterov", o});
  o.momentum = 0.9;
  o.dampening = 0.1;
  cases.push_back({"nesterov", o});
  for (const Case& c : cases) {
    auto sgd = SGD::Create(std::vector<ParameterPtr>{MakeParam({1})}, c.options);
    EXPECT_EQ(sgd.status().code(), absl::StatusCode::kInvalidArgument) << c.option;
    EXPECT_THAT(sgd.status().message(), HasSubstr(std::string("SgdOptions.") + c.option));
  }
  o = SgdOptions();
  o.momentum = 0.9;
  o.nesterov = true;
  EXPECT_TRUE(SGD::Create(std::vector<ParameterPtr>{MakeParam({1})}, o).ok());
}

}  // namespace
}  // namespace optim
