// HashStore: an in-process Store (a map behind a mutex). Rank threads of one process
// share one HashStore for rendezvous; see comm/testing/thread_ranks.h.
//
//   auto store = std::make_shared<comm::HashStore>();
//   RETURN_IF_ERROR(store->Set("k", "v"));
//   ASSIGN_OR_RETURN(std::string v, store->Get("k", absl::Seconds(1)));  // "v"
//
// Thread-safe. Calls made for rendezvous must follow NOTE [Same order on all ranks]
// in comm/store.h.
#ifndef COMM_HASH_STORE_H_
#define COMM_HASH_STORE_H_

#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "comm/store.h"

namespace comm {

class HashStore : public Store {
 public:
  HashStore() = default;
  HashStore(const HashStore&) = delete;
  HashStore& operator=(const HashStore&) = delete;

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys) override;
  absl::StatusOr<bool> DeleteKey(absl::string_view key) override;
  // "the in-process store".
  std::string Describe() const override { return "the in-process store"; }

  // Number of keys held; for tests.
  int64_t NumKeys() const;

 private:
  bool HasAll(const std::vector<std::string>& keys) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, std::string, std::less<>> map_ ABSL_GUARDED_BY(mu_);
};

}  // namespace comm

#endif  // COMM_HASH_STORE_H_
