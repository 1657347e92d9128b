// Fused multi-tensor AdamW and SGD; see kernels/cuda/fused.h.
#include <cuda_runtime.h>

#include "kernels/cuda/fused.h"
#include "kernels/optim.h"

namespace kernels {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// The segment holding chunk `chunk`: the last one whose first_chunk <= chunk.
template <typename Segment>
__device__ int64_t FindSegment(const Segment* segments, int64_t num_segments, int64_t chunk) {
  int64_t lo = 0, hi = num_segments - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (segments[mid].first_chunk <= chunk) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

__global__ void FusedAdamWKernel(const AdamWSegment* segments, int64_t num_segments) {
  const int64_t chunk = blockIdx.x;
  const AdamWSegment seg = segments[FindSegment(segments, num_segments, chunk)];
  const int64_t begin = (chunk - seg.first_chunk) * kFusedChunk;
  const int64_t end = begin + kFusedChunk < seg.n ? begin + kFusedChunk : seg.n;
  const AdamWScalars s = seg.s;
  for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) {
    AdamWUpdate(&seg.w[j], &seg.m[j], &seg.v[j], seg.g[j], s);
  }
}

__global__ void FusedSgdKernel(const SgdSegment* segments, int64_t num_segments) {
  const int64_t chunk = blockIdx.x;
  const SgdSegment seg = segments[FindSegment(segments, num_segments, chunk)];
  const int64_t begin = (chunk - seg.first_chunk) * kFusedChunk;
  const int64_t end = begin + kFusedChunk < seg.n ? begin + kFusedChunk : seg.n;
  const SgdScalars s = seg.s;
  float unused = 0.0f;
  for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) {
    SgdUpdate(&seg.w[j], seg.buf != nullptr ? &seg.buf[j] : &unused, seg.g[j], s);
  }
}

}  // namespace

cudaError_t FusedAdamW(const AdamWSegment* segments, int64_t num_segments, int64_t total_chunks) {
  if (num_segments <= 0 || total_chunks <= 0) return cudaSuccess;
  if (total_chunks > 0x7fffffff) return cudaErrorInvalidValue;
  FusedAdamWKernel<<<static_cast<unsigned int>(total_chunks), kThreads>>>(segments, num_segments);
  return cudaGetLastError();
}

cudaError_t FusedSgd(const SgdSegment* segments, int64_t num_segments, int64_t total_chunks) {
  if (num_segments <= 0 || total_chunks <= 0) return cudaSuccess;
  if (total_chunks > 0x7fffffff) return cudaErrorInvalidValue;
  FusedSgdKernel<<<static_cast<unsigned int>(total_chunks), kThreads>>>(segments, num_segments);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace kernels
