#include "optim/optimizer.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/allocator.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace optim {
namespace {

using core::MemoryTag;
using core::NamedParameter;
using core::Parameter;
using core::ParameterPtr;
using core::Tensor;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The smallest optimizer over the shared machinery: p -= lr * g, and one state tensor
// "visits" that counts, per element, how many updates it received. Its arithmetic is
// exact in float for the small integers used here, so tests compare exactly.
class CountingOptimizer : public Optimizer {
 public:
  static absl::StatusOr<std::unique_ptr<CountingOptimizer>> Create(
      std::vector<NamedParameter> params, double lr) {
    RETURN_IF_ERROR(ValidateParameters("Counting", params));
    return std::unique_ptr<CountingOptimizer>(new CountingOptimizer(std::move(params), lr));
  }
  static absl::StatusOr<std::unique_ptr<CountingOptimizer>> Create(std::vector<ParameterPtr> params,
                                                                   double lr) {
    return Create(NameByIndex(std::move(params)), lr);
  }

  absl::Status Step() override {
    ASSIGN_OR_RETURN(std::vector<size_t> active, BeginStep());
    for (size_t i : active) {
      float* w = param(i).data.data<float>();
      const float* g = param(i).grad.data<float>();
      float* visits = state(i).tensors[0].data<float>();
      for (int64_t j = 0; j < param(i).data.numel(); ++j) {
        w[j] -= static_cast<float>(lr()) * g[j];
        visits[j] += 1.0f;
      }
    }
    return absl::OkStatus();
  }
  std::string TypeName() const override { return "Counting"; }
  std::vector<std::string> StateNames() const override { return {"visits"}; }

