// The backend skeleton on its own: the Create/Join checks, BackendGroup's shared
// members and CollectiveWorker's order, deadlines, broken state and shutdown.
#include "comm/internal/worker_group.h"

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "comm/hash_store.h"
#include "gtest/gtest.h"

namespace comm {
namespace internal {
namespace {

// A group whose collectives run `body` on a CollectiveWorker.
class FakeGroup : public BackendGroup {
 public:
  explicit FakeGroup(CollectiveWorker::Hooks hooks = {})
      : BackendGroup(std::make_shared<HashStore>(), 1, 2, "world"),
        worker_(this, &stats(), std::move(hooks)) {}
  ~FakeGroup() override { worker_.Stop(); }

  std::string backend_name() const override { return "fake"; }
  absl::StatusOr<std::shared_ptr<Work>> AllGather(const core::Tensor&, const core::Tensor&,
                                                  const AllGatherOptions&) override {
    return absl::UnimplementedError("");
  }
  absl::StatusOr<std::shared_ptr<Work>> ReduceScatter(const core::Tensor&, const core::Tensor&,
                                                      const ReduceScatterOptions&) override {
    return absl::UnimplementedError("");
  }
  absl::StatusOr<std::shared_ptr<Work>> AllReduce(const core::Tensor&,
                                                  const AllReduceOptions&) override {
    return absl::UnimplementedError("");
  }
  absl::StatusOr<std::shared_ptr<Work>> Broadcast(const core::Tensor&,
                                                  const BroadcastOptions&) override {
    return absl::UnimplementedError("");
  }
  absl::StatusOr<std::shared_ptr<Work>> Barrier(const BarrierOptions&) override {
    return absl::UnimplementedError("");
  }
  absl::StatusOr<std::shared_ptr<ProcessGroup>> NewSubgroup(const std::vector<int>& ranks,
                                                            const SubgroupOptions&) override {
    absl::StatusOr<SubgroupPlacement> place = PlaceNextSubgroup(ranks);
    if (!place.ok()) return place.status();
    last_subgroup_ = *place;
    return absl::UnimplementedError("");
  }

  CollectiveWorker& worker() { return worker_; }
  using BackendGroup::SubgroupName;
  SubgroupPlacement last_subgroup_;

