#include "comm/prefix_store.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace comm {

PrefixStore::PrefixStore(std::shared_ptr<Store> base, std::string prefix)
    : base_(std::move(base)), prefix_(std::move(prefix)) {}

std::string PrefixStore::Full(absl::string_view key) const {
  return absl::StrCat(prefix_, "/", key);
}

std::vector<std::string> PrefixStore::Full(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const std::string& k : keys) out.push_back(Full(k));
  return out;
}

absl::Status PrefixStore::Set(absl::string_view key, absl::string_view value) {
  return base_->Set(Full(key), value);
}

absl::StatusOr<std::string> PrefixStore::Get(absl::string_view key, absl::Duration timeout) {
  return base_->Get(Full(key), timeout);
}

absl::StatusOr<int64_t> PrefixStore::Add(absl::string_view key, int64_t delta) {
  return base_->Add(Full(key), delta);
}

absl::Status PrefixStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  return base_->Wait(Full(keys), timeout);
}

absl::StatusOr<bool> PrefixStore::Check(const std::vector<std::string>& keys) {
  return base_->Check(Full(keys));
}

absl::StatusOr<bool> PrefixStore::DeleteKey(absl::string_view key) {
  return base_->DeleteKey(Full(key));
}

}  // namespace comm
