// StoreAgent: one thread that talks to a Store for a process group, so that a store
// that stops answering (a TcpStore whose serving rank hung) never stalls a collective:
// progress records are posted without waiting, and the questions a failing collective
// asks come back within a bound or not at all.
//
//   internal::StoreAgent agent(store);
//   agent.Post("progress/0", "17");                    // returns at once
//   auto value = std::make_shared<std::string>();
//   absl::Status s = agent.Call(
//       [value](Store& st) -> absl::Status {              // capture by value only
//         absl::StatusOr<std::string> v = st.Get("progress/1", absl::ZeroDuration());
//         if (v.ok()) *value = *v;
//         return v.status();
//       },
//       absl::Seconds(2));                               // DeadlineExceeded if no answer
//
// The agent works in order: posts and calls run one at a time as they were made,
// except that a post replaces a not-yet-written post of the same key (only the newest
// value of a key is written). Thread-safe.
#ifndef COMM_INTERNAL_STORE_AGENT_H_
#define COMM_INTERNAL_STORE_AGENT_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "comm/store.h"

namespace comm {
namespace internal {

class StoreAgent {
 public:
  // Starts the thread. `store` must not be null. `name` is used in log messages.
  StoreAgent(std::shared_ptr<Store> store, std::string name);
  // Stops the thread: work not started is dropped; a store call in flight gets
  // `kStopWait` to finish, after which the thread is left to finish it alone (it owns
  // everything it uses).
  ~StoreAgent();
  StoreAgent(const StoreAgent&) = delete;
  StoreAgent& operator=(const StoreAgent&) = delete;

  static constexpr absl::Duration kStopWait = absl::Milliseconds(200);

  // Queues Set(key, value) and returns at once. A failed Set is logged (once per
  // agent), never reported.
  void Post(std::string key, std::string value);

  // Runs `fn` on the agent thread after the work queued before it, and returns its
  // status; DeadlineExceeded ("no answer within 2s") when `fn` has not finished within
  // `timeout`, counting the wait for earlier work (it may still run later: capture only
  // by value or shared_ptr).
  absl::Status Call(std::function<absl::Status(Store&)> fn, absl::Duration timeout);

 private:
  struct State;
  // The thread's body; owns `state` (and through it the store) until it returns.
  static void Loop(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
};

}  // namespace internal
}  // namespace comm

#endif  // COMM_INTERNAL_STORE_AGENT_H_
