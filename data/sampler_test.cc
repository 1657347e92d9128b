#include "data/sampler.h"

#include <vector>

#include "core/tensor.h"
#include "data/markov_language.h"
#include "data/regression.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace data {
namespace {

using ::testing::HasSubstr;

// Concatenates the ranks' local parts in rank order, checking that each is a view of
// `global` at its own row offset, so the parts are disjoint and cover it in order.
std::vector<float> UnionOfRanks(const core::Tensor& global, int world) {
  std::vector<float> all;
  const int64_t row_numel = global.numel() / global.size(0);
  for (int r = 0; r < world; ++r) {
    const RankSampler sampler = RankSampler::Create(r, world).value();
    const core::Tensor local = sampler.Local(global).value();
    EXPECT_TRUE(local.SharesStorage(global)) << "rank " << r << " of " << world;
    EXPECT_EQ(local.size(0), global.size(0) / world);
    EXPECT_EQ(local.offset(), global.offset() + r * local.size(0) * row_numel);
    for (int64_t d = 1; d < global.dim(); ++d) EXPECT_EQ(local.size(d), global.size(d));
    const std::vector<float> part = local.ToVector();
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

TEST(SamplerTest, RanksPartitionTokenBatchesForOneToFourRanks) {
  const MarkovLanguage lang = MarkovLanguage::Create(MarkovLanguageOptions()).value();
  const TokenBatch global = lang.Batch(7, 12, 5).value();
  for (int world = 1; world <= 4; ++world) {
    EXPECT_EQ(UnionOfRanks(global.inputs, world), global.inputs.ToVector()) << world;
    EXPECT_EQ(UnionOfRanks(global.targets, world), global.targets.ToVector()) << world;
    for (int r = 0; r < world; ++r) {
      const TokenBatch local = RankSampler::Create(r, world).value().Local(global).value();
      EXPECT_EQ(local.inputs.shape(), (core::Shape{12 / world, 5}));
      EXPECT_EQ(local.targets.shape(), (core::Shape{12 / world, 5}));
      EXPECT_EQ(local.inputs.dtype(), core::DType::kInt32);
    }
  }
}

TEST(SamplerTest, RanksPartitionRegressionBatchesAndOtherShapes) {
  RegressionOptions o;
  o.in_features = 3;
  o.out_features = 2;
  const RegressionTask task = RegressionTask::Create(o).value();
  const RegressionBatch global = task.Batch(0, 12).value();
  core::Tensor cube = core::Tensor::Empty({12, 2, 3});
  for (int64_t i = 0; i < cube.numel(); ++i) cube.data<float>()[i] = static_cast<float>(i);
  for (int world = 1; world <= 4; ++world) {
    EXPECT_EQ(UnionOfRanks(global.inputs, world), global.inputs.ToVector()) << world;
    EXPECT_EQ(UnionOfRanks(global.targets, world), global.targets.ToVector()) << world;
    EXPECT_EQ(UnionOfRanks(cube, world), cube.ToVector()) << world;
    const RankSampler last = RankSampler::Create(world - 1, world).value();
    const RegressionBatch local = last.Local(global).value();
    EXPECT_EQ(local.inputs.shape(), (core::Shape{12 / world, 3}));
    EXPECT_EQ(local.targets.shape(), (core::Shape{12 / world, 2}));
    EXPECT_EQ(last.Rows(12).value(), (std::pair<int64_t, int64_t>(12 - 12 / world, 12)));
  }
}

TEST(SamplerTest, IndivisibleBatchNamesBatchSizeAndWorldSize) {
  const RankSampler sampler = RankSampler::Create(1, 4).value();
  const core::Tensor global = core::Tensor::Zeros({10, 3});
  absl::StatusOr<core::Tensor> local = sampler.Local(global);
  EXPECT_EQ(local.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(local.status().message(), HasSubstr("batch size 10"));
  EXPECT_THAT(local.status().message(), HasSubstr("world size 4"));
  EXPECT_EQ(sampler.Rows(6).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SamplerTest, RejectsBadRanksAndMalformedBatches) {
  EXPECT_EQ(RankSampler::Create(0, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RankSampler::Create(2, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RankSampler::Create(-1, 2).status().code(), absl::StatusCode::kInvalidArgument);
  const RankSampler sampler = RankSampler::Create(0, 2).value();
  EXPECT_EQ(sampler.Local(core::Tensor()).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sampler.Local(core::Tensor::Zeros({})).status().code(),
            absl::StatusCode::kInvalidArgument);
  RegressionBatch mismatched{core::Tensor::Zeros({4, 2}), core::Tensor::Zeros({6, 1})};
  EXPECT_EQ(sampler.Local(mismatched).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SamplerTest, RowsAreViewsOfTheBatchAndOutOfRangeRowsAreErrors) {
  const core::Tensor t = core::Tensor::FromVector({0, 1, 2, 3, 4, 5, 6, 7}, {4, 2}).value();
  const core::Tensor middle = Rows(t, 1, 3).value();
  EXPECT_EQ(middle.shape(), (core::Shape{2, 2}));
  EXPECT_THAT(middle.ToVector(), ::testing::ElementsAre(2, 3, 4, 5));
  EXPECT_EQ(middle.data<float>(), t.data<float>() + 2) << "a view, not a copy";
  EXPECT_EQ(Rows(t, 2, 2).value().numel(), 0);
  EXPECT_THAT(Rows(t, 3, 5).status().message(), HasSubstr("rows [3, 5)"));
  EXPECT_EQ(Rows(t, -1, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Rows(t, 2, 1).status().code(), absl::StatusCode::kInvalidArgument);
  TokenBatch mismatched{core::Tensor::Zeros({4, 2}), core::Tensor::Zeros({3, 2})};
  EXPECT_EQ(Rows(mismatched, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace data
