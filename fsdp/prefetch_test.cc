// Prefetch and overlap, proven from the runtime's recorded event order (never timing):
// the next unit's all-gather is issued before the current unit's backward computation
// begins, at most limit_all_gathers units are unsharded ahead, forward prefetch follows
// the previous forward's order, and a unit's reduce-scatter is still in flight while the
// next unit computes.
#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/process_group.h"
#include "comm/testing/thread_ranks.h"
#include "comm/work.h"
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

// Success when both events were recorded and the first occurrence of `first` comes
// before that of `second`. A missing event is a failure of its own (naming it), never a
// position of -1 that an order comparison would accept.
::testing::AssertionResult Before(const std::vector<std::string>& events, const std::string& first,
                                  const std::string& second) {
  const int a = Find(events, first);
  const int b = Find(events, second);
  if (a < 0 || b < 0) {
    return ::testing::AssertionFailure()
           << "event '" << (a < 0 ? first : second) << "' never happened; events:\n"
           << absl::StrJoin(events, "\n");
  }
  if (a >= b) {
    return ::testing::AssertionFailure() << "'" << first << "' (at " << a << ") is not before '"
                                         << second << "' (at " << b << "); events:\n"
                                         << absl::StrJoin(events, "\n");
  }
  return ::testing::AssertionSuccess();
}

