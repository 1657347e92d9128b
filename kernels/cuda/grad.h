// CUDA launchers of fsdp's gradient arithmetic (bodies in kernels/grad.h; built only
// under --config=cuda, compiled by nvcc in grad.cu). Raw device pointers of the current
// device; each enqueues on the compute stream (the legacy default stream) and returns
// the error of the launch (or of the copy). Callers (fsdp/device_ops.cc) check the
// tensors first and turn the error into an absl::Status naming them.
//
//   cudaError_t err = kernels::cuda::AddInto(dst, src, /*src_bf16=*/true, n);
#ifndef KERNELS_CUDA_GRAD_H_
#define KERNELS_CUDA_GRAD_H_

#include <cuda_runtime_api.h>
#include <stdint.h>

namespace kernels {
namespace cuda {

// dst[i] += src[i] for i < n; src is fp32, or bf16 bits when src_bf16. On `stream` when
// given (a collective's, NOTE [Staged collectives] in comm/process_group.h).
cudaError_t AddInto(float* dst, const void* src, bool src_bf16, int64_t n,
                    cudaStream_t stream = cudaStreamLegacy);
// dst[i] *= factor.
cudaError_t Scale(float* dst, int64_t n, float factor);
// Doubles of device scratch SumOfSquares needs.
inline constexpr int kSumScratchDoubles = 1024;
// *result (host) = sum of x[i]^2 in double, summed in a fixed order (deterministic),
// using `scratch` (kSumScratchDoubles doubles of device memory); waits for the compute
// stream.
cudaError_t SumOfSquares(const float* x, int64_t n, double* scratch, double* result);

}  // namespace cuda
}  // namespace kernels

#endif  // KERNELS_CUDA_GRAD_H_
