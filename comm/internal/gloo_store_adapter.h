// Lets gloo's rendezvous (gloo::rendezvous::Context::connectFullMesh) use our Store.
// Gloo reports failure by exception, so errors from our Store are thrown as
// StoreError, which carries the original absl::Status for the caller to recover.
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
#include "comm/store.h"

namespace comm {
namespace internal {

// An error from our Store, thrown through gloo.
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
  // Waits that gloo starts without a timeout of their own use `timeout`.
  GlooStoreAdapter(std::shared_ptr<comm::Store> store, absl::Duration timeout)
      : store_(std::move(store)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::shared_ptr<comm::Store> store_;
  absl::Duration timeout_;
};

}  // namespace internal
}  // namespace comm

#endif  // COMM_INTERNAL_GLOO_STORE_ADAPTER_H_
