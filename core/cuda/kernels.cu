#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "core/cuda/kernels.h"

namespace core {
namespace cuda {
namespace {

__global__ void FillF32(float* p, int64_t n, float v) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    p[i] = v;
  }
}

__global__ void FillU16(uint16_t* p, int64_t n, uint16_t v) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    p[i] = v;
  }
}

__global__ void FillI32(int32_t* p, int64_t n, int32_t v) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    p[i] = v;
  }
}

}  // namespace

absl::Status Fill(void* ptr, int64_t n, DType dtype, float value) {
  if (n == 0) return absl::OkStatus();
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((n + threads - 1) / threads, 4096));
  switch (dtype) {
    case DType::kFloat32:
      FillF32<<<blocks, threads>>>(static_cast<float*>(ptr), n, value);
      break;
    case DType::kBFloat16:
      FillU16<<<blocks, threads>>>(static_cast<uint16_t*>(ptr), n,
                                   BFloat16::FromFloat(value).bits);
      break;
    case DType::kInt32:
      FillI32<<<blocks, threads>>>(static_cast<int32_t*>(ptr), n, static_cast<int32_t>(value));
      break;
  }
  cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    return absl::InternalError(absl::StrCat("CUDA Fill kernel failed: ", cudaGetErrorString(err)));
  }
  return absl::OkStatus();
}

}  // namespace cuda
}  // namespace core
