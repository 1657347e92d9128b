// CPU launchers of the attention mask (kernels/attention_mask.h), the host twins of
// kernels/cuda/attention_mask.h: same names, same arguments, raw host pointers. Rows are
// split by ParallelChunks (kernels/cpu.h); every element depends on its own position
// alone, so the bits do not depend on the thread count. Callers
// (nn/functional/attention.cc) check sizes first; these validate nothing and never fail.
//
//   kernels::cpu::AttentionMask(layout, fmask, nullptr, add, valid, rows);
#ifndef KERNELS_CPU_ATTENTION_MASK_H_
#define KERNELS_CPU_ATTENTION_MASK_H_

#include <stdint.h>

#include "kernels/attention_mask.h"

namespace kernels {
namespace cpu {

// add [rows, m.S] = kernels::AttentionMaskValue of every element, and valid [rows] = 1 for
// a row that keeps any column, else 0. fmask and imask: at most one not null.
void AttentionMask(const AttentionMaskLayout& m, const float* fmask, const int32_t* imask,
                   float* add, float* valid, int64_t rows);
// gmask [rows, m.S] = g where kernels::AttentionMaskKeeps, else 0: the gradient of an fp32
// mask's entries from the additive mask's.
void AttentionMaskBackward(const AttentionMaskLayout& m, const float* fmask, const int32_t* imask,
                           const float* g, float* gmask, int64_t rows);

}  // namespace cpu
}  // namespace kernels

#endif  // KERNELS_CPU_ATTENTION_MASK_H_
