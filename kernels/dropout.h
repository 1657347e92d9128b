// Dropout's keep mask as a pure function of (seed, step, element index), written once for
// the CPU loops (kernels/cpu/dropout.h) and the CUDA kernels (kernels/cuda/dropout.h), so
// every device, thread count and split of a tensor draws the same mask.
//
//   const uint64_t key = kernels::DropoutKey(seed, step);
//   const uint32_t threshold = kernels::DropoutThreshold(p);
//   for (int64_t i = 0; i < n; ++i) {
//     y[i] = kernels::DropoutApply(x[i], kernels::DropoutBits(key, offset + i), threshold, scale);
//   }
//
// NOTE [Dropout mask]: element i keeps when the top 32 bits of SplitMix64's output number
// i of the stream that starts at key = DropoutKey(seed, step) are at least
// threshold = floor(p * 2^32): with probability 1 - threshold / 2^32, within 2^-32 of 1 - p.
// The stream is counter-based (output i is Mix64(key + (i + 1) * gamma), no state), so any
// element's decision costs one mix and needs no other element's: a shard that holds
// elements [offset, offset + n) of a global tensor draws exactly the global mask's
// decisions for them. SplitMix64 passes BigCrush as a single stream; the key mixes the
// seed and the step, so neighbouring seeds or steps give unrelated masks.
#ifndef KERNELS_DROPOUT_H_
#define KERNELS_DROPOUT_H_

#include <stdint.h>

#include "core/hd.h"

namespace kernels {

// SplitMix64's increment (the golden ratio in 64 bits) and finalizer.
inline constexpr uint64_t kDropoutGamma = 0x9e3779b97f4a7c15ull;

FSDP_HD inline uint64_t DropoutMix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The stream's start for one (seed, step).
FSDP_HD inline uint64_t DropoutKey(uint64_t seed, uint64_t step) {
  return DropoutMix64(DropoutMix64(seed + kDropoutGamma) ^ (step + kDropoutGamma));
}

// 32 random bits for element `index` (NOTE [Dropout mask]).
FSDP_HD inline uint32_t DropoutBits(uint64_t key, uint64_t index) {
  return static_cast<uint32_t>(DropoutMix64(key + (index + 1) * kDropoutGamma) >> 32);
}

// floor(p * 2^32) for p in [0, 1): an element keeps when its bits are at least this.
FSDP_HD inline uint32_t DropoutThreshold(double p) {
  return static_cast<uint32_t>(p * 4294967296.0);
}

// x * scale for a kept element, 0 for a dropped one (also when x is NaN or infinite).
FSDP_HD inline float DropoutApply(float x, uint32_t bits, uint32_t threshold, float scale) {
  return bits >= threshold ? x * scale : 0.0f;
}

}  // namespace kernels

#endif  // KERNELS_DROPOUT_H_
