// The policy author's test: the registered name builds the policy, its plan of the MLP
// has one unit per MlpBlock plus the root, and equal options give equal identities.
#include "mlp_blocks_policy.h"

#include "gtest/gtest.h"
#include "mlp.h"
#include "policy/plan.h"
#include "policy/registry.h"

namespace consumer {
namespace {

TEST(MlpBlocksPolicyTest, IsRegisteredAndPlansOneUnitPerBlockPlusTheRoot) {
  auto mlp = Mlp::Create({8, 32, 32, 4}, 7);
  ASSERT_TRUE(mlp.ok()) << mlp.status();
  policy::PolicyParams params;
  params.Add("min_params", "100");
  auto p = policy::PolicyRegistry::Global().Create("mlp_blocks", params);
  ASSERT_TRUE(p.ok()) << p.status();
  auto plan = policy::Plan(**mlp, **p, /*world_size=*/2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->units_size(), 3);
  EXPECT_EQ(plan->units(0).path(), "block0");
  EXPECT_EQ(plan->units(1).path(), "block1");
  EXPECT_EQ(plan->units(2).path(), "");  // the root, with the head
  // block0 holds 8*32+32 = 288 elements: a threshold above that leaves it to the root.
  EXPECT_EQ(policy::Plan(**mlp, *MlpBlocks(300), 2)->units_size(), 3 - 1);
}

TEST(MlpBlocksPolicyTest, EqualOptionsDecideAlikeAndBadOptionsAreRefused) {
  EXPECT_EQ(MlpBlocks(5)->Identity(), MlpBlocks(5)->Identity());
  EXPECT_NE(MlpBlocks(5)->Identity(), MlpBlocks(6)->Identity());
  policy::PolicyParams bad;
  bad.Add("min_params", "-1");
  EXPECT_EQ(policy::PolicyRegistry::Global().Create("mlp_blocks", bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  policy::PolicyParams unknown;
  unknown.Add("types", "MlpBlock");
  EXPECT_EQ(policy::PolicyRegistry::Global().Create("mlp_blocks", unknown).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace consumer
