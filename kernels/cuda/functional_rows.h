// CUDA launchers of the row bodies nn/functional adds (built only under --config=cuda,
// compiled by nvcc in functional_rows.cu): the twins of kernels/cpu/functional_rows.h, same
// names and arguments, raw device pointers of the current device. Each launch goes to the
// compute stream (the legacy default stream) and returns the launch's error, never
// synchronising. One warp per row, its sums in a fixed order (lane-strided, then the warp's
// shuffle tree), so every run gives the same bits.
//
//   cudaError_t err = kernels::cuda::SoftmaxForward(x, y, rows, cols);
#ifndef KERNELS_CUDA_FUNCTIONAL_ROWS_H_
#define KERNELS_CUDA_FUNCTIONAL_ROWS_H_

#include <cuda_runtime_api.h>
#include <stdint.h>

namespace kernels {
namespace cuda {

cudaError_t SoftmaxForward(const float* x, float* y, int64_t rows, int64_t cols);
cudaError_t SoftmaxBackward(const float* y, const float* gy, float* gx, int64_t rows, int64_t cols);
cudaError_t LogSoftmaxForward(const float* x, float* y, int64_t rows, int64_t cols);
cudaError_t LogSoftmaxBackward(const float* y, const float* gy, float* gx, int64_t rows,
                               int64_t cols);
// s: one float in device memory, read by the kernel (no host round trip).
cudaError_t ScaleByScalar(const float* x, const float* s, bool negate, float* out, int64_t n);

}  // namespace cuda
}  // namespace kernels

#endif  // KERNELS_CUDA_FUNCTIONAL_ROWS_H_
