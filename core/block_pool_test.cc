#include "core/block_pool.h"

#include <cstdlib>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "core/testing/fake_segment_source.h"
#include "gtest/gtest.h"

namespace core {
namespace {

using FakeSource = testing::FakeSegmentSource;

constexpr int64_t kKiB = 1024;
constexpr int64_t kMiB = 1024 * 1024;

class BlockPoolTest : public ::testing::Test {
 protected:
  void TearDown() override { EXPECT_EQ(c_->bad_frees, 0) << "the pool freed a bad segment"; }
  std::unique_ptr<BlockPool> MakePool(int64_t cap = 0) {
    return std::make_unique<BlockPool>(std::make_unique<FakeSource>(c_, cap));
  }
  std::shared_ptr<FakeSource::Counters> c_ = std::make_shared<FakeSource::Counters>();
};

TEST_F(BlockPoolTest, RoundsToSizeClassesAndSegments) {
  auto pool = MakePool();
  EXPECT_EQ(pool->RoundSize(0), 512);
  EXPECT_EQ(pool->RoundSize(1), 512);
  EXPECT_EQ(pool->RoundSize(512), 512);
  EXPECT_EQ(pool->RoundSize(513), 1024);
  EXPECT_EQ(pool->RoundSize(INT64_MAX), -1);
  EXPECT_EQ(pool->SegmentSize(512), 2 * kMiB);
  EXPECT_EQ(pool->SegmentSize(kMiB), 2 * kMiB);
  EXPECT_EQ(pool->SegmentSize(kMiB + 512), 20 * kMiB);
  EXPECT_EQ(pool->SegmentSize(10 * kMiB - 512), 20 * kMiB);
  EXPECT_EQ(pool->SegmentSize(10 * kMiB), 10 * kMiB);
  EXPECT_EQ(pool->SegmentSize(10 * kMiB + 512), 12 * kMiB);
  void* p = pool->Allocate(1000).value();
  EXPECT_EQ(pool->BlockSize(p).value(), 1024);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 512, 0u);
  void* z = pool->Allocate(0).value();
  EXPECT_NE(z, nullptr);
  EXPECT_NE(z, p);
  EXPECT_EQ(pool->BlockSize(z).value(), 512);
  const BlockPoolStats s = pool->Stats();
  EXPECT_EQ(s.num_segment_allocs, 1);  // both small blocks share one 2 MiB segment
  EXPECT_EQ(s.reserved_bytes, 2 * kMiB);
  EXPECT_EQ(s.allocated_bytes, 1024 + 512);
  EXPECT_EQ(s.num_blocks, 2);
  EXPECT_TRUE(pool->Free(p).ok());
  EXPECT_TRUE(pool->Free(z).ok());
}

TEST_F(BlockPoolTest, FreedBlockIsReusedWithoutANewSegment) {
  auto pool = MakePool();
  void* a = pool->Allocate(3 * kMiB).value();
  ASSERT_TRUE(pool->Free(a).ok());
  EXPECT_EQ(pool->Stats().allocated_bytes, 0);
  EXPECT_EQ(pool->Stats().reserved_bytes, 20 * kMiB);  // cached, not returned
  void* b = pool->Allocate(3 * kMiB).value();
  EXPECT_EQ(b, a);
  EXPECT_EQ(c_->allocs, 1);
  EXPECT_EQ(c_->frees, 0);
  ASSERT_TRUE(pool->Free(b).ok());
}

TEST_F(BlockPoolTest, BestFitPicksTheSmallestFreeBlockThatFits) {
  auto pool = MakePool();
  // Three small blocks with allocated separators so that freeing does not merge them.
  void* big = pool->Allocate(64 * kKiB).value();
  void* s1 = pool->Allocate(512).value();
  void* mid = pool->Allocate(16 * kKiB).value();
  void* s2 = pool->Allocate(512).value();
  ASSERT_TRUE(pool->Free(big).ok());
  ASSERT_TRUE(pool->Free(mid).ok());
  // 10 KiB fits in both holes and in the segment's tail; best fit takes the 16 KiB one.
  void* got = pool->Allocate(10 * kKiB).value();
  EXPECT_EQ(got, mid);
  EXPECT_EQ(pool->BlockSize(got).value(), 10 * kKiB);  // split: the rest stays free
  void* rest = pool->Allocate(6 * kKiB).value();
  EXPECT_EQ(static_cast<char*>(rest), static_cast<char*>(mid) + 10 * kKiB);
  EXPECT_EQ(c_->allocs, 1);
  for (void* p : {s1, s2, got, rest}) ASSERT_TRUE(pool->Free(p).ok());
}

TEST_F(BlockPoolTest, SplitsAndMergesBackIntoOneSegment) {
  auto pool = MakePool();
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(pool->Allocate(100 * kKiB).value());
  for (int i = 1; i < 8; ++i) {
    EXPECT_EQ(static_cast<char*>(blocks[i]), static_cast<char*>(blocks[i - 1]) + 100 * kKiB)
        << "blocks should be carved consecutively from one segment";
  }
  EXPECT_EQ(c_->allocs, 1);
  // Free in an order that needs merging on both sides.
  for (int i : {1, 3, 5, 7, 2, 6, 0, 4}) ASSERT_TRUE(pool->Free(blocks[i]).ok());
  // Everything merged: the whole segment is one free block again, so two 1 MiB blocks
  // (the largest small blocks) fill it from its start without a new segment, and once
  // freed, EmptyCache (which returns only wholly free segments) returns it.
  void* h1 = pool->Allocate(kMiB).value();
  void* h2 = pool->Allocate(kMiB).value();
  EXPECT_EQ(h1, blocks[0]);
  EXPECT_EQ(static_cast<char*>(h2), static_cast<char*>(h1) + kMiB);
  EXPECT_EQ(c_->allocs, 1);
  ASSERT_TRUE(pool->Free(h2).ok());
  EXPECT_EQ(pool->EmptyCache(), 0) << "a segment with a live block must stay";
  ASSERT_TRUE(pool->Free(h1).ok());
  EXPECT_EQ(pool->EmptyCache(), 2 * kMiB);
  EXPECT_EQ(c_->frees, 1);
  EXPECT_EQ(pool->Stats().reserved_bytes, 0);
  EXPECT_EQ(pool->Stats().num_segments, 0);
}

TEST_F(BlockPoolTest, LargeBlocksKeepASmallRemainderAndSplitALargeOne) {
  auto pool = MakePool();
  // 19.5 MiB of a 20 MiB segment: the 0.5 MiB rest is not worth a block of its own.
  void* a = pool->Allocate(20 * kMiB - kMiB / 2).value();
  EXPECT_EQ(pool->BlockSize(a).value(), 20 * kMiB);
  ASSERT_TRUE(pool->Free(a).ok());
  // 2 MiB of it: the 18 MiB rest is split off and serves the next request.
  void* b = pool->Allocate(2 * kMiB).value();
  EXPECT_EQ(pool->BlockSize(b).value(), 2 * kMiB);
  void* c = pool->Allocate(5 * kMiB).value();
  EXPECT_EQ(static_cast<char*>(c), static_cast<char*>(b) + 2 * kMiB);
  EXPECT_EQ(c_->allocs, 1);
  // Small requests never come from the large pool.
  void* s = pool->Allocate(4 * kKiB).value();
  EXPECT_EQ(c_->allocs, 2);
  for (void* p : {b, c, s}) ASSERT_TRUE(pool->Free(p).ok());
}

TEST_F(BlockPoolTest, RepeatedTrainingStepAllocatesNoSegmentAfterTheFirst) {
  auto pool = MakePool();
  // A step: parameters gathered, activations of several sizes, gradients, freed in an
  // order different from allocation, some kept across steps (optimizer state).
  const std::vector<int64_t> sizes = {37 * kMiB, 4 * kKiB,  768 * 4, 3 * kMiB,
                                      50 * kKiB, 12 * kMiB, 1,       600 * kKiB,
                                      2 * kMiB,  24 * kMiB, 100,     5 * kMiB + 3};
  std::vector<void*> persistent = {pool->Allocate(9 * kMiB).value(),
                                   pool->Allocate(300 * kKiB).value()};
  int64_t allocs_after_first = -1;
  int64_t reserved_after_first = -1;
  for (int step = 0; step < 10; ++step) {
    std::vector<void*> live;
    for (int64_t n : sizes) {
      live.push_back(pool->Allocate(n).value());
      if (live.size() % 3 == 0) {  // free a middle one early, like a dead activation
        ASSERT_TRUE(pool->Free(live[live.size() / 2]).ok());
        live.erase(live.begin() + live.size() / 2);
      }
    }
    for (size_t i = 0; i < live.size(); i += 2) ASSERT_TRUE(pool->Free(live[i]).ok());
    for (size_t i = 1; i < live.size(); i += 2) ASSERT_TRUE(pool->Free(live[i]).ok());
    if (step == 0) {
      allocs_after_first = pool->Stats().num_segment_allocs;
      reserved_after_first = pool->Stats().reserved_bytes;
    } else {
      EXPECT_EQ(pool->Stats().num_segment_allocs, allocs_after_first) << "step " << step;
      EXPECT_EQ(pool->Stats().reserved_bytes, reserved_after_first) << "step " << step;
    }
  }
  EXPECT_EQ(c_->allocs, allocs_after_first);
  EXPECT_EQ(c_->frees, 0);
  for (void* p : persistent) ASSERT_TRUE(pool->Free(p).ok());
  EXPECT_EQ(pool->Stats().allocated_bytes, 0);
  EXPECT_EQ(pool->Stats().num_blocks, 0);
}

TEST_F(BlockPoolTest, OutOfMemoryReleasesTheCacheAndRetriesOnce) {
  auto pool = MakePool(/*cap=*/40 * kMiB);
  void* a = pool->Allocate(15 * kMiB).value();  // 16 MiB segment
  void* b = pool->Allocate(15 * kMiB).value();  // another: 32 MiB reserved
  void* small = pool->Allocate(kKiB).value();   // 2 MiB segment: 34 MiB
  ASSERT_TRUE(pool->Free(a).ok());
  ASSERT_TRUE(pool->Free(small).ok());
  EXPECT_EQ(c_->allocs, 3);
  // 20 MiB does not fit the cached 16 MiB block, and 34 + 20 > 40: the first try fails,
  // the two wholly free cached segments (16 + 2 MiB) go back, the retry succeeds.
  void* c = pool->Allocate(20 * kMiB).value();
  EXPECT_EQ(c_->failures, 1);
  EXPECT_EQ(c_->frees, 2);
  BlockPoolStats s = pool->Stats();
  EXPECT_EQ(s.num_oom_retries, 1);
  EXPECT_EQ(s.reserved_bytes, 16 * kMiB + 20 * kMiB);
  EXPECT_EQ(s.num_segment_allocs, 4);
  EXPECT_EQ(s.num_segment_frees, 2);
  // Nothing cached to release now: the retry fails too, and the error says why.
  absl::StatusOr<void*> d = pool->Allocate(8 * kMiB);
  ASSERT_FALSE(d.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(d.status())) << d.status();
  EXPECT_NE(d.status().message().find("fake:0"), std::string::npos) << d.status();
  EXPECT_NE(d.status().message().find("fake device out of memory"), std::string::npos);
  EXPECT_NE(d.status().message().find("8.00MiB"), std::string::npos) << d.status();
  EXPECT_EQ(c_->failures, 3);
  EXPECT_EQ(pool->Stats().num_oom_retries, 2);
  EXPECT_EQ(pool->Stats().reserved_bytes, 36 * kMiB);  // the failure changed nothing
  for (void* p : {b, c}) ASSERT_TRUE(pool->Free(p).ok());
}

TEST_F(BlockPoolTest, PeaksTrackAndReset) {
  auto pool = MakePool();
  void* a = pool->Allocate(30 * kMiB).value();
  ASSERT_TRUE(pool->Free(a).ok());
  pool->EmptyCache();
  BlockPoolStats s = pool->Stats();
  EXPECT_EQ(s.peak_reserved_bytes, 30 * kMiB);
  EXPECT_EQ(s.peak_allocated_bytes, 30 * kMiB);
  EXPECT_EQ(s.reserved_bytes, 0);
  pool->ResetPeaks();
  EXPECT_EQ(pool->Stats().peak_reserved_bytes, 0);
  EXPECT_EQ(pool->Stats().peak_allocated_bytes, 0);
}

TEST_F(BlockPoolTest, BadFreeAndNegativeSizeAreErrorsThatChangeNothing) {
  auto pool = MakePool();
  void* a = pool->Allocate(kKiB).value();
  int x = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(pool->Free(&x)));
  ASSERT_TRUE(pool->Free(a).ok());
  absl::Status twice = pool->Free(a);
  EXPECT_TRUE(absl::IsInvalidArgument(twice)) << twice;
  EXPECT_NE(twice.message().find("fake:0"), std::string::npos) << twice;
  EXPECT_TRUE(absl::IsInvalidArgument(pool->Allocate(-1).status()));
  EXPECT_TRUE(absl::IsResourceExhausted(pool->Allocate(INT64_MAX).status()));
  EXPECT_EQ(pool->Stats().num_blocks, 0);
  EXPECT_EQ(pool->Stats().allocated_bytes, 0);
}

