#include "comm/testing/thread_ranks.h"

#include <atomic>
#include <set>

#include "absl/time/clock.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace comm {
namespace testing {
namespace {

TEST(ThreadRanksTest, EachRankHasItsOwnAllocatorAndTheGroupCountsThere) {
  absl::Mutex mu;
  std::set<core::Allocator*> allocators;
  absl::Status s = RunThreadRanks(3, [&](RankContext& ctx) -> absl::Status {
    {
      absl::MutexLock lock(&mu);
      allocators.insert(ctx.allocator.get());
    }
    EXPECT_EQ(core::Allocator::Current(core::Device::Cpu()), ctx.allocator);
    core::Tensor mine =
        core::Tensor::Zeros({250 * (ctx.rank + 1)}, core::DType::kFloat32, core::MemoryTag::kParam);
    EXPECT_EQ(ctx.allocator->Stats().current(core::MemoryTag::kParam), 1000 * (ctx.rank + 1));
    // A bf16 all-reduce reduces in an fp32 copy made on the group's worker thread; it
    // must be counted under this rank's allocator as kComm: 1000 elements x 4 bytes.
    ctx.allocator->ResetPeaks();
    core::Tensor g = core::Tensor::Zeros({1000}, core::DType::kBFloat16);
    ASSIGN_OR_RETURN(auto work, ctx.group->AllReduce(g, AllReduceOptions{}));
    RETURN_IF_ERROR(work->Wait(absl::Seconds(20)));
    EXPECT_EQ(ctx.allocator->Stats().peak(core::MemoryTag::kComm), 4000);
    EXPECT_EQ(ctx.allocator->Stats().current(core::MemoryTag::kComm), 0);
    EXPECT_EQ(ctx.group->size(), 3);
    EXPECT_EQ(ctx.group->rank(), ctx.rank);
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(allocators.size(), 3u);
}

TEST(ThreadRanksTest, ReturnsTheFirstErrorWithItsRank) {
  absl::Status s = RunThreadRanks(3, [](RankContext& ctx) -> absl::Status {
    if (ctx.rank == 2) return absl::InvalidArgumentError("boom");
    return absl::OkStatus();
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "rank 2: boom");
}

TEST(ThreadRanksTest, AFailingRankReleasesItsGroupSoPeersFailFast) {
  std::atomic<bool> peer_failed_fast{false};
  absl::Status s = RunThreadRanks(2, [&](RankContext& ctx) -> absl::Status {
    if (ctx.rank == 1) return absl::AbortedError("rank 1 gives up");
    AllReduceOptions opts;
    opts.timeout = absl::Seconds(30);
    core::Tensor t = core::Tensor::Zeros({10});
    const absl::Time start = absl::Now();
    ASSIGN_OR_RETURN(auto work, ctx.group->AllReduce(t, opts));
    absl::Status got = work->Wait(absl::Seconds(40));
    // Far below the collective's 30 s deadline: the closed connection is noticed.
    peer_failed_fast = !got.ok() && absl::Now() - start < absl::Seconds(10);
    return got;
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s;
  EXPECT_TRUE(peer_failed_fast.load());
}

TEST(ThreadRanksTest, OverallDeadlineNamesTheRanksStillRunning) {
  ThreadRanksOptions opts;
  opts.timeout = absl::Milliseconds(300);
  opts.create_group = false;
  const absl::Time start = absl::Now();
  absl::Status s = RunThreadRanks(
      3,
      [](RankContext& ctx) -> absl::Status {
        if (ctx.rank == 1) absl::SleepFor(absl::Seconds(2));  // captures nothing: safe to outlive
        return absl::OkStatus();
      },
      opts);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("ranks [1] of 3"), std::string::npos) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST(ThreadRanksTest, RejectsAnEmptyWorld) {
  EXPECT_EQ(RunThreadRanks(0, [](RankContext&) { return absl::OkStatus(); }).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace testing
}  // namespace comm
