// Permutation: a pseudo-random permutation of [0, n) chosen by a 64-bit key, evaluated one
// position at a time in O(1) memory and time (no table), so it can order 10^9 windows of a
// token file (data/token_file.h) without materialising them.
//
//   ASSIGN_OR_RETURN(data::Permutation order, data::Permutation::Create(/*n=*/1000, /*key=*/7));
//   for (int64_t i = 0; i < order.size(); ++i) Visit(order.At(i));  // each of 0..999 once
//
// NOTE [Keyed permutation]: a balanced Feistel network of kRounds rounds over 2^b values,
// b the smallest even number of bits with 2^b >= n (so 2^b < 4 n), each round's function a
// SplitMix64 hash of (key, round, half). A Feistel network is a bijection of [0, 2^b) for
// any round function; At() walks the cycle (applies it again) until the value falls below
// n, which keeps it a bijection of [0, n) and takes fewer than 4 applications on average.
// The same (n, key) gives the same permutation on every machine and at every world size.
#ifndef DATA_PERMUTATION_H_
#define DATA_PERMUTATION_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace data {

class Permutation {
 public:
  static constexpr int kRounds = 6;

  // InvalidArgument for n < 1 or n > 2^62.
  static absl::StatusOr<Permutation> Create(int64_t n, uint64_t key);

  int64_t size() const { return n_; }
  // The value at position i, for 0 <= i < size(): every value of [0, size()) at exactly
  // one position. Outside that range: -1.
  int64_t At(int64_t i) const;

 private:
  Permutation(int64_t n, uint64_t key, int half_bits) : n_(n), key_(key), half_bits_(half_bits) {}
  // One pass of the network over [0, 2^(2 half_bits)).
  uint64_t Encrypt(uint64_t x) const;

  int64_t n_;
  uint64_t key_;
  int half_bits_;
};

}  // namespace data

#endif  // DATA_PERMUTATION_H_
