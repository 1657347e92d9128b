// CUDA launcher of the standalone rotary embedding (nn/functional/rotary.h; built only under
// --config=cuda, compiled by nvcc in rotary.cu): the twin of kernels/cpu/rotary.h, same
// name and arguments, raw device pointers of the current device. The launch goes to the
// compute stream (the legacy default stream) and returns the launch's error, never
// synchronising. Each element is kernels::RotaryRotate with the sign of the sines a
// compile-time constant, as nn::RotaryPackQkv's kernel (kernels/cuda/llama.cu) calls it.
//
//   cudaError_t err = kernels::cuda::RotaryRows(x, cos, sin, P, positions, per, 0, y, rows,
//                                               T, D, /*inverse=*/false);
#ifndef KERNELS_CUDA_ROTARY_H_
#define KERNELS_CUDA_ROTARY_H_

#include <cuda_runtime_api.h>
#include <stdint.h>

namespace kernels {
namespace cuda {

cudaError_t RotaryRows(const float* x, const float* cos, const float* sin, int64_t P,
                       const int32_t* positions, int64_t per, int64_t offset, float* y,
                       int64_t rows, int64_t T, int64_t D, bool inverse);

}  // namespace cuda
}  // namespace kernels

#endif  // KERNELS_CUDA_ROTARY_H_
