#include "optim/adamw.h"

#include <cmath>
#include <memory>
#include <vector>

#include "core/allocator.h"
#include "core/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_runtime.h"
#include "kernels/optim.h"

namespace optim {
namespace {

using core::MemoryTag;
using core::Parameter;
using core::ParameterPtr;
using core::Tensor;
using ::testing::HasSubstr;

// The implementation computes in float32 and the expectations are exact (double) values
// of PyTorch's published rule. Parameters here are at most 2 in magnitude and each step
// rounds about ten times at <= 0.5 ulp (1.2e-7 at 2), and the update lr * m_hat /
// (sqrt(v_hat) + eps) is a ratio whose relative error is a few float epsilons times lr;
// over three steps that stays below 1e-6 with margin. The smallest difference the tests
// rely on (eps placement, bias correction) is above 1e-3.
constexpr double kTol = 1e-6;

// PyTorch's AdamW algorithm (torch.optim.AdamW documentation), in double, one scalar:
//   theta <- theta - lr * wd * theta
//   m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
//   m_hat <- m / (1 - b1^t); v_hat <- v / (1 - b2^t)
//   theta <- theta - lr * m_hat / (sqrt(v_hat) + eps)
struct ReferenceAdamW {
  double lr, b1, b2, eps, wd;
  double theta, m = 0, v = 0;
  int t = 0;
  double Step(double g) {
    ++t;
    theta -= lr * wd * theta;
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    const double m_hat = m / (1 - std::pow(b1, t));
    const double v_hat = v / (1 - std::pow(b2, t));
    theta -= lr * m_hat / (std::sqrt(v_hat) + eps);
    return theta;
  }
};

ParameterPtr MakeParam(std::vector<float> values) {
  return Parameter::Make(Tensor::FromVector(values, {static_cast<int64_t>(values.size())}).value());
}

void SetGrad(const ParameterPtr& p, std::vector<float> grad) {
  p->grad = Tensor::FromVector(grad, {static_cast<int64_t>(grad.size())}).value();
}

std::unique_ptr<AdamW> MakeAdamW(std::vector<ParameterPtr> params, AdamWOptions options) {
  absl::StatusOr<std::unique_ptr<AdamW>> opt = AdamW::Create(std::move(params), options);
  EXPECT_TRUE(opt.ok()) << opt.status();
  return *std::move(opt);
}

const std::vector<std::vector<float>> kGrads = {
    {0.1f, -0.2f, 0.3f}, {-0.05f, 0.4f, 0.3f}, {0.2f, 0.0f, -0.1f}};

TEST(AdamWTest, DefaultsArePyTorchs) {
  const AdamWOptions o;
  EXPECT_EQ(o.lr, 1e-3);
  EXPECT_EQ(o.beta1, 0.9);
  EXPECT_EQ(o.beta2, 0.999);
  EXPECT_EQ(o.eps, 1e-8);
  EXPECT_EQ(o.weight_decay, 1e-2);
}

TEST(AdamWTest, FirstThreeStepsMatchPyTorchsRuleWrittenOut) {
  ParameterPtr p = MakeParam({1.0f, -0.5f, 2.0f});
  AdamWOptions o;
  o.lr = 0.1;
  o.weight_decay = 0.1;
  auto opt = MakeAdamW({p}, o);
  // Values of the rule above evaluated in double (Python floats) for these gradients.
  // Step 1 by hand for the first element: theta = 1 * (1 - 0.01) = 0.99, m_hat = g,
  // v_hat = g^2, so theta = 0.99 - 0.1 * 0.1 / (0.1 + 1e-8) = 0.8900000100.
  const std::vector<std::vector<double>> expected = {{0.8900000100, -0.3950000050, 1.8800000033},
                                                     {0.8544663093, -0.4276603565, 1.7612000066},
                                                     {0.7801104912, -0.4516836606, 1.6830182147}};
  for (int step = 0; step < 3; ++step) {
    SetGrad(p, kGrads[step]);
    ASSERT_TRUE(opt->Step().ok());
    const std::vector<float> got = p->data.ToVector();
    for (int i = 0; i < 3; ++i) {
      // The written-out values carry 10 decimals, so they are good to 5e-11.
      EXPECT_NEAR(got[i], expected[step][i], kTol) << "step " << step + 1 << " element " << i;
    }
  }
}

TEST(AdamWTest, EpsIsAddedToSqrtOfBiasCorrectedSecondMoment) {
  // Large eps and small betas make each ingredient visible: eps inside the sqrt, eps
  // before bias correction, or a missing bias correction all move the result by > 1e-3.
  const std::vector<float> init = {1.0f, -0.5f, 2.0f};
  ParameterPtr p = MakeParam(init);
  AdamWOptions o;
  o.lr = 0.1;
  o.beta1 = 0.5;
  o.beta2 = 0.75;
  o.eps = 0.5;
  o.weight_decay = 0.1;
  auto opt = MakeAdamW({p}, o);
  std::vector<ReferenceAdamW> ref;
  for (float x : init) ref.push_back({o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, x});
  for (int step = 0; step < 3; ++step) {
    SetGrad(p, kGrads[step]);
    ASSERT_TRUE(opt->Step().ok());
    const std::vector<float> got = p->data.ToVector();
    for (int i = 0; i < 3; ++i) {
      EXPECT_NEAR(got[i], ref[i].Step(kGrads[step][i]), kTol)
          << "step " << step + 1 << " element " << i;
    }
  }
  // Step 1, first element, by hand: 0.99 - 0.1 * 0.1 / (0.1 + 0.5) = 0.97333...; with eps
  // under the square root it would be 0.99 - 0.01 / sqrt(0.51) = 0.97600...
  ParameterPtr q = MakeParam({1.0f});
  auto single = MakeAdamW({q}, o);
  SetGrad(q, {0.1f});
  ASSERT_TRUE(single->Step().ok());
  EXPECT_NEAR(q->data.ToVector()[0], 0.99 - 0.01 / 0.6, kTol);
  EXPECT_GT(std::fabs(q->data.ToVector()[0] - (0.99 - 0.01 / std::sqrt(0.51))), 1e-3);
}

TEST(AdamWTest, WeightDecayIsDecoupledFromTheGradient) {
  // With a zero gradient Adam's update is 0 / (0 + eps) = 0, so only the decoupled decay
  // p *= (1 - lr * wd) acts; L2-style decay (wd * p added to g) would move p by ~lr.
  ParameterPtr p = MakeParam({2.0f});
  SetGrad(p, {0.0f});
  AdamWOptions o;
  o.lr = 0.1;
  o.weight_decay = 0.5;
  auto opt = MakeAdamW({p}, o);
  ASSERT_TRUE(opt->Step().ok());
  ASSERT_TRUE(opt->Step().ok());
  EXPECT_NEAR(p->data.ToVector()[0], 2.0 * 0.95 * 0.95, kTol);
}

TEST(AdamWTest, BiasCorrectionCountsEachParametersOwnSteps) {
  // PyTorch keeps state['step'] per parameter: a parameter whose first gradient arrives
  // at the optimizer's second step takes a first step (m_hat = g, v_hat = g^2, an update
  // of lr * g / (|g| + eps)), not a second one.
  ParameterPtr early = MakeParam({0.0f});
  ParameterPtr late = MakeParam({0.0f});
  AdamWOptions o;
  o.lr = 0.1;
  o.weight_decay = 0.0;
  auto opt = MakeAdamW({early, late}, o);
  SetGrad(early, {0.5f});
  ASSERT_TRUE(opt->Step().ok());
  SetGrad(late, {0.5f});
  ASSERT_TRUE(opt->Step().ok());
  EXPECT_NEAR(late->data.ToVector()[0], -0.1 * 0.5 / (0.5 + 1e-8), kTol);
  ReferenceAdamW ref{o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, 0.0};
  ref.Step(0.5);
  EXPECT_NEAR(early->data.ToVector()[0], ref.Step(0.5), kTol);
  EXPECT_EQ(opt->State().param_steps,
            (std::vector<std::pair<std::string, int64_t>>{{"#0", 2}, {"#1", 1}}));
}

TEST(AdamWTest, StepsOnlyTheSliceAParameterViews) {
  Tensor full = Tensor::FromVector({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {10}).value();
  ParameterPtr shard = Parameter::Make(full.View(2, {5}).value());
  SetGrad(shard, {1, -1, 1, -1, 1});
  AdamWOptions o;
  o.lr = 0.1;
  auto opt = MakeAdamW({shard}, o);
  ASSERT_TRUE(opt->Step().ok());
  const std::vector<float> v = full.ToVector();
  for (int i = 0; i < 10; ++i) {
    if (i >= 2 && i < 7) {
      const double g = (i % 2 == 0) ? 1.0 : -1.0;
      ReferenceAdamW ref{o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, static_cast<double>(i)};
      // Magnitudes up to 6 here: 2e-6 covers a few ulps (4.8e-7 each) of float rounding.
      EXPECT_NEAR(v[i], ref.Step(g), 2e-6) << "inside the slice at " << i;
    } else {
      EXPECT_EQ(v[i], static_cast<float>(i)) << "outside the slice at " << i;
    }
  }
  const auto state = opt->StateTensors();
  ASSERT_EQ(state.size(), 2u);
  EXPECT_EQ(state[0].first, "#0.exp_avg");
  EXPECT_EQ(state[1].first, "#0.exp_avg_sq");
  EXPECT_EQ(state[0].second.numel(), 5);
}

TEST(AdamWTest, SkipsFrozenAndGradlessParameters) {
  ParameterPtr frozen = MakeParam({1.0f, 2.0f});
  frozen->requires_grad = false;
  SetGrad(frozen, {1.0f, 1.0f});
  ParameterPtr gradless = MakeParam({3.0f});
  auto opt = MakeAdamW({frozen, gradless}, AdamWOptions());
  ASSERT_TRUE(opt->Step().ok());
  EXPECT_EQ(frozen->data.ToVector(), (std::vector<float>{1.0f, 2.0f}));
  EXPECT_EQ(gradless->data.ToVector(), (std::vector<float>{3.0f})) << "no weight decay either";
  EXPECT_TRUE(opt->StateTensors().empty());
}

TEST(AdamWTest, StateIsTwoFloat32TensorsPerSteppedParameterUnderKOptim) {
  auto allocator = std::make_shared<core::Allocator>(core::Device::Cpu());
  core::ScopedAllocator scope(allocator);
  ParameterPtr w = Parameter::Make(Tensor::Zeros({16, 8}));
  ParameterPtr frozen = Parameter::Make(Tensor::Zeros({100}), /*requires_grad=*/false);
  ASSERT_TRUE(w->EnsureGrad().ok());
  ASSERT_TRUE(frozen->EnsureGrad().ok());
  auto opt = MakeAdamW({w, frozen}, AdamWOptions());
  EXPECT_EQ(allocator->Stats().current(MemoryTag::kOptim), 0) << "allocated lazily";
  ASSERT_TRUE(opt->Step().ok());
  // exp_avg and exp_avg_sq for the 128 elements of w; nothing for the frozen parameter.
  EXPECT_EQ(allocator->Stats().current(MemoryTag::kOptim), 2 * 128 * 4);
  ASSERT_TRUE(opt->Step().ok());
  EXPECT_EQ(allocator->Stats().peak(MemoryTag::kOptim), 2 * 128 * 4) << "no per-step scratch";
  opt->ResetState();
  EXPECT_EQ(allocator->Stats().current(MemoryTag::kOptim), 0);
}

TEST(AdamWTest, ShardingAfterTheFirstStepIsReportedByParameterName) {
  ParameterPtr w = Parameter::Make(Tensor::Zeros({3, 4}));
  ASSERT_TRUE(w->EnsureGrad().ok());
  auto opt = AdamW::Create(std::vector<core::NamedParameter>{{"blocks.1.mlp.fc.weight", w}},
                           AdamWOptions())
                 .value();
  ASSERT_TRUE(opt->Step().ok());
  w->data = w->data.Flat().View(6, {6}).value();
  w->grad = Tensor::Zeros({6});
  absl::Status s = opt->Step();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("AdamW"));
  EXPECT_THAT(s.message(), HasSubstr("'blocks.1.mlp.fc.weight'"));
  EXPECT_THAT(s.message(), HasSubstr("6 elements"));
  EXPECT_THAT(s.message(), HasSubstr("12 elements"));
  EXPECT_THAT(s.message(), HasSubstr("after wrapping"));
}

TEST(AdamWTest, StateRoundTripContinuesIdentically) {
  ParameterPtr a = MakeParam({1.0f, -0.5f, 2.0f});
  ParameterPtr b = MakeParam({1.0f, -0.5f, 2.0f});
  AdamWOptions o;
  o.lr = 0.1;
  auto first = MakeAdamW({a}, o);
  SetGrad(a, kGrads[0]);
  ASSERT_TRUE(first->Step().ok());
  ASSERT_TRUE(b->data.CopyFrom(a->data).ok());
  auto second = MakeAdamW({b}, o);
  ASSERT_TRUE(second->LoadState(first->State()).ok());
  SetGrad(a, kGrads[1]);
  SetGrad(b, kGrads[1]);
  ASSERT_TRUE(first->Step().ok());
  ASSERT_TRUE(second->Step().ok());
  EXPECT_EQ(a->data.ToVector(), b->data.ToVector()) << "same state, same arithmetic";
  EXPECT_EQ(second->step_count(), 2);
}

TEST(AdamWTest, RejectsBadOptionsNamingTheOption) {
  struct Case {
    const char* option;
    AdamWOptions options;
  };
  std::vector<Case> cases;
  auto with = [](auto set) {
    AdamWOptions o;
    set(o);
    return o;
  };
  cases.push_back({"lr", with([](AdamWOptions& o) { o.lr = -1e-3; })});
  cases.push_back({"lr", with([](AdamWOptions& o) { o.lr = std::nan(""); })});
  cases.push_back({"beta1", with([](AdamWOptions& o) { o.beta1 = 1.0; })});
  cases.push_back({"beta1", with([](AdamWOptions& o) { o.beta1 = -0.1; })});
  cases.push_back({"beta2", with([](AdamWOptions& o) { o.beta2 = 1.0; })});
  cases.push_back({"beta2", with([](AdamWOptions& o) { o.beta2 = std::nan(""); })});
  cases.push_back({"eps", with([](AdamWOptions& o) { o.eps = 0.0; })});
  cases.push_back({"eps", with([](AdamWOptions& o) { o.eps = -1e-8; })});
  cases.push_back({"weight_decay", with([](AdamWOptions& o) { o.weight_decay = -0.01; })});
  for (const Case& c : cases) {
    auto opt = AdamW::Create(std::vector<ParameterPtr>{MakeParam({1})}, c.options);
    EXPECT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument) << c.option;
    EXPECT_THAT(opt.status().message(), HasSubstr(std::string("AdamWOptions.") + c.option));
  }
  // The edges of the valid ranges are accepted.
  AdamWOptions edge;
  edge.lr = 0.0;
  edge.beta1 = 0.0;
  edge.beta2 = 0.0;
  edge.weight_decay = 0.0;
  EXPECT_TRUE(AdamW::Create(std::vector<ParameterPtr>{MakeParam({1})}, edge).ok());
}

// The vectorised, thread-split CPU loop (FSDP_CPU_CLONES, ParallelChunks) updates every
// element bit for bit as the scalar body kernels::AdamWUpdate does, on 1 and 3 threads,
// at a length that is not a multiple of any vector width.
TEST(AdamWTest, CpuLoopMatchesTheScalarBodyBitForBitOnAnyThreadCount) {
  const int64_t n = 100003;
  std::vector<float> w0(n), g(n);
  for (int64_t i = 0; i < n; ++i) {
    w0[i] = std::sin(0.37f * i);
    g[i] = std::cos(0.91f * i) * (i % 7 == 0 ? 1e-3f : 1.0f);
  }
  AdamWOptions options;
  options.lr = 0.01;
  options.weight_decay = 0.1;
  // Scalar reference: three steps through the shared body.
  std::vector<float> w = w0, m(n, 0.0f), v(n, 0.0f);
  for (int t = 1; t <= 3; ++t) {
    const kernels::AdamWScalars s = kernels::MakeAdamWScalars(
        options.lr, options.beta1, options.beta2, options.eps, options.weight_decay, t);
    for (int64_t i = 0; i < n; ++i) kernels::AdamWUpdate(&w[i], &m[i], &v[i], g[i], s);
  }
  const int saved = kernels::IntraOpThreads();
  for (int threads : {1, 3}) {
    ASSERT_TRUE(kernels::SetIntraOpThreads(threads).ok());
    ParameterPtr p = MakeParam(w0);
    std::unique_ptr<AdamW> opt = MakeAdamW({p}, options);
    for (int t = 1; t <= 3; ++t) {
      SetGrad(p, g);
      ASSERT_TRUE(opt->Step().ok());
    }
    const std::vector<float> got = p->data.ToVector();
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(got[i], w[i]) << "element " << i << " with " << threads << " threads";
    }
  }
  ASSERT_TRUE(kernels::SetIntraOpThreads(saved).ok());
}

}  // namespace
}  // namespace optim
