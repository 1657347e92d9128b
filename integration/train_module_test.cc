// StepRows and ShareOfMean: the rows a step runs and the factor that makes the ranks' and
// micro-batches' averaged gradients those of the global batch's mean over its items.
#include "integration/train_module.h"

#include <utility>

#include "gtest/gtest.h"

namespace integration {
namespace {

StepContext Context(int rank, int world_size, int batch_size, int micro_batch = 0,
                    int micro_batches = 1) {
  StepContext ctx;
  ctx.rank = rank;
  ctx.world_size = world_size;
  ctx.batch_size = batch_size;
  ctx.micro_batch = micro_batch;
  ctx.micro_batches = micro_batches;
  return ctx;
}

TEST(StepRowsTest, RanksShareTheBatchAndMicroBatchesComeFirst) {
  using Rows = std::pair<int64_t, int64_t>;
  EXPECT_EQ(StepRows(Context(0, 1, 8)).value(), Rows(0, 8));
  EXPECT_EQ(StepRows(Context(1, 2, 8)).value(), Rows(4, 8));
  EXPECT_EQ(StepRows(Context(3, 4, 8)).value(), Rows(6, 8));
  // Micro-batch 1 of 2 is rows [8, 16); rank 1 of 4 runs [10, 12) of it.
  EXPECT_EQ(StepRows(Context(1, 4, 16, 1, 2)).value(), Rows(10, 12));
  // Every (micro-batch, rank) pair covers the batch once, in order.
  int64_t next = 0;
  for (int m = 0; m < 4; ++m) {
    for (int r = 0; r < 2; ++r) {
      const Rows rows = StepRows(Context(r, 2, 16, m, 4)).value();
      EXPECT_EQ(rows.first, next);
      next = rows.second;
    }
  }
  EXPECT_EQ(next, 16);
}

TEST(StepRowsTest, ABatchThatDoesNotDivideIsAnError) {
  EXPECT_EQ(StepRows(Context(0, 3, 8)).status().code(), absl::StatusCode::kInvalidArgument);
  absl::Status s = StepRows(Context(0, 1, 9, 0, 2)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("micro-batch 0 of 2"), std::string::npos) << s;
  EXPECT_FALSE(StepRows(Context(0, 1, 8, 2, 2)).ok());
}

TEST(ShareOfMeanTest, TheSharesScaledLocalMeansAverageToTheGlobalMean) {
  // Items per share (2 ranks x 2 micro-batches) and their sums of losses.
  const int64_t items[4] = {3, 7, 1, 5};
  const double sums[4] = {6.0, 7.0, 4.0, 10.0};
  double averaged = 0;
  for (int m = 0; m < 2; ++m) {
    for (int r = 0; r < 2; ++r) {
      const int i = 2 * m + r;
      const double share = ShareOfMean(Context(r, 2, 8, m, 2), items[i], 16).value();
      EXPECT_DOUBLE_EQ(share, items[i] * 4.0 / 16.0);
      averaged += sums[i] / items[i] * share / 4;  // FSDP's and the runner's 1 / shares
    }
  }
  EXPECT_DOUBLE_EQ(averaged, 27.0 / 16.0);
  // One rank, one micro-batch: 1.
  EXPECT_EQ(ShareOfMean(Context(0, 1, 8), 16, 16).value(), 1.0);
}

TEST(ShareOfMeanTest, CountsOutOfRangeAreErrors) {
  EXPECT_FALSE(ShareOfMean(Context(0, 1, 8), 1, 0).ok());
  EXPECT_FALSE(ShareOfMean(Context(0, 1, 8), -1, 4).ok());
  absl::Status s = ShareOfMean(Context(0, 1, 8), 5, 4).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("5 local items of 4"), std::string::npos) << s;
}

}  // namespace
}  // namespace integration
