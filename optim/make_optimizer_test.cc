#include "optim/make_optimizer.h"

#include <memory>
#include <vector>

#include "core/parameter.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace optim {
namespace {

std::vector<core::NamedParameter> OneParameter() {
  auto p = std::make_shared<core::Parameter>();
  p->data = core::Tensor::FromVector({1.0f}, {1}).value();
  p->grad = core::Tensor::FromVector({0.5f}, {1}).value();
  return {{"w", p}};
}

TEST(MakeOptimizerTest, MakesTheKindAskedForWithItsOptions) {
  OptimizerOptions options;
  options.kind = OptimizerKind::kSgd;
  options.sgd.lr = 0.1;
  std::vector<core::NamedParameter> params = OneParameter();
  std::unique_ptr<Optimizer> sgd = MakeOptimizer(params, options).value();
  ASSERT_TRUE(sgd->Step().ok());
  EXPECT_FLOAT_EQ(params[0].second->data.ToVector()[0], 1.0f - 0.1f * 0.5f);  // w - lr g

  options = OptimizerOptions();
  options.adamw.lr = 0.01;
  options.adamw.weight_decay = 0;
  params = OneParameter();
  std::unique_ptr<Optimizer> adamw = MakeOptimizer(params, options).value();
  ASSERT_TRUE(adamw->Step().ok());
  // AdamW's first step moves by lr (times g / |g|, up to eps).
  EXPECT_NEAR(params[0].second->data.ToVector()[0], 1.0f - 0.01f, 1e-6);
}

TEST(MakeOptimizerTest, BadOptionsAreTheOptimizersErrors) {
  OptimizerOptions options;
  options.kind = OptimizerKind::kSgd;
  options.sgd.lr = -1;
  EXPECT_EQ(MakeOptimizer(OneParameter(), options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.kind = OptimizerKind::kAdamW;
  options.adamw.beta1 = 1.5;
  EXPECT_EQ(MakeOptimizer(OneParameter(), options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace optim
