// Store: the small key-value service that ranks use to find each other (rendezvous)
// before any collective can run. Backends exchange addresses and ids through it.
//
//   std::shared_ptr<comm::Store> store = std::make_shared<comm::HashStore>();
//   RETURN_IF_ERROR(store->Set("addr/0", "10.0.0.1:4000"));
//   ASSIGN_OR_RETURN(std::string addr, store->Get("addr/0", absl::Seconds(30)));
//   ASSIGN_OR_RETURN(int64_t arrived, store->Add("arrived", 1));
//   RETURN_IF_ERROR(store->Wait({"addr/0", "addr/1"}, absl::Seconds(30)));
//
// Implementations: HashStore (one process), FileStore (a directory several processes
// can see), TcpStore (served by rank 0 over TCP); PrefixStore lets several groups share
// one store. Values are byte strings; Add keeps a decimal integer under its key, so
// Get of a counter returns e.g. "3".
//
// NOTE [Same order on all ranks]: everything in comm/ that several ranks take part in
// (rendezvous, collectives, subgroup creation) must be called in the same order, with
// matching arguments, on every rank of the group. Stores themselves are plain shared
// state and have no such rule, but the code that uses them for rendezvous does.
#ifndef COMM_STORE_H_
#define COMM_STORE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace comm {

// Environment variable holding the job secret every client of a job's TcpStore proves
// (comm/tcp_store.h); comm::Launch sets it for its ranks, a cluster scheduler may too.
inline constexpr char kJobSecretEnv[] = "FSDP_JOB_SECRET";

class Store {
 public:
  virtual ~Store() = default;

  // Stores `value` under `key`, replacing what was there, and wakes waiters on it.
  virtual absl::Status Set(absl::string_view key, absl::string_view value) = 0;

  // The value of `key`, waiting up to `timeout` for it to be set. DeadlineExceeded
  // naming the key and the timeout when it does not appear in time.
  virtual absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) = 0;

  // Adds `delta` to the integer under `key` (0 if absent) and returns the new value.
  // InvalidArgument if the key holds something that is not a decimal integer.
  virtual absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) = 0;

  // Returns once every key in `keys` is set; DeadlineExceeded naming the missing keys
  // after `timeout`.
  virtual absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) = 0;

  // Whether every key in `keys` is set right now; never waits.
  virtual absl::StatusOr<bool> Check(const std::vector<std::string>& keys) = 0;

  // Removes `key`; returns whether it was there. Optional: Unimplemented by default.
  virtual absl::StatusOr<bool> DeleteKey(absl::string_view key) {
    return absl::UnimplementedError(
        absl::StrCat("DeleteKey(\"", key, "\") is not supported by this store"));
  }

  // How messages about this store name it: a noun phrase saying where its data lives,
  // "the store at 127.0.0.1:29500" (TcpStore), "the store in /tmp/job42" (FileStore),
  // "the in-process store" (HashStore). A view of another store (PrefixStore) names
  // that store. The default, for stores that do not say, is "the store". Never blocks.
  virtual std::string Describe() const { return "the store"; }
};

}  // namespace comm

#endif  // COMM_STORE_H_
