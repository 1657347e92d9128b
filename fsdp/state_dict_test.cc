// State dicts: full (all ranks, rank 0 only) equal to the unwrapped model's parameters,
// round trips, a full dict saved at N = 2 loaded into a model wrapped at N = 4, sharded
// dicts whose parts tile every parameter, and load errors that change nothing.
#include "fsdp/state_dict.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "comm/testing/thread_ranks.h"
#include "core/status_macros.h"
#include "data/sampler.h"
#include "fsdp/fully_shard.h"
#include "fsdp/testing/gpt_training.h"
#include "gtest/gtest.h"
#include "nn/nn.h"
#include "optim/adamw.h"

namespace fsdp {
namespace {

using Values = std::vector<std::pair<std::string, std::vector<float>>>;

Values ToValues(const StateDict& dict) {
  Values out;
  for (const auto& [name, t] : dict) out.emplace_back(name, t.ToVector());
  return out;
}

// Trains `steps` AdamW steps on this rank's slices.
absl::Status Train(comm::testing::RankContext& ctx, nn::Gpt& gpt,
                   const testing::GptTrainingSetup& setup, int steps) {
  ASSIGN_OR_RETURN(data::MarkovLanguage language, testing::MakeLanguage(setup));
  ASSIGN_OR_RETURN(auto sampler, data::RankSampler::Create(ctx.rank, ctx.world_size));
  ASSIGN_OR_RETURN(auto adamw, optim::AdamW::Create(gpt.NamedParameters(), setup.adamw));
  for (int step = 0; step < steps; ++step) {
    ASSIGN_OR_RETURN(data::TokenBatch global,
                     language.Batch(step, setup.global_batch, setup.seq_len));
    ASSIGN_OR_RETURN(data::TokenBatch local, sampler.Local(global));
    adamw->ZeroGrad();
    RETURN_IF_ERROR(testing::ForwardBackward(gpt, local).status());
    RETURN_IF_ERROR(adamw->Step());
  }
  return absl::OkStatus();
}

TEST(FullStateDictTest, EqualsTheUnwrappedModelAndRank0OnlyLeavesOthersEmpty) {
  testing::GptTrainingSetup setup = testing::TinySetup();
  setup.steps = 3;
  absl::StatusOr<testing::TrainingRun> reference = testing::TrainUnwrapped(setup);
  ASSERT_TRUE(reference.ok()) << reference.status();
  absl::Status s =
      comm::testing::RunThreadRanks(3, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(setup));
        WrapperRegistry registry;
        ASSIGN_OR_RETURN(
            auto handle,
            FullyShard(gpt, ctx.group, testing::PerBlockOptions(ShardingStrategy::kFullShard),
                       &registry));
        RETURN_IF_ERROR(Train(ctx, *gpt, setup, setup.steps));
        ASSIGN_OR_RETURN(StateDict full, FullStateDict(*gpt, &registry));
        testing::TrainingRun run;
        run.losses = reference->losses;  // not compared here
        run.params = ToValues(full);
        RETURN_IF_ERROR(
            testing::CompareRuns(*reference, run, 1e-5, 1e-6));  // NOTE [Parity tolerance]
        // Independent copies: editing the dict leaves the model alone.
        full[0].second.Fill(3.0f);
        ASSIGN_OR_RETURN(StateDict again, FullStateDict(*gpt, &registry));
        EXPECT_EQ(ToValues(again), run.params);
        ASSIGN_OR_RETURN(StateDict rank0, FullStateDict(*gpt, &registry, {/*rank0_only=*/true}));
        if (ctx.rank == 0) {
          EXPECT_EQ(ToValues(rank0), run.params);
        } else {
          EXPECT_TRUE(rank0.empty());
        }
        for (const auto& [name, p] : gpt->NamedParameters()) EXPECT_EQ(p->data.dim(), 1) << name;
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(FullStateDictTest, SavedAtTwoRanksLoadsIntoAModelWrappedAtFour) {
  testing::GptTrainingSetup setup = testing::TinySetup();
  absl::Mutex mu;
  StateDict saved;  // rank 0's, at N = 2
  std::vector<float> logits_before;
  absl::Status s =
      comm::testing::RunThreadRanks(2, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(setup));
        WrapperRegistry registry;
        ASSIGN_OR_RETURN(
            auto handle,
            FullyShard(gpt, ctx.group, testing::PerBlockOptions(ShardingStrategy::kFullShard),
                       &registry));
        RETURN_IF_ERROR(Train(ctx, *gpt, setup, 4));
        ASSIGN_OR_RETURN(StateDict full, FullStateDict(*gpt, &registry, {/*rank0_only=*/true}));
        ASSIGN_OR_RETURN(data::MarkovLanguage language, testing::MakeLanguage(setup));
        ASSIGN_OR_RETURN(data::TokenBatch batch, language.Batch(50, 3, setup.seq_len));
        ASSIGN_OR_RETURN(core::Tensor logits, gpt->Forward(batch.inputs));
        if (ctx.rank == 0) {
          absl::MutexLock lock(&mu);
          saved = std::move(full);
          logits_before = logits.ToVector();
        }
        return absl::OkStatus();
      });
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_FALSE(saved.empty());
  testing::GptTrainingSetup other = setup;
  other.gpt.seed = 99;  // different initial weights: everything must come from the dict
  s = comm::testing::RunThreadRanks(4, [&](comm::testing::RankContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(other));
    WrapperRegistry registry;
    ASSIGN_OR_RETURN(
        auto handle,
        FullyShard(gpt, ctx.group, testing::PerBlockOptions(ShardingStrategy::kHybridShard, 2),
                   &registry));
    RETURN_IF_ERROR(LoadFullStateDict(*gpt, &registry, saved));
    ASSIGN_OR_RETURN(StateDict loaded, FullStateDict(*gpt, &registry));
    EXPECT_EQ(ToValues(loaded), ToValues(saved));  // exact: copies of float32 values
    ASSIGN_OR_RETURN(data::MarkovLanguage language, testing::MakeLanguage(setup));
    ASSIGN_OR_RETURN(data::TokenBatch batch, language.Batch(50, 3, setup.seq_len));
    ASSIGN_OR_RETURN(core::Tensor logits, gpt->Forward(batch.inputs));
    EXPECT_EQ(logits.ToVector(), logits_before);
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(ShardedStateDictTest, PartsTileEveryParameterAndRoundTrip) {
  testing::GptTrainingSetup setup = testing::TinySetup();
  constexpr int kWorld = 3;
  absl::Mutex mu;
  std::vector<std::vector<ShardedTensor>> parts(kWorld);
  absl::Status s =
      comm::testing::RunThreadRanks(kWorld, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(setup));
        WrapperRegistry registry;
        FullyShardOptions options = testing::PerBlockOptions(ShardingStrategy::kFullShard);
        options.ignored_paths = {"ln_f"};  // unmanaged: replicated in the sharded dict
        ASSIGN_OR_RETURN(auto handle, FullyShard(gpt, ctx.group, options, &registry));
        RETURN_IF_ERROR(Train(ctx, *gpt, setup, 2));
        ASSIGN_OR_RETURN(StateDict before, FullStateDict(*gpt, &registry));
        ASSIGN_OR_RETURN(std::vector<ShardedTensor> mine, ShardedStateDict(*gpt, &registry));
        RETURN_IF_ERROR(Train(ctx, *gpt, setup, 2));  // move away from the saved values
        ASSIGN_OR_RETURN(StateDict moved, FullStateDict(*gpt, &registry));
        EXPECT_NE(ToValues(moved), ToValues(before));
        RETURN_IF_ERROR(LoadShardedStateDict(*gpt, &registry, mine));
        ASSIGN_OR_RETURN(StateDict after, FullStateDict(*gpt, &registry));
        EXPECT_EQ(ToValues(after), ToValues(before));
        // Check each part against the full values.
        std::map<std::string, std::vector<float>> full;
        for (const auto& [name, t] : before) full[name] = t.ToVector();
        for (const ShardedTensor& t : mine) {
          const std::vector<float> local = t.local.ToVector();
          EXPECT_EQ(static_cast<int64_t>(local.size()), t.end - t.begin) << t.name;
          for (int64_t k = t.begin; k < t.end; ++k) EXPECT_EQ(local[k - t.begin], full[t.name][k]);
          EXPECT_EQ(t.replicated, absl::StartsWith(t.name, "ln_f.")) << t.name;
          EXPECT_EQ(t.unit.empty(), t.replicated) << t.name;
          if (!t.replicated) {
            EXPECT_EQ(t.shard_size, kWorld);
          }
        }
        absl::MutexLock lock(&mu);
        parts[ctx.rank] = std::move(mine);
        return absl::OkStatus();
      });
  ASSERT_TRUE(s.ok()) << s;
  // Over the ranks, the parts of each split parameter are disjoint and cover it.
  for (size_t i = 0; i < parts[0].size(); ++i) {
    const ShardedTensor& first = parts[0][i];
    if (first.replicated) continue;
    int64_t next = 0;
    for (int r = 0; r < kWorld; ++r) {
      const ShardedTensor& t = parts[r][i];
      EXPECT_EQ(t.name, first.name);
      EXPECT_EQ(t.shard_rank, r);
      EXPECT_EQ(t.begin, next) << t.name << " rank " << r;
      next = t.end;
    }
    EXPECT_EQ(next, core::NumElements(first.full_shape)) << first.name;
  }
}

TEST(StateDictErrorsTest, BadKeysShapesAndLayoutsChangeNothing) {
  testing::GptTrainingSetup setup = testing::TinySetup();
  absl::Status s =
      comm::testing::RunThreadRanks(2, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(setup));
        WrapperRegistry registry;
        ASSIGN_OR_RETURN(
            auto handle,
            FullyShard(gpt, ctx.group, testing::PerBlockOptions(ShardingStrategy::kFullShard),
                       &registry));
        ASSIGN_OR_RETURN(StateDict good, FullStateDict(*gpt, &registry));
        StateDict zeros;
        for (const auto& [name, t] : good) zeros.emplace_back(name, core::Tensor::Zeros(t.shape()));

        StateDict missing(zeros.begin() + 1, zeros.end());
        absl::Status st = LoadFullStateDict(*gpt, &registry, missing);
        EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
        EXPECT_TRUE(absl::StrContains(st.message(), "missing key 'wte.weight'")) << st;

        StateDict extra = zeros;
        extra.emplace_back("lm_head.weight", core::Tensor::Zeros({1}));
        st = LoadFullStateDict(*gpt, &registry, extra);
        EXPECT_TRUE(absl::StrContains(st.message(), "unexpected key 'lm_head.weight'")) << st;

        StateDict twice = zeros;
        twice.push_back(zeros[2]);
        st = LoadFullStateDict(*gpt, &registry, twice);
        EXPECT_TRUE(absl::StrContains(st.message(), "key 'blocks.0.ln_1.weight' appears twice"))
            << st;

        StateDict wrong = zeros;
        wrong.back().second = core::Tensor::Zeros({3});
        st = LoadFullStateDict(*gpt, &registry, wrong);
        EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
        EXPECT_TRUE(absl::StrContains(st.message(), "key 'ln_f.bias'")) << st;
        EXPECT_TRUE(absl::StrContains(st.message(), "[16]")) << st;

        // None of these wrote anything: the zeros never landed.
        ASSIGN_OR_RETURN(StateDict now, FullStateDict(*gpt, &registry));
        EXPECT_EQ(ToValues(now), ToValues(good));

        // A sharded dict from another layout (here: rank 1's parts on rank 0 and back).
        ASSIGN_OR_RETURN(std::vector<ShardedTensor> mine, ShardedStateDict(*gpt, &registry));
        std::vector<ShardedTensor> shifted = mine;
        for (ShardedTensor& t : shifted) t.shard_rank = 1 - t.shard_rank;
        st = LoadShardedStateDict(*gpt, &registry, shifted);
        EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
        EXPECT_TRUE(absl::StrContains(st.message(), "a different layout")) << st;
        EXPECT_TRUE(absl::StrContains(st.message(), "key 'wte.weight'")) << st;
        EXPECT_EQ(LoadFullStateDict(*gpt, nullptr, good).code(),
                  absl::StatusCode::kInvalidArgument);
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
}

// NOTE [Agree before acting]: a dict that fits on rank 0 but not on rank 1 fails every
// rank with rank 1's error, within seconds, and writes nothing on any rank.
TEST(StateDictAgreementTest, ALoadThatFailsOnOneRankFailsEveryRankAndWritesNothing) {
  testing::GptTrainingSetup setup = testing::TinySetup();
  constexpr int kWorld = 2;
  std::vector<absl::Status> full_errors(kWorld), sharded_errors(kWorld);
  const absl::Time start = absl::Now();
  absl::Status s =
      comm::testing::RunThreadRanks(kWorld, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(setup));
        WrapperRegistry registry;
        ASSIGN_OR_RETURN(
            auto handle,
            FullyShard(gpt, ctx.group, testing::PerBlockOptions(ShardingStrategy::kFullShard),
                       &registry));
        ASSIGN_OR_RETURN(StateDict good, FullStateDict(*gpt, &registry));
        ASSIGN_OR_RETURN(std::vector<ShardedTensor> parts, ShardedStateDict(*gpt, &registry));

        // Full: rank 0's dict is valid (zeros), rank 1's lacks a key.
        StateDict zeros;
        for (const auto& [name, t] : good) zeros.emplace_back(name, core::Tensor::Zeros(t.shape()));
        if (ctx.rank == 1) zeros.erase(zeros.begin() + 3);
        full_errors[ctx.rank] = LoadFullStateDict(*gpt, &registry, zeros);

        // Sharded: rank 0's parts are its own (zeroed), rank 1's claim another layout.
        for (ShardedTensor& t : parts) t.local.Zero();
        if (ctx.rank == 1) parts[0].shard_rank = 0;
        sharded_errors[ctx.rank] = LoadShardedStateDict(*gpt, &registry, parts);

        // No rank wrote anything: the zeros never landed, on rank 0 either.
        ASSIGN_OR_RETURN(StateDict now, FullStateDict(*gpt, &registry));
        EXPECT_EQ(ToValues(now), ToValues(good)) << "rank " << ctx.rank;
        return absl::OkStatus();
      });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));  // the collectives' timeout is 30 s
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(full_errors[r].code(), absl::StatusCode::kInvalidArgument) << full_errors[r];
    EXPECT_TRUE(absl::StrContains(
        full_errors[r].message(),
        "rank 1: LoadFullStateDict(<root> (Gpt)): missing key 'blocks.0.ln_1.bias'"))
        << "rank " << r << ": " << full_errors[r];
    EXPECT_EQ(sharded_errors[r].code(), absl::StatusCode::kInvalidArgument) << sharded_errors[r];
    EXPECT_TRUE(absl::StrContains(sharded_errors[r].message(),
                                  "rank 1: LoadShardedStateDict(<root> (Gpt)): key 'wte.weight' "
                                  "was saved as elements"))
        << "rank " << r << ": " << sharded_errors[r];
  }
}

}  // namespace
}  // namespace fsdp