// Runs one training step (forward + backward) of a 4-block Gpt on 2 ranks and returns
// rank 0's events of the `iteration`-th step (0-based), from its first forward event on.
std::vector<std::string> RecordStep(const FullyShardOptions& options, int iterations = 1) {
  testing::GptTrainingSetup setup = testing::TinySetup();
  setup.gpt.n_layer = 4;
  std::vector<std::string> out;
  absl::Status s =
      comm::testing::RunThreadRanks(2, [&](comm::testing::RankContext& ctx) -> absl::Status {
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

// The events of the backward only (after the root's reshard ending the forward); empty,
// with a failure, when that reshard never happened.
std::vector<std::string> BackwardPart(const std::vector<std::string>& events) {
  const int fwd_end = Find(events, absl::StrCat("reshard ", kRoot));
  EXPECT_GE(fwd_end, 0) << absl::StrJoin(events, "\n");
  if (fwd_end < 0) return {};
  return std::vector<std::string>(events.begin() + fwd_end + 1, events.end());
}

// The events of the forward only (up to the root's reshard); empty, with a failure,
// when that reshard never happened.
std::vector<std::string> ForwardPart(const std::vector<std::string>& events) {
  const int fwd_end = Find(events, absl::StrCat("reshard ", kRoot));
  EXPECT_GE(fwd_end, 0) << absl::StrJoin(events, "\n");
  if (fwd_end < 0) return {};
  return std::vector<std::string>(events.begin(), events.begin() + fwd_end + 1);
}

// Largest number of units whose all-gather was issued while their computation had not
// yet begun (counted at each computation start). Every one of the 5 units (the root and
// 4 blocks) must begin computing exactly once, or the count would mean nothing: a
// failure otherwise.
int MaxAhead(const std::vector<std::string>& events, const std::string& begin_prefix) {
  std::set<std::string> issued;
  std::set<std::string> begun;
  int max_ahead = 0;
  for (const std::string& e : events) {
    if (absl::StartsWith(e, "allgather_issued ")) issued.insert(e.substr(17));
    if (absl::StartsWith(e, begin_prefix)) {
      const std::string unit = e.substr(begin_prefix.size());
      EXPECT_TRUE(begun.insert(unit).second) << unit << " began twice";
      issued.erase(unit);
      max_ahead = std::max(max_ahead, static_cast<int>(issued.size()));
    }
  }
  const std::set<std::string> all = {kRoot, Block(0), Block(1), Block(2), Block(3)};
  EXPECT_EQ(begun, all) << "'" << begin_prefix << "' events: not every unit computed:\n"
                        << absl::StrJoin(events, "\n");
  return max_ahead;
}

TEST(PrefetchTest, BackwardPrefetchIssuesTheNextAllGatherBeforeTheCurrentComputeBegins) {
  FullyShardOptions options = testing::PerBlockOptions(ShardingStrategy::kFullShard);
  const std::vector<std::string> bwd = BackwardPart(RecordStep(options));
  const std::vector<std::string> order = {kRoot, Block(3), Block(2), Block(1), Block(0)};
  for (size_t i = 0; i + 1 < order.size(); ++i) {
    EXPECT_TRUE(
        Before(bwd, "allgather_issued " + order[i + 1], "backward_compute_begin " + order[i]))
        << order[i + 1] << " not prefetched before " << order[i] << "'s backward";
  }
  // Exactly limit_all_gathers (2) units run ahead at the busiest moment, never more.
  EXPECT_EQ(MaxAhead(bwd, "backward_compute_begin "), 2) << absl::StrJoin(bwd, "\n");
}

TEST(PrefetchTest, WithoutBackwardPrefetchTheAllGatherWaitsForTheUnitsOwnBackward) {
  FullyShardOptions options = testing::PerBlockOptions(ShardingStrategy::kFullShard);
  options.backward_prefetch = false;
  const std::vector<std::string> bwd = BackwardPart(RecordStep(options));
  for (int b = 3; b >= 1; --b) {
    EXPECT_TRUE(
        Before(bwd, "backward_compute_begin " + Block(b), "allgather_issued " + Block(b - 1)));
  }
  EXPECT_EQ(MaxAhead(bwd, "backward_compute_begin "), 0);
}

TEST(PrefetchTest, LimitAllGathersBoundsTheUnitsAhead) {
  FullyShardOptions options = testing::PerBlockOptions(ShardingStrategy::kFullShard);
  options.limit_all_gathers = 1;
  const std::vector<std::string> bwd = BackwardPart(RecordStep(options));
  EXPECT_EQ(MaxAhead(bwd, "backward_compute_begin "), 1) << absl::StrJoin(bwd, "\n");
  // blocks.2 is prefetched before blocks.3 computes, blocks.1 only after.
  const std::string compute3 = "backward_compute_begin " + Block(3);
  EXPECT_TRUE(Before(bwd, "allgather_issued " + Block(2), compute3));
  EXPECT_TRUE(Before(bwd, compute3, "allgather_issued " + Block(1)));
  options.limit_all_gathers = 0;
  EXPECT_EQ(MaxAhead(BackwardPart(RecordStep(options)), "backward_compute_begin "), 0);
}

TEST(PrefetchTest, ForwardPrefetchFollowsThePreviousForwardsOrder) {
  FullyShardOptions options = testing::PerBlockOptions(ShardingStrategy::kFullShard);
  options.forward_prefetch = true;
  // The first forward has no recorded order; the second prefetches blocks.0 and
  // blocks.1 from the root's pre-hook, before the root computes.
  const std::vector<std::string> second = RecordStep(options, /*iterations=*/2);
  const std::string root_compute = std::string("forward_compute_begin ") + kRoot;
  EXPECT_TRUE(Before(second, "allgather_issued " + Block(0), root_compute));
  EXPECT_TRUE(Before(second, "allgather_issued " + Block(1), root_compute));
  EXPECT_TRUE(Before(second, root_compute, "allgather_issued " + Block(2)));  // limit 2
  EXPECT_EQ(MaxAhead(ForwardPart(second), "forward_compute_begin "), 2)
      << absl::StrJoin(second, "\n");

  options.forward_prefetch = false;
  const std::vector<std::string> plain = RecordStep(options, 2);
  EXPECT_TRUE(Before(plain, root_compute, "allgather_issued " + Block(0)));
}

TEST(PrefetchTest, ReduceScatterOverlapsTheNextUnitsBackward) {
  const std::vector<std::string> bwd =
      BackwardPart(RecordStep(testing::PerBlockOptions(ShardingStrategy::kFullShard)));
  for (int b = 3; b >= 1; --b) {
    const std::string next_compute = "backward_compute_begin " + Block(b - 1);
    EXPECT_TRUE(Before(bwd, "reduce_issued " + Block(b), next_compute));
    EXPECT_TRUE(Before(bwd, next_compute, "reduce_done " + Block(b)));
  }
  // The root waits for every reduction before the backward ends.
  for (int b = 0; b < 4; ++b) EXPECT_TRUE(Before(bwd, "reduce_done " + Block(b), "backward_end"));
  EXPECT_TRUE(Before(bwd, std::string("reduce_done ") + kRoot, "backward_end"));
}

// NOTE [Comm overlap]: each all-gather and reduce-scatter a unit waits on is counted once
// with the gloo backend's measured run time. One FULL_SHARD step of the 5-unit Gpt
// gathers every unit twice (forward, then backward: every unit, the root included,
// reshards after its forward) and reduces every unit once.
TEST(CommTimingTest, CountsEveryWaitedCollectiveWithItsRunTime) {
  testing::GptTrainingSetup setup = testing::TinySetup();
  setup.gpt.n_layer = 4;
  std::vector<CommTiming> timings(2);
  absl::Status s =
      comm::testing::RunThreadRanks(2, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(setup));
        ASSIGN_OR_RETURN(data::MarkovLanguage language, testing::MakeLanguage(setup));
        WrapperRegistry registry;
        ASSIGN_OR_RETURN(
            auto handle,
            FullyShard(gpt, ctx.group, testing::PerBlockOptions(ShardingStrategy::kFullShard),
                       &registry));
        ASSIGN_OR_RETURN(data::TokenBatch batch, language.Batch(0, 4, setup.seq_len));
        RETURN_IF_ERROR(testing::ForwardBackward(*gpt, batch).status());
        const CommTiming first = registry.runtime().comm_timing();
        registry.runtime().ResetCommTiming();
        if (registry.runtime().comm_timing().all_gathers != 0) {
          return absl::InternalError("ResetCommTiming left counts");
        }
        RETURN_IF_ERROR(testing::ForwardBackward(*gpt, batch).status());
        timings[ctx.rank] = registry.runtime().comm_timing();
        if (first.all_gathers != timings[ctx.rank].all_gathers) {
          return absl::InternalError(absl::StrCat("steps differ: ", first.all_gathers, " vs ",
                                                  timings[ctx.rank].all_gathers, " all-gathers"));
        }
        return absl::OkStatus();
      });
  ASSERT_TRUE(s.ok()) << s;
  for (const CommTiming& t : timings) {
    EXPECT_EQ(t.all_gathers, 10);
    EXPECT_EQ(t.reductions, 5);
    EXPECT_GT(t.all_gather_run, absl::ZeroDuration());
    EXPECT_GT(t.reduce_run, absl::ZeroDuration());
    EXPECT_GE(t.all_gather_wait, absl::ZeroDuration());
    const double hidden = CommTiming::Hidden(t.all_gather_run, t.all_gather_wait);
    EXPECT_GE(hidden, 0.0);
    EXPECT_LE(hidden, 1.0);
  }
}

// A Work as a CUDA backend's looks to its caller: no host-measured run time, and a
// StreamWaitTiming of {10 ms, 2 ms} once `known` is set and it has been waited on.
class StreamOrderedWork : public comm::Work {
 public:
  StreamOrderedWork(std::shared_ptr<comm::Work> inner, std::shared_ptr<std::atomic<bool>> known)
      : inner_(std::move(inner)), known_(std::move(known)) {}
  bool IsCompleted() const override { return inner_->IsCompleted(); }
  absl::Status Wait(absl::Duration timeout) override {
    waited_ = true;
    return inner_->Wait(timeout);
  }
  std::string Describe() const override { return inner_->Describe(); }
  std::optional<StreamTiming> StreamWaitTiming() const override {
    if (!waited_ || !known_->load()) return std::nullopt;
    return StreamTiming{absl::Milliseconds(10), absl::Milliseconds(2)};
  }

 private:
  const std::shared_ptr<comm::Work> inner_;
  const std::shared_ptr<std::atomic<bool>> known_;
  std::atomic<bool> waited_{false};
};

// Runs every collective on `inner` and hands its Work back as a StreamOrderedWork.
class StreamOrderedGroup : public comm::ProcessGroup {
 public:
  StreamOrderedGroup(std::shared_ptr<comm::ProcessGroup> inner,
                     std::shared_ptr<std::atomic<bool>> known)
      : inner_(std::move(inner)), known_(std::move(known)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend_name() const override { return inner_->backend_name(); }
  std::string name() const override { return inner_->name(); }
  absl::StatusOr<std::shared_ptr<comm::Work>> AllGather(
      const core::Tensor& input, const core::Tensor& output,
      const comm::AllGatherOptions& options) override {
    return Wrap(inner_->AllGather(input, output, options));
  }
  absl::StatusOr<std::shared_ptr<comm::Work>> ReduceScatter(
      const core::Tensor& input, const core::Tensor& output,
      const comm::ReduceScatterOptions& options) override {
    return Wrap(inner_->ReduceScatter(input, output, options));
  }
  absl::StatusOr<std::shared_ptr<comm::Work>> AllReduce(
      const core::Tensor& tensor, const comm::AllReduceOptions& options) override {
    return Wrap(inner_->AllReduce(tensor, options));
  }
  absl::StatusOr<std::shared_ptr<comm::Work>> Broadcast(
      const core::Tensor& tensor, const comm::BroadcastOptions& options) override {
    return Wrap(inner_->Broadcast(tensor, options));
  }
  absl::StatusOr<std::shared_ptr<comm::Work>> Barrier(
      const comm::BarrierOptions& options) override {
    return Wrap(inner_->Barrier(options));
  }
  comm::CommStats Stats() const override { return inner_->Stats(); }
  void ResetStats() override { inner_->ResetStats(); }
  absl::StatusOr<std::shared_ptr<comm::ProcessGroup>> NewSubgroup(
      const std::vector<int>& ranks, const comm::SubgroupOptions& options) override {
    return inner_->NewSubgroup(ranks, options);
  }

 private:
  absl::StatusOr<std::shared_ptr<comm::Work>> Wrap(
      absl::StatusOr<std::shared_ptr<comm::Work>> work) {
    if (!work.ok()) return work;
    return std::shared_ptr<comm::Work>(
        std::make_shared<StreamOrderedWork>(*std::move(work), known_));
  }
  const std::shared_ptr<comm::ProcessGroup> inner_;
  const std::shared_ptr<std::atomic<bool>> known_;
};

// NOTE [Comm overlap] on a stream-ordered backend: a collective is counted with the
// backend's StreamWaitTiming, not before it is known (comm_timing() counts it then), and
// once only.
TEST(CommTimingTest, CountsStreamOrderedWaitsOnceTheirTimingIsKnown) {
  testing::GptTrainingSetup setup = testing::TinySetup();
  setup.gpt.n_layer = 4;
  std::vector<CommTiming> before(2), after(2), again(2);
  absl::Status s =
      comm::testing::RunThreadRanks(2, [&](comm::testing::RankContext& ctx) -> absl::Status {
        auto known = std::make_shared<std::atomic<bool>>(false);
        auto group = std::make_shared<StreamOrderedGroup>(ctx.group, known);
        ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(setup));
        ASSIGN_OR_RETURN(data::MarkovLanguage language, testing::MakeLanguage(setup));
        WrapperRegistry registry;
        ASSIGN_OR_RETURN(
            auto handle,
            FullyShard(gpt, group, testing::PerBlockOptions(ShardingStrategy::kFullShard),
                       &registry));
        ASSIGN_OR_RETURN(data::TokenBatch batch, language.Batch(0, 4, setup.seq_len));
        RETURN_IF_ERROR(testing::ForwardBackward(*gpt, batch).status());
        before[ctx.rank] = registry.runtime().comm_timing();
        known->store(true);
        after[ctx.rank] = registry.runtime().comm_timing();
        again[ctx.rank] = registry.runtime().comm_timing();
        return absl::OkStatus();
      });
  ASSERT_TRUE(s.ok()) << s;
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(before[rank].all_gathers, 0);
    EXPECT_EQ(before[rank].reductions, 0);
    // As CountsEveryWaitedCollectiveWithItsRunTime: 10 all-gathers and 5 reductions.
    EXPECT_EQ(after[rank].all_gathers, 10);
    EXPECT_EQ(after[rank].reductions, 5);
    EXPECT_EQ(after[rank].all_gather_run, absl::Milliseconds(100));
    EXPECT_EQ(after[rank].all_gather_wait, absl::Milliseconds(20));
    EXPECT_EQ(after[rank].reduce_run, absl::Milliseconds(50));
    EXPECT_EQ(after[rank].reduce_wait, absl::Milliseconds(10));
    EXPECT_EQ(again[rank].all_gathers, 10);
    EXPECT_EQ(again[rank].reductions, 5);
  }
}

TEST(CommTimingTest, HiddenIsTheShareOfRunTimeNotWaitedFor) {
  EXPECT_DOUBLE_EQ(CommTiming::Hidden(absl::Milliseconds(10), absl::Milliseconds(2)), 0.8);
  EXPECT_DOUBLE_EQ(CommTiming::Hidden(absl::Milliseconds(10), absl::ZeroDuration()), 1.0);
  // A wait longer than the run (queued behind earlier collectives) hides nothing.
  EXPECT_DOUBLE_EQ(CommTiming::Hidden(absl::Milliseconds(1), absl::Milliseconds(5)), 0.0);
  EXPECT_DOUBLE_EQ(CommTiming::Hidden(absl::ZeroDuration(), absl::Milliseconds(1)), 0.0);
}

}  // namespace
}  // namespace fsdp
