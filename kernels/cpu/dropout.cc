// CPU launcher of dropout; see kernels/cpu/dropout.h. Compiled with CPU_LOOP_COPTS
// (kernels/cpu_loops.bzl): the rules of kernels/cpu.h.
#include "kernels/cpu/dropout.h"

#include <stdint.h>

#include "kernels/cpu.h"
#include "kernels/cpu_runtime.h"
#include "kernels/dropout.h"

namespace kernels {
namespace cpu {
namespace {

namespace k = ::kernels;

// Elementwise chunks start on 64-byte lines (16 floats).
constexpr int64_t kAlign = 16;

// Elements [0, n) of a chunk whose first element has global index `first`.
FSDP_CPU_CLONES void DropoutLoop(const float* x, float* y, int64_t n, uint64_t key, uint64_t first,
                                 uint32_t threshold, float scale) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    y[i] = k::DropoutApply(x[i], k::DropoutBits(key, first + static_cast<uint64_t>(i)), threshold,
                           scale);
  }
}

}  // namespace

void Dropout(const float* x, float* y, int64_t n, uint64_t key, int64_t offset, uint32_t threshold,
             float scale) {
  ParallelChunks(IntraOpThreads(), n, n, kAlign, [&](int64_t b, int64_t e) {
    DropoutLoop(x + b, y + b, e - b, key, static_cast<uint64_t>(offset + b), threshold, scale);
  });
}

}  // namespace cpu
}  // namespace kernels
