#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "core/bf16_hd.h"
#include "core/cuda/kernels.h"
#include "core/cuda_status.h"

namespace core {
namespace cuda {
namespace {

constexpr int kThreads = 256;
// Grid-stride loops: enough blocks to fill any current GPU, never more than needed.
constexpr int64_t kMaxBlocks = 8192;

int BlocksFor(int64_t n) {
  return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
}

template <typename T>
__global__ void FillKernel(T* p, int64_t n, T v) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    p[i] = v;
  }
}

__global__ void FloatToBf16Kernel(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    dst[i] = FloatToBf16Bits(src[i]);
  }
}

__global__ void Bf16ToFloatKernel(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    dst[i] = Bf16BitsToFloat(src[i]);
  }
}

}  // namespace

absl::Status Fill(void* ptr, int64_t n, DType dtype, float value) {
  if (n <= 0) return absl::OkStatus();
  const int blocks = BlocksFor(n);
  switch (dtype) {
    case DType::kFloat32:
      FillKernel<float><<<blocks, kThreads, 0, ComputeStream()>>>(static_cast<float*>(ptr), n,
                                                                  value);
      break;
    case DType::kBFloat16:
      FillKernel<uint16_t><<<blocks, kThreads, 0, ComputeStream()>>>(
          static_cast<uint16_t*>(ptr), n, FloatToBf16Bits(value));
      break;
    case DType::kInt32:
      FillKernel<int32_t><<<blocks, kThreads, 0, ComputeStream()>>>(
          static_cast<int32_t*>(ptr), n, static_cast<int32_t>(value));
      break;
  }
  return LaunchStatus(absl::StrCat("launching the fill kernel (", n, " elements of ",
                                   DTypeName(dtype), ", value ", value, ")"));
}

cudaError_t ConvertFloatToBf16On(cudaStream_t stream, const float* src, uint16_t* dst,
                                 int64_t n) {
  if (n <= 0) return cudaSuccess;
  FloatToBf16Kernel<<<BlocksFor(n), kThreads, 0, stream>>>(src, dst, n);
  return cudaGetLastError();
}

cudaError_t ConvertBf16ToFloatOn(cudaStream_t stream, const uint16_t* src, float* dst,
                                 int64_t n) {
  if (n <= 0) return cudaSuccess;
  Bf16ToFloatKernel<<<BlocksFor(n), kThreads, 0, stream>>>(src, dst, n);
  return cudaGetLastError();
}

absl::Status ConvertFloatToBf16(const float* src, uint16_t* dst, int64_t n) {
  return StatusFromCuda(ConvertFloatToBf16On(ComputeStream(), src, dst, n),
                        absl::StrCat("launching the float32 -> bfloat16 kernel (", n,
                                     " elements)"));
}

absl::Status ConvertBf16ToFloat(const uint16_t* src, float* dst, int64_t n) {
  return StatusFromCuda(ConvertBf16ToFloatOn(ComputeStream(), src, dst, n),
                        absl::StrCat("launching the bfloat16 -> float32 kernel (", n,
                                     " elements)"));
}

}  // namespace cuda
}  // namespace core
