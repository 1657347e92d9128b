#include "comm/testing/store_conformance.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/time/clock.h"

namespace comm {
namespace testing {

std::string StoreFactoryName(const ::testing::TestParamInfo<StoreFactory>& info) {
  return info.param.name;
}

void StoreConformanceTest::SetUp() {
  store_ = GetParam().make();
  ASSERT_NE(store_, nullptr);
}

std::shared_ptr<Store> StoreConformanceTest::Another() {
  if (GetParam().connect_another) return GetParam().connect_another(store_);
  return store_;
}

namespace {

// Generous bound for "returned promptly" on a loaded 2-core machine: the operations
// measured take milliseconds, so a 5 s bound only fails on a real hang or missed wakeup.
constexpr absl::Duration kPrompt = absl::Seconds(5);

TEST_P(StoreConformanceTest, SetThenGetReturnsLatestValue) {
  ASSERT_TRUE(store_->Set("k", "first").ok());
  EXPECT_EQ(store_->Get("k", absl::Seconds(1)).value(), "first");
  ASSERT_TRUE(store_->Set("k", "second").ok());
  EXPECT_EQ(Another()->Get("k", absl::Seconds(1)).value(), "second");
}

TEST_P(StoreConformanceTest, BinaryValuesRoundTrip) {
  std::string value;
  for (int i = 0; i < 256; ++i) value.push_back(static_cast<char>(i));
  value += std::string(3, '\0');
  ASSERT_TRUE(store_->Set("bin/key with spaces", value).ok());
  EXPECT_EQ(store_->Get("bin/key with spaces", absl::Seconds(1)).value(), value);
  ASSERT_TRUE(store_->Set("empty", "").ok());
  EXPECT_EQ(store_->Get("empty", absl::Seconds(1)).value(), "");
}

TEST_P(StoreConformanceTest, GetWaitsForALaterSet) {
  std::shared_ptr<Store> other = Another();
  std::thread setter([other] {
    absl::SleepFor(absl::Milliseconds(100));
    EXPECT_TRUE(other->Set("late", "here").ok());
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> v = store_->Get("late", absl::Seconds(20));
  setter.join();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "here");
  EXPECT_LT(absl::Now() - start, kPrompt);
}

TEST_P(StoreConformanceTest, GetOfAMissingKeyTimesOutNamingIt) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> v = store_->Get("never/set", absl::Milliseconds(200));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(v.status().code(), absl::StatusCode::kDeadlineExceeded) << v.status();
  EXPECT_NE(v.status().message().find("never/set"), std::string::npos) << v.status();
  // It waited (at least most of) the timeout, and not much longer. 150 ms rather than
  // 200 ms allows for clock granularity in the poll loops.
  EXPECT_GE(took, absl::Milliseconds(150));
  EXPECT_LT(took, kPrompt);
}

TEST_P(StoreConformanceTest, ConcurrentAddsAreAtomic) {
  constexpr int kThreads = 4, kAdds = 25;
  std::vector<std::thread> threads;
  std::vector<std::shared_ptr<Store>> clients;
  for (int t = 0; t < kThreads; ++t) clients.push_back(Another());
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kAdds; ++i) EXPECT_TRUE(clients[t]->Add("counter", 1).ok());
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(store_->Add("counter", 0).value(), kThreads * kAdds);
  EXPECT_EQ(store_->Get("counter", absl::Seconds(1)).value(), std::to_string(kThreads * kAdds));
  EXPECT_EQ(store_->Add("counter", -5).value(), kThreads * kAdds - 5);
}

TEST_P(StoreConformanceTest, AddOnANonIntegerIsInvalidArgument) {
  ASSERT_TRUE(store_->Set("text", "hello").ok());
  EXPECT_EQ(store_->Add("text", 1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(StoreConformanceTest, WaitReturnsWhenAllKeysAreSetAndNamesMissingOnes) {
  ASSERT_TRUE(store_->Set("a", "1").ok());
  absl::Status s = store_->Wait({"a", "b"}, absl::Milliseconds(200));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("b"), std::string::npos) << s;
  EXPECT_EQ(s.message().find("[a"), std::string::npos) << "present key named missing: " << s;

  std::shared_ptr<Store> other = Another();
  std::thread setter([other] {
    absl::SleepFor(absl::Milliseconds(100));
    EXPECT_TRUE(other->Set("b", "2").ok());
  });
  EXPECT_TRUE(store_->Wait({"a", "b"}, absl::Seconds(20)).ok());
  setter.join();
}

TEST_P(StoreConformanceTest, CheckNeverWaits) {
  EXPECT_FALSE(store_->Check({"x"}).value());
  ASSERT_TRUE(store_->Set("x", "1").ok());
  EXPECT_TRUE(store_->Check({"x"}).value());
  EXPECT_FALSE(store_->Check({"x", "y"}).value());
  EXPECT_TRUE(store_->Check({}).value());
}

TEST_P(StoreConformanceTest, DeleteKeyRemovesIt) {
  absl::StatusOr<bool> missing = store_->DeleteKey("gone");
  if (!GetParam().supports_delete) {
    EXPECT_EQ(missing.status().code(), absl::StatusCode::kUnimplemented);
    return;
  }
  EXPECT_FALSE(missing.value());
  ASSERT_TRUE(store_->Set("gone", "v").ok());
  EXPECT_TRUE(store_->DeleteKey("gone").value());
  EXPECT_FALSE(store_->Check({"gone"}).value());
}

}  // namespace
}  // namespace testing
}  // namespace comm
