// CUDA launchers of fsdp's gradient arithmetic (bodies in fsdp/cuda/grad_math.h).
// Built only under --config=cuda. Each enqueues on the legacy default stream (the
// compute stream) and returns the cudaError_t of the launch (or of the copy) as an int,
// 0 for success; pointers are device pointers of the current device.
#ifndef FSDP_CUDA_GRAD_KERNELS_H_
#define FSDP_CUDA_GRAD_KERNELS_H_

#include <cstdint>

namespace fsdp {
namespace cuda {

// dst[i] += src[i] for i < n; src is fp32, or bf16 bits when src_bf16.
int AddInto(float* dst, const void* src, bool src_bf16, int64_t n);
// dst[i] *= factor.
int Scale(float* dst, int64_t n, float factor);
// Doubles of device scratch SumOfSquares needs.
inline constexpr int kSumScratchDoubles = 1024;
// *result (host) = sum of x[i]^2 in double, summed in a fixed order (deterministic),
// using `scratch` (kSumScratchDoubles doubles of device memory); waits for the compute
// stream.
int SumOfSquares(const float* x, int64_t n, double* scratch, double* result);

}  // namespace cuda
}  // namespace fsdp

#endif  // FSDP_CUDA_GRAD_KERNELS_H_
