// ParamInit: any slice of a parameter filled on its own equals that slice of the whole
// (what lets FullyShard fill a deferred parameter's shard alone), the whole equals the
// draws the layers always made, and deferred parameters stay meta until filled.
#include "core/param_init.h"

#include <vector>

#include "core/module.h"
#include "core/parameter.h"
#include "core/random.h"
#include "gtest/gtest.h"

namespace core {
namespace {

std::vector<float> Filled(const ParamInit& init, int64_t begin, int64_t n) {
  Tensor t = Tensor::Empty({n});
  EXPECT_TRUE(init.Fill(t, begin).ok());
  return t.ToVector();
}

TEST(ParamInitTest, EverySliceIsThatSliceOfTheWhole) {
  for (const ParamInit& init :
       {ParamInit::Uniform(7, 0, -0.5f, 0.5f), ParamInit::Uniform(7, 13, -0.5f, 0.5f),
        ParamInit::Normal(9, 0, 0.0f, 0.02f), ParamInit::Normal(9, 5, 1.0f, 2.0f),
        ParamInit::Constant(3.0f)}) {
    SCOPED_TRACE(init.ToString());
    const std::vector<float> whole = Filled(init, 0, 100);
    for (int64_t begin : {0, 1, 37, 99}) {
      const std::vector<float> part = Filled(init, begin, 100 - begin);
      EXPECT_EQ(part, std::vector<float>(whole.begin() + begin, whole.end())) << begin;
    }
  }
}

TEST(ParamInitTest, TheWholeIsTheStreamsDrawsInOrder) {
  Rng uniform(7);
  uniform.Discard(13);  // skip 13 elements, one draw each
  Rng normal(9);
  normal.Discard(2 * 5);  // skip 5 elements, two draws each
  const std::vector<float> u = Filled(ParamInit::Uniform(7, 13, -0.5f, 0.5f), 0, 10);
  const std::vector<float> n = Filled(ParamInit::Normal(9, 5, 1.0f, 2.0f), 0, 10);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(u[i], uniform.Uniform(-0.5f, 0.5f)) << i;
    EXPECT_EQ(n[i], normal.Normal(1.0f, 2.0f)) << i;
  }
}

TEST(ParamInitTest, BadOutputsAreInvalidArgument) {
  const ParamInit init = ParamInit::Normal(1, 0, 0, 1);
  EXPECT_EQ(init.Fill(Tensor::Empty({4}, DType::kBFloat16), 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(init.Fill(Tensor(), 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(init.Fill(Tensor::Meta({4}), 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(init.Fill(Tensor::Empty({4}), -1).code(), absl::StatusCode::kInvalidArgument);
}

class Weighted : public Module {
 public:
  Weighted() {
    w_ = AllocateParameter("w", {3, 4});
    (void)InitParameter(*w_, ParamInit::Uniform(5, 0, -1, 1));
  }
  std::string TypeName() const override { return "Weighted"; }
  const ParameterPtr& w() const { return w_; }

 protected:
  absl::StatusOr<Tensor> ForwardImpl(const Tensor& x) override { return x; }
  absl::StatusOr<Tensor> BackwardImpl(const Tensor& g) override { return g; }

 private:
  ParameterPtr w_;
};

TEST(DeferredInitScopeTest, ParametersAreMetaWithTheirRecipeInsideAndFilledOutside) {
  EXPECT_FALSE(DeferredInitScope::Active());
  std::shared_ptr<Weighted> deferred;
  {
    DeferredInitScope scope;
    EXPECT_TRUE(DeferredInitScope::Active());
    deferred = std::make_shared<Weighted>();
  }
  EXPECT_FALSE(DeferredInitScope::Active());
  ASSERT_TRUE(deferred->w()->deferred());
  EXPECT_FALSE(deferred->w()->data.defined());
  EXPECT_EQ(deferred->w()->data.numel(), 12);
  EXPECT_EQ(deferred->w()->data.shape(), (Shape{3, 4}));
  EXPECT_EQ(deferred->w()->data.ToString(), "Tensor(float32, [3, 4], meta cpu)");
  ASSERT_NE(deferred->w()->init, nullptr);

  auto eager = std::make_shared<Weighted>();
  ASSERT_FALSE(eager->w()->deferred());
  // The recipe fills what the eager constructor filled.
  EXPECT_EQ(Filled(*deferred->w()->init, 0, 12), eager->w()->data.ToVector());
}

}  // namespace
}  // namespace core
