// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), small and dependency-free, for the
// TcpStore job-secret handshake. Not a general crypto library: no streaming HMAC, no
// other hashes.
//
//   std::string digest = comm::internal::Sha256("abc");              // 32 raw bytes
//   std::string mac = comm::internal::HmacSha256(secret, nonce);     // 32 raw bytes
//   bool same = comm::internal::ConstantTimeEquals(mac, received);
#ifndef COMM_INTERNAL_SHA256_H_
#define COMM_INTERNAL_SHA256_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace comm {
namespace internal {

// Size of a SHA-256 digest (and of an HMAC-SHA256 tag), in bytes.
inline constexpr size_t kSha256Bytes = 32;

// Incremental SHA-256: Update any number of times, then Finish once.
class Sha256Hasher {
 public:
  Sha256Hasher();
  void Update(absl::string_view data);
  // The 32-byte digest of everything passed to Update. The hasher must not be used after.
  std::string Finish();

 private:
  void Block(const uint8_t* p);

  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_bytes_ = 0;
};

// The 32-byte SHA-256 digest of `data`.
std::string Sha256(absl::string_view data);

// The 32-byte HMAC-SHA256 of `message` under `key` (any length; RFC 2104).
std::string HmacSha256(absl::string_view key, absl::string_view message);

// Whether `a` and `b` are equal, taking time that depends only on their lengths (not on
// where they first differ). Different lengths compare unequal.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace internal
}  // namespace comm

#endif  // COMM_INTERNAL_SHA256_H_
