#include "comm/internal/shm_copy.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define FSDP_SHM_X86 1
#endif

#include <cstring>
#include <vector>

#include "comm/internal/reduce.h"
#include "core/dtype.h"

// NOTE [Streaming copies]: in a large collective (its largest tensor has at least
// kStreamingBytes, more than the caches keep for long), pieces copied or reduced into the
// destination use non-temporal stores: it is not read back soon, and ordinary stores
// would first read every line of it from memory (read for ownership). Slots themselves
// are filled with ordinary stores so the readers find them in cache. StreamFence() ends
// a collective's streaming stores (they are weakly ordered).

namespace comm {
namespace internal {

void CopyOut(void* dst_v, const void* src_v, size_t n, bool streaming) {
#ifdef FSDP_SHM_X86
  if (streaming && n >= 256) {
    auto* dst = static_cast<uint8_t*>(dst_v);
    const auto* src = static_cast<const uint8_t*>(src_v);
    const size_t head = (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15;
    std::memcpy(dst, src, head);
    size_t i = head;
    for (; i + 64 <= n; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
      const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
    }
    std::memcpy(dst + i, src + i, n - i);
    return;
  }
#endif
  (void)streaming;
  std::memcpy(dst_v, src_v, n);
}

void CopyTwice(void* slot_v, void* dst_v, const void* src_v, size_t n, bool streaming) {
#ifdef FSDP_SHM_X86
  auto* dst = static_cast<uint8_t*>(dst_v);
  if (streaming && n >= 256 && (reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
    auto* slot = static_cast<uint8_t*>(slot_v);
    const auto* src = static_cast<const uint8_t*>(src_v);
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
      const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(slot + i), a);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(slot + i + 16), b);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(slot + i + 32), c);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(slot + i + 48), d);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
    }
    std::memcpy(slot + i, src + i, n - i);
    std::memcpy(dst + i, src + i, n - i);
    return;
  }
#endif
  std::memcpy(slot_v, src_v, n);
  CopyOut(dst_v, src_v, n, streaming);
}

bool StreamReduceFloat(ReduceOp op, const void* const* chunks, int n, int64_t len, void* out_v) {
#ifdef FSDP_SHM_X86
  auto* out = static_cast<float*>(out_v);
  if ((reinterpret_cast<uintptr_t>(out) & 15) != 0) return false;
  const __m128 divisor = _mm_set1_ps(static_cast<float>(n));
  const auto at = [&](int j, int64_t i) { return static_cast<const float*>(chunks[j]) + i; };
  int64_t i = 0;
  for (; i + 8 <= len; i += 8) {
    __m128 a = _mm_loadu_ps(at(0, i));
    __m128 b = _mm_loadu_ps(at(0, i + 4));
    for (int j = 1; j < n; ++j) {
      const __m128 x = _mm_loadu_ps(at(j, i));
      const __m128 y = _mm_loadu_ps(at(j, i + 4));
      if (op == ReduceOp::kMax) {
        // std::max(acc, v) == (acc < v ? v : acc) == maxps(v, acc), NaNs included.
        a = _mm_max_ps(x, a);
        b = _mm_max_ps(y, b);
      } else {
        a = _mm_add_ps(a, x);
        b = _mm_add_ps(b, y);
      }
    }
    if (op == ReduceOp::kAverage) {
      a = _mm_div_ps(a, divisor);
      b = _mm_div_ps(b, divisor);
    }
    _mm_stream_ps(out + i, a);
    _mm_stream_ps(out + i + 4, b);
  }
  if (i < len) {
    std::vector<const void*> rest(static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) rest[j] = at(j, i);
    ReduceChunkList(core::DType::kFloat32, op, rest.data(), n, len - i, out + i);
  }
  return true;
#else
  (void)op, (void)chunks, (void)n, (void)len, (void)out_v;
  return false;
#endif
}

void StreamFence() {
#ifdef FSDP_SHM_X86
  _mm_sfence();
#endif
}

}  // namespace internal
}  // namespace comm
