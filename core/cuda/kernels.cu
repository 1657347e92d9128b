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

__global__ void AddKernel(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    out[i] = a[i] + b[i];
  }
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

// Four elements per thread and iteration (16-byte loads, 8-byte stores); the same bits as
// FloatToBf16Kernel.
__global__ void FloatToBf16x4Kernel(const float4* src, uint2* dst, int64_t n4) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n4;
       i += int64_t{blockDim.x} * gridDim.x) {
    const float4 v = src[i];
    dst[i] = make_uint2(Bf16PairBits(v.x, v.y), Bf16PairBits(v.z, v.w));
  }
}

__global__ void Bf16ToFloatx4Kernel(const uint2* src, float4* dst, int64_t n4) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n4;
       i += int64_t{blockDim.x} * gridDim.x) {
    const uint2 v = src[i];
    dst[i] = make_float4(Bf16BitsToFloat(static_cast<uint16_t>(v.x & 0xffffu)),
                         Bf16BitsToFloat(static_cast<uint16_t>(v.x >> 16)),
                         Bf16BitsToFloat(static_cast<uint16_t>(v.y & 0xffffu)),
                         Bf16BitsToFloat(static_cast<uint16_t>(v.y >> 16)));
  }
}

// Whether the four-wide kernels can take the first n / 4 * 4 elements.
bool FourWide(const void* src, const void* dst, int64_t n) {
  return n >= 4 && reinterpret_cast<uintptr_t>(src) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(dst) % 16 == 0;
}

__global__ void Bf16ToFloatKernel(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    dst[i] = Bf16BitsToFloat(src[i]);
  }
}

}  // namespace

absl::Status Add(const float* a, const float* b, float* out, int64_t n) {
  if (n <= 0) return absl::OkStatus();
  AddKernel<<<BlocksFor(n), kThreads, 0, ComputeStream()>>>(a, b, out, n);
  return LaunchStatus(absl::StrCat("launching the add kernel (", n, " elements)"));
}

absl::Status Fill(void* ptr, int64_t n, DType dtype, float value) {
  if (n <= 0) return absl::OkStatus();
  const int blocks = BlocksFor(n);
  switch (dtype) {
    case DType::kFloat32:
      FillKernel<float>
          <<<blocks, kThreads, 0, ComputeStream()>>>(static_cast<float*>(ptr), n, value);
      break;
    case DType::kBFloat16:
      FillKernel<uint16_t><<<blocks, kThreads, 0, ComputeStream()>>>(static_cast<uint16_t*>(ptr), n,
                                                                     FloatToBf16Bits(value));
      break;
    case DType::kInt32:
      FillKernel<int32_t><<<blocks, kThreads, 0, ComputeStream()>>>(static_cast<int32_t*>(ptr), n,
                                                                    static_cast<int32_t>(value));
      break;
  }
  return LaunchStatus(absl::StrCat("launching the fill kernel (", n, " elements of ",
                                   DTypeName(dtype), ", value ", value, ")"));
}

// Converts n elements with the four-wide kernel where the pointers allow (the first n / 4 * 4),
// the one-wide kernel for the rest.
template <typename Src, typename Dst, typename Src4, typename Dst4>
cudaError_t ConvertOn(cudaStream_t stream, const Src* src, Dst* dst, int64_t n,
                      void (*four)(const Src4*, Dst4*, int64_t),
                      void (*one)(const Src*, Dst*, int64_t)) {
  if (n <= 0) return cudaSuccess;
  int64_t done = 0;
  if (FourWide(src, dst, n)) {
    const int64_t n4 = n / 4;
    four<<<BlocksFor(n4), kThreads, 0, stream>>>(reinterpret_cast<const Src4*>(src),
                                                 reinterpret_cast<Dst4*>(dst), n4);
    done = 4 * n4;
  }
  if (done < n) one<<<BlocksFor(n - done), kThreads, 0, stream>>>(src + done, dst + done, n - done);
  return cudaGetLastError();
}

cudaError_t ConvertFloatToBf16On(cudaStream_t stream, const float* src, uint16_t* dst, int64_t n) {
  return ConvertOn(stream, src, dst, n, FloatToBf16x4Kernel, FloatToBf16Kernel);
}

cudaError_t ConvertBf16ToFloatOn(cudaStream_t stream, const uint16_t* src, float* dst, int64_t n) {
  return ConvertOn(stream, src, dst, n, Bf16ToFloatx4Kernel, Bf16ToFloatKernel);
}

absl::Status ConvertFloatToBf16(const float* src, uint16_t* dst, int64_t n) {
  return StatusFromCuda(
      ConvertFloatToBf16On(ComputeStream(), src, dst, n),
      absl::StrCat("launching the float32 -> bfloat16 kernel (", n, " elements)"));
}

absl::Status ConvertBf16ToFloat(const uint16_t* src, float* dst, int64_t n) {
  return StatusFromCuda(
      ConvertBf16ToFloatOn(ComputeStream(), src, dst, n),
      absl::StrCat("launching the bfloat16 -> float32 kernel (", n, " elements)"));
}

}  // namespace cuda
}  // namespace core
