// CPU launchers of the attention mask; see kernels/cpu/attention_mask.h. Compiled with
// CPU_LOOP_COPTS (kernels/cpu_loops.bzl): the rules of kernels/cpu.h.
#include "kernels/cpu/attention_mask.h"

#include <stdint.h>

#include "kernels/attention_mask.h"
#include "kernels/cpu.h"
#include "kernels/cpu_runtime.h"

namespace kernels {
namespace cpu {
namespace {

namespace k = ::kernels;

FSDP_CPU_CLONES void MaskRows(const AttentionMaskLayout& m, const float* fmask,
                              const int32_t* imask, float* add, float* valid, int64_t first,
                              int64_t end) {
  for (int64_t r = first; r < end; ++r) {
    bool any = false;
    for (int64_t s = 0; s < m.S; ++s) {
      add[r * m.S + s] = k::AttentionMaskValue(m, fmask, imask, r, s);
      any = any || k::AttentionMaskKeeps(m, fmask, imask, r, s);
    }
    valid[r] = any ? 1.0f : 0.0f;
  }
}

FSDP_CPU_CLONES void MaskBackwardRows(const AttentionMaskLayout& m, const float* fmask,
                                      const int32_t* imask, const float* g, float* gmask,
                                      int64_t first, int64_t end) {
  for (int64_t r = first; r < end; ++r) {
    for (int64_t s = 0; s < m.S; ++s) {
      gmask[r * m.S + s] = k::AttentionMaskKeeps(m, fmask, imask, r, s) ? g[r * m.S + s] : 0.0f;
    }
  }
}

}  // namespace

void AttentionMask(const AttentionMaskLayout& m, const float* fmask, const int32_t* imask,
                   float* add, float* valid, int64_t rows) {
  ParallelChunks(IntraOpThreads(), rows, rows * m.S, 1,
                 [&](int64_t b, int64_t e) { MaskRows(m, fmask, imask, add, valid, b, e); });
}

void AttentionMaskBackward(const AttentionMaskLayout& m, const float* fmask, const int32_t* imask,
                           const float* g, float* gmask, int64_t rows) {
  ParallelChunks(IntraOpThreads(), rows, rows * m.S, 1,
                 [&](int64_t b, int64_t e) { MaskBackwardRows(m, fmask, imask, g, gmask, b, e); });
}

}  // namespace cpu
}  // namespace kernels
