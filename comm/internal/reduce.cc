#include "comm/internal/reduce.h"

#include <algorithm>

namespace comm {
namespace internal {
namespace {

template <typename T, typename Acc, typename Load, typename StoreFn>
void ReduceChunksT(ReduceOp op, const T* chunks, int n, int64_t k, T* out, Load load,
                   StoreFn store) {
  for (int64_t i = 0; i < k; ++i) {
    Acc acc = load(chunks[i]);
    for (int j = 1; j < n; ++j) {
      const Acc v = load(chunks[j * k + i]);
      acc = op == ReduceOp::kMax ? std::max(acc, v) : acc + v;
    }
    if (op == ReduceOp::kAverage) acc = acc / static_cast<Acc>(n);
    out[i] = store(acc);
  }
}

}  // namespace

void ReduceChunks(core::DType dtype, ReduceOp op, const void* chunks, int n, int64_t k,
                  void* out) {
  switch (dtype) {
    case core::DType::kFloat32:
      ReduceChunksT<float, float>(
          op, static_cast<const float*>(chunks), n, k, static_cast<float*>(out),
          [](float v) { return v; }, [](float v) { return v; });
      break;
    case core::DType::kBFloat16:
      ReduceChunksT<core::BFloat16, float>(
          op, static_cast<const core::BFloat16*>(chunks), n, k, static_cast<core::BFloat16*>(out),
          [](core::BFloat16 v) { return v.ToFloat(); },
          [](float v) { return core::BFloat16::FromFloat(v); });
      break;
    case core::DType::kInt32:
      ReduceChunksT<int32_t, int64_t>(
          op, static_cast<const int32_t*>(chunks), n, k, static_cast<int32_t*>(out),
          [](int32_t v) { return static_cast<int64_t>(v); },
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
      pc[i] = op == ReduceOp::kMax ? std::max(pa[i], pb[i])
                                   : static_cast<int32_t>(static_cast<uint32_t>(pa[i]) +
                                                          static_cast<uint32_t>(pb[i]));
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
