// Tests of the StoreAgent: posts are written in order and coalesced, calls come back or
// time out, and a store that hangs never holds up the caller or the agent's owner.
#include "comm/internal/store_agent.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "comm/hash_store.h"
#include "gtest/gtest.h"

namespace comm {
namespace internal {
namespace {

// A HashStore whose Sets are logged and can be held: while closed, every call blocks
// until it is opened (at most 20 s, so no test can hang).
class GatedStore : public Store {
 public:
  void Close() {
    absl::MutexLock lock(&mu_);
    open_ = false;
  }
  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }
  std::vector<std::string> sets() {
    absl::MutexLock lock(&mu_);
    return sets_;
  }
  // Waits until `n` Sets have reached the store (blocked or not).
  bool AwaitSetsStarted(int n) {
    absl::MutexLock lock(&mu_);
    auto reached = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return started_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), absl::Seconds(10));
  }

  absl::Status Set(absl::string_view key, absl::string_view value) override {
    {
      absl::MutexLock lock(&mu_);
      ++started_;
      Gate();
      sets_.push_back(absl::StrCat(key, "=", value));
    }
    return base_.Set(key, value);
  }
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override {
    Pass();
    return base_.Get(key, timeout);
  }
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override {
    Pass();
    return base_.Add(key, delta);
  }
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    Pass();
    return base_.Wait(keys, timeout);
  }
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys) override {
    Pass();
    return base_.Check(keys);
  }

 private:
  void Gate() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    mu_.AwaitWithTimeout(absl::Condition(&open_), absl::Seconds(20));
  }
  void Pass() {
    absl::MutexLock lock(&mu_);
    Gate();
  }

  HashStore base_;
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = true;
  int started_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> sets_ ABSL_GUARDED_BY(mu_);
};

absl::Status Flush(StoreAgent& agent) {
  return agent.Call([](Store&) { return absl::OkStatus(); }, absl::Seconds(10));
}

TEST(StoreAgentTest, PostsAreWrittenInOrder) {
  auto store = std::make_shared<GatedStore>();
  StoreAgent agent(store, "test");
  agent.Post("a", "1");
  agent.Post("b", "2");
  ASSERT_TRUE(Flush(agent).ok());
  EXPECT_EQ(store->sets(), (std::vector<std::string>{"a=1", "b=2"}));
  EXPECT_EQ(store->Get("b", absl::ZeroDuration()).value(), "2");
}

TEST(StoreAgentTest, PostsOfOneKeyCoalesceWhileTheStoreLags) {
  auto store = std::make_shared<GatedStore>();
  StoreAgent agent(store, "test");
  store->Close();
  agent.Post("progress/0", "1");
  ASSERT_TRUE(store->AwaitSetsStarted(1));  // the agent is stuck writing "1"
  for (int n = 2; n <= 50; ++n) agent.Post("progress/0", absl::StrCat(n));
  store->Open();
  ASSERT_TRUE(Flush(agent).ok());
  // "1" (already in flight) and then only the newest value.
  EXPECT_EQ(store->sets(), (std::vector<std::string>{"progress/0=1", "progress/0=50"}));
}

TEST(StoreAgentTest, CallReturnsTheFunctionsStatusAfterEarlierPosts) {
  auto store = std::make_shared<GatedStore>();
  StoreAgent agent(store, "test");
  agent.Post("k", "v");
  auto seen = std::make_shared<std::string>();
  absl::Status s = agent.Call(
      [seen](Store& st) -> absl::Status {
        absl::StatusOr<std::string> v = st.Get("k", absl::ZeroDuration());
        if (!v.ok()) return v.status();
        *seen = *v;
        return absl::NotFoundError("from fn");
      },
      absl::Seconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_EQ(*seen, "v");
}

TEST(StoreAgentTest, CallOnAHungStoreTimesOutAndTheOwnerIsNotHeld) {
  auto store = std::make_shared<GatedStore>();
  absl::Duration destroy_took;
  {
    auto agent = std::make_unique<StoreAgent>(store, "test");
    store->Close();
    agent->Post("progress/0", "7");  // hangs the agent thread
    const absl::Time start = absl::Now();
    absl::Status s = agent->Call([](Store&) { return absl::OkStatus(); }, absl::Milliseconds(200));
    const absl::Duration took = absl::Now() - start;
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_NE(s.message().find("no answer within 200ms"), std::string::npos) << s;
    EXPECT_GE(took, absl::Milliseconds(190));
    EXPECT_LT(took, absl::Seconds(5));
    const absl::Time destroy_start = absl::Now();
    agent.reset();
    destroy_took = absl::Now() - destroy_start;
  }
  EXPECT_LT(destroy_took, absl::Seconds(5));
  store->Open();  // the abandoned thread finishes its Set and exits on its own
  EXPECT_TRUE(store->Get("progress/0", absl::Seconds(10)).ok());
}

}  // namespace
}  // namespace internal
}  // namespace comm
