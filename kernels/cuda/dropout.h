// CUDA launcher of dropout (kernels/dropout.h; built only under --config=cuda, compiled by
// nvcc in dropout.cu): the twin of kernels/cpu/dropout.h, same name and arguments, raw
// device pointers of the current device. The launch goes to the compute stream (the
// legacy default stream) and returns the launch's error, never synchronising. Each
// element's result depends on its index alone: the CPU's bits.
//
//   cudaError_t err = kernels::cuda::Dropout(x, y, n, key, offset, threshold, scale);
#ifndef KERNELS_CUDA_DROPOUT_H_
#define KERNELS_CUDA_DROPOUT_H_

#include <cuda_runtime_api.h>
#include <stdint.h>

namespace kernels {
namespace cuda {

cudaError_t Dropout(const float* x, float* y, int64_t n, uint64_t key, int64_t offset,
                    uint32_t threshold, float scale);

}  // namespace cuda
}  // namespace kernels

#endif  // KERNELS_CUDA_DROPOUT_H_
