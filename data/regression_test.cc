#include "data/regression.h"

#include <cmath>
#include <vector>

#include "core/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace data {
namespace {

using ::testing::HasSubstr;

RegressionTask MakeTask(int in, int out, uint64_t seed) {
  RegressionOptions o;
  o.in_features = in;
  o.out_features = out;
  o.seed = seed;
  absl::StatusOr<RegressionTask> task = RegressionTask::Create(o);
  EXPECT_TRUE(task.ok()) << task.status();
  return *std::move(task);
}

TEST(RegressionTest, TargetsAreWeightTimesInputsPlusBias) {
  RegressionTask task = MakeTask(5, 3, 1);
  EXPECT_EQ(task.weight().shape(), (core::Shape{3, 5}));
  EXPECT_EQ(task.bias().shape(), (core::Shape{3}));
  const RegressionBatch batch = task.Batch(0, 7).value();
  EXPECT_EQ(batch.inputs.shape(), (core::Shape{7, 5}));
  EXPECT_EQ(batch.targets.shape(), (core::Shape{7, 3}));
  EXPECT_EQ(batch.inputs.dtype(), core::DType::kFloat32);
  const std::vector<float> x = batch.inputs.ToVector();
  const std::vector<float> y = batch.targets.ToVector();
  const std::vector<float> w = task.weight().ToVector();
  const std::vector<float> b = task.bias().ToVector();
  for (int r = 0; r < 7; ++r) {
    for (int o = 0; o < 3; ++o) {
      double expected = b[o];
      for (int i = 0; i < 5; ++i) expected += static_cast<double>(w[o * 5 + i]) * x[r * 5 + i];
      // The target is the double result rounded to float once: within half an ulp,
      // which is below 1e-6 relative.
      EXPECT_NEAR(y[r * 3 + o], expected, 1e-6 * std::max(1.0, std::fabs(expected)));
    }
  }
}

TEST(RegressionTest, InputsAreStandardNormal) {
  RegressionTask task = MakeTask(4, 1, 2);
  const std::vector<float> x = task.Batch(1, 5000).value().inputs.ToVector();
  const double n = static_cast<double>(x.size());
  double mean = 0, sq = 0;
  for (float v : x) mean += v;
  mean /= n;
  for (float v : x) sq += (v - mean) * (v - mean);
  const double var = sq / (n - 1);
  // 20000 draws: the mean's standard error is 1/sqrt(20000) = 0.0071 and the variance's
  // is sqrt(2/20000) = 0.01; allow 5 standard errors.
  EXPECT_NEAR(mean, 0.0, 5 * 0.0071);
  EXPECT_NEAR(var, 1.0, 5 * 0.01);
}

TEST(RegressionTest, BatchesAreDeterministicInSeedAndIndex) {
  RegressionTask a = MakeTask(6, 2, 9);
  RegressionTask b = MakeTask(6, 2, 9);
  EXPECT_EQ(a.weight().ToVector(), b.weight().ToVector());
  const RegressionBatch a4 = a.Batch(4, 8).value();
  const RegressionBatch a2 = a.Batch(2, 8).value();
  const RegressionBatch b2 = b.Batch(2, 8).value();
  const RegressionBatch b4 = b.Batch(4, 8).value();
  EXPECT_EQ(a4.inputs.ToVector(), b4.inputs.ToVector());
  EXPECT_EQ(a4.targets.ToVector(), b4.targets.ToVector());
  EXPECT_EQ(a2.inputs.ToVector(), b2.inputs.ToVector());
  EXPECT_NE(a2.inputs.ToVector(), a4.inputs.ToVector());
  // The first rows of a bigger batch are the smaller batch.
  const std::vector<float> big = a.Batch(4, 16).value().inputs.ToVector();
  EXPECT_EQ(std::vector<float>(big.begin(), big.begin() + 8 * 6), a4.inputs.ToVector());
  EXPECT_NE(MakeTask(6, 2, 10).weight().ToVector(), a.weight().ToVector());
}

TEST(RegressionTest, RejectsBadOptionsNamingTheOption) {
  RegressionOptions o;
  o.in_features = 0;
  auto bad_in = RegressionTask::Create(o);
  EXPECT_EQ(bad_in.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_in.status().message(), HasSubstr("in_features"));
  o = RegressionOptions();
  o.out_features = -3;
  auto bad_out = RegressionTask::Create(o);
  EXPECT_EQ(bad_out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_out.status().message(), HasSubstr("out_features"));
  RegressionTask task = MakeTask(2, 2, 0);
  EXPECT_EQ(task.Batch(0, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(task.Batch(-1, 4).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace data
