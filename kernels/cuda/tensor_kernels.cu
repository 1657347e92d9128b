// CUDA launchers of kernels/tensor.h; see kernels/cuda/tensor_kernels.h. Grid-stride
// kernels over the outputs (sums: a warp per output chunk). Indexing is int64 throughout.
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/tensor_kernels.h"
#include "kernels/tensor.h"

namespace kernels {
namespace cuda {
namespace {

namespace k = ::kernels;

// True when every operand walks the iteration contiguously (after CoalesceDims: rank 0,
// or rank 1 with stride 1): the kernels then skip the index math.
template <int N>
bool Contiguous(const StridedIter<N>& it) {
  if (it.rank > 1) return false;
  for (int t = 0; t < N && it.rank == 1; ++t) {
    if (it.strides[t][0] != 1) return false;
  }
  return true;
}

template <bool kContiguous>
__global__ void BinaryKernel(int kind, const float* a, const float* b, float* out,
                             StridedIter<2> it, int64_t n) {
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) {
    if constexpr (kContiguous) {
      out[i] = k::BinaryOp(kind, a[i], b[i]);
    } else {
      int64_t off[2];
      k::StridedOffsets(it, i, off);
      out[i] = k::BinaryOp(kind, a[off[0]], b[off[1]]);
    }
  }
}

__global__ void UnaryKernel(int kind, const float* x, float* y, int64_t n, float c) {
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) y[i] = k::UnaryOp(kind, x[i], c);
}

__global__ void UnaryGradKernel(int kind, const float* v, const float* g, float* gx, int64_t n) {
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) {
    gx[i] = k::UnaryGrad(kind, v[i], g[i]);
  }
}

__global__ void StridedCopyKernel(const uint32_t* src, uint32_t* dst, StridedIter<2> it,
                                  int64_t n) {
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) {
    int64_t off[2];
    k::StridedOffsets(it, i, off);
    dst[off[1]] = src[off[0]];
  }
}

__global__ void ExpandScaledKernel(const float* x, float* out, StridedIter<1> it, float scale,
                                   int64_t n) {
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) {
    int64_t off;
    k::StridedOffsets(it, i, &off);
    out[i] = x[off] * scale;
  }
}

// NOTE [Sum order]: warp w sums chunk w % C of output w / C.
__global__ void SumChunksKernel(const float* x, float* out, StridedIter<1> outer,
                                StridedIter<1> terms, double scale, double* scratch, int64_t J,
                                int64_t C) {
  __shared__ double lanes[kWarpsPerBlock][k::kSumLanes];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t R = IterSize(terms);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp; w < J * C;
       w += warps) {
    const int64_t j = w / C, c = w - j * C;
    int64_t base;
    k::StridedOffsets(outer, j, &base);
    const int64_t begin = c * k::kSumChunk;
    const int64_t end = begin + k::kSumChunk < R ? begin + k::kSumChunk : R;
    lanes[warp][lane] = k::SumLane(x, base, terms, begin, end, lane);
    __syncwarp();
    if (lane == 0) {
      const double s = k::CombineLanes(lanes[warp]);
      if (C == 1) {
        out[j] = static_cast<float>(s * scale);
      } else {
        scratch[w] = s;
      }
    }
    __syncwarp();
  }
}

__global__ void SumFinishKernel(const double* scratch, float* out, double scale, int64_t J,
                                int64_t C) {
  for (int64_t j = GlobalIndex(); j < J; j += GlobalStride()) {
    double total = scratch[j * C];
    for (int64_t c = 1; c < C; ++c) total += scratch[j * C + c];
    out[j] = static_cast<float>(total * scale);
  }
}

__global__ void MaxAlongDimKernel(const float* x, float* values, int32_t* indices,
                                  StridedIter<1> outer, int64_t stride, int64_t K, int64_t J) {
  for (int64_t j = GlobalIndex(); j < J; j += GlobalStride()) {
    int64_t base;
    k::StridedOffsets(outer, j, &base);
    k::MaxAlong(x, base, stride, K, values + j, indices + j);
  }
}

__global__ void GatherKernel(const float* data, const int32_t* index, float* out, GatherScatter g,
                             int64_t n) {
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) {
    int64_t out_off;
    const float v = k::GatherAt(g, data, index, i, &out_off);
    out[out_off] = v;
  }
}

