// RunAndCompare and ExpectMatches on a reference held in memory: one weight, its gradient and
// the loss. They load the weights before the run, measure what the run gives against the
// file, and fail a test for a scalar or a gradient out of bounds.
#include "nn/testing/torch_reference.h"

#include <vector>

#include "core/parameter.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"

namespace nn {
namespace torch_ref {
namespace {

// param.w [2] = {1, 2}, grad.w = {0.5, -4}, loss 3.
ReferenceFile File() {
  ReferenceFile f;
  f.tensors["param.w"] = {"F32", {2}, {1, 2}};
  f.tensors["grad.w"] = {"F64", {2}, {0.5, -4}};
  f.tensors["loss"] = {"F64", {}, {3}};
  return f;
}

// Runs a "model" of one parameter w whose backward leaves `grad` and that computes `ours`.
absl::StatusOr<Comparison> RunToy(std::vector<float> grad, Scalars ours) {
  core::ParameterPtr w = core::Parameter::Make(core::Tensor::Zeros({2}));
  return RunAndCompare(File(), {{"w", w}}, [&]() -> absl::StatusOr<Scalars> {
    EXPECT_EQ(w->data.ToVector(), (std::vector<float>{1, 2}));  // loaded before the run
    ASSIGN_OR_RETURN(w->grad, core::Tensor::FromVector(grad, {2}));
    return ours;
  });
}

TEST(TorchReferenceTest, RunAndCompareMeasuresTheLossAndEachGradient) {
  absl::StatusOr<Comparison> c = RunToy({0.5f, -4.004f}, {{"loss", 3.003}});
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->scalars.size(), 1u);
  EXPECT_EQ(c->scalars[0].name, "loss");
  EXPECT_NEAR(c->scalars[0].relative, 1e-3, 1e-12);
  ASSERT_EQ(c->grads.params.size(), 1u);
  EXPECT_EQ(c->grads.worst.name, "w");
  EXPECT_EQ(c->grads.worst.max_reference, 4.0);
  EXPECT_NEAR(c->grads.worst.ratio, 1e-3, 1e-6);  // |-4.004f + 4| / 4

  ExpectMatches(*c, 2e-3, 2e-3, "toy");
  EXPECT_NONFATAL_FAILURE(ExpectMatches(*c, 5e-4, 2e-3, "toy"), "toy: loss");
  EXPECT_NONFATAL_FAILURE(ExpectMatches(*c, 2e-3, 5e-4, "toy"), "toy: gradient of w");
}

// A gradient whose reference is all zeros proves nothing: ExpectMatches fails it.
TEST(TorchReferenceTest, ExpectMatchesFailsAnAllZeroReferenceGradient) {
  Comparison c;
  c.grads.params.push_back({"w", 0.0, 0.0});
  EXPECT_NONFATAL_FAILURE(ExpectMatches(c, 1, 1, "toy"), "toy: w");
}

TEST(TorchReferenceTest, RunAndCompareRejectsAScalarTheFileLacks) {
  absl::StatusOr<Comparison> c = RunToy({0.5f, -4.0f}, {{"aux", 1.0}});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
}

}  // namespace
}  // namespace torch_ref
}  // namespace nn
