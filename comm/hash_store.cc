#include "comm/hash_store.h"

#include "absl/strings/str_cat.h"
#include "comm/internal/store_util.h"

namespace comm {

absl::Status HashStore::Set(absl::string_view key, absl::string_view value) {
  absl::MutexLock lock(&mu_);
  map_[std::string(key)] = std::string(value);
  return absl::OkStatus();
}

absl::StatusOr<std::string> HashStore::Get(absl::string_view key, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto present = [this, key]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return map_.find(key) != map_.end(); };
  if (!mu_.AwaitWithTimeout(absl::Condition(&present), timeout)) {
    return internal::WaitTimedOut("HashStore", {std::string(key)}, timeout);
  }
  return map_.find(key)->second;
}

absl::StatusOr<int64_t> HashStore::Add(absl::string_view key, int64_t delta) {
  absl::MutexLock lock(&mu_);
  auto it = map_.find(key);
  absl::StatusOr<int64_t> value =
      internal::AddToCounter("HashStore", key, it == map_.end() ? nullptr : &it->second, delta);
  if (!value.ok()) return value.status();
  map_[std::string(key)] = absl::StrCat(*value);
  return value;
}

bool HashStore::HasAll(const std::vector<std::string>& keys) const {
  for (const std::string& k : keys) {
    if (map_.find(k) == map_.end()) return false;
  }
  return true;
}

absl::Status HashStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this, &keys]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return HasAll(keys); };
  if (mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) return absl::OkStatus();
  std::vector<std::string> missing;
  for (const std::string& k : keys) {
    if (map_.find(k) == map_.end()) missing.push_back(k);
  }
  return internal::WaitTimedOut("HashStore", missing, timeout);
}

absl::StatusOr<bool> HashStore::Check(const std::vector<std::string>& keys) {
  absl::MutexLock lock(&mu_);
  return HasAll(keys);
}

absl::StatusOr<bool> HashStore::DeleteKey(absl::string_view key) {
  absl::MutexLock lock(&mu_);
  auto it = map_.find(key);
  if (it == map_.end()) return false;
  map_.erase(it);
  return true;
}

int64_t HashStore::NumKeys() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(map_.size());
}

}  // namespace comm
