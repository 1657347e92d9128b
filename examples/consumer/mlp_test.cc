// The consumer's model as graph modules: its parameters keep their names and the values
// nn::Linear gives from the same seed, the graph's gradients agree with the library's
// gradient checker, and a wrong call is an error, not a crash.
#include "mlp.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/autograd.h"
#include "core/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/functional/gradcheck.h"
#include "nn/linear.h"

namespace consumer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(MlpTest, ParametersAreNamedAndInitialisedAsLinearLayers) {
  absl::StatusOr<std::shared_ptr<Mlp>> mlp = Mlp::Create({3, 5, 4, 2}, 7);
  ASSERT_TRUE(mlp.ok()) << mlp.status();
  std::vector<std::string> names;
  for (const core::NamedParameter& p : (*mlp)->NamedParameters()) names.push_back(p.first);
  EXPECT_THAT(names, ElementsAre("block0.weight", "block0.bias", "block1.weight", "block1.bias",
                                 "head.weight", "head.bias"));
  // Block i starts where nn::Linear(sizes[i], sizes[i + 1], true, seed + i) starts.
  const nn::Linear linear1(5, 4, /*bias=*/true, 7 + 1);
  const core::Module& block1 = *(*mlp)->NamedChildren()[1].second;
  ASSERT_EQ(block1.TypeName(), "MlpBlock");
  EXPECT_EQ(block1.OwnParameters()[0].second->data.ToVector(), linear1.weight()->data.ToVector());
  EXPECT_EQ(block1.OwnParameters()[1].second->data.ToVector(), linear1.bias()->data.ToVector());
}

TEST(MlpTest, GradientsOfTheGraphMatchTheGradientChecker) {
  absl::StatusOr<std::shared_ptr<Mlp>> mlp = Mlp::Create({3, 6, 5, 2}, 11);
  ASSERT_TRUE(mlp.ok()) << mlp.status();
  std::shared_ptr<Mlp> net = *mlp;
  absl::StatusOr<nn::gradcheck::Report> r = nn::gradcheck::CheckGradients(
      [net](const std::vector<core::Tensor>& in) -> absl::StatusOr<std::vector<core::Tensor>> {
        ASSIGN_OR_RETURN(core::Tensor y, net->CallOne({in[0]}));
        return std::vector<core::Tensor>{y};
      },
      {nn::gradcheck::RandomTensor({4, 3}, 5)}, {}, net->NamedParameters(), {"x"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok()) << r->ToString();
  // x, then every element of every parameter: 12 + (18 + 6) + (30 + 5) + (10 + 2).
  EXPECT_EQ(r->num_checked, 83);
  EXPECT_GT(r->max_abs_numeric, 0.1);
}

TEST(MlpTest, RefusesBadSizesAndCallsOfTheWrongArity) {
  EXPECT_EQ(Mlp::Create({3}, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Mlp::Create({3, 0, 2}, 1).status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::shared_ptr<Mlp>> mlp = Mlp::Create({3, 4, 2}, 1);
  ASSERT_TRUE(mlp.ok()) << mlp.status();
  const core::Tensor x = nn::gradcheck::RandomTensor({2, 3}, 1);
  const absl::Status two = (*mlp)->Call({x, x}).status();
  EXPECT_EQ(two.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(two.message(), HasSubstr("takes 1 input, got 2"));
  // A wrong width reaches the block's Linear, which names it.
  const absl::Status wide = (*mlp)->CallOne({nn::gradcheck::RandomTensor({2, 5}, 1)}).status();
  EXPECT_EQ(wide.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wide.message(), HasSubstr("Linear"));
}

}  // namespace
}  // namespace consumer
