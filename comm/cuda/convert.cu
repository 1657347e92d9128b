#include <cuda_runtime.h>

#include <cstdint>

#include "comm/cuda/convert.h"

namespace comm {
namespace cuda {
namespace {

__global__ void Bf16ToFloatKernel(const uint16_t* in, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = __uint_as_float(static_cast<uint32_t>(in[i]) << 16);
  }
}

__global__ void FloatToBf16Kernel(const float* in, uint16_t* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint32_t u = __float_as_uint(in[i]);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
      out[i] = static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
    } else {
      out[i] = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
  }
}

int Blocks(int64_t n) {
  const int64_t b = (n + 255) / 256;
  return static_cast<int>(b < 4096 ? (b < 1 ? 1 : b) : 4096);
}

}  // namespace

int Bf16ToFloat(const void* in, float* out, int64_t n, void* stream) {
  if (n == 0) return 0;
  Bf16ToFloatKernel<<<Blocks(n), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint16_t*>(in), out, n);
  return static_cast<int>(cudaGetLastError());
}

int FloatToBf16(const float* in, void* out, int64_t n, void* stream) {
  if (n == 0) return 0;
  FloatToBf16Kernel<<<Blocks(n), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      in, static_cast<uint16_t*>(out), n);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace cuda
}  // namespace comm
