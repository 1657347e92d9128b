// CUDA launchers of the gradient arithmetic; see kernels/cuda/grad.h. Grid-stride
// kernels over the kernels/grad.h bodies; sums of squares through fixed shared-memory trees.
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda/grad.h"
#include "kernels/grad.h"
#include "kernels/math.h"

namespace kernels {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;  // also the partial sums SumOfSquares keeps

int Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < kMaxBlocks ? (b < 1 ? 1 : b) : kMaxBlocks);
}

__global__ void AddIntoKernel(float* dst, const float* src, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = ::kernels::AddTerm(dst[i], src[i]);
  }
}

__global__ void AddIntoBf16Kernel(float* dst, const uint16_t* src, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = ::kernels::AddTerm(dst[i], ::kernels::Load(src, i));
  }
}

__global__ void ScaleKernel(float* dst, int64_t n, float factor) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = ::kernels::ScaleTerm(dst[i], factor);
  }
}

// Block b writes the sum of its grid-stride elements' squares to partial[b]; a tree
// in shared memory keeps the order fixed.
__global__ void SquaresKernel(const float* x, int64_t n, double* partial) {
  __shared__ double tree[kThreads];
  double s = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    s += ::kernels::SquareTerm(x[i]);
  }
  tree[threadIdx.x] = s;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) tree[threadIdx.x] += tree[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = tree[0];
}

// One block adds `count` partial sums into partial[0], in a fixed order.
__global__ void SumPartialsKernel(double* partial, int count) {
  __shared__ double tree[kThreads];
  double s = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
  tree[threadIdx.x] = s;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) tree[threadIdx.x] += tree[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[0] = tree[0];
}

}  // namespace

cudaError_t AddInto(float* dst, const void* src, bool src_bf16, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (src_bf16) {
    AddIntoBf16Kernel<<<Blocks(n), kThreads, 0, stream>>>(dst, static_cast<const uint16_t*>(src),
                                                          n);
  } else {
    AddIntoKernel<<<Blocks(n), kThreads, 0, stream>>>(dst, static_cast<const float*>(src), n);
  }
  return cudaGetLastError();
}

cudaError_t Scale(float* dst, int64_t n, float factor) {
  if (n <= 0) return cudaSuccess;
  ScaleKernel<<<Blocks(n), kThreads, 0, cudaStreamLegacy>>>(dst, n, factor);
  return cudaGetLastError();
}

cudaError_t SumOfSquares(const float* x, int64_t n, double* scratch, double* result) {
  *result = 0;
  if (n <= 0) return cudaSuccess;
  const int blocks = Blocks(n);
  static_assert(kMaxBlocks <= kSumScratchDoubles, "scratch too small");
  SquaresKernel<<<blocks, kThreads, 0, cudaStreamLegacy>>>(x, n, scratch);
  SumPartialsKernel<<<1, kThreads, 0, cudaStreamLegacy>>>(scratch, blocks);
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) {
    err =
        cudaMemcpyAsync(result, scratch, sizeof(double), cudaMemcpyDeviceToHost, cudaStreamLegacy);
  }
  if (err == cudaSuccess) err = cudaStreamSynchronize(cudaStreamLegacy);
  return err;
}

}  // namespace cuda
}  // namespace kernels
