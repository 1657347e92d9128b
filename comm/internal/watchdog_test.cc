// Tests of the watchdog's deadline and queue logic (NOTE [Watchdog]) with fake
// operations: a flag stands for the CUDA event, an injected clock for time.
#include "comm/internal/watchdog.h"

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace comm {
namespace internal {
namespace {

// A fake asynchronous operation: finishes when `outcome` is set; the "device" is done
// with its buffers when `device_done` is true. Records what the watchdog did to it.
struct FakeOp {
  std::optional<absl::Status> outcome;
  bool device_done = false;
  int completions = 0;
  absl::Status completed_with;
  int releases = 0;
};

class FakeClock {
 public:
  absl::Time Now() const { return now_; }
  void Advance(absl::Duration d) { now_ += d; }

 private:
  absl::Time now_ = absl::FromUnixSeconds(1000);
};

WatchedOp Watch(FakeOp* fake, const std::string& name, absl::Duration timeout,
                bool track_device = true) {
  WatchedOp op;
  op.description = name;
  op.timeout = timeout;
  op.poll = [fake] { return fake->outcome; };
  if (track_device) op.device_done = [fake] { return fake->device_done; };
  op.complete = [fake](const absl::Status& s) {
    ++fake->completions;
    fake->completed_with = s;
  };
  op.release = [fake] { ++fake->releases; };
  return op;
}

class WatchdogTest : public ::testing::Test {
 protected:
  std::unique_ptr<Watchdog> Make() {
    Watchdog::Options options;
    options.now = [this] { return clock_.Now(); };
    options.start_thread = false;
    options.on_failure = [this](const absl::Status& s) { failures_.push_back(s); };
    return std::make_unique<Watchdog>(options);
  }
  FakeClock clock_;
  std::vector<absl::Status> failures_;
};

TEST_F(WatchdogTest, CompletesASucceededOperationOnceAndReleasesItWhenTheDeviceIsDone) {
  auto dog = Make();
  FakeOp op;
  dog->Add(Watch(&op, "AllGather #0 on nccl group 'world' (rank 0 of 2)", absl::Seconds(5)));
  EXPECT_EQ(dog->PollOnce(), 0);
  EXPECT_EQ(op.completions, 0);
  EXPECT_EQ(dog->running(), 1);
  op.outcome = absl::OkStatus();
  EXPECT_EQ(dog->PollOnce(), 1);
  EXPECT_EQ(op.completions, 1);
  EXPECT_TRUE(op.completed_with.ok());
  // Complete, but the device still uses the buffers: kept, not released.
  EXPECT_EQ(op.releases, 0);
  EXPECT_EQ(dog->running(), 0);
  EXPECT_EQ(dog->draining(), 1);
  dog->PollOnce();
  EXPECT_EQ(op.releases, 0);
  op.device_done = true;
  dog->PollOnce();
  EXPECT_EQ(op.releases, 1);
  EXPECT_EQ(dog->draining(), 0);
  dog->PollOnce();
  EXPECT_EQ(op.completions, 1);
  EXPECT_EQ(op.releases, 1);
  EXPECT_TRUE(failures_.empty());
}

TEST_F(WatchdogTest, EnforcesTheDeadlineWithoutAnyoneWaiting) {
  auto dog = Make();
  FakeOp op;
  dog->Add(Watch(&op, "ReduceScatter #7 on nccl group 'world' (rank 1 of 2)", absl::Seconds(5)));
  clock_.Advance(absl::Seconds(4));
  dog->PollOnce();
  EXPECT_EQ(op.completions, 0) << "not yet at the deadline";
  clock_.Advance(absl::Seconds(2));
  EXPECT_EQ(dog->PollOnce(), 1);
  ASSERT_EQ(op.completions, 1);
  EXPECT_EQ(op.completed_with.code(), absl::StatusCode::kDeadlineExceeded);
  const std::string message(op.completed_with.message());
  EXPECT_NE(message.find("ReduceScatter #7"), std::string::npos) << message;
  EXPECT_NE(message.find("nccl group 'world'"), std::string::npos) << message;
  EXPECT_NE(message.find("5s"), std::string::npos) << message;
  // The group hears about it first (to abort the communicator and break).
  ASSERT_EQ(failures_.size(), 1u);
  EXPECT_EQ(failures_[0], op.completed_with);
  // A late finish changes nothing.
  op.outcome = absl::OkStatus();
  dog->PollOnce();
  EXPECT_EQ(op.completions, 1);
  EXPECT_EQ(op.completed_with.code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(WatchdogTest, AFailedOperationBreaksTheGroupAndKeepsItsBuffersUntilTheDeviceIsDone) {
  auto dog = Make();
  FakeOp failed, later;
  dog->Add(Watch(&failed, "AllReduce #1", absl::Seconds(5)));
  dog->Add(Watch(&later, "AllReduce #2", absl::Seconds(5)));
  failed.outcome = absl::InternalError("NCCL asynchronous error: remote process exited");
  dog->PollOnce();
  EXPECT_EQ(failed.completions, 1);
  EXPECT_EQ(failed.completed_with.code(), absl::StatusCode::kInternal);
  ASSERT_EQ(failures_.size(), 1u);
  EXPECT_EQ(later.completions, 0);
  EXPECT_EQ(failed.releases, 0) << "the kernel may still be running";
  failed.device_done = true;
  dog->PollOnce();
  EXPECT_EQ(failed.releases, 1);
}

TEST_F(WatchdogTest, EachOperationHasItsOwnDeadline) {
  auto dog = Make();
  FakeOp short_op, long_op;
  dog->Add(Watch(&long_op, "Broadcast #0", absl::Seconds(10)));
  clock_.Advance(absl::Seconds(1));
  dog->Add(Watch(&short_op, "Barrier #1", absl::Seconds(2)));
  clock_.Advance(absl::Seconds(2.5));
  dog->PollOnce();
  EXPECT_EQ(long_op.completions, 0);
  EXPECT_EQ(short_op.completions, 1);
  EXPECT_EQ(short_op.completed_with.code(), absl::StatusCode::kDeadlineExceeded);
  clock_.Advance(absl::Seconds(7));
  dog->PollOnce();
  EXPECT_EQ(long_op.completions, 1);
  EXPECT_EQ(long_op.completed_with.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(failures_.size(), 2u);
}

TEST_F(WatchdogTest, WithoutADeviceCallbackReleasesAtCompletion) {
  auto dog = Make();
  FakeOp op;
  dog->Add(Watch(&op, "AllGather #0", absl::Seconds(1), /*track_device=*/false));
  op.outcome = absl::OkStatus();
  dog->PollOnce();
  EXPECT_EQ(op.completions, 1);
  EXPECT_EQ(op.releases, 1);
  EXPECT_EQ(dog->draining(), 0);
}

TEST_F(WatchdogTest, DestructionAbortsRunningOperationsAndReleasesEverything) {
  FakeOp running, draining;
  {
    auto dog = Make();
    dog->Add(Watch(&running, "AllGather #0", absl::Seconds(100)));
    dog->Add(Watch(&draining, "AllGather #1", absl::Seconds(100)));
    draining.outcome = absl::OkStatus();
    dog->PollOnce();
    EXPECT_EQ(draining.releases, 0);
  }
  EXPECT_EQ(running.completions, 1);
  EXPECT_EQ(running.completed_with.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(running.releases, 1);
  EXPECT_EQ(draining.completions, 1);
  EXPECT_TRUE(draining.completed_with.ok());
  EXPECT_EQ(draining.releases, 1);
}

// The real thread and clock: an operation that never finishes fails at its deadline
// although nobody polls or waits.
TEST(WatchdogThreadTest, TheThreadFiresTheDeadlineOnItsOwn) {
  absl::Notification failed;
  Watchdog::Options options;
  options.poll_interval = absl::Milliseconds(1);
  options.on_failure = [&](const absl::Status&) {
    if (!failed.HasBeenNotified()) failed.Notify();
  };
  Watchdog dog(options);
  absl::Notification completed;
  absl::Status outcome;
  WatchedOp op;
  op.description = "AllReduce #0 on fake group";
  op.timeout = absl::Milliseconds(50);
  op.poll = [] { return std::optional<absl::Status>(); };  // never finishes
  op.complete = [&](const absl::Status& s) {
    outcome = s;
    completed.Notify();
  };
  const absl::Time start = absl::Now();
  dog.Add(std::move(op));
  ASSERT_TRUE(completed.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(50));
  EXPECT_TRUE(failed.HasBeenNotified());
  EXPECT_EQ(outcome.code(), absl::StatusCode::kDeadlineExceeded) << outcome;
}

TEST(WatchdogThreadTest, OperationsAddedFromACallbackQueueAfterTheOlderOnes) {
  Watchdog::Options options;
  options.start_thread = false;
  Watchdog dog(options);
  std::vector<int> order;
  std::vector<std::unique_ptr<FakeOp>> ops;
  for (int i = 0; i < 4; ++i) ops.push_back(std::make_unique<FakeOp>());
  auto make = [&](int i) {
    WatchedOp op = Watch(ops[i].get(), "op", absl::Seconds(60), /*track_device=*/false);
    op.complete = [&order, i](const absl::Status&) { order.push_back(i); };
    return op;
  };
  for (int i = 0; i < 3; ++i) {
    WatchedOp op = make(i);
    if (i == 0) {
      // Op 0's completion queues op 3 (the NCCL group may issue from a callback's thread).
      op.complete = [&order, &dog, &make](const absl::Status&) {
        order.push_back(0);
        dog.Add(make(3));
      };
    }
    dog.Add(std::move(op));
  }
  ops[0]->outcome = absl::OkStatus();
  EXPECT_EQ(dog.PollOnce(), 1);
  EXPECT_EQ(dog.running(), 3);
  for (auto& op : ops) op->outcome = absl::OkStatus();
  EXPECT_EQ(dog.PollOnce(), 3);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
}

}  // namespace
}  // namespace internal
}  // namespace comm