__global__ void ScatterAddKernel(const float* src, const int32_t* index, float* data,
                                 GatherScatter g, int64_t n) {
  for (int64_t e = GlobalIndex(); e < n; e += GlobalStride()) {
    data[e] = k::ScatterSumAt(g, src, index, e, data[e]);
  }
}

// Blocks of kWarpsPerBlock warps for `warps` warps, at most kMaxBlocks.
unsigned int GridForWarps(int64_t warps) {
  int64_t blocks = (warps + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  return static_cast<unsigned int>(blocks < 1 ? 1 : blocks);
}

}  // namespace

cudaError_t Binary(int kind, const float* a, const float* b, float* out, StridedIter<2> it) {
  const int64_t n = IterSize(it);
  if (n == 0) return cudaSuccess;
  if (Contiguous(it)) {
    BinaryKernel<true><<<GridFor(n), kThreads>>>(kind, a, b, out, it, n);
  } else {
    BinaryKernel<false><<<GridFor(n), kThreads>>>(kind, a, b, out, it, n);
  }
  return cudaGetLastError();
}

cudaError_t Unary(int kind, const float* x, float* y, int64_t n, float c) {
  if (n == 0) return cudaSuccess;
  UnaryKernel<<<GridFor(n), kThreads>>>(kind, x, y, n, c);
  return cudaGetLastError();
}

cudaError_t UnaryGrad(int kind, const float* v, const float* g, float* gx, int64_t n) {
  if (n == 0) return cudaSuccess;
  UnaryGradKernel<<<GridFor(n), kThreads>>>(kind, v, g, gx, n);
  return cudaGetLastError();
}

cudaError_t StridedCopy(const void* src, void* dst, StridedIter<2> it) {
  const int64_t n = IterSize(it);
  if (n == 0) return cudaSuccess;
  if (Contiguous(it)) {
    return cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * sizeof(uint32_t),
                           cudaMemcpyDeviceToDevice, 0);
  }
  StridedCopyKernel<<<GridFor(n), kThreads>>>(static_cast<const uint32_t*>(src),
                                              static_cast<uint32_t*>(dst), it, n);
  return cudaGetLastError();
}

cudaError_t Sum(const float* x, float* out, StridedIter<1> outer, StridedIter<1> terms,
                double scale, double* scratch) {
  const int64_t J = IterSize(outer), C = k::SumChunks(IterSize(terms));
  if (J == 0) return cudaSuccess;
  if (C > 1 && scratch == nullptr) return cudaErrorInvalidValue;
  SumChunksKernel<<<GridForWarps(J * C), kThreads>>>(x, out, outer, terms, scale, scratch, J, C);
  if (C == 1) return cudaGetLastError();
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  SumFinishKernel<<<GridFor(J), kThreads>>>(scratch, out, scale, J, C);
  return cudaGetLastError();
}

cudaError_t ExpandScaled(const float* x, float* out, StridedIter<1> it, float scale) {
  const int64_t n = IterSize(it);
  if (n == 0) return cudaSuccess;
  ExpandScaledKernel<<<GridFor(n), kThreads>>>(x, out, it, scale, n);
  return cudaGetLastError();
}

cudaError_t MaxAlongDim(const float* x, float* values, int32_t* indices, StridedIter<1> outer,
                        int64_t stride, int64_t K) {
  const int64_t J = IterSize(outer);
  if (J == 0) return cudaSuccess;
  MaxAlongDimKernel<<<GridFor(J), kThreads>>>(x, values, indices, outer, stride, K, J);
  return cudaGetLastError();
}

cudaError_t Gather(const float* data, const int32_t* index, float* out, GatherScatter g) {
  const int64_t n = k::GatherScatterSize(g);
  if (n == 0) return cudaSuccess;
  GatherKernel<<<GridFor(n), kThreads>>>(data, index, out, g, n);
  return cudaGetLastError();
}

cudaError_t ScatterAdd(const float* src, const int32_t* index, float* data, GatherScatter g) {
  int64_t n = 1;
  for (int d = 0; d < g.rank; ++d) n *= g.data_sizes[d];
  if (n == 0 || k::GatherScatterSize(g) == 0) return cudaSuccess;
  ScatterAddKernel<<<GridFor(n), kThreads>>>(src, index, data, g, n);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace kernels
