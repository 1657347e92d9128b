// CUDA launchers of the attention mask (kernels/attention_mask.h; built only under
// --config=cuda, compiled by nvcc in attention_mask.cu): the twins of
// kernels/cpu/attention_mask.h, same names and arguments, raw device pointers of the
// current device. Each launch goes to the compute stream (the legacy default stream) and
// returns the launch's error, never synchronising. Every element is the CPU's bits.
//
//   cudaError_t err = kernels::cuda::AttentionMask(layout, fmask, nullptr, add, valid, rows);
#ifndef KERNELS_CUDA_ATTENTION_MASK_H_
#define KERNELS_CUDA_ATTENTION_MASK_H_

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "kernels/attention_mask.h"

namespace kernels {
namespace cuda {

cudaError_t AttentionMask(const AttentionMaskLayout& m, const float* fmask, const int32_t* imask,
                          float* add, float* valid, int64_t rows);
cudaError_t AttentionMaskBackward(const AttentionMaskLayout& m, const float* fmask,
                                  const int32_t* imask, const float* g, float* gmask, int64_t rows);

}  // namespace cuda
}  // namespace kernels

#endif  // KERNELS_CUDA_ATTENTION_MASK_H_
