#include "nn/embedding.h"

#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/testing/gradcheck.h"

namespace nn {
namespace {

using ::testing::HasSubstr;

core::Tensor Ids(std::vector<int32_t> v, core::Shape s) {
  return core::Tensor::FromInts(v, s).value();
}

TEST(EmbeddingTest, TableTooLargeToAllocateIsReportedNotFatal) {
  // 2^40 x 1024 floats: the constructor cannot return an error, so it records it.
  auto wte = std::make_shared<Embedding>(int64_t{1} << 40, 1024);
  absl::Status status = wte->ConstructionStatus();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("(Embedding): parameter 'weight'"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("[1099511627776, 1024]"));
  absl::StatusOr<core::Tensor> y = wte->Forward(Ids({0}, {1}));
  EXPECT_EQ(y.status().code(), absl::StatusCode::kResourceExhausted) << y.status();
}

TEST(EmbeddingTest, ForwardLooksUpRowsForAnyShape) {
  Embedding emb(4, 3, 1);
  const std::vector<float> table = emb.weight()->data.ToVector();
  absl::StatusOr<core::Tensor> y = emb.Forward(Ids({2, 0, 2, 3}, {2, 2}));
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->shape(), (core::Shape{2, 2, 3}));
  const std::vector<float> out = y->ToVector();
  const int ids[] = {2, 0, 2, 3};
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 3; ++j) EXPECT_EQ(out[i * 3 + j], table[ids[i] * 3 + j]);
  }
}

TEST(EmbeddingTest, InitIsStandardNormalAndSeeded) {
  Embedding a(100, 50, 3), b(100, 50, 3), c(100, 50, 4);
  EXPECT_EQ(a.NamedParameters().size(), 1u);
  EXPECT_EQ(a.NamedParameters()[0].first, "weight");
  EXPECT_EQ(a.weight()->data.ToVector(), b.weight()->data.ToVector());
  EXPECT_NE(a.weight()->data.ToVector(), c.weight()->data.ToVector());
  double s = 0.0, s2 = 0.0;
  for (float v : a.weight()->data.ToVector()) {
    s += v;
    s2 += static_cast<double>(v) * v;
  }
  const double n = 5000, mean = s / n, stddev = std::sqrt(s2 / n - mean * mean);
  // Standard errors over 5000 draws: mean 0.014, std 0.01; bounds are 5 sigma.
  EXPECT_NEAR(mean, 0.0, 0.07);
  EXPECT_NEAR(stddev, 1.0, 0.05);
}

TEST(EmbeddingTest, BackwardMatchesFiniteDifferencesWithRepeatedIds) {
  Embedding emb(5, 3, 2);
  // Id 1 appears three times, id 4 never: its rows' gradient must be exactly zero.
  const core::Tensor ids = Ids({1, 3, 1, 0, 2, 1}, {2, 3});
  // Embedding is linear in the table, so the central difference has no truncation
  // error and only fp32 rounding noise (~1e-5 here); atol 1e-3 / rtol 1e-2 per NOTE [Gradient-check
  // tolerance].
  gradcheck::Options o;
  absl::StatusOr<gradcheck::Report> r = gradcheck::CheckModule(emb, ids, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok()) << r->ToString();
  EXPECT_EQ(r->num_checked, 15);
  EXPECT_GT(r->max_abs_numeric, 0.5);
  const std::vector<float> g = emb.weight()->grad.ToVector();
  for (int j = 0; j < 3; ++j) EXPECT_EQ(g[4 * 3 + j], 0.0f);
}

TEST(EmbeddingTest, BackwardReturnsUndefinedInputGradient) {
  Embedding emb(5, 3);
  ASSERT_TRUE(emb.Forward(Ids({1, 2}, {2})).ok());
  absl::StatusOr<core::Tensor> gx = emb.Backward(core::Tensor::Zeros({2, 3}));
  ASSERT_TRUE(gx.ok()) << gx.status();
  EXPECT_FALSE(gx->defined());
  EXPECT_TRUE(emb.weight()->grad.defined());
}

TEST(EmbeddingTest, BadIdsAndTypesNameTheModuleAndId) {
  Embedding emb(5, 3);
  absl::StatusOr<core::Tensor> y = emb.Forward(Ids({1, 5}, {2}));
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(y.status().message()), HasSubstr("<root> (Embedding)"));
  EXPECT_THAT(std::string(y.status().message()), HasSubstr("id 5"));
  y = emb.Forward(Ids({-1}, {1}));
  EXPECT_THAT(std::string(y.status().message()), HasSubstr("id -1"));
  y = emb.Forward(core::Tensor::Zeros({2}));
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(y.status().message()), HasSubstr("int32"));
  EXPECT_EQ(emb.Backward(core::Tensor::Zeros({1, 3})).status().code(),
            absl::StatusCode::kFailedPrecondition);
  Embedding bad(5, -1);
  EXPECT_THAT(std::string(bad.Forward(Ids({0}, {1})).status().message()),
              HasSubstr("embedding_dim"));
}

TEST(EmbeddingTest, IdsAreCopiedSoReusingTheBufferIsSafe) {
  Embedding emb(5, 2, 1);
  core::Tensor ids = Ids({1, 2}, {2});
  ASSERT_TRUE(emb.Forward(ids).ok());
  ids.data<int32_t>()[0] = 1000;  // caller reuses its buffer before Backward
  ASSERT_TRUE(emb.Backward(core::Tensor::FromVector({1, 1, 1, 1}, {2, 2}).value()).ok());
  EXPECT_EQ(emb.weight()->grad.ToVector(), (std::vector<float>{0, 0, 1, 1, 1, 1, 0, 0, 0, 0}));
}

}  // namespace
}  // namespace nn
