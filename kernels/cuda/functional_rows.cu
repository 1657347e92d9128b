// CUDA launchers of nn/functional's row bodies; see kernels/cuda/functional_rows.h.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "kernels/cuda/functional_rows.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/grad.h"
#include "kernels/math.h"
#include "kernels/rowwise.h"

namespace kernels {
namespace cuda {
namespace {

namespace k = ::kernels;

// One warp per row of x [rows, cols]: the softmax (log_softmax false) or log-softmax.
__global__ void SoftmaxForwardKernel(const float* x, float* y, int64_t rows, int64_t cols,
                                     bool log_softmax) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const float* xr = x + row * cols;
  float* yr = y + row * cols;
  float m = -INFINITY;
  for (int64_t j = lane; j < cols; j += 32) m = fmaxf(m, xr[j]);
  m = WarpMax(m);
  float sum = 0.0f;
  for (int64_t j = lane; j < cols; j += 32) {
    const float e = k::SoftmaxExp(xr[j], m);
    if (!log_softmax) yr[j] = e;
    sum += e;
  }
  sum = WarpSum(sum);
  if (log_softmax) {
    const float log_sum = k::Log(sum);
    for (int64_t j = lane; j < cols; j += 32) yr[j] = k::LogSoftmaxOut(xr[j], m, log_sum);
  } else {
    const float inv = 1.0f / sum;
    for (int64_t j = lane; j < cols; j += 32) yr[j] = k::SoftmaxNormalize(yr[j], inv);
  }
}

// One warp per row: the softmax's (log_softmax false) or log-softmax's input gradient.
__global__ void SoftmaxBackwardKernel(const float* y, const float* gy, float* gx, int64_t rows,
                                      int64_t cols, bool log_softmax) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const float* yr = y + row * cols;
  const float* gr = gy + row * cols;
  float* out = gx + row * cols;
  float acc = 0.0f;
  for (int64_t j = lane; j < cols; j += 32) acc += log_softmax ? gr[j] : gr[j] * yr[j];
  acc = WarpSum(acc);
  for (int64_t j = lane; j < cols; j += 32) {
    out[j] = log_softmax ? k::LogSoftmaxBackward(yr[j], gr[j], acc)
                         : k::SoftmaxBackward(yr[j], gr[j], acc, 1.0f);
  }
}

__global__ void ScaleByScalarKernel(const float* x, const float* s, bool negate, float* out,
                                    int64_t n) {
  const float factor = negate ? -s[0] : s[0];
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) out[i] = k::ScaleTerm(x[i], factor);
}

cudaError_t Rows(const float* x, float* y, int64_t rows, int64_t cols, bool log_softmax) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  SoftmaxForwardKernel<<<GridForRows(rows), kThreads>>>(x, y, rows, cols, log_softmax);
  return cudaGetLastError();
}

cudaError_t BackwardRows(const float* y, const float* gy, float* gx, int64_t rows, int64_t cols,
                         bool log_softmax) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  SoftmaxBackwardKernel<<<GridForRows(rows), kThreads>>>(y, gy, gx, rows, cols, log_softmax);
  return cudaGetLastError();
}

}  // namespace

cudaError_t SoftmaxForward(const float* x, float* y, int64_t rows, int64_t cols) {
  return Rows(x, y, rows, cols, /*log_softmax=*/false);
}

cudaError_t SoftmaxBackward(const float* y, const float* gy, float* gx, int64_t rows,
                            int64_t cols) {
  return BackwardRows(y, gy, gx, rows, cols, /*log_softmax=*/false);
}

cudaError_t LogSoftmaxForward(const float* x, float* y, int64_t rows, int64_t cols) {
  return Rows(x, y, rows, cols, /*log_softmax=*/true);
}

cudaError_t LogSoftmaxBackward(const float* y, const float* gy, float* gx, int64_t rows,
                               int64_t cols) {
  return BackwardRows(y, gy, gx, rows, cols, /*log_softmax=*/true);
}

cudaError_t ScaleByScalar(const float* x, const float* s, bool negate, float* out, int64_t n) {
  if (n <= 0) return cudaSuccess;
  ScaleByScalarKernel<<<GridFor(n), kThreads>>>(x, s, negate, out, n);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace kernels
