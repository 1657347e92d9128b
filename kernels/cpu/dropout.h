// CPU launcher of dropout (kernels/dropout.h), the host twin of kernels/cuda/dropout.h:
// same name, same arguments, raw host pointers. The loop follows kernels/cpu.h
// (FSDP_CPU_CLONES, elements split by ParallelChunks); each element's result depends on its
// index alone, so it has the same bits for any ISA clone and thread count. Callers
// (nn/functional/dropout.cc) check sizes first; this validates nothing and never fails.
//
//   kernels::cpu::Dropout(x, y, n, kernels::DropoutKey(seed, step), offset,
//                         kernels::DropoutThreshold(p), 1.0f / (1.0f - p));
#ifndef KERNELS_CPU_DROPOUT_H_
#define KERNELS_CPU_DROPOUT_H_

#include <stdint.h>

namespace kernels {
namespace cpu {

// y[i] = kernels::DropoutApply(x[i], DropoutBits(key, offset + i), threshold, scale) for
// i < n (NOTE [Dropout mask]). y may be x. The backward is this call on the gradient.
void Dropout(const float* x, float* y, int64_t n, uint64_t key, int64_t offset, uint32_t threshold,
             float scale);

}  // namespace cpu
}  // namespace kernels

#endif  // KERNELS_CPU_DROPOUT_H_