 private:
  CollectiveWorker worker_;
};

TEST(JoinChecksTest, NameTheGroupAndTheOption) {
  EXPECT_EQ(JoinWho("gloo", "world", 1, 4), "gloo group 'world' (rank 1 of 4)");
  absl::StatusOr<std::shared_ptr<Store>> none = GroupStore(nullptr, "GlooProcessGroup", "w");
  EXPECT_EQ(none.status(),
            absl::InvalidArgumentError("GlooProcessGroup::Create('w'): store is null"));
  absl::Status rank = CheckRankAndSize("g", 2, 2);
  EXPECT_EQ(rank, absl::InvalidArgumentError("g: rank must be in [0, size) and size at least 1"));
  EXPECT_TRUE(CheckRankAndSize("g", 1, 2).ok());
  EXPECT_EQ(CheckPositive("g", "X.timeout", absl::ZeroDuration()),
            absl::InvalidArgumentError("g: X.timeout must be positive"));
  EXPECT_TRUE(CheckPositive("g", "X.timeout", absl::Seconds(1)).ok());
}

TEST(JoinChecksTest, GroupStorePutsKeysUnderTheName) {
  auto base = std::make_shared<HashStore>();
  absl::StatusOr<std::shared_ptr<Store>> scoped = GroupStore(base, "T", "world");
  ASSERT_TRUE(scoped.ok()) << scoped.status();
  ASSERT_TRUE((*scoped)->Set("k", "v").ok());
  EXPECT_EQ(base->Get("world/k", absl::Seconds(1)).value(), "v");
}

TEST(BackendGroupTest, SubgroupsAreNumberedInCallOrder) {
  FakeGroup group;
  EXPECT_EQ(group.Describe(), "fake group 'world' (rank 1 of 2)");
  EXPECT_EQ(group.NewSubgroup({0}, SubgroupOptions{}).status().code(),
            absl::StatusCode::kNotFound);  // rank 1 is not a member; the call still counts
  (void)group.NewSubgroup({1}, SubgroupOptions{});
  EXPECT_EQ(group.last_subgroup_.key_prefix, "sub1");
  EXPECT_EQ(group.SubgroupName(SubgroupOptions{}, group.last_subgroup_), "world/sub1");
  SubgroupOptions named;
  named.name = "dp";
  EXPECT_EQ(group.SubgroupName(named, group.last_subgroup_), "dp");
}

TEST(CollectiveWorkerTest, RunsInIssueOrderAndCountsWhatSucceeds) {
  FakeGroup group;
  group.worker().Start();
  std::vector<uint64_t> order;
  std::vector<std::shared_ptr<Work>> works;
  for (int i = 0; i < 3; ++i) {
    works.push_back(group.worker().Enqueue(CollectiveKind::kAllReduce, absl::Seconds(10),
                                           Traffic{8, 4}, [&order](const QueuedOp& op) {
                                             order.push_back(op.seq);
                                             return absl::OkStatus();
                                           }));
  }
  for (auto& w : works) ASSERT_TRUE(w->WaitHost(absl::Seconds(10)).ok());
  EXPECT_EQ(order, (std::vector<uint64_t>{0, 1, 2}));
  EXPECT_EQ(works[2]->Describe(), "AllReduce #2 on fake group 'world' (rank 1 of 2)");
  const CommStats stats = group.Stats();
  const CollectiveStats& s = stats.of(CollectiveKind::kAllReduce);
  EXPECT_EQ(s.calls, 3);
  EXPECT_EQ(s.bytes_sent, 24);
  EXPECT_EQ(s.bytes_received, 12);
  group.ResetStats();
  EXPECT_EQ(group.Stats().Total().calls, 0);
}

TEST(CollectiveWorkerTest, FirstFailureBreaksTheGroupOnce) {
  std::atomic<int> breaks{0};
  CollectiveWorker::Hooks hooks;
  hooks.on_break = [&breaks](const absl::Status& s) {
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
    ++breaks;
  };
  FakeGroup group(hooks);
  group.worker().Start();
  auto failing =
      group.worker().Enqueue(CollectiveKind::kBarrier, absl::Seconds(10), Traffic{},
                             [](const QueuedOp&) { return absl::UnavailableError("peer gone"); });
  auto later = group.worker().Enqueue(CollectiveKind::kBroadcast, absl::Seconds(10), Traffic{},
                                      [](const QueuedOp&) { return absl::OkStatus(); });
  EXPECT_EQ(failing->WaitHost(absl::Seconds(10)).code(), absl::StatusCode::kUnavailable);
  const absl::Status second = later->WaitHost(absl::Seconds(10));
  EXPECT_EQ(second.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(second.message(),
            "Broadcast on fake group 'world' (rank 1 of 2): the group is broken by an earlier "
            "failure: peer gone");
  EXPECT_TRUE(group.worker().broken());
  EXPECT_EQ(group.worker().CheckUsable(CollectiveKind::kAllGather).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(breaks.load(), 1);
  EXPECT_EQ(group.Stats().Total().calls, 0);
}

TEST(CollectiveWorkerTest, OneThatCannotStartInTimeIsDeadlineExceeded) {
  FakeGroup group;
  group.worker().Start();
  absl::Notification release;
  auto slow = group.worker().Enqueue(CollectiveKind::kBarrier, absl::Seconds(10), Traffic{},
                                     [&release](const QueuedOp&) {
                                       release.WaitForNotification();
                                       return absl::OkStatus();
                                     });
  bool ran = false;
  auto late = group.worker().Enqueue(CollectiveKind::kAllGather, absl::Milliseconds(1), Traffic{},
                                     [&ran](const QueuedOp&) {
                                       ran = true;
                                       return absl::OkStatus();
                                     });
  absl::SleepFor(absl::Milliseconds(20));
  release.Notify();
  ASSERT_TRUE(slow->WaitHost(absl::Seconds(10)).ok());
  const absl::Status s = late->WaitHost(absl::Seconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("AllGather #1 on fake group 'world' (rank 1 of 2) did not start "
                             "within its timeout of 1ms"),
            absl::string_view::npos)
      << s;
  EXPECT_FALSE(ran);
}

TEST(CollectiveWorkerTest, StopCancelsWhatHasNotStarted) {
  auto group = std::make_unique<FakeGroup>();  // its worker never starts
  bool ran = false;
  auto queued = group->worker().Enqueue(CollectiveKind::kBarrier, absl::Seconds(10), Traffic{},
                                        [&ran](const QueuedOp&) {
                                          ran = true;
                                          return absl::OkStatus();
                                        });
  group.reset();
  const absl::Status s = queued->WaitHost(absl::Seconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "Barrier #0 on fake group 'world' (rank 1 of 2): the group was destroyed first");
  EXPECT_FALSE(ran);
}

}  // namespace
}  // namespace internal
}  // namespace comm
