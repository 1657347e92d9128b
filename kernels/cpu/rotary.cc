// CPU launcher of the standalone rotary embedding; see kernels/cpu/rotary.h. Compiled with
// CPU_LOOP_COPTS (kernels/cpu_loops.bzl): the rules of kernels/cpu.h.
#include "kernels/cpu/rotary.h"

#include <stdint.h>

#include "kernels/cpu.h"
#include "kernels/cpu_runtime.h"
#include "kernels/elementwise.h"

namespace kernels {
namespace cpu {
namespace {

namespace k = ::kernels;

// Rows [first, end): the loops of nn::RotaryPackQkv's heads (kernels/cpu/llama.cc), with
// the angles' sines times `sign` (-1: the inverse rotation).
FSDP_CPU_CLONES void RotaryLoop(const float* FSDP_RESTRICT x, const float* cos, const float* sin,
                                int64_t P, const int32_t* positions, int64_t per, int64_t offset,
                                float sign, float* FSDP_RESTRICT y, int64_t first, int64_t end,
                                int64_t T, int64_t D) {
  const int64_t half = D / 2;
  for (int64_t r = first; r < end; ++r) {
    const int64_t t = r % T;
    const int64_t pos = positions != nullptr ? positions[(r / T / per) * T + t] : offset + t;
    const float* xr = x + r * D;
    float* yr = y + r * D;
    if (pos < 0 || pos >= P) {
      for (int64_t j = 0; j < D; ++j) yr[j] = xr[j];
      continue;
    }
    const float* c = cos + pos * half;
    const float* s = sin + pos * half;
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
      yr[i] = k::RotaryRotate(xr[i], xr[half + i], c[i], sign * s[i], true);
    }
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
      yr[half + i] = k::RotaryRotate(xr[half + i], xr[i], c[i], sign * s[i], false);
    }
  }
}

}  // namespace

void RotaryRows(const float* x, const float* cos, const float* sin, int64_t P,
                const int32_t* positions, int64_t per, int64_t offset, float* y, int64_t rows,
                int64_t T, int64_t D, bool inverse) {
  if (T <= 0 || D <= 0) return;
  const float sign = inverse ? -1.0f : 1.0f;
  ParallelChunks(IntraOpThreads(), rows, rows * D, 1, [&](int64_t b, int64_t e) {
    RotaryLoop(x, cos, sin, P, positions, per, offset, sign, y, b, e, T, D);
  });
}

}  // namespace cpu
}  // namespace kernels
