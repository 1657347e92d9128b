// bf16 <-> fp32 conversion kernels for the NCCL backend, which reduces bf16 in fp32
// and rounds back once (round to nearest even, NaN kept, as core::BFloat16 does).
// Built only under --config=cuda. Both enqueue on `stream` (a cudaStream_t) and
// return the cudaError_t of the launch as an int (0 is success).
#ifndef COMM_CUDA_CONVERT_H_
#define COMM_CUDA_CONVERT_H_

#include <cstdint>

namespace comm {
namespace cuda {

int Bf16ToFloat(const void* in, float* out, int64_t n, void* stream);
int FloatToBf16(const float* in, void* out, int64_t n, void* stream);

}  // namespace cuda
}  // namespace comm

#endif  // COMM_CUDA_CONVERT_H_
