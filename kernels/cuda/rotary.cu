// CUDA launcher of the standalone rotary embedding; see kernels/cuda/rotary.h. Grid-stride
// over the output elements; a row's position is read once per element (from cache).
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/rotary.h"
#include "kernels/elementwise.h"

namespace kernels {
namespace cuda {
namespace {

namespace k = ::kernels;

template <bool kInverse>
__global__ void RotaryRowsKernel(const float* x, const float* cos, const float* sin, int64_t P,
                                 const int32_t* positions, int64_t per, int64_t offset, float* y,
                                 int64_t n, int64_t T, int64_t D) {
  const int64_t half = D / 2;
  const float sign = kInverse ? -1.0f : 1.0f;
  for (int64_t e = GlobalIndex(); e < n; e += GlobalStride()) {
    const int64_t r = e / D, j = e - r * D, t = r % T;
    const int64_t pos = positions != nullptr ? positions[(r / T / per) * T + t] : offset + t;
    const float* xr = x + r * D;
    if (pos < 0 || pos >= P) {
      y[e] = xr[j];
      continue;
    }
    const bool first = j < half;
    const int64_t i = first ? j : j - half;
    y[e] = k::RotaryRotate(xr[j], xr[first ? j + half : j - half], cos[pos * half + i],
                           sign * sin[pos * half + i], first);
  }
}

}  // namespace

cudaError_t RotaryRows(const float* x, const float* cos, const float* sin, int64_t P,
                       const int32_t* positions, int64_t per, int64_t offset, float* y,
                       int64_t rows, int64_t T, int64_t D, bool inverse) {
  const int64_t n = rows * D;
  if (n <= 0 || T <= 0) return cudaSuccess;
  if (inverse) {
    RotaryRowsKernel<true>
        <<<GridFor(n), kThreads>>>(x, cos, sin, P, positions, per, offset, y, n, T, D);
  } else {
    RotaryRowsKernel<false>
        <<<GridFor(n), kThreads>>>(x, cos, sin, P, positions, per, offset, y, n, T, D);
  }
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace kernels
