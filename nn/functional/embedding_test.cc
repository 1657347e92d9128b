#include "nn/functional/embedding.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/autograd.h"
#include "core/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/embedding.h"
#include "nn/functional/gradcheck.h"
#include "nn/functional/internal/layer_test_util.h"
#include "nn/to_device.h"

namespace nn {
namespace functional {
namespace {

using core::DType;
using core::Tensor;
using layer_test_util::ExpectSameBits;
using layer_test_util::Ids;
using layer_test_util::Random;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(EmbeddingTest, GathersRowsAndSumsTheGradientOfRepeatedIds) {
  const Tensor table = core::Leaf(Tensor::FromVector({0, 1, 10, 11, 20, 21}, {3, 2}).value());
  absl::StatusOr<Tensor> y = Embedding(Ids({2, 0, 2}, {1, 3}), table);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->shape(), (core::Shape{1, 3, 2}));
  EXPECT_THAT(y->ToVector(), ElementsAre(20, 21, 0, 1, 20, 21));
  ASSERT_TRUE(
      core::Backward({*y}, {Tensor::FromVector({1, 2, 3, 4, 5, 6}, {1, 3, 2}).value()}).ok());
  // Row 2 is used twice: 1 + 5 and 2 + 6; row 1 never.
  EXPECT_THAT(core::LeafGrad(table).ToVector(), ElementsAre(3, 4, 0, 0, 6, 8));
}

// NOTE [Functional Embedding]: output and table gradient with nn::Embedding's bits, for an
// fp32 and a bf16 table held as a parameter or as a plain leaf.
TEST(EmbeddingTest, MatchesTheLayerBitForBit) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (bool parameter : {true, false}) {
      SCOPED_TRACE(absl::StrCat(core::DTypeName(dtype), parameter ? " parameter" : " leaf"));
      nn::Embedding layer(11, 7, /*seed=*/5);
      ASSERT_TRUE(ConvertParameters(layer, dtype).ok());
      const Tensor ids = Ids({3, 10, 0, 3, 3, 7, 1, 9}, {2, 4});
      const Tensor g = Random({2, 4, 7}, 2);
      absl::StatusOr<Tensor> want_y = layer.Forward(ids);
      ASSERT_TRUE(want_y.ok()) << want_y.status();
      ASSERT_TRUE(layer.Backward(g).ok());

      core::ParameterPtr w = core::Parameter::Make(layer.weight()->data);
      const Tensor wl = core::Leaf(w->data);
      absl::StatusOr<Tensor> y = parameter ? Embedding(ids, w) : Embedding(ids, wl);
      ASSERT_TRUE(y.ok()) << y.status();
      ExpectSameBits(*y, *want_y, "output");
      ASSERT_TRUE(core::Backward({*y}, {g}).ok());
      ExpectSameBits(parameter ? w->grad : core::LeafGrad(wl), layer.weight()->grad,
                     "table gradient");
    }
  }
}

TEST(EmbeddingTest, GradientsPassTheCheck) {
  const Tensor ids = Ids({1, 4, 1, 0, 2, 4}, {3, 2});
  absl::StatusOr<gradcheck::Report> r = gradcheck::CheckGradients(
      [](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor y, Embedding(in[0], in[1]));
        return std::vector<Tensor>{y};
      },
      {ids, Random({5, 3}, 1)}, {}, {}, {"ids", "table"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok()) << r->ToString();
  EXPECT_EQ(r->num_checked, 15);
  EXPECT_GT(r->max_abs_numeric, 0.1);
}

TEST(EmbeddingTest, ScalarAndEmptyIds) {
  const Tensor table = Random({4, 3}, 1);
  absl::StatusOr<Tensor> one = Embedding(Ids({2}, {}), table);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->shape(), (core::Shape{3}));
  EXPECT_EQ(one->ToVector(), table.View(6, {3}).value().ToVector());
  absl::StatusOr<Tensor> none = Embedding(Ids({}, {0, 5}), table);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->shape(), (core::Shape{0, 5, 3}));
}

TEST(EmbeddingTest, BadArgumentsAreInvalidArgumentNamingThem) {
  const Tensor table = Tensor::Zeros({4, 3});
  absl::Status s = Embedding(Ids({0, 1, 4}, {3}), table).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("Embedding: id 4 at flat position 2 of ids [3] is outside [0, 4)"));
  s = Embedding(Ids({-1}, {1}), table).status();
  EXPECT_THAT(s.message(), HasSubstr("id -1"));
  s = Embedding(Tensor::Zeros({2}), table).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("Embedding: ids must be int32"));
  s = Embedding(Ids({0}, {1}), Tensor::Zeros({12})).status();
  EXPECT_THAT(s.message(), HasSubstr("Embedding: table must be 2-D"));
  s = Embedding(Ids({0}, {1}), Tensor::Zeros({4, 3}, DType::kInt32)).status();
  EXPECT_THAT(s.message(), HasSubstr("Embedding: table must be float32 or bfloat16"));
  EXPECT_THAT(Embedding(Tensor(), table).status().message(), HasSubstr("ids is undefined"));
}

TEST(EmbeddingTest, NoGradScopeRecordsNothing) {
  core::NoGradScope no_grad;
  absl::StatusOr<Tensor> y = Embedding(Ids({0}, {1}), core::Leaf(Tensor::Zeros({2, 2})));
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_FALSE(core::RequiresGrad(*y));
}

}  // namespace
}  // namespace functional
}  // namespace nn
