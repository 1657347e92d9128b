#include "comm/work.h"

#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace comm {
namespace {

TEST(CompletionWorkTest, IsCompletedDoesNotBlockAndWaitReturnsTheStatus) {
  auto work = std::make_shared<CompletionWork>("AllReduce #0 on test");
  EXPECT_FALSE(work->IsCompleted());
  absl::Status early = work->Wait(absl::Milliseconds(10));
  EXPECT_EQ(early.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(early.message().find("AllReduce #0 on test"), std::string::npos) << early;
  std::thread t([work] {
    absl::SleepFor(absl::Milliseconds(50));
    work->Complete(absl::UnavailableError("peer died"));
  });
  absl::Status s = work->Wait(absl::Seconds(10));
  t.join();
  EXPECT_TRUE(work->IsCompleted());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  // Only the first completion counts.
  work->Complete(absl::OkStatus());
  EXPECT_EQ(work->Wait(absl::ZeroDuration()).code(), absl::StatusCode::kUnavailable);
}

TEST(CompletionWorkTest, DoneIsAlreadyComplete) {
  auto work = CompletionWork::Done(absl::OkStatus(), "noop");
  EXPECT_TRUE(work->IsCompleted());
  EXPECT_TRUE(work->Wait(absl::ZeroDuration()).ok());
  EXPECT_EQ(work->Describe(), "noop");
}

TEST(CompletionWorkTest, RunTimeIsKnownOnlyOnceCompleted) {
  CompletionWork work("AllGather #1");
  EXPECT_FALSE(work.RunTime().has_value());
  work.SetRunTime(absl::Milliseconds(7));
  EXPECT_FALSE(work.RunTime().has_value()) << "still running";
  work.Complete(absl::OkStatus());
  ASSERT_TRUE(work.RunTime().has_value());
  EXPECT_EQ(*work.RunTime(), absl::Milliseconds(7));
  EXPECT_FALSE(CompletionWork::Done(absl::OkStatus(), "x")->RunTime().has_value())
      << "a backend that does not measure leaves it unknown";
}

}  // namespace
}  // namespace comm
