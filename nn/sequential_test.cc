#include "nn/sequential.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/activations.h"
#include "nn/linear.h"
#include "nn/testing/gradcheck.h"

namespace nn {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<Sequential> MakeMlp() {
  return Sequential::Make({std::make_shared<Linear>(4, 6, true, 1), std::make_shared<GELU>(),
                           std::make_shared<Linear>(6, 3, false, 2)});
}

TEST(SequentialTest, ChildrenAreNamedByIndex) {
  std::shared_ptr<Sequential> seq = MakeMlp();
  ASSERT_EQ(seq->size(), 3u);
  EXPECT_EQ((*seq)[1]->TypeName(), "GELU");
  EXPECT_EQ(seq->modules()[2]->Path(), "2");
  std::vector<std::string> names;
  for (const auto& [name, p] : seq->NamedParameters()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "2.weight"}));
  EXPECT_EQ(seq->Describe(), "<root> (Sequential)");
}

TEST(SequentialTest, ForwardComposesInOrder) {
  auto a = std::make_shared<Linear>(4, 6, true, 1);
  auto g = std::make_shared<GELU>();
  auto b = std::make_shared<Linear>(6, 3, false, 2);
  std::shared_ptr<Sequential> seq = Sequential::Make({a, g, b});
  const core::Tensor x = gradcheck::RandomTensor({2, 4}, 3);
  absl::StatusOr<core::Tensor> y = seq->Forward(x);
  ASSERT_TRUE(y.ok()) << y.status();
  core::Tensor manual = b->Forward(g->Forward(a->Forward(x).value()).value()).value();
  EXPECT_EQ(y->ToVector(), manual.ToVector());
}

TEST(SequentialTest, BackwardRunsInReverseAndMatchesFiniteDifferences) {
  std::shared_ptr<Sequential> seq = MakeMlp();
  std::vector<std::string> order;
  std::vector<core::HookHandle> hooks;
  for (const auto& m : seq->modules()) {
    hooks.push_back(m->RegisterBackwardPreHook([&order](core::Module& mod) {
      order.push_back(mod.Path());
      return absl::OkStatus();
    }));
  }
  // Tolerances per NOTE [Gradient-check tolerance] (atol 1e-3, rtol 1e-2 with eps 1e-2).
  absl::StatusOr<gradcheck::Report> r =
      gradcheck::CheckModule(*seq, gradcheck::RandomTensor({3, 4}, 4), {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok()) << r->ToString();
  EXPECT_EQ(r->num_checked, 12 + 24 + 6 + 18);
  EXPECT_EQ(order, (std::vector<std::string>{"2", "1", "0"}));
}

TEST(SequentialTest, EmptyIsIdentityAndNullIsReported) {
  std::shared_ptr<Sequential> empty = Sequential::Make({});
  const core::Tensor x = gradcheck::RandomTensor({2}, 1);
  EXPECT_EQ(empty->Forward(x).value().ToVector(), x.ToVector());
  EXPECT_EQ(empty->Backward(x).value().ToVector(), x.ToVector());

  std::shared_ptr<Sequential> bad = Sequential::Make({std::make_shared<GELU>(), nullptr});
  EXPECT_EQ(bad->NamedChildren().size(), 1u);
  absl::StatusOr<core::Tensor> y = bad->Forward(x);
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(y.status().message()), HasSubstr("<root> (Sequential)"));
  EXPECT_THAT(std::string(y.status().message()), HasSubstr("module 1 is null"));
}

TEST(SequentialTest, ChildErrorNamesTheChildPath) {
  std::shared_ptr<Sequential> seq = MakeMlp();
  absl::StatusOr<core::Tensor> y = seq->Forward(core::Tensor::Zeros({2, 5}));
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(y.status().message()), HasSubstr("0 (Linear)"));
}

}  // namespace
}  // namespace nn