TEST_F(BlockPoolTest, DestructorReturnsFreeSegments) {
  {
    auto pool = MakePool();
    void* a = pool->Allocate(kKiB).value();
    void* b = pool->Allocate(15 * kMiB).value();
    ASSERT_TRUE(pool->Free(a).ok());
    ASSERT_TRUE(pool->Free(b).ok());
  }
  EXPECT_EQ(c_->allocs, 2);
  EXPECT_EQ(c_->frees, 2);
  EXPECT_EQ(c_->live_bytes, 0);
}

TEST_F(BlockPoolTest, RandomSequenceKeepsInvariantsAndMergesEverythingBack) {
  auto pool = MakePool();
  std::mt19937 rng(12345);
  std::map<char*, int64_t> live;  // pointer -> requested bytes
  for (int op = 0; op < 5000; ++op) {
    if (live.empty() || rng() % 5 < 3) {
      // Sizes from bytes to tens of MiB, small ones more often.
      const int64_t n =
          static_cast<int64_t>(rng() % 4 == 0 ? rng() % (30 * kMiB) : rng() % (64 * kKiB));
      char* p = static_cast<char*>(pool->Allocate(n).value());
      ASSERT_GE(pool->BlockSize(p).value(), n);
      live[p] = n;
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      ASSERT_TRUE(pool->Free(it->first).ok());
      live.erase(it);
    }
    if (op % 250 == 0) {
      // Live blocks are disjoint; the counters add up.
      int64_t allocated = 0;
      char* end = nullptr;
      for (auto& [p, n] : live) {
        ASSERT_GE(p, end) << "overlapping blocks at op " << op;
        const int64_t size = pool->BlockSize(p).value();
        end = p + size;
        allocated += size;
      }
      const BlockPoolStats s = pool->Stats();
      ASSERT_EQ(s.allocated_bytes, allocated);
      ASSERT_EQ(s.num_blocks, static_cast<int64_t>(live.size()));
      ASSERT_EQ(s.reserved_bytes, c_->live_bytes);
      ASSERT_LE(s.allocated_bytes, s.reserved_bytes);
    }
  }
  for (auto& [p, n] : live) ASSERT_TRUE(pool->Free(p).ok());
  // Every segment merged back into one free block, so EmptyCache returns all of them.
  const int64_t reserved = pool->Stats().reserved_bytes;
  EXPECT_EQ(pool->EmptyCache(), reserved);
  EXPECT_EQ(pool->Stats().reserved_bytes, 0);
  EXPECT_EQ(c_->live_bytes, 0);
  EXPECT_EQ(c_->frees, c_->allocs);
}