 private:
  CountingOptimizer(std::vector<NamedParameter> params, double lr)
      : Optimizer(std::move(params), lr) {}
};

ParameterPtr MakeParam(std::vector<float> values, std::vector<float> grad) {
  ParameterPtr p =
      Parameter::Make(Tensor::FromVector(values, {static_cast<int64_t>(values.size())}).value());
  if (!grad.empty()) {
    p->grad = Tensor::FromVector(grad, {static_cast<int64_t>(grad.size())}).value();
  }
  return p;
}

TEST(OptimizerTest, UnnamedParametersAreNamedByIndex) {
  ParameterPtr a = MakeParam({1}, {1});
  ParameterPtr b = MakeParam({2, 3}, {1, 1});
  auto opt = CountingOptimizer::Create(std::vector<ParameterPtr>{a, b}, 1.0).value();
  ASSERT_EQ(opt->named_parameters().size(), 2u);
  EXPECT_EQ(opt->named_parameters()[0].first, "#0");
  EXPECT_EQ(opt->named_parameters()[1].first, "#1");
  EXPECT_EQ(opt->named_parameters()[1].second, b);
  ASSERT_TRUE(opt->Step().ok());
  std::vector<std::string> keys;
  for (const auto& [key, t] : opt->StateTensors()) keys.push_back(key);
  EXPECT_THAT(keys, ElementsAre("#0.visits", "#1.visits"));
}

TEST(OptimizerTest, RejectsNullRepeatedAndBadlyNamedParameters) {
  ParameterPtr a = MakeParam({1}, {});
  ParameterPtr b = MakeParam({1}, {});
  auto null_param = CountingOptimizer::Create({{"x", a}, {"y", nullptr}}, 1.0);
  EXPECT_EQ(null_param.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(null_param.status().message(), HasSubstr("'y'"));

  auto twice = CountingOptimizer::Create({{"x", a}, {"again", a}}, 1.0);
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(twice.status().message(), HasSubstr("'again'"));
  EXPECT_THAT(twice.status().message(), HasSubstr("'x'"));

  auto same_name = CountingOptimizer::Create({{"x", a}, {"x", b}}, 1.0);
  EXPECT_EQ(same_name.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(same_name.status().message(), HasSubstr("'x'"));

  auto empty_name = CountingOptimizer::Create({{"", a}}, 1.0);
  EXPECT_EQ(empty_name.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(OptimizerTest, SkipsFrozenAndGradlessParameters) {
  ParameterPtr live = MakeParam({1, 2}, {1, 1});
  ParameterPtr frozen = MakeParam({5}, {1});
  frozen->requires_grad = false;
  ParameterPtr gradless = MakeParam({7}, {});
  auto opt =
      CountingOptimizer::Create({{"live", live}, {"frozen", frozen}, {"gradless", gradless}}, 1.0)
          .value();
  ASSERT_TRUE(opt->Step().ok());
  EXPECT_THAT(live->data.ToVector(), ElementsAre(0.0f, 1.0f));
  EXPECT_THAT(frozen->data.ToVector(), ElementsAre(5.0f));
  EXPECT_THAT(gradless->data.ToVector(), ElementsAre(7.0f));
  const OptimizerState state = opt->State();
  ASSERT_EQ(state.tensors.size(), 1u);
  EXPECT_EQ(state.tensors[0].first, "live.visits");
  ASSERT_EQ(state.param_steps.size(), 1u);
  EXPECT_EQ(state.param_steps[0], (std::pair<std::string, int64_t>("live", 1)));

  // Once the gradless parameter gets a gradient it takes its first step (a per-parameter
  // count of 1) while the other has taken two.
  gradless->grad = Tensor::FromVector({1}, {1}).value();
  ASSERT_TRUE(opt->Step().ok());
  EXPECT_EQ(opt->step_count(), 2);
  EXPECT_THAT(opt->State().param_steps,
              ElementsAre(std::pair<std::string, int64_t>("live", 2),
                          std::pair<std::string, int64_t>("gradless", 1)));
}

TEST(OptimizerTest, StateIsAllocatedLazilyUnderKOptimWithTheDataNumel) {
  auto allocator = std::make_shared<core::Allocator>(core::Device::Cpu());
  core::ScopedAllocator scope(allocator);
  ParameterPtr p = Parameter::Make(Tensor::Zeros({3, 5}, core::DType::kFloat32, MemoryTag::kParam));
  ASSERT_TRUE(p->EnsureGrad().ok());
  auto opt = CountingOptimizer::Create({{"w", p}}, 1.0).value();
  EXPECT_EQ(allocator->Stats().current(MemoryTag::kOptim), 0);
  EXPECT_TRUE(opt->StateTensors().empty());
  ASSERT_TRUE(opt->Step().ok());
  // One float32 state tensor of 15 elements.
  EXPECT_EQ(allocator->Stats().current(MemoryTag::kOptim), 15 * 4);
  const auto tensors = opt->StateTensors();
  ASSERT_EQ(tensors.size(), 1u);
  EXPECT_EQ(tensors[0].second.numel(), 15);
  EXPECT_EQ(tensors[0].second.dtype(), core::DType::kFloat32);
  EXPECT_EQ(tensors[0].second.storage()->tag(), MemoryTag::kOptim);
  opt->ResetState();
  EXPECT_TRUE(opt->StateTensors().empty());
  EXPECT_EQ(allocator->Stats().current(MemoryTag::kOptim), 15 * 4)
      << "still referenced by `tensors`";
}

TEST(OptimizerTest, ResetStateFreesStateMemory) {
  auto allocator = std::make_shared<core::Allocator>(core::Device::Cpu());
  core::ScopedAllocator scope(allocator);
  ParameterPtr p = MakeParam({1, 2, 3, 4}, {1, 1, 1, 1});
  auto opt = CountingOptimizer::Create({{"w", p}}, 1.0).value();
  ASSERT_TRUE(opt->Step().ok());
  EXPECT_EQ(allocator->Stats().current(MemoryTag::kOptim), 4 * 4);
  opt->ResetState();
  EXPECT_EQ(allocator->Stats().current(MemoryTag::kOptim), 0);
  EXPECT_EQ(opt->step_count(), 1) << "ResetState keeps step_count";
  EXPECT_TRUE(opt->State().param_steps.empty());
}

TEST(OptimizerTest, DataResizedAfterFirstStepIsFailedPreconditionNamingEverything) {
  ParameterPtr p = MakeParam({1, 2, 3, 4, 5, 6, 7, 8}, {1, 1, 1, 1, 1, 1, 1, 1});
  ParameterPtr other = MakeParam({10}, {1});
  auto opt = CountingOptimizer::Create({{"other", other}, {"layer.weight", p}}, 1.0).value();
  ASSERT_TRUE(opt->Step().ok());
  // "Shard" the parameter: its data becomes a 4-element slice, as FSDP would leave it.
  p->data = p->data.View(4, {4}).value();
  p->grad = Tensor::FromVector({1, 1, 1, 1}, {4}).value();
  absl::Status s = opt->Step();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("'layer.weight'"));
  EXPECT_THAT(s.message(), HasSubstr("4 elements"));
  EXPECT_THAT(s.message(), HasSubstr("8 elements"));
  EXPECT_THAT(s.message(), HasSubstr("after wrapping"));
  EXPECT_THAT(s.message(), HasSubstr("ResetState()"));
  // Nothing moved, not even the parameter listed before the bad one.
  EXPECT_THAT(other->data.ToVector(), ElementsAre(9.0f));
  EXPECT_THAT(p->data.ToVector(), ElementsAre(4.0f, 5.0f, 6.0f, 7.0f));
  EXPECT_EQ(opt->step_count(), 1);

  opt->ResetState();
  ASSERT_TRUE(opt->Step().ok());
  EXPECT_THAT(p->data.ToVector(), ElementsAre(3.0f, 4.0f, 5.0f, 6.0f));
  EXPECT_EQ(opt->StateTensors().back().second.numel(), 4);
}

TEST(OptimizerTest, GradientOfWrongSizeIsFailedPreconditionNamingTheParameter) {
  ParameterPtr ok = MakeParam({1}, {1});
  ParameterPtr bad = MakeParam({1, 2, 3}, {1, 1});
  auto opt = CountingOptimizer::Create({{"ok", ok}, {"blocks.0.bias", bad}}, 1.0).value();
  absl::Status s = opt->Step();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("'blocks.0.bias'"));
  EXPECT_THAT(s.message(), HasSubstr("gradient of 2 elements"));
  EXPECT_THAT(ok->data.ToVector(), ElementsAre(1.0f));
  EXPECT_EQ(opt->step_count(), 0);
  EXPECT_TRUE(opt->StateTensors().empty());
}

TEST(OptimizerTest, BadLearningRateFromSetLrIsRejectedAtStep) {
  ParameterPtr p = MakeParam({1}, {1});
  auto opt = CountingOptimizer::Create({{"w", p}}, 1.0).value();
  opt->set_lr(-0.5);
  EXPECT_EQ(opt->lr(), -0.5);
  absl::Status s = opt->Step();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("lr"));
  opt->set_lr(std::nan(""));
  EXPECT_EQ(opt->Step().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(p->data.ToVector(), ElementsAre(1.0f));
  opt->set_lr(0.5);
  ASSERT_TRUE(opt->Step().ok());
  EXPECT_THAT(p->data.ToVector(), ElementsAre(0.5f));
}

TEST(OptimizerTest, NonFloat32ParameterIsRejectedByName) {
  ParameterPtr p = Parameter::Make(Tensor::Zeros({2}, core::DType::kBFloat16));
  ASSERT_TRUE(p->EnsureGrad().ok());
  auto opt = CountingOptimizer::Create({{"emb", p}}, 1.0).value();
  absl::Status s = opt->Step();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'emb'"));
  EXPECT_THAT(s.message(), HasSubstr("bfloat16"));
}

TEST(OptimizerTest, ZeroGradZeroesOrDropsEveryGradient) {
  ParameterPtr a = MakeParam({1, 2}, {3, 4});
  ParameterPtr frozen = MakeParam({1}, {5});
  frozen->requires_grad = false;
  ParameterPtr none = MakeParam({1}, {});
  auto opt = CountingOptimizer::Create({{"a", a}, {"frozen", frozen}, {"none", none}}, 1.0).value();
  const Tensor a_grad = a->grad;
  opt->ZeroGrad();
  EXPECT_TRUE(a->grad.SharesStorage(a_grad)) << "zeroed in place";
  EXPECT_THAT(a->grad.ToVector(), ElementsAre(0.0f, 0.0f));
  EXPECT_THAT(frozen->grad.ToVector(), ElementsAre(0.0f));
  EXPECT_FALSE(none->grad.defined());
  opt->ZeroGrad(/*set_to_none=*/true);
  EXPECT_FALSE(a->grad.defined());
  EXPECT_FALSE(frozen->grad.defined());
}

TEST(OptimizerTest, LoadStateRestoresAnotherOptimizersStateAsCopies) {
  ParameterPtr a = MakeParam({1, 2}, {1, 1});
  ParameterPtr b = MakeParam({3}, {1});
  auto source = CountingOptimizer::Create({{"a", a}, {"b", b}}, 1.0).value();
  ASSERT_TRUE(source->Step().ok());
  b->grad = Tensor();
  ASSERT_TRUE(source->Step().ok());  // a: 2 steps, b: 1 step
  const OptimizerState saved = source->State();

  ParameterPtr a2 = MakeParam({0, 0}, {1, 1});
  ParameterPtr b2 = MakeParam({0}, {1});
  auto target = CountingOptimizer::Create({{"a", a2}, {"b", b2}}, 1.0).value();
  ASSERT_TRUE(target->LoadState(saved).ok());
  EXPECT_EQ(target->step_count(), 2);
  EXPECT_EQ(target->State().param_steps, saved.param_steps);
  const auto loaded = target->StateTensors();
  ASSERT_EQ(loaded.size(), 2u);
  EXPECT_EQ(loaded[0].first, "a.visits");
  EXPECT_THAT(loaded[0].second.ToVector(), ElementsAre(2.0f, 2.0f));
  EXPECT_THAT(loaded[1].second.ToVector(), ElementsAre(1.0f));
  EXPECT_FALSE(loaded[0].second.SharesStorage(saved.tensors[0].second));
  EXPECT_EQ(loaded[0].second.storage()->tag(), MemoryTag::kOptim);
  // The loaded state continues counting from where the source was.
  ASSERT_TRUE(target->Step().ok());
  EXPECT_THAT(target->StateTensors()[0].second.ToVector(), ElementsAre(3.0f, 3.0f));
  EXPECT_THAT(saved.tensors[0].second.ToVector(), ElementsAre(2.0f, 2.0f))
      << "the target's step must not touch the source's state";
}

TEST(OptimizerTest, LoadStateRejectsInconsistentStateAndChangesNothing) {
  ParameterPtr a = MakeParam({1, 2}, {1, 1});
  auto opt = CountingOptimizer::Create({{"a", a}}, 1.0).value();
  ASSERT_TRUE(opt->Step().ok());
  const Tensor two = Tensor::FromVector({5, 5}, {2}).value();
  const Tensor three = Tensor::FromVector({5, 5, 5}, {3}).value();

  OptimizerState unknown{7, {{"b.visits", two}}, {{"a", 1}}};
  absl::Status s = opt->LoadState(unknown);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'b.visits'"));

  OptimizerState wrong_size{7, {{"a.visits", three}}, {{"a", 1}}};
  s = opt->LoadState(wrong_size);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'a.visits'"));
  EXPECT_THAT(s.message(), HasSubstr("3 elements"));

  OptimizerState missing{7, {}, {{"a", 1}}};
  s = opt->LoadState(missing);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'a.visits' is missing"));

  OptimizerState without_steps{7, {{"a.visits", two}}, {}};
  EXPECT_EQ(opt->LoadState(without_steps).code(), absl::StatusCode::kInvalidArgument);

  OptimizerState unknown_param{7, {}, {{"zzz", 1}}};
  EXPECT_EQ(opt->LoadState(unknown_param).code(), absl::StatusCode::kInvalidArgument);

  EXPECT_EQ(opt->step_count(), 1);
  ASSERT_EQ(opt->StateTensors().size(), 1u);
  EXPECT_THAT(opt->StateTensors()[0].second.ToVector(), ElementsAre(1.0f, 1.0f));
}

}  // namespace
}  // namespace optim
