// PrefixStore: a view of another Store in which every key is put under "<prefix>/", so
// several process groups (the world, each subgroup, the NCCL id exchange) can share one
// underlying store without their keys colliding.
//
//   auto base = std::make_shared<comm::HashStore>();
//   comm::PrefixStore world(base, "world");
//   RETURN_IF_ERROR(world.Set("0", addr));   // base holds "world/0"
//
// Prefixes nest: PrefixStore(make_shared<PrefixStore>(base, "a"), "b") writes "a/b/k".
// Thread-safe if the underlying store is. Calls made for rendezvous must follow
// NOTE [Same order on all ranks] in comm/store.h.
#ifndef COMM_PREFIX_STORE_H_
#define COMM_PREFIX_STORE_H_

#include <memory>
#include <string>
#include <vector>

#include "comm/store.h"

namespace comm {

class PrefixStore : public Store {
 public:
  // `base` must not be null.
  PrefixStore(std::shared_ptr<Store> base, std::string prefix);

  const std::string& prefix() const { return prefix_; }
  const std::shared_ptr<Store>& base() const { return base_; }

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys) override;
  absl::StatusOr<bool> DeleteKey(absl::string_view key) override;
  // The base's Describe(): the prefix names no other place, and messages that name a
  // key give it with its prefix.
  std::string Describe() const override { return base_->Describe(); }

 private:
  std::string Full(absl::string_view key) const;
  std::vector<std::string> Full(const std::vector<std::string>& keys) const;

  std::shared_ptr<Store> base_;
  std::string prefix_;
};

}  // namespace comm

#endif  // COMM_PREFIX_STORE_H_
