// ReduceChunkList over contiguous chunks, against a plain element-by-element reference: same bits
// for every dtype and op, including lengths that cross the bf16/int32 accumulator's block boundary.
#include "comm/internal/reduce.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "gtest/gtest.h"

namespace comm {
namespace internal {
namespace {

// The reference: element i combines chunk 0, 1, ..., n-1 in that order.
template <typename T, typename Acc, typename Load, typename StoreFn>
std::vector<T> Reference(ReduceOp op, const std::vector<T>& chunks, int n, int64_t k, Load load,
                         StoreFn store) {
  std::vector<T> out(k);
  for (int64_t i = 0; i < k; ++i) {
    Acc acc = load(chunks[i]);
    for (int j = 1; j < n; ++j) {
      const Acc v = load(chunks[j * k + i]);
      acc = op == ReduceOp::kMax ? std::max(acc, v) : acc + v;
    }
    if (op == ReduceOp::kAverage) acc = acc / static_cast<Acc>(n);
    out[i] = store(acc);
  }
  return out;
}

// Chunk j of `n` contiguous chunks of k elements at chunks[j * k].
void ReduceChunks(core::DType dtype, ReduceOp op, const void* chunks, int n, int64_t k, void* out) {
  std::vector<const void*> list(n);
  for (int j = 0; j < n; ++j) {
    list[j] = static_cast<const char*>(chunks) + j * k * core::DTypeSize(dtype);
  }
  ReduceChunkList(dtype, op, list.data(), n, k, out);
}

template <typename T>
bool SameBits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax};
constexpr int64_t kLengths[] = {1, 7, 2047, 2048, 2049, 5000};

TEST(ReduceChunksTest, Float32MatchesTheReferenceBitForBit) {
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  for (int n : {2, 3, 5}) {
    for (int64_t k : kLengths) {
      std::vector<float> chunks(n * k);
      for (float& v : chunks) v = dist(rng);
      for (ReduceOp op : kOps) {
        std::vector<float> out(k, -1.0f);
        ReduceChunks(core::DType::kFloat32, op, chunks.data(), n, k, out.data());
        const auto same = [](float v) { return v; };
        EXPECT_TRUE(SameBits(out, Reference<float, float>(op, chunks, n, k, same, same)))
            << "n " << n << " k " << k << " op " << static_cast<int>(op);
      }
    }
  }
}

TEST(ReduceChunksTest, BFloat16AccumulatesInFloatAndMatchesTheReference) {
  std::mt19937 rng(2);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  const auto load = [](core::BFloat16 v) { return v.ToFloat(); };
  const auto store = [](float v) { return core::BFloat16::FromFloat(v); };
  for (int n : {2, 4}) {
    for (int64_t k : kLengths) {
      std::vector<core::BFloat16> chunks(n * k);
      for (auto& v : chunks) v = core::BFloat16::FromFloat(dist(rng));
      for (ReduceOp op : kOps) {
        std::vector<core::BFloat16> out(k);
        ReduceChunks(core::DType::kBFloat16, op, chunks.data(), n, k, out.data());
        EXPECT_TRUE(SameBits(out, Reference<core::BFloat16, float>(op, chunks, n, k, load, store)))
            << "n " << n << " k " << k << " op " << static_cast<int>(op);
      }
    }
  }
}

TEST(ReduceChunksTest, Int32AccumulatesInInt64) {
  const auto load = [](int32_t v) { return static_cast<int64_t>(v); };
  const auto store = [](int64_t v) { return static_cast<int32_t>(v); };
  for (int64_t k : kLengths) {
    const int n = 3;
    std::vector<int32_t> chunks(n * k);
    for (int64_t i = 0; i < n * k; ++i) chunks[i] = static_cast<int32_t>((i * 7919) % 2001) - 1000;
    // Three values near INT32_MAX: their int64 average is exact, an int32 sum would wrap.
    chunks[0] = chunks[k] = chunks[2 * k] = 2000000000;
    for (ReduceOp op : kOps) {
      std::vector<int32_t> out(k);
      ReduceChunks(core::DType::kInt32, op, chunks.data(), n, k, out.data());
      EXPECT_EQ(out, (Reference<int32_t, int64_t>(op, chunks, n, k, load, store)))
          << "k " << k << " op " << static_cast<int>(op);
      if (op == ReduceOp::kAverage) {
        EXPECT_EQ(out[0], 2000000000);
      }
    }
  }
}

}  // namespace
}  // namespace internal
}  // namespace comm
