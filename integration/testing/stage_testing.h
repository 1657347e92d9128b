// Test-only: the small GPT and stage options the integration tests share, and helpers
// for thread-rank tests of the StageRunner.
//
//   ASSERT_OK(integration::testing::RunRanks(2, [](comm::testing::RankContext& ctx) -> absl::Status
//   {
//     ASSIGN_OR_RETURN(auto module, integration::GptTrainModule::Create(
//                                       integration::testing::TinyGpt(16, 16, 3)));
//     ASSIGN_OR_RETURN(auto runner, integration::StageRunner::Create(
//                                       ctx.group, integration::testing::TinyStages(4, 6)));
//     ...
//     ASSIGN_OR_RETURN(integration::FitResult fit, runner->Fit(*module));
//     EXPECT_EQ(fit.losses.size(), 6u);
//     RETURN_IF_ERROR(integration::testing::NoFailuresYet());  // as an ASSERT_* would
//     EXPECT_LT(fit.losses[5], fit.losses[0]);
//     return absl::OkStatus();
//   }));
//
// Rank functions return a Status, so they check with EXPECT_* (gtest assertions are
// thread-safe and print the values) and stop early through NoFailuresYet().
#ifndef INTEGRATION_TESTING_STAGE_TESTING_H_
#define INTEGRATION_TESTING_STAGE_TESTING_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "comm/testing/thread_ranks.h"
#include "gtest/gtest.h"
#include "integration/gpt_module.h"
#include "integration/stage_options.h"

namespace integration {
namespace testing {

// A Gpt of 2 blocks with 2 heads over 8 positions, vocabulary `vocab` and width `width`,
// seeded by `seed` (the language by seed + 1); AdamW lr 1e-2, 2 warm-up steps. A step
// takes milliseconds.
GptModuleOptions TinyGpt(int64_t vocab, int64_t width, uint64_t seed);

// One unit per TransformerBlock plus the root; `rows` rows per global batch (train and
// eval), 2 evaluation batches, `fit_steps` steps per Fit, progress every `log_every`.
StageOptions TinyStages(int rows, int64_t fit_steps, int64_t log_every = 0);

// RunThreadRanks with a 120 s deadline for the whole run.
absl::Status RunRanks(int n, const comm::testing::RankFunction& fn);

// OK while no assertion of the running test has failed (on any thread), otherwise
// Internal: a rank function returns it where a failed EXPECT_* would make the rest
// unsafe (an index past the end) or meaningless, as an ASSERT_* ends a test body.
absl::Status NoFailuresYet();

}  // namespace testing
}  // namespace integration

#define INTEGRATION_ASSERT_OK(expr)                        \
  do {                                                     \
    const absl::Status _status = (expr);                   \
    ASSERT_TRUE(_status.ok()) << #expr << ": " << _status; \
  } while (0)

#endif  // INTEGRATION_TESTING_STAGE_TESTING_H_
