// The conformance tests of what goes wrong: argument checks, deadlines and the broken
// group, peers that leave, Wait's contract (comm/testing/process_group_conformance.h).
#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/failure.h"
#include "comm/testing/process_group_conformance.h"
#include "core/allocator.h"
#include "core/block_pool.h"
#include "core/status_macros.h"

namespace comm {
namespace testing {
namespace {

using core::DType;
using core::Tensor;

// Waits until `*count` reaches `n` (at most 30 s): how a rank that must stay away from
// a collective waits for the others to be done with it, keeping its group open.
void AwaitCount(const std::shared_ptr<std::atomic<int>>& count, int n) {
  const absl::Time end = absl::Now() + absl::Seconds(30);
  while (count->load() < n && absl::Now() < end) absl::SleepFor(absl::Milliseconds(10));
}

// Host memory labelled cuda:0, so a tensor "on the GPU" exists in a CPU build.
struct HostBackedCuda : core::SegmentSource {
  absl::StatusOr<void*> Allocate(int64_t n) override { return std::aligned_alloc(512, n); }
  void Free(void* p, int64_t) override { std::free(p); }
  std::string Describe() const override { return "host-backed cuda:0"; }
};

TEST_P(ProcessGroupConformanceTest, BadArgumentsAreInvalidArgumentNamingCollectiveAndGroup) {
  if (n() < 2) GTEST_SKIP() << "needs at least 2 ranks";
  const bool host_only = backend().host_only;
  absl::Status s = RunRanks([host_only](RankContext& ctx) -> absl::Status {
    ProcessGroup& g = *ctx.group;
    const std::string group = absl::StrCat(g.backend_name(), " group 'world'");
    auto expect_invalid = [&](absl::StatusOr<std::shared_ptr<Work>> w, const std::string& kind,
                              const std::string& detail) {
      EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument)
          << kind << ": " << w.status();
      EXPECT_NE(w.status().message().find(kind), std::string::npos) << w.status();
      EXPECT_NE(w.status().message().find(group), std::string::npos) << w.status();
      EXPECT_NE(w.status().message().find(detail), std::string::npos) << w.status();
    };
    Tensor in = Tensor::Zeros({3});
    expect_invalid(g.AllGather(in, Tensor::Zeros({3 * ctx.world_size - 1}), AllGatherOptions{}),
                   "AllGather", absl::StrCat(3 * ctx.world_size - 1));
    expect_invalid(
        g.AllGather(in, Tensor::Zeros({3 * ctx.world_size}, DType::kBFloat16), AllGatherOptions{}),
        "AllGather", "dtypes");
    Tensor out = Tensor::Zeros({3 * ctx.world_size});
    // Overlapping the output, but at another rank's slot.
    Tensor wrong_slot = out.View(ctx.rank == 0 ? 3 : 0, {3}).value();
    expect_invalid(g.AllGather(wrong_slot, out, AllGatherOptions{}), "AllGather", "overlaps");
    Tensor straddle = out.View(1, {3}).value();
    expect_invalid(g.AllGather(straddle, out, AllGatherOptions{}), "AllGather", "overlaps");
    expect_invalid(
        g.ReduceScatter(Tensor::Zeros({3 * ctx.world_size + 1}), in, ReduceScatterOptions{}),
        "ReduceScatter", absl::StrCat(3 * ctx.world_size + 1));
    expect_invalid(
        g.ReduceScatter(out, out.View(ctx.rank == 0 ? 3 : 0, {3}).value(), ReduceScatterOptions{}),
        "ReduceScatter", "overlaps");
    ReduceScatterOptions avg;
    avg.reduce_op = ReduceOp::kAverage;
    expect_invalid(g.ReduceScatter(Tensor::Zeros({3 * ctx.world_size}, DType::kInt32),
                                   Tensor::Zeros({3}, DType::kInt32), avg),
                   "ReduceScatter", "average");
    BroadcastOptions bad_root;
    bad_root.root = ctx.world_size;
    expect_invalid(g.Broadcast(in, bad_root), "Broadcast", absl::StrCat("root ", ctx.world_size));
    AllReduceOptions no_time;
    no_time.timeout = absl::ZeroDuration();
    expect_invalid(g.AllReduce(in, no_time), "AllReduce", "timeout");
    BarrierOptions no_barrier_time;
    no_barrier_time.timeout = absl::ZeroDuration();
    expect_invalid(g.Barrier(no_barrier_time), "Barrier", "timeout");
    expect_invalid(g.AllReduce(Tensor(), AllReduceOptions{}), "AllReduce", "undefined");
    if (host_only) {
      auto cuda = std::make_shared<core::Allocator>(core::Device::Cuda(0),
                                                    std::make_unique<HostBackedCuda>());
      Tensor d;
      {
        core::ScopedAllocator scope(cuda);
        d = Tensor::Empty({3 * ctx.world_size}, DType::kFloat32, core::MemoryTag::kOther,
                          core::Device::Cuda(0));
      }
      expect_invalid(g.AllReduce(d, AllReduceOptions{}), "AllReduce", "cuda:0");
      expect_invalid(g.AllGather(in, d, AllGatherOptions{}), "AllGather", "cuda:0");
    }
    // Nothing was sent, so the group still works.
    RETURN_IF_ERROR(Finish(g.AllReduce(in, AllReduceOptions{})));
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

// The last rank never issues the collective (and keeps its group open meanwhile): the
// others time out at its deadline, blame it, and their group is broken afterwards. An
// all-reduce of 100 fp32 and an all-gather of 5000 per rank, each on a fresh group.
TEST_P(ProcessGroupConformanceTest, CollectiveARankNeverIssuesTimesOutBlamesItAndBreaksTheGroup) {
  if (n() < 2) GTEST_SKIP() << "needs at least 2 ranks";
  for (const CollectiveKind kind : {CollectiveKind::kAllReduce, CollectiveKind::kAllGather}) {
    auto done = std::make_shared<std::atomic<int>>(0);
    absl::Status s = RunRanks([done, kind](RankContext& ctx) -> absl::Status {
      const int n = ctx.world_size;
      const int missing = n - 1;
      if (ctx.rank == missing) {
        AwaitCount(done, n - 1);
        return absl::OkStatus();
      }
      const absl::Duration timeout = absl::Milliseconds(400);
      Tensor small = Tensor::Zeros({100});
      Tensor in = Tensor::Zeros({5000});
      Tensor out = Tensor::Zeros({5000 * n});
      const absl::Time start = absl::Now();
      absl::StatusOr<std::shared_ptr<Work>> work;
      if (kind == CollectiveKind::kAllReduce) {
        AllReduceOptions o;
        o.timeout = timeout;
        work = ctx.group->AllReduce(small, o);
      } else {
        AllGatherOptions o;
        o.timeout = timeout;
        work = ctx.group->AllGather(in, out, o);
      }
      RETURN_IF_ERROR(work.status());
      absl::Status got = (*work)->Wait(kCollectiveTimeout);
      const absl::Duration took = absl::Now() - start;
      const std::string name = CollectiveKindName(kind);
      EXPECT_EQ(got.code(), absl::StatusCode::kDeadlineExceeded) << got;
      EXPECT_NE(got.message().find(name), std::string::npos) << got;
      EXPECT_NE(got.message().find(absl::StrCat(ctx.group->backend_name(), " group 'world'")),
                std::string::npos)
          << got;
      EXPECT_NE(got.message().find("400ms"), std::string::npos) << got;
      EXPECT_NE(got.message().find(absl::StrCat("rank ", missing)), std::string::npos) << got;
      EXPECT_TRUE(IsSecondary(got)) << got;
      EXPECT_EQ(CulpritRanks(got), std::vector<int>{missing}) << got;
      // It gave up at its deadline: not before it, and well before kTimeout (5 s bound
      // is slack for a loaded machine).
      EXPECT_GE(took, absl::Milliseconds(350)) << got;
      EXPECT_LT(took, absl::Seconds(5)) << got;
      absl::StatusOr<std::shared_ptr<Work>> after = ctx.group->Barrier(BarrierOptions{});
      EXPECT_EQ(after.status().code(), absl::StatusCode::kFailedPrecondition) << after.status();
      EXPECT_NE(after.status().message().find(std::string(got.message())), std::string::npos)
          << after.status();
      ++*done;
      return absl::OkStatus();
    });
    EXPECT_TRUE(s.ok()) << CollectiveKindName(kind) << ": " << s;
  }
}

// Rank 1 destroys its group after three all-reduces (as a process that dies mid-job):
// the others' next all-reduce fails at once, not at its 30 s deadline, naming rank 1.
// With tensors of 1000 and of 3000 fp32, each on a fresh group.
TEST_P(ProcessGroupConformanceTest, PeerThatDestroysItsGroupMakesTheOthersFailFastNamingIt) {
  if (n() < 3) GTEST_SKIP() << "needs at least 3 ranks";
  for (const int64_t len : {1000, 3000}) {
    absl::Status s = RunRanks([len](RankContext& ctx) -> absl::Status {
      Tensor t = Tensor::Zeros({len});
      for (int i = 0; i < 3; ++i)
        RETURN_IF_ERROR(Finish(ctx.group->AllReduce(t, AllReduceOptions{})));
      if (ctx.rank == 1) {
        ctx.group.reset();  // leaves: its connections or its segment close
        return absl::OkStatus();
      }
      AllReduceOptions opts;
      opts.timeout = absl::Seconds(30);
      const absl::Time start = absl::Now();
      ASSIGN_OR_RETURN(auto work, ctx.group->AllReduce(t, opts));
      absl::Status got = work->Wait(absl::Seconds(40));
      // Noticed at once, not at the 30 s deadline (10 s: slack for a loaded machine).
      EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << got;
      EXPECT_EQ(got.code(), absl::StatusCode::kUnavailable) << got;
      EXPECT_NE(got.message().find("AllReduce"), std::string::npos) << got;
      EXPECT_NE(got.message().find("rank 1"), std::string::npos) << got;
      EXPECT_EQ(CulpritRanks(got), std::vector<int>{1}) << got;
      return absl::OkStatus();
    });
    EXPECT_TRUE(s.ok()) << len << " elements: " << s;
  }
}

TEST_P(ProcessGroupConformanceTest, ShortWaitOnARunningCollectiveSaysSoAndALaterWaitSucceeds) {
  if (n() < 2) GTEST_SKIP() << "needs at least 2 ranks";
  absl::Status s = RunRanks([&](RankContext& ctx) -> absl::Status {
    Tensor t = Tensor::Zeros({10});
    t.Fill(1.0f);
    if (ctx.rank == 1) absl::SleepFor(absl::Milliseconds(500));
    ASSIGN_OR_RETURN(auto work, ctx.group->AllReduce(t, AllReduceOptions{}));
    if (ctx.rank == 0) {
      absl::Status early = work->Wait(absl::Milliseconds(20));
      EXPECT_EQ(early.code(), absl::StatusCode::kDeadlineExceeded) << early;
      EXPECT_NE(early.message().find("still running"), std::string::npos) << early;
      EXPECT_FALSE(work->IsCompleted());
    }
    RETURN_IF_ERROR(Finish(work));
    EXPECT_TRUE(work->IsCompleted());
    EXPECT_EQ(ElementAt(t, 0), ctx.world_size);
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace testing
}  // namespace comm
