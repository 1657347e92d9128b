// CUDA launchers of the general tensor ops' bodies (kernels/tensor.h), the twins of
// kernels/cpu/tensor_kernels.h (same names, same arguments, raw device pointers; built
// only under --config=cuda, compiled by nvcc in tensor_kernels.cu). Every launch goes to
// the compute stream (the legacy default stream) and returns the launch's error
// (cudaGetLastError), never synchronising. Callers (nn/functional) check shapes and dtypes.
//
//   cudaError_t err = kernels::cuda::Binary(kernels::kBinaryAdd, a, b, out, it);
//
// Index values are not checked on the device: Gather writes 0 and ScatterAdd skips an
// element whose index is out of range (NOTE [Gather and scatter]), so nothing is written
// out of bounds.
#ifndef KERNELS_CUDA_TENSOR_KERNELS_H_
#define KERNELS_CUDA_TENSOR_KERNELS_H_

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "kernels/tensor.h"

namespace kernels {
namespace cuda {

// Grid-stride over the outputs; contiguous operands skip the index math.
cudaError_t Binary(int kind, const float* a, const float* b, float* out, StridedIter<2> it);
cudaError_t Unary(int kind, const float* x, float* y, int64_t n, float c);
cudaError_t UnaryGrad(int kind, const float* v, const float* g, float* gx, int64_t n);
cudaError_t StridedCopy(const void* src, void* dst, StridedIter<2> it);
// NOTE [Sum order]: a warp per (output, chunk), lane l adding its terms in order; the
// lanes' sums are added in lane order by lane 0, so the bits are the CPU's. With more than
// one chunk the chunk sums go to `scratch` (SumChunks(R) doubles per output; null
// otherwise) and a second kernel adds them in order.
cudaError_t Sum(const float* x, float* out, StridedIter<1> outer, StridedIter<1> terms,
                double scale, double* scratch);
cudaError_t ExpandScaled(const float* x, float* out, StridedIter<1> it, float scale);
// A thread per output.
cudaError_t MaxAlongDim(const float* x, float* values, int32_t* indices, StridedIter<1> outer,
                        int64_t stride, int64_t K);
// A thread per index element.
cudaError_t Gather(const float* data, const int32_t* index, float* out, GatherScatter g);
// A thread per data element, looping over the index along dim in order (ScatterSumAt): no
// atomics, the CPU's bits. Costs data elements x index length along dim.
cudaError_t ScatterAdd(const float* src, const int32_t* index, float* data, GatherScatter g);

}  // namespace cuda
}  // namespace kernels

#endif  // KERNELS_CUDA_TENSOR_KERNELS_H_
