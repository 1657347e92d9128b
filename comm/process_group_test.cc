#include "comm/process_group.h"

#include "gtest/gtest.h"

namespace comm {
namespace {

TEST(ExpectedTrafficTest, AllGatherAndReduceScatterMoveSTimesNMinusOneOverN) {
  for (CollectiveKind kind : {CollectiveKind::kAllGather, CollectiveKind::kReduceScatter}) {
    // 4 ranks, 4000 bytes in total: each rank sends and receives three quarters.
    Traffic t = ExpectedTraffic(kind, 4000, 4, 1);
    EXPECT_EQ(t.sent, 3000);
    EXPECT_EQ(t.received, 3000);
    // Rounded down when S does not divide: 10 * 2 / 3 = 6.67 -> 6.
    EXPECT_EQ(ExpectedTraffic(kind, 10, 3, 0).sent, 6);
  }
}

TEST(ExpectedTrafficTest, AllReduceMovesTwiceThat) {
  Traffic t = ExpectedTraffic(CollectiveKind::kAllReduce, 4000, 4, 3);
  EXPECT_EQ(t.sent, 6000);
  EXPECT_EQ(t.received, 6000);
  EXPECT_EQ(ExpectedTraffic(CollectiveKind::kAllReduce, 52, 3, 0).sent, 69);  // 104*2/3
  // No overflow near the largest tensors (2^50 bytes).
  const int64_t huge = int64_t{1} << 50;
  EXPECT_EQ(ExpectedTraffic(CollectiveKind::kAllReduce, huge, 8, 0).sent, huge / 4 * 7);
}

TEST(ExpectedTrafficTest, BroadcastChainConservesBytes) {
  for (int n : {2, 3, 5}) {
    for (int root = 0; root < n; ++root) {
      int64_t sent = 0, received = 0;
      for (int r = 0; r < n; ++r) {
        Traffic t = ExpectedTraffic(CollectiveKind::kBroadcast, 100, n, r, root);
        EXPECT_EQ(t.received, r == root ? 0 : 100);
        sent += t.sent;
        received += t.received;
      }
      EXPECT_EQ(sent, 100 * (n - 1));
      EXPECT_EQ(received, 100 * (n - 1));
    }
  }
}

TEST(ExpectedTrafficTest, OneRankAndBarrierMoveNothing) {
  for (CollectiveKind kind : {CollectiveKind::kAllGather, CollectiveKind::kReduceScatter,
                              CollectiveKind::kAllReduce, CollectiveKind::kBroadcast}) {
    EXPECT_EQ(ExpectedTraffic(kind, 1000, 1, 0).sent, 0);
    EXPECT_EQ(ExpectedTraffic(kind, 1000, 1, 0).received, 0);
  }
  EXPECT_EQ(ExpectedTraffic(CollectiveKind::kBarrier, 1000, 4, 0).sent, 0);
}

TEST(StatsRecorderTest, RecordsPerKindAndResets) {
  StatsRecorder rec;
  rec.Record(CollectiveKind::kAllGather, {10, 20});
  rec.Record(CollectiveKind::kAllGather, {1, 2});
  rec.Record(CollectiveKind::kBarrier, {});
  CommStats s = rec.Snapshot();
  EXPECT_EQ(s.of(CollectiveKind::kAllGather).calls, 2);
  EXPECT_EQ(s.of(CollectiveKind::kAllGather).bytes_sent, 11);
  EXPECT_EQ(s.of(CollectiveKind::kAllGather).bytes_received, 22);
  EXPECT_EQ(s.Total().calls, 3);
  EXPECT_NE(s.ToString().find("AllGather: 2 calls"), std::string::npos) << s.ToString();
  EXPECT_EQ(s.ToString().find("ReduceScatter"), std::string::npos) << s.ToString();
  rec.Reset();
  EXPECT_EQ(rec.Snapshot().Total().calls, 0);
}

TEST(NamesTest, KindsAndOps) {
  EXPECT_EQ(CollectiveKindName(CollectiveKind::kReduceScatter), "ReduceScatter");
  EXPECT_EQ(ReduceOpName(ReduceOp::kAverage), "average");
}

}  // namespace
}  // namespace comm
