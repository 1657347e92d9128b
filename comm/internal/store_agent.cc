#include "comm/internal/store_agent.h"

#include <deque>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "glog/logging.h"

namespace comm {
namespace internal {

// One queued item: a Set (fn empty) or a call.
struct Item {
  std::string key;
  std::string value;
  std::function<void(Store&)> fn;
};

struct StoreAgent::State {
  std::shared_ptr<Store> store;
  std::string name;
  absl::Mutex mu;
  std::deque<Item> queue ABSL_GUARDED_BY(mu);
  bool stopping ABSL_GUARDED_BY(mu) = false;
  bool warned = false;  // only the agent thread touches it
  absl::Notification exited;
};

StoreAgent::StoreAgent(std::shared_ptr<Store> store, std::string name)
    : state_(std::make_shared<State>()) {
  state_->store = std::move(store);
  state_->name = std::move(name);
  std::thread([state = state_] { Loop(state); }).detach();
}

StoreAgent::~StoreAgent() {
  {
    absl::MutexLock lock(&state_->mu);
    state_->stopping = true;
    state_->queue.clear();
  }
  if (!state_->exited.WaitForNotificationWithTimeout(kStopWait)) {
    LOG(WARNING) << state_->name << ": the store did not answer within "
                 << absl::FormatDuration(kStopWait)
                 << " while stopping; its last request is left to finish in the background";
  }
}

void StoreAgent::Post(std::string key, std::string value) {
  absl::MutexLock lock(&state_->mu);
  if (state_->stopping) return;
  for (Item& item : state_->queue) {
    if (!item.fn && item.key == key) {
      item.value = std::move(value);
      return;
    }
  }
  state_->queue.push_back(Item{std::move(key), std::move(value), nullptr});
}

absl::Status StoreAgent::Call(std::function<absl::Status(Store&)> fn, absl::Duration timeout) {
  struct Result {
    absl::Notification done;
    absl::Status status;
  };
  auto result = std::make_shared<Result>();
  {
    absl::MutexLock lock(&state_->mu);
    if (state_->stopping) {
      return absl::FailedPreconditionError(absl::StrCat(state_->name, ": store agent stopped"));
    }
    state_->queue.push_back(Item{"", "", [fn = std::move(fn), result](Store& store) {
                                   result->status = fn(store);
                                   result->done.Notify();
                                 }});
  }
  if (!result->done.WaitForNotificationWithTimeout(timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("no answer within ", absl::FormatDuration(timeout)));
  }
  return result->status;
}

void StoreAgent::Loop(std::shared_ptr<State> state) {
  while (true) {
    Item item;
    {
      absl::MutexLock lock(&state->mu);
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) {
        return state->stopping || !state->queue.empty();
      };
      state->mu.Await(absl::Condition(&ready));
      if (state->stopping) break;
      item = std::move(state->queue.front());
      state->queue.pop_front();
    }
    if (item.fn) {
      item.fn(*state->store);
      continue;
    }
    absl::Status s = state->store->Set(item.key, item.value);
    bool stopping = false;
    {
      absl::MutexLock lock(&state->mu);
      stopping = state->stopping;  // the owner may be gone, and the process exiting
    }
    if (!s.ok() && !stopping && !state->warned) {
      state->warned = true;
      LOG(WARNING) << state->name << ": recording \"" << item.key
                   << "\" in the store failed (later failures are not logged): " << s;
    }
  }
  state->exited.Notify();
}

}  // namespace internal
}  // namespace comm
