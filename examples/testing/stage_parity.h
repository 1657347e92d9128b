// Test-only: what the examples' tests share to check a TrainModule through the StageRunner:
// a Fit on N thread ranks ending in Release (rank 0's global losses and full trained
// parameters), the strategy cases to run it under, and the deterministic mode's options.
//
//   ASSIGN_OR_RETURN(fsdp::testing::TrainingRun one, examples::testing::FitAndRelease(1, options,
//   make)); ASSIGN_OR_RETURN(fsdp::testing::TrainingRun four, examples::testing::FitAndRelease(4,
//   options, make)); RETURN_IF_ERROR(fsdp::testing::CompareRuns(one, four, 1e-5, 1e-6));
#ifndef EXAMPLES_TESTING_STAGE_PARITY_H_
#define EXAMPLES_TESTING_STAGE_PARITY_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fsdp/testing/gpt_training.h"
#include "gtest/gtest.h"
#include "integration/stage_options.h"
#include "integration/train_module.h"

namespace examples {
namespace testing {

// Makes a fresh TrainModule with the same initial weights on every call.
using ModuleFactory = std::function<absl::StatusOr<std::unique_ptr<integration::TrainModule>>()>;

// A fresh module on each of `world` thread ranks, one StageRunner::Fit of options.fit_steps
// steps, then Release: rank 0's losses and its full parameters by NamedParameters() name
// (every rank's are checked to be rank 0's, bit for bit).
absl::StatusOr<fsdp::testing::TrainingRun> FitAndRelease(int world,
                                                         const integration::StageOptions& options,
                                                         const ModuleFactory& make);

// The full parameters of a (released or never wrapped) model by NamedParameters() name.
std::vector<std::pair<std::string, std::vector<float>>> FullParameters(const core::Module& model);

// Every strategy at N = 2 and 4: FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, and HYBRID_SHARD 2 x 1
// and 2 x 2.
std::vector<fsdp::testing::StrategyCase> EveryStrategyCase();

// The stage API's lifecycle on the module `make` builds, with gtest failures as they happen:
// on 2 ranks, Fit 4 steps saving a checkpoint to `dir`, Validate and Test (both reusing the
// units: 0 parameter bytes copied; different held-out losses), Fit 2 more (reused, from step
// 4, saving again), Release (the same Module and Parameter objects); then a fresh module on 4
// ranks loads that checkpoint (model and optimizer, step 6), fits 2 more steps and releases.
// The N = 2 weights after 6 steps and the N = 4 losses and weights after 8 equal one rank's
// uninterrupted runs within NOTE [Parity tolerance] (fsdp/parity_test.cc). `options` gives
// the wrap and batch sizes (its fit_steps and checkpoint_dir are set here); `units` is the
// number of FSDP units its policy makes.
void CheckStagesAndResume(const ModuleFactory& make, integration::StageOptions options, int units,
                          const std::string& dir);

// FitAndRelease on c.world_size ranks under case c (WithStrategy) equals the same options'
// run on 1 rank within NOTE [Parity tolerance] (fsdp/parity_test.cc), and the run trains (its
// loss falls by 0.1 or more); gtest failures otherwise. Prints the worst |error| / tolerance.
void CheckParityWithOneRank(const integration::StageOptions& options, const ModuleFactory& make,
                            const fsdp::testing::StrategyCase& c);

// FitAndRelease on 1, 2 and 4 ranks gives the same losses and weights bit for bit (gtest
// failures otherwise): `options` in the deterministic mode (Deterministic below).
void CheckSameBitsAtEveryWorldSize(const integration::StageOptions& options,
                                   const ModuleFactory& make);

// `options` with the case's strategy (and hybrid size) and a 60 s collective timeout.
integration::StageOptions WithStrategy(integration::StageOptions options,
                                       const fsdp::testing::StrategyCase& c);

// `options` in the deterministic mode (NOTE [Deterministic training] in
// integration/stage_options.h) with `micro_batches` micro-batches per step.
integration::StageOptions Deterministic(integration::StageOptions options, int micro_batches);

}  // namespace testing
}  // namespace examples

// gtest checks of a Status and a StatusOr, printing the status on failure.
#define EXAMPLES_CONCAT_INNER(a, b) a##b
#define EXAMPLES_CONCAT(a, b) EXAMPLES_CONCAT_INNER(a, b)
#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  EXAMPLES_ASSERT_OK_AND_ASSIGN_IMPL(EXAMPLES_CONCAT(_status_or_, __LINE__), lhs, expr)
#define EXAMPLES_ASSERT_OK_AND_ASSIGN_IMPL(so, lhs, expr) \
  auto so = (expr);                                       \
  ASSERT_TRUE(so.ok()) << #expr << ": " << so.status();   \
  lhs = std::move(so).value()
#define EXPECT_OK(expr) EXPECT_EQ(absl::OkStatus(), (expr))

#endif  // EXAMPLES_TESTING_STAGE_PARITY_H_
