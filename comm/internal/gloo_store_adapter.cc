#include "comm/internal/gloo_store_adapter.h"

namespace comm {
namespace internal {

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  absl::Status s = store_->Set(key, absl::string_view(data.data(), data.size()));
  if (!s.ok()) throw StoreError(std::move(s));
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  absl::StatusOr<std::string> v = store_->Get(key, timeout_);
  if (!v.ok()) throw StoreError(v.status());
  return std::vector<char>(v->begin(), v->end());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys) { wait(keys, {}); }

void GlooStoreAdapter::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  // Gloo passes zero (kNoTimeout) or its context timeout; never wait past ours.
  absl::Duration t = absl::Milliseconds(timeout.count());
  if (t <= absl::ZeroDuration() || t > timeout_) t = timeout_;
  absl::Status s = store_->Wait(keys, t);
  if (!s.ok()) throw StoreError(std::move(s));
}

}  // namespace internal
}  // namespace comm
