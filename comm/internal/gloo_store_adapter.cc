#include "comm/internal/gloo_store_adapter.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace comm {
namespace internal {
namespace {

// The rank in a gloo rendezvous key "<rank>" or "rank_<rank>", or -1.
int RankOfKey(absl::string_view key, bool* host_name_key) {
  *host_name_key = absl::ConsumePrefix(&key, "rank_");
  int rank = -1;
  if (key.empty() || key.size() > 9 || !absl::SimpleAtoi(key, &rank) || rank < 0) return -1;
  for (char c : key) {
    if (c < '0' || c > '9') return -1;
  }
  return rank;
}

}  // namespace

absl::Duration GlooStoreAdapter::Left() const {
  return std::max(absl::ZeroDuration(), deadline_ - absl::Now());
}

void GlooStoreAdapter::Check(const std::string& key, const std::string& value) {
  bool host_name_key = false;
  const int owner = RankOfKey(key, &host_name_key);
  if (owner < 0 || owner >= size_ || owner == rank_) return;
  absl::Status s;
  std::string what;
  if (host_name_key) {
    what = absl::StrCat("the host name of rank ", owner);
    s = CheckHostName(value);
  } else {
    what = absl::StrCat("the gloo addresses of rank ", owner);
    absl::StatusOr<PeerAddress> mine = ParseAddressList(value, owner, rank_, size_);
    if (mine.ok()) listening_.Add(*mine, owner);
    s = mine.status();
  }
  if (s.ok()) return;
  throw StoreError(absl::Status(
      s.code(), absl::StrCat("key '", key_prefix_, key, "' (", what, "): ", s.message(),
                             ": it was not written by rank ", owner,
                             "'s gloo (corrupt, or forged by another process)")));
}

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  absl::Status s = store_->Set(key, absl::string_view(data.data(), data.size()));
  if (!s.ok()) throw StoreError(std::move(s));
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  absl::StatusOr<std::string> v = store_->Get(key, Left());
  if (!v.ok()) throw StoreError(v.status());
  Check(key, *v);
  return std::vector<char>(v->begin(), v->end());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys) { wait(keys, {}); }

void GlooStoreAdapter::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& /*timeout*/) {
  absl::Status s = store_->Wait(keys, Left());
  if (!s.ok()) throw StoreError(std::move(s));
}

}  // namespace internal
}  // namespace comm
