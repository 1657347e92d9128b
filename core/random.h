// Deterministic random numbers for initialisation and synthetic data: the same seed
// gives the same sequence on every machine, compiler and thread count (no
// implementation-defined std distributions).
//
//   core::Rng rng(42);
//   float u = rng.Uniform();          // [0, 1)
//   float n = rng.Normal(0.0f, 0.02f);
//   core::Rng child = rng.Fork(7);    // independent stream derived from (seed, 7)
#ifndef CORE_RANDOM_H_
#define CORE_RANDOM_H_

#include <cmath>
#include <cstdint>

namespace core {

// xoshiro256** seeded through splitmix64.
class Rng {
 public:
  explicit Rng(uint64_t seed) : seed_(seed) {
    uint64_t x = seed;
    for (uint64_t& s : s_) s = SplitMix64(&x);
  }

  uint64_t NextU64() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }

  // Advances the stream by `n` NextU64 draws (n <= 0: none).
  void Discard(int64_t n) {
    for (int64_t i = 0; i < n; ++i) NextU64();
  }

  // Uniform in [0, 1) with 24 random bits; one NextU64 draw each (as Uniform(lo, hi)).
  float Uniform() { return static_cast<float>(NextU64() >> 40) * (1.0f / 16777216.0f); }

  // Uniform in [lo, hi).
  float Uniform(float lo, float hi) { return lo + (hi - lo) * Uniform(); }

  // Uniform integer in [0, n); n > 0.
  uint64_t UniformInt(uint64_t n) { return NextU64() % n; }

  // Normal(mean, stddev) by Box-Muller in double precision; two NextU64 draws each.
  float Normal(float mean, float stddev) {
    double u1 = static_cast<double>(NextU64() >> 11) * (1.0 / 9007199254740992.0);
    const double u2 = static_cast<double>(NextU64() >> 11) * (1.0 / 9007199254740992.0);
    if (u1 < 1e-300) u1 = 1e-300;
    const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    return static_cast<float>(mean + stddev * z);
  }

  // A generator for sub-stream `stream`, independent of how much of this one was used.
  Rng Fork(uint64_t stream) const {
    uint64_t x = seed_ ^ (0x9e3779b97f4a7c15ull * (stream + 1));
    return Rng(SplitMix64(&x));
  }

 private:
  static uint64_t SplitMix64(uint64_t* x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

  uint64_t seed_;
  uint64_t s_[4];
};

}  // namespace core

#endif  // CORE_RANDOM_H_
