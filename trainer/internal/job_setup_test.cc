// --memory_plan: the plan and the per-rank estimate of the job as asked and in the four
// memory modes, for a model of any size (built deferred), without starting a rank.
#include "trainer/internal/job_setup.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace integration {
namespace internal {
namespace {

using ::testing::HasSubstr;

TEST(MemoryPlanTest, PrintsThePlanAndEveryModesEstimate) {
  JobOptions job = JobOptionsFromFlags();
  job.world_size = 8;
  job.batch_size = 64;
  // GPT-2 XL's shapes (1.6 B parameters): planned without allocating them.
  job.gpt.vocab_size = 50304;
  job.gpt.block_size = 1024;
  job.train.seq_len = 1024;
  job.gpt.n_embd = 1600;
  job.gpt.n_layer = 48;
  job.gpt.n_head = 25;
  job.activation_checkpoint_every = 2;
  absl::StatusOr<std::string> report = MemoryPlanReport(job, absl::Seconds(10));
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_THAT(*report, HasSubstr("Wrap plan: 49 units, world size 8"));
  EXPECT_THAT(*report, HasSubstr("Activation checkpointing (every_kth(TransformerBlock; k=2))"));
  for (const char* mode :
       {"as asked", "no checkpointing, full init", "every block checkpointed, full init",
        "no checkpointing, deferred init", "every block checkpointed, deferred init"}) {
    EXPECT_THAT(*report, HasSubstr(mode)) << *report;
  }
  // Deferred init removes the full model each rank would build (init 0B).
  for (absl::string_view line : absl::StrSplit(*report, '\n')) {
    if (absl::StrContains(line, "deferred init")) {
      EXPECT_THAT(std::string(line), HasSubstr(" 0B "));
    }
  }
}

// On a CUDA device the report adds the offload mode: no model state on the device, the
// host column holding it (20 bytes per shard element: NOTE [Memory estimate]).
TEST(MemoryPlanTest, OnACudaDeviceItShowsOffloadWithTheStateOnTheHost) {
  JobOptions job = JobOptionsFromFlags();
  job.device = "cuda";
  job.world_size = 1;
  job.gpt.n_layer = 4;
  absl::StatusOr<std::string> report = MemoryPlanReport(job, absl::Seconds(10));
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_THAT(*report, HasSubstr("cuda:0"));
  bool found = false;
  for (absl::string_view line : absl::StrSplit(*report, '\n')) {
    if (!absl::StrContains(line, "deferred, offload")) continue;
    found = true;
    std::vector<std::string> columns = absl::StrSplit(line, ' ', absl::SkipEmpty());
    ASSERT_GE(columns.size(), 7u) << line;
    // ... init, state, gathered, activations, comm, host: state is 0B.
    EXPECT_EQ(columns[columns.size() - 5], "0B") << line;
    EXPECT_NE(columns.back(), "0B") << line;
  }
  EXPECT_TRUE(found) << *report;
}

// --model=llama: one unit per LlamaDecoderLayer, checkpointing applied to them, and no
// activation figure (the GPT's formula does not cover the Llama), said in the report.
TEST(MemoryPlanTest, PlansTheLlamaWithoutAnActivationFigure) {
  JobOptions job = JobOptionsFromFlags();
  job.model_kind = "llama";
  job.world_size = 4;
  job.llama.num_hidden_layers = 6;
  job.llama.num_key_value_heads = 2;
  job.activation_checkpoint_every = 3;
  absl::StatusOr<std::string> report = MemoryPlanReport(job, absl::Seconds(10));
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_THAT(*report, HasSubstr("Wrap plan: 7 units, world size 4"));
  EXPECT_THAT(*report, HasSubstr("layers.5"));
  EXPECT_THAT(*report, HasSubstr("every_kth(LlamaDecoderLayer; k=3)"));
  EXPECT_THAT(*report, HasSubstr("leaves out the activations"));
  int rows = 0;
  for (absl::string_view line : absl::StrSplit(*report, '\n')) {
    const bool row = absl::StartsWith(line, "  as asked") ||
                     (absl::StrContains(line, " init ") && !absl::StartsWith(line, "  mode"));
    if (!row) continue;
    ++rows;
    std::vector<std::string> columns = absl::StrSplit(line, ' ', absl::SkipEmpty());
    ASSERT_GE(columns.size(), 7u) << line;
    // ... gathered, activations, comm, host: the activations are "-".
    EXPECT_EQ(columns[columns.size() - 3], "-") << line;
  }
  EXPECT_EQ(rows, 5) << *report;
  // A bad Llama flag names the flag.
  job.llama.num_key_value_heads = 4;
  job.llama.num_attention_heads = 6;  // hidden 64 is not 6 heads of an even width
  report = MemoryPlanReport(job, absl::Seconds(10));
  EXPECT_EQ(report.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(report.status().message(), HasSubstr("--n_embd (64) must be --n_head (6)"));
}

TEST(MemoryPlanTest, BadOptionsAreErrorsNamingTheFlag) {
  JobOptions job = JobOptionsFromFlags();
  job.activation_checkpoint_every = -1;
  absl::StatusOr<std::string> report = MemoryPlanReport(job, absl::Seconds(10));
  EXPECT_EQ(report.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(report.status().message(), HasSubstr("--activation_checkpoint_every"));
}

}  // namespace
}  // namespace internal
}  // namespace integration
