// Lets gloo's rendezvous (gloo::rendezvous::Context::connectFullMesh) use our Store,
// and checks every value gloo reads before gloo parses it.
//
//   internal::GlooStoreAdapter adapter(store, rank, size, absl::Now() + timeout, "world/");
//   context->connectFullMesh(adapter, device);   // may throw StoreError
//   adapter.listening();                          // peers' listening addresses, by rank
//
// Gloo reports failure by exception, so errors are thrown as StoreError, which carries
// an absl::Status for the caller to recover: the store's own error (DeadlineExceeded
// naming the missing keys when a rank does not join by the deadline), or DataLoss naming
// the key and the rank it claims to be when a value cannot be what that rank's gloo
// wrote (NOTE [Gloo TCP addresses] in comm/internal/gloo_address.h), so that random or
// truncated bytes never reach gloo's parser.
#ifndef COMM_INTERNAL_GLOO_STORE_ADAPTER_H_
#define COMM_INTERNAL_GLOO_STORE_ADAPTER_H_

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "comm/internal/gloo_address.h"
#include "comm/store.h"

namespace comm {
namespace internal {

// An error from our Store or a value check, thrown through gloo.
class StoreError : public std::runtime_error {
 public:
  explicit StoreError(absl::Status status)
      : std::runtime_error(std::string(status.message())), status_(std::move(status)) {}
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  // For rank `rank` of `size`; every wait and get gives up at `deadline`. `key_prefix`
  // ("world/") is what `store` puts before its keys, for messages only.
  GlooStoreAdapter(std::shared_ptr<comm::Store> store, int rank, int size, absl::Time deadline,
                   std::string key_prefix)
      : store_(std::move(store)),
        rank_(rank),
        size_(size),
        deadline_(deadline),
        key_prefix_(std::move(key_prefix)) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  // Gloo's own timeout is ignored: waits end at the adapter's deadline.
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  // The address each peer listens on for its pair with this rank, as read so far.
  const PeerDirectory& listening() const { return listening_; }

 private:
  absl::Duration Left() const;
  // Throws StoreError(DataLoss) unless `value` of `key` is well formed.
  void Check(const std::string& key, const std::string& value);

  std::shared_ptr<comm::Store> store_;
  const int rank_;
  const int size_;
  const absl::Time deadline_;
  const std::string key_prefix_;
  PeerDirectory listening_;
};

}  // namespace internal
}  // namespace comm

#endif  // COMM_INTERNAL_GLOO_STORE_ADAPTER_H_
