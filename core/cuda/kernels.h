// CUDA kernels used by core (built only under --config=cuda). Every launch goes to the
// compute stream (NOTE [Compute stream] in core/cuda_status.h) of the current device and
// is asynchronous: an OK status means the launch was accepted; errors of the kernel
// itself surface at the next synchronizing call. Callers make the device current first.
#ifndef CORE_CUDA_KERNELS_H_
#define CORE_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "core/dtype.h"

namespace core {
namespace cuda {

// Sets `n` elements of `dtype` at device pointer `ptr` to `value` (converted to the dtype
// as on the host: bf16 rounds to nearest even, int32 truncates).
absl::Status Fill(void* ptr, int64_t n, DType dtype, float value);

// out[i] = a[i] + b[i] for i < n (out may be a or b): the autograd engine's gradient sum
// (core::AddInto), the fp32 addition of kernels' Add.
absl::Status Add(const float* a, const float* b, float* out, int64_t n);

// dst[i] = bf16(src[i]) for i < n, with core::FloatToBf16Bits (core/bf16_hd.h): the one
// array converter of device memory (Tensor::CopyFrom, nn's mixed-dtype GEMM and the NCCL
// backend use it).
absl::Status ConvertFloatToBf16(const float* src, uint16_t* dst, int64_t n);

// dst[i] = float(src[i]) for i < n, with core::Bf16BitsToFloat.
absl::Status ConvertBf16ToFloat(const uint16_t* src, float* dst, int64_t n);

// The same conversions enqueued on `stream` (another than the compute stream, e.g. a
// communication stream), returning the launch's error (cudaSuccess for n <= 0).
cudaError_t ConvertFloatToBf16On(cudaStream_t stream, const float* src, uint16_t* dst, int64_t n);
cudaError_t ConvertBf16ToFloatOn(cudaStream_t stream, const uint16_t* src, float* dst, int64_t n);

}  // namespace cuda
}  // namespace core

#endif  // CORE_CUDA_KERNELS_H_
