// Prefetch and overlap, proven from the runtime's recorded event order (never timing):
// the next unit's all-gather is issued before the current unit's backward computation
// begins, at most limit_all_gathers units are unsharded ahead, forward prefetch follows
// the previous forward's order, and a unit's reduce-scatter is still in flight while the
// next unit computes.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/testing/thread_ranks.h"
#include "core/status_macros.h"
#include "fsdp/fully_shard.h"
#include "fsdp/testing/gpt_training.h"
#include "gtest/gtest.h"

namespace fsdp {
namespace {

const char* const kRoot = "<root> (Gpt)";
std::string Block(int i) { return absl::StrCat("blocks.", i, " (TransformerBlock)"); }

// Position of the first event equal to `event` at or after `from`, or -1.
int Find(const std::vector<std::string>& events, const std::string& event, int from = 0) {
  for (int i = from; i < static_cast<int>(events.size()); ++i) {
    if (events[i] == event) return i;
  }
  return -1;
}

// Runs one training step (forward + backward) of a 4-block Gpt on 2 ranks and returns
// rank 0's events of the `iteration`-th step (0-based), from its first forward event on.
std::vector<std::string> RecordStep(const FullyShardOptions& options, int iterations = 1) {
  testing::GptTrainingSetup setup = testing::TinySetup();
  setup.gpt.n_layer = 4;
  std::vector<std::string> out;
  absl::Status s = comm::testing::RunThreadRanks(2, [&](comm::testing::RankContext& ctx)
                                                        -> absl::Status {
    ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(setup));
    ASSIGN_OR_RETURN(data::MarkovLanguage language, testing::MakeLanguage(setup));
    WrapperRegistry registry;
    ASSIGN_OR_RETURN(auto handle, FullyShard(gpt, ctx.group, options, &registry));
    for (int it = 0; it < iterations; ++it) {
      registry.ClearEvents();
      registry.RecordEvents(true);
      ASSIGN_OR_RETURN(data::TokenBatch batch, language.Batch(it, 4, setup.seq_len));
      RETURN_IF_ERROR(testing::ForwardBackward(*gpt, batch).status());
      registry.RecordEvents(false);
    }
    if (ctx.rank == 0) out = registry.events();
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

// The events of the backward only (from the root's backward all-gather on).
std::vector<std::string> BackwardPart(const std::vector<std::string>& events) {
  const int fwd_end = Find(events, absl::StrCat("reshard ", kRoot));
  EXPECT_GE(fwd_end, 0) << absl::StrJoin(events, "\n");
  return std::vector<std::string>(events.begin() + fwd_end + 1, events.end());
}

// The events of the forward only (up to the root's reshard).
std::vector<std::string> ForwardPart(const std::vector<std::string>& events) {
  const int fwd_end = Find(events, absl::StrCat("reshard ", kRoot));
  EXPECT_GE(fwd_end, 0) << absl::StrJoin(events, "\n");
  return std::vector<std::string>(events.begin(), events.begin() + fwd_end + 1);
}

// Largest number of units whose all-gather was issued while their computation had not
// yet begun (counted at each computation start).
int MaxAhead(const std::vector<std::string>& events, const std::string& begin_prefix) {
  std::set<std::string> issued;
  int max_ahead = 0;
  for (const std::string& e : events) {
    if (absl::StartsWith(e, "allgather_issued ")) issued.insert(e.substr(17));
    if (absl::StartsWith(e, begin_prefix)) {
      issued.erase(e.substr(begin_prefix.size()));
      max_ahead = std::max(max_ahead, static_cast<int>(issued.size()));
    }
  }
  return max_ahead;
}

TEST(PrefetchTest, BackwardPrefetchIssuesTheNextAllGatherBeforeTheCurrentComputeBegins) {
  FullyShardOptions options = testing::PerBlockOptions(ShardingStrategy::kFullShard);
  const std::vector<std::string> bwd = BackwardPart(RecordStep(options));
  const std::vector<std::string> order = {kRoot, Block(3), Block(2), Block(1), Block(0)};
  for (size_t i = 0; i + 1 < order.size(); ++i) {
    const int issued_next = Find(bwd, "allgather_issued " + order[i + 1]);
    const int compute = Find(bwd, "backward_compute_begin " + order[i]);
    ASSERT_GE(issued_next, 0) << absl::StrJoin(bwd, "\n");
    ASSERT_GE(compute, 0);
    EXPECT_LT(issued_next, compute) << order[i + 1] << " not prefetched before " << order[i]
                                    << "'s backward:\n" << absl::StrJoin(bwd, "\n");
  }
  // Exactly limit_all_gathers (2) units run ahead at the busiest moment, never more.
  EXPECT_EQ(MaxAhead(bwd, "backward_compute_begin "), 2) << absl::StrJoin(bwd, "\n");
}

TEST(PrefetchTest, WithoutBackwardPrefetchTheAllGatherWaitsForTheUnitsOwnBackward) {
  FullyShardOptions options = testing::PerBlockOptions(ShardingStrategy::kFullShard);
  options.backward_prefetch = false;
  const std::vector<std::string> bwd = BackwardPart(RecordStep(options));
  for (int b = 3; b >= 1; --b) {
    const int issued_next = Find(bwd, "allgather_issued " + Block(b - 1));
    const int compute = Find(bwd, "backward_compute_begin " + Block(b));
    EXPECT_GT(issued_next, compute) << absl::StrJoin(bwd, "\n");
  }
  EXPECT_EQ(MaxAhead(bwd, "backward_compute_begin "), 0);
}

TEST(PrefetchTest, LimitAllGathersBoundsTheUnitsAhead) {
  FullyShardOptions options = testing::PerBlockOptions(ShardingStrategy::kFullShard);
  options.limit_all_gathers = 1;
  const std::vector<std::string> bwd = BackwardPart(RecordStep(options));
  EXPECT_EQ(MaxAhead(bwd, "backward_compute_begin "), 1) << absl::StrJoin(bwd, "\n");
  // blocks.2 is prefetched before blocks.3 computes, blocks.1 only after.
  const int compute3 = Find(bwd, "backward_compute_begin " + Block(3));
  EXPECT_LT(Find(bwd, "allgather_issued " + Block(2)), compute3);
  EXPECT_GT(Find(bwd, "allgather_issued " + Block(1)), compute3);
  options.limit_all_gathers = 0;
  EXPECT_EQ(MaxAhead(BackwardPart(RecordStep(options)), "backward_compute_begin "), 0);
}

TEST(PrefetchTest, ForwardPrefetchFollowsThePreviousForwardsOrder) {
  FullyShardOptions options = testing::PerBlockOptions(ShardingStrategy::kFullShard);
  options.forward_prefetch = true;
  // The first forward has no recorded order; the second prefetches blocks.0 and
  // blocks.1 from the root's pre-hook, before the root computes.
  const std::vector<std::string> second = RecordStep(options, /*iterations=*/2);
  const int root_compute = Find(second, std::string("forward_compute_begin ") + kRoot);
  ASSERT_GE(root_compute, 0);
  EXPECT_LT(Find(second, "allgather_issued " + Block(0)), root_compute)
      << absl::StrJoin(second, "\n");
  EXPECT_LT(Find(second, "allgather_issued " + Block(1)), root_compute);
  EXPECT_GT(Find(second, "allgather_issued " + Block(2)), root_compute);  // limit 2
  EXPECT_EQ(MaxAhead(ForwardPart(second), "forward_compute_begin "), 2) << absl::StrJoin(second, "\n");

  options.forward_prefetch = false;
  const std::vector<std::string> plain = RecordStep(options, 2);
  EXPECT_GT(Find(plain, "allgather_issued " + Block(0)),
            Find(plain, std::string("forward_compute_begin ") + kRoot));
}

TEST(PrefetchTest, ReduceScatterOverlapsTheNextUnitsBackward) {
  const std::vector<std::string> bwd =
      BackwardPart(RecordStep(testing::PerBlockOptions(ShardingStrategy::kFullShard)));
  for (int b = 3; b >= 1; --b) {
    const int issued = Find(bwd, "reduce_issued " + Block(b));
    const int next_compute = Find(bwd, "backward_compute_begin " + Block(b - 1));
    const int done = Find(bwd, "reduce_done " + Block(b));
    ASSERT_GE(issued, 0) << absl::StrJoin(bwd, "\n");
    EXPECT_LT(issued, next_compute);
    EXPECT_GT(done, next_compute) << absl::StrJoin(bwd, "\n");
  }
  // The root waits for every reduction before the backward ends.
  const int end = Find(bwd, "backward_end");
  for (int b = 0; b < 4; ++b) EXPECT_LT(Find(bwd, "reduce_done " + Block(b)), end);
  EXPECT_LT(Find(bwd, std::string("reduce_done ") + kRoot), end);
}

}  // namespace
}  // namespace fsdp
