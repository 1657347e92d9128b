#include "data/permutation.h"

#include "absl/strings/str_cat.h"

namespace data {
namespace {

uint64_t Mix(uint64_t z) {  // SplitMix64's finaliser
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

absl::StatusOr<Permutation> Permutation::Create(int64_t n, uint64_t key) {
  if (n < 1 || n > (int64_t{1} << 62)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Permutation::Create: n = ", n, ": must be in [1, 2^62]"));
  }
  int bits = 0;
  while ((int64_t{1} << bits) < n) ++bits;
  if (bits % 2 != 0) ++bits;
  return Permutation(n, key, bits / 2);
}

uint64_t Permutation::Encrypt(uint64_t x) const {
  if (half_bits_ == 0) return x;  // n == 1
  const uint64_t mask = (uint64_t{1} << half_bits_) - 1;
  uint64_t left = x >> half_bits_, right = x & mask;
  for (int r = 0; r < kRounds; ++r) {
    const uint64_t f = Mix(key_ ^ Mix((static_cast<uint64_t>(r) << 58) ^ right)) & mask;
    const uint64_t next = left ^ f;
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

int64_t Permutation::At(int64_t i) const {
  if (i < 0 || i >= n_) return -1;
  uint64_t x = static_cast<uint64_t>(i);
  do {
    x = Encrypt(x);
  } while (x >= static_cast<uint64_t>(n_));
  return static_cast<int64_t>(x);
}

}  // namespace data
