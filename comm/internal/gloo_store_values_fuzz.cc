// Fuzzes everything the gloo backend parses from the store or from gloo's messages:
// rendezvous addresses and host names (through the store adapter, as gloo would read
// them), connection records, broken records, progress values and error messages.
// Input: byte 0 picks the group size (2..9) and the key read; the rest is the value.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "comm/hash_store.h"
#include "comm/internal/gloo_address.h"
#include "comm/internal/gloo_diagnosis.h"
#include "comm/internal/gloo_store_adapter.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int group_size = 2 + data[0] % 8;
  const bool host_name_key = (data[0] & 0x80) != 0;
  const std::string value(reinterpret_cast<const char*>(data + 1), size - 1);
  namespace ci = comm::internal;

  // As gloo's rendezvous reads it: rank 0 reads rank 1's key.
  auto store = std::make_shared<comm::HashStore>();
  const std::string key = host_name_key ? "rank_1" : "1";
  if (!store->Set(key, value).ok()) return 0;
  ci::GlooStoreAdapter adapter(store, 0, group_size, absl::Now() + absl::Seconds(1), "world/");
  try {
    std::vector<char> got = adapter.get(key);
    if (got.size() != value.size()) __builtin_trap();
  } catch (const ci::StoreError&) {
  }

  (void)ci::ParseAddressList(value, 1, 0, group_size);
  (void)ci::CheckHostName(value);
  (void)ci::FindConnection(value, 1, 0);
  (void)ci::DecodeBrokenRecord(value);
  (void)ci::ParseProgress(value);
  ci::PeerDirectory directory;
  for (const std::string& address : ci::GlooAddressesIn(value)) {
    directory.Add(ci::PeerAddress{address, "shown"}, 1);
  }
  std::string shown;
  const int rank = directory.RankIn(value, &shown);
  if (!ci::GlooAddressesIn(value).empty() && rank != 1) __builtin_trap();
  return 0;
}
