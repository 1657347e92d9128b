#include "comm/internal/reduce.h"

#include <algorithm>

namespace comm {
namespace internal {
namespace {

// Combines chunk j into the accumulator, element by element: contiguous loops the compiler
// vectorises, while each element still combines the chunks in the order j = 0, 1, ...
template <typename Acc, typename T, typename Load>
void Combine(ReduceOp op, const T* chunk, int64_t k, Acc* acc, Load load) {
  if (op == ReduceOp::kMax) {
    for (int64_t i = 0; i < k; ++i) acc[i] = std::max(acc[i], static_cast<Acc>(load(chunk[i])));
  } else {
    for (int64_t i = 0; i < k; ++i) acc[i] += static_cast<Acc>(load(chunk[i]));
  }
}

// Block by block through a stack accumulator (nothing allocated per call): every chunk's
// block is read before the block of `out` is written, so `out` may be one of the chunks.
template <typename T, typename Acc, typename Load, typename StoreFn>
void ReduceListT(ReduceOp op, const void* const* chunks, int n, int64_t k, void* out_bytes,
                 Load load, StoreFn store) {
  constexpr int64_t kBlock = 2048;
  Acc acc[kBlock];
  T* out = static_cast<T*>(out_bytes);
  for (int64_t begin = 0; begin < k; begin += kBlock) {
    const int64_t len = std::min(kBlock, k - begin);
    const T* first = static_cast<const T*>(chunks[0]) + begin;
    for (int64_t i = 0; i < len; ++i) acc[i] = static_cast<Acc>(load(first[i]));
    for (int j = 1; j < n; ++j) {
      Combine(op, static_cast<const T*>(chunks[j]) + begin, len, acc, load);
    }
    if (op == ReduceOp::kAverage) {
      const Acc d = static_cast<Acc>(n);
      for (int64_t i = 0; i < len; ++i) acc[i] = acc[i] / d;
    }
    for (int64_t i = 0; i < len; ++i) out[begin + i] = store(acc[i]);
  }
}

}  // namespace

void ReduceChunkList(core::DType dtype, ReduceOp op, const void* const* chunks, int n, int64_t k,
                     void* out) {
  switch (dtype) {
    case core::DType::kFloat32: {
      const auto same = [](float v) { return v; };
      ReduceListT<float, float>(op, chunks, n, k, out, same, same);
      break;
    }
    case core::DType::kBFloat16:
      ReduceListT<core::BFloat16, float>(
          op, chunks, n, k, out, [](core::BFloat16 v) { return v.ToFloat(); },
          [](float v) { return core::BFloat16::FromFloat(v); });
      break;
    case core::DType::kInt32:
      ReduceListT<int32_t, int64_t>(
          op, chunks, n, k, out, [](int32_t v) { return static_cast<int64_t>(v); },
          [](int64_t v) { return static_cast<int32_t>(v); });
      break;
  }
}

void ReducePair(core::DType dtype, ReduceOp op, void* c, const void* a, const void* b,
                size_t count) {
  if (dtype == core::DType::kInt32) {
    int32_t* pc = static_cast<int32_t*>(c);
    const int32_t* pa = static_cast<const int32_t*>(a);
    const int32_t* pb = static_cast<const int32_t*>(b);
    for (size_t i = 0; i < count; ++i) {
      pc[i] =
          op == ReduceOp::kMax
              ? std::max(pa[i], pb[i])
              : static_cast<int32_t>(static_cast<uint32_t>(pa[i]) + static_cast<uint32_t>(pb[i]));
    }
    return;
  }
  float* pc = static_cast<float*>(c);
  const float* pa = static_cast<const float*>(a);
  const float* pb = static_cast<const float*>(b);
  if (op == ReduceOp::kMax) {
    for (size_t i = 0; i < count; ++i) pc[i] = std::max(pa[i], pb[i]);
  } else {
    for (size_t i = 0; i < count; ++i) pc[i] = pa[i] + pb[i];
  }
}

void DivideInPlace(float* data, int64_t count, int n) {
  const float d = static_cast<float>(n);
  for (int64_t i = 0; i < count; ++i) data[i] /= d;
}

}  // namespace internal
}  // namespace comm