TEST_F(BlockPoolTest, ConcurrentUseKeepsBlocksDisjoint) {
  auto pool = MakePool();
  std::vector<std::thread> threads;
  std::vector<std::vector<std::pair<char*, int64_t>>> got(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const int64_t n = (i % 7 + 1) * 3000 + t;
        char* p = static_cast<char*>(pool->Allocate(n).value());
        p[0] = static_cast<char>(t);
        p[n - 1] = static_cast<char>(t);
        got[t].push_back({p, n});
        if (i % 2 == 1) {
          auto [q, m] = got[t][got[t].size() - 2];
          EXPECT_EQ(q[0], static_cast<char>(t));
          EXPECT_EQ(q[m - 1], static_cast<char>(t));
          ASSERT_TRUE(pool->Free(q).ok());
          got[t].erase(got[t].end() - 2);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  // The blocks still held by all threads do not overlap.
  std::map<char*, int64_t> all;
  for (auto& v : got) {
    for (auto& [p, n] : v) all[p] = n;
  }
  char* end = nullptr;
  for (auto& [p, n] : all) {
    EXPECT_GE(p, end);
    end = p + n;
  }
  for (auto& v : got) {
    for (auto& [p, n] : v) ASSERT_TRUE(pool->Free(p).ok());
  }
  EXPECT_EQ(pool->Stats().num_blocks, 0);
}

}  // namespace
}  // namespace core
