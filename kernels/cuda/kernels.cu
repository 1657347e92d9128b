// CUDA launchers of the kernels/ bodies; see kernels/cuda/kernels.h. Elementwise bodies run
// in grid-stride kernels, row-wise bodies with one warp (or one block) per row and
// shuffle reductions. Indexing is int64 throughout.
#include <cuda_runtime.h>
#include <stdint.h>

#include <algorithm>
#include <cub/device/device_radix_sort.cuh>
#include <initializer_list>
#include <type_traits>

#include "core/bf16_hd.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/elementwise.h"
#include "kernels/math.h"
#include "kernels/rowwise.h"

namespace kernels {
namespace cuda {
namespace {

namespace k = ::kernels;

// Sum (or max) over the block; every thread gets the result. `scratch` holds one value
// per warp (blockDim.x <= 1024).
template <typename T>
__device__ T BlockSum(T v, T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = (blockDim.x + 31) >> 5;
  v = WarpSum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T total = 0;
  for (int w = 0; w < warps; ++w) total += scratch[w];
  return total;
}

__device__ float BlockMax(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = (blockDim.x + 31) >> 5;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float m = scratch[0];
  for (int w = 1; w < warps; ++w) m = fmaxf(m, scratch[w]);
  return m;
}

// ---- Elementwise.

__global__ void GeluForwardKernel(const float* x, float* y, int64_t n) {
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) y[i] = k::GeluTanhForward(x[i]);
}

__global__ void GeluBackwardKernel(const float* x, const float* gy, float* gx, int64_t n) {
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) {
    gx[i] = k::GeluTanhBackward(x[i], gy[i]);
  }
}

__global__ void ReluForwardKernel(const float* x, float* y, int64_t n) {
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) y[i] = k::ReluForward(x[i]);
}

__global__ void ReluBackwardKernel(const float* y, const float* gy, float* gx, int64_t n) {
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) gx[i] = k::ReluBackward(y[i], gy[i]);
}

__global__ void AddKernel(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) out[i] = k::Add(a[i], b[i]);
}

// The by-column kernels walk rows across the grid and columns across each block (no
// integer division per element).
// `Four`: cols % 4 == 0 and the fp32 matrices 16-byte aligned (FourWideRows), so each
// thread moves four elements per 16-byte access.
template <bool Four, typename W>
__global__ void BiasAddKernel(const float* x, const W* bias, float* out, int64_t rows,
                              int64_t cols) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    if constexpr (Four) {
      const float4* x4 = reinterpret_cast<const float4*>(x + r * cols);
      float4* o4 = reinterpret_cast<float4*>(out + r * cols);
      for (int64_t q = threadIdx.x; q < cols / 4; q += blockDim.x) {
        const float4 v = x4[q];
        const int64_t j = 4 * q;
        o4[q] = make_float4(k::BiasAdd(v.x, bias, j), k::BiasAdd(v.y, bias, j + 1),
                            k::BiasAdd(v.z, bias, j + 2), k::BiasAdd(v.w, bias, j + 3));
      }
    } else {
      for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
        out[r * cols + j] = k::BiasAdd(x[r * cols + j], bias, j);
      }
    }
  }
}

// Whether [rows, cols] fp32 matrices at these addresses can be walked four columns at a time.
bool FourWideRows(int64_t cols, std::initializer_list<const void*> ptrs) {
  if (cols % 4 != 0) return false;
  for (const void* p : ptrs) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

// Blocks for the by-column kernels: one row per block, at most kMaxBlocks.
unsigned int GridForColumnRows(int64_t rows) {
  return static_cast<unsigned int>(rows < kMaxBlocks ? (rows < 1 ? 1 : rows) : kMaxBlocks);
}

__global__ void ScaleMatricesKernel(float* c, int64_t batch, int64_t rows, int64_t cols, int64_t ld,
                                    int64_t stride, float beta) {
  const int64_t n = batch * rows * cols;
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) {
    const int64_t b = i / (rows * cols), r = (i / cols) % rows, j = i % cols;
    float* p = c + b * stride + r * ld + j;
    *p = beta == 0.0f ? 0.0f : beta * *p;
  }
}

// One block per row of y (strided over the rows), its threads across the columns.
template <typename W>
__global__ void EmbeddingForwardKernel(const int32_t* ids, int64_t n_ids, const W* table,
                                       int64_t num, int64_t dim, float* y) {
  for (int64_t r = blockIdx.x; r < n_ids; r += gridDim.x) {
    const int32_t id = ids[r];
    const bool valid = k::EmbeddingIdValid(id, num);
    float* out = y + r * dim;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
      out[j] = valid ? k::EmbeddingGather(table, id, dim, j) : 0.0f;
    }
  }
}

// position[i] = i.
__global__ void IotaKernel(int32_t* position, int n) {
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) position[i] = static_cast<int32_t>(i);
}

// One block per run of equal ids in `sorted` (positions in `position`, in order within a
// run: the sort is stable): gw[id, :] += g[p, :] for the run's positions p in order.
__global__ void EmbeddingRunsKernel(const int32_t* sorted, const int32_t* position, int n,
                                    const float* g, int64_t num, int64_t dim, float* gw) {
  for (int64_t s = blockIdx.x; s < n; s += gridDim.x) {  // 64-bit: s + gridDim.x may pass 2^31
    const int32_t id = sorted[s];
    if ((s > 0 && sorted[s - 1] == id) || !k::EmbeddingIdValid(id, num)) continue;
    int64_t end = s + 1;
    while (end < n && sorted[end] == id) ++end;
    float* row = gw + static_cast<int64_t>(id) * dim;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
      float acc = row[j];
      int64_t p = s;
      // Eight rows' loads in flight before their adds, which stay in position order (the
      // same bits): a frequent token's run (a few percent of a batch's tokens) is a chain
      // of hundreds of adds, each otherwise waiting for its own load.
      constexpr int kInFlight = 8;
      for (; p + kInFlight <= end; p += kInFlight) {
        float v[kInFlight];
#pragma unroll
        for (int u = 0; u < kInFlight; ++u) {
          v[u] = g[static_cast<int64_t>(position[p + u]) * dim + j];
        }
#pragma unroll
        for (int u = 0; u < kInFlight; ++u) acc = k::Add(acc, v[u]);
      }
      for (; p < end; ++p) acc = k::Add(acc, g[static_cast<int64_t>(position[p]) * dim + j]);
      row[j] = acc;
    }
  }
}

// Fingerprint's sums: each thread over its grid-stride words, then the warp, then one
// atomic add per warp (integer sums: any order gives the same bits).
__device__ __forceinline__ unsigned long long SplitMix64(unsigned long long x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__global__ void FingerprintKernel(const uint16_t* words, int64_t n, unsigned long long* out) {
  unsigned long long sum = 0, nonzero = 0;
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) {
    const uint16_t w = words[i];
    sum += SplitMix64((static_cast<unsigned long long>(i) << 16) | w);
    nonzero += w != 0;
  }
  sum = WarpSum(sum);
  nonzero = WarpSum(nonzero);
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(out, sum);
    atomicAdd(out + 1, nonzero);
  }
}

// The scratch of EmbeddingBackward: sorted ids, positions before and after the sort (n
// each), then the radix sort's temporary storage, each 256-byte aligned.
struct EmbeddingScratch {
  size_t ids, positions, sorted_positions, temp, temp_bytes, total;
};

size_t Aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

// The layout for n ids, or the error of CUB's size query.
cudaError_t EmbeddingScratchLayout(int n, EmbeddingScratch* l) {
  *l = EmbeddingScratch{};
  size_t temp_bytes = 0;
  const cudaError_t err = cub::DeviceRadixSort::SortPairs(
      nullptr, temp_bytes, static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), n);
  if (err != cudaSuccess) return err;
  const size_t ints = Aligned(static_cast<size_t>(n) * sizeof(int32_t));
  l->ids = 0;
  l->positions = ints;
  l->sorted_positions = 2 * ints;
  l->temp = 3 * ints;
  l->temp_bytes = temp_bytes;
  l->total = l->temp + Aligned(temp_bytes);
  return cudaSuccess;
}

// ---- Column sums: block (32, 8) covers 32 columns; lanes y split the rows, then a
// fixed-order tree in shared memory, so the result is deterministic.
// Block (bx, by) sums rows [by * rows_per_chunk, ...) of columns [32 bx, 32 bx + 32): into
// out[col] += (one chunk) or out[by * cols + col] = (its chunk's partial sum).
// NOTE [GEMM epilogues]: the epilogue of a GEMM whose product cuBLASLt stored plainly in
// acc, one element per thread (kernels/cpu/kernels.h GemmEpilogue's arguments).
template <typename W, typename T>
__global__ void GemmEpilogueKernel(const float* acc, int kind, const W* bias, T* aux, T* out,
                                   int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) {
    const float pre = k::GemmEpiloguePre(kind, acc[i], bias, i % cols);
    const float saved = k::GemmEpilogueReadsAux(kind) ? k::Load(aux, i) : 0.0f;
    if (kind == k::kGemmEpilogueBiasGelu) k::Store(aux, i, pre);
    k::Store(out, i, k::GemmEpilogueOut(kind, pre, saved));
  }
}

template <typename X>
__global__ void ColumnSumsKernel(const X* x, const float* y, float* out, int64_t rows, int64_t cols,
                                 int64_t rows_per_chunk, bool accumulate) {
  __shared__ float partial[8][33];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t end = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;
  float s = 0.0f;
  if (col < cols) {
    for (int64_t r = first + threadIdx.y; r < end; r += 8) {
      const int64_t i = r * cols + col;
      s += y != nullptr ? k::Load(x, i) * y[i] : k::Load(x, i);
    }
  }
  partial[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float total = 0.0f;
    for (int l = 0; l < 8; ++l) total += partial[l][threadIdx.x];
    if (accumulate) {
      out[col] += total;
    } else {
      out[static_cast<int64_t>(blockIdx.y) * cols + col] = total;
    }
  }
}

// acc[col] += the chunks' partial sums of column col (partial[c * stride + col]), in chunk
// order.
__global__ void ColumnSumsFinishKernel(const float* partial, int64_t stride, float* acc,
                                       int64_t chunks, int64_t cols) {
  for (int64_t col = GlobalIndex(); col < cols; col += GlobalStride()) {
    float total = 0.0f;
    for (int64_t c = 0; c < chunks; ++c) total += partial[c * stride + col];
    acc[col] += total;
  }
}

// ---- LayerNorm, one warp per row.

// N consecutive floats at p: one 16-byte access when Wide (N == 4, p 16-byte aligned),
// else N scalar ones. p may point to global or shared memory.
template <int N, bool Wide>
struct Floats {
  float v[N];
  __device__ __forceinline__ static Floats Load(const float* p) {
    Floats f;
    if constexpr (Wide) {
      static_assert(N == 4, "16-byte accesses move four floats");
      const float4 q = *reinterpret_cast<const float4*>(p);
      f.v[0] = q.x;
      f.v[1] = q.y;
      f.v[2] = q.z;
      f.v[3] = q.w;
    } else {
#pragma unroll
      for (int e = 0; e < N; ++e) f.v[e] = p[e];
    }
    return f;
  }
  __device__ __forceinline__ void Store(float* p) const {
    if constexpr (Wide) {
      *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
    } else {
#pragma unroll
      for (int e = 0; e < N; ++e) p[e] = v[e];
    }
  }
};

// N consecutive bf16 values (the bits) at p, rounded from v: one 8-byte store when Wide.
template <int N, bool Wide>
__device__ __forceinline__ void StoreRounded(uint16_t* p, const float (&v)[N]) {
  if constexpr (Wide) {
    *reinterpret_cast<uint2*>(p) =
        make_uint2(core::Bf16PairBits(v[0], v[1]), core::Bf16PairBits(v[2], v[3]));
  } else {
#pragma unroll
    for (int e = 0; e < N; ++e) p[e] = core::FloatToBf16Bits(v[e]);
  }
}
template <int N, bool Wide>
__device__ __forceinline__ void StoreRounded(float* p, const float (&v)[N]) {
  Floats<N, Wide> f;
#pragma unroll
  for (int e = 0; e < N; ++e) f.v[e] = v[e];
  f.Store(p);
}

// The groups of N columns lane `lane` owns in a row of `cols` (N * (lane + 32 i)): calls
// body(i, j) for each, j its first column. With Cached > 0 (cols <= 32 N Cached) the loop is
// unrolled with i < Cached, so a kernel can keep group i in registers (RowCache); else i is
// 0. The same groups in the same order either way.
template <int N, int Cached, typename Body>
__device__ __forceinline__ void ForEachGroup(int lane, int64_t cols, Body&& body) {
  if constexpr (Cached > 0) {
#pragma unroll
    for (int i = 0; i < Cached; ++i) {
      const int64_t j = N * (lane + 32 * static_cast<int64_t>(i));
      if (j < cols) body(i, j);
    }
  } else {
#pragma unroll 4
    for (int64_t j = N * lane; j < cols; j += 32 * N) body(0, j);
  }
}

// A row's groups of one lane (ForEachGroup) kept in registers after the first pass reads
// them, when Cached > 0: Take(i, load) returns group i, reading it with load() only on the
// first pass or when nothing is cached. The values, and so every sum, are the same.
template <typename F, int Cached>
struct RowCache {
  F v[Cached > 0 ? Cached : 1];
  template <typename Load>
  __device__ __forceinline__ F Take(int i, bool first_pass, Load&& load) {
    if constexpr (Cached > 0) {
      if (first_pass) v[i] = load();
      return v[i];
    } else {
      return load();
    }
  }
};

// w[j .. j + N) (fp32 or bf16 weights) as a local array the row bodies index from 0: one 8-
// or 16-byte load where N == 4 and w + j is so aligned (a parameter's place in a flat
// buffer decides), else N scalar loads; the same values either way.
template <int N, typename W>
struct Weights {
  W v[N];
};
template <int N, typename W>
__device__ __forceinline__ Weights<N, W> LoadWeights(const W* w, int64_t j) {
  Weights<N, W> r;
  if constexpr (N == 4) {
    if (reinterpret_cast<uintptr_t>(w + j) % sizeof(r.v) == 0) {
      using Vec = std::conditional_t<sizeof(W) == 2, uint2, float4>;
      const Vec q = *reinterpret_cast<const Vec*>(w + j);
      memcpy(r.v, &q, sizeof(r.v));
      return r;
    }
  }
#pragma unroll
  for (int e = 0; e < N; ++e) r.v[e] = w[j + e];
  return r;
}

// The groups a lane may keep in registers (LayerNorm kernels' Cached) for rows of `cols`:
// 8 four-wide groups (rows of up to 1024 columns, 32 registers a cached tensor), else none.
constexpr int kCachedGroups = 8;
inline bool RowFitsCache(int64_t cols, int n) { return n == 4 && cols <= 32 * 4 * kCachedGroups; }

// LayerNorm of the rows of x, or of x + x2 when x2 is not null (residual + LayerNorm, the
// sum written to `sum`, which may be x or x2: each lane reads and writes its own elements).
// Without Centered, RMSNorm instead: no mean pass, no bias (b and mean_out unused).
// One warp per row; lane l takes the groups of N columns starting at N * (l + 32 i), N and
// Wide as in LayerNormBackwardKernel (Wide: every row, y's included, 16-byte aligned); with
// Cached (ForEachGroup) the row is read once and its passes run from registers.
template <int N, bool Wide, int Cached, bool Centered, typename W, typename Y>
__global__ void LayerNormForwardKernel(const float* x, const float* x2, float* sum_out, const W* w,
                                       const W* b, float eps, Y* y, float* mean_out, float* rstd,
                                       int64_t rows, int64_t cols) {
  using F = Floats<N, Wide>;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const float* xr = x + row * cols;
  const float* x2r = x2 != nullptr ? x2 + row * cols : nullptr;
  auto in = [&](int64_t j) {
    F v = F::Load(xr + j);
    if (x2r != nullptr) {
      const F v2 = F::Load(x2r + j);
#pragma unroll
      for (int e = 0; e < N; ++e) v.v[e] = k::Add(v.v[e], v2.v[e]);
    }
    return v;
  };
  RowCache<F, Cached> row_x;
  float mean = 0.0f;
  if constexpr (Centered) {
    float sum = 0.0f;
    ForEachGroup<N, Cached>(lane, cols, [&](int i, int64_t j) {
      const F v = row_x.Take(i, true, [&] { return in(j); });
#pragma unroll
      for (int e = 0; e < N; ++e) sum += v.v[e];
    });
    mean = WarpSum(sum) / static_cast<float>(cols);
  }
  float sq = 0.0f;
  ForEachGroup<N, Cached>(lane, cols, [&](int i, int64_t j) {
    const F v = row_x.Take(i, !Centered, [&] { return in(j); });
#pragma unroll
    for (int e = 0; e < N; ++e) {
      const float d = Centered ? v.v[e] - mean : v.v[e];
      sq += d * d;
    }
  });
  // The variance about the mean, or (RMSNorm) the mean square.
  const float var = WarpSum(sq) / static_cast<float>(cols);
  const float r = Centered ? k::LayerNormRstd(var, eps) : k::RmsNormRstd(var, eps);
  Y* yr = y + row * cols;
  float* sr = sum_out != nullptr ? sum_out + row * cols : nullptr;
  ForEachGroup<N, Cached>(lane, cols, [&](int i, int64_t j) {
    const F v = row_x.Take(i, false, [&] { return in(j); });
    if (sr != nullptr) v.Store(sr + j);
    float out[N];
    const Weights<N, W> wj = LoadWeights<N>(w, j);
    if constexpr (Centered) {
      const Weights<N, W> bj = LoadWeights<N>(b, j);
#pragma unroll
      for (int e = 0; e < N; ++e) out[e] = k::LayerNormApply(v.v[e], mean, r, wj.v, bj.v, e);
    } else {
#pragma unroll
      for (int e = 0; e < N; ++e) out[e] = k::RmsNormApply(v.v[e], r, wj.v, e);
    }
    StoreRounded<N, Wide>(yr + j, out);
  });
  if (lane == 0) {
    if constexpr (Centered) mean_out[row] = mean;
    rstd[row] = r;
  }
}

// LayerNorm's backward, one warp per row: gx from g, xhat (kernels::LayerNormHat of the
// forward's input x and the row's mean and rstd: the forward's bits) and w, plus residual when
// it is not null (residual + LayerNorm backward; residual must not be gx), and gx rounded
// to bf16 into gx16 when that is not null. Block b takes
// rows [b * rows_per_block, (b + 1) * rows_per_block), warp v of it rows first + v,
// first + v + warps, ...
// With Sums, in the same pass, the column sums of g * xhat and of g over the block's rows
// (kernels::LayerNormGradChunks): each warp keeps its own in shared memory
// ([warps][stats][cols], stats = 2, or 1 for RMSNorm); the block then adds its warps' sums in warp
// order into partial[blockIdx.x] ([stats, cols]: g * xhat, then g), or, with partial null (one
// block), into gw and gb (each when not null). Lane l owns the groups of N columns starting at N *
// (l + 32 i); N is 4 when cols % 4 == 0 (a function of the shape, so the order of every sum is too)
// and Wide says the rows are 16-byte aligned, so each group moves in one access (else N scalar
// ones, the same sums). With Cached (ForEachGroup) a row's g and x are read once, the second pass
// taking g and xhat from registers. Without Centered, RMSNorm's backward (kernels::RmsNormHat and
// RmsNormBackwardInput; mean and gb unused, and only the g * xhat sums are kept: stats = 1).
template <int N, bool Wide, bool Sums, int Cached, bool Centered, typename W>
__global__ void LayerNormBackwardKernel(const float* g, const float* x, const float* mean,
                                        const float* rstd, const W* w, const float* residual,
                                        float* gx, uint16_t* gx16, float* gw, float* gb,
                                        float* partial, int64_t rows, int64_t cols,
                                        int64_t rows_per_block) {
  using F = Floats<N, Wide>;
  extern __shared__ __align__(16) float sums[];
  const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  constexpr int kStats = Centered ? 2 : 1;  // the column sums kept: g * xhat (and g)
  float* own_gh = sums + static_cast<int64_t>(warp) * kStats * cols;
  float* own_g = own_gh + cols;
  if constexpr (Sums) {
    for (int64_t j = lane; j < kStats * cols; j += 32) own_gh[j] = 0.0f;
    __syncwarp();  // the lanes then add into columns other lanes zeroed
  }
  const int64_t first = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t end = first + rows_per_block < rows ? first + rows_per_block : rows;
  for (int64_t row = first + warp; row < end; row += warps) {
    const float* gr = g + row * cols;
    const float* xr = x + row * cols;
    const float mu = Centered ? mean[row] : 0.0f, r = rstd[row];
    const auto hat = [&](int64_t j) {
      F h = F::Load(xr + j);
#pragma unroll
      for (int e = 0; e < N; ++e) {
        h.v[e] = Centered ? k::LayerNormHat(h.v[e], mu, r) : k::RmsNormHat(h.v[e], r);
      }
      return h;
    };
    RowCache<F, Cached> row_g, row_h;
    float sum_gh = 0.0f, sum_gh_h = 0.0f;
    ForEachGroup<N, Cached>(lane, cols, [&](int i, int64_t j) {
      const F gv = row_g.Take(i, true, [&] { return F::Load(gr + j); });
      const F hv = row_h.Take(i, true, [&] { return hat(j); });
      const Weights<N, W> wj = LoadWeights<N>(w, j);
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const float gh = k::LayerNormGradHat<float>(gv.v[e], wj.v, e);
        if constexpr (Centered) sum_gh += gh;
        sum_gh_h += gh * hv.v[e];
      }
    });
    const float mean_gh = Centered ? WarpSum(sum_gh) / static_cast<float>(cols) : 0.0f;
    const float mean_gh_h = WarpSum(sum_gh_h) / static_cast<float>(cols);
    float* out = gx + row * cols;
    const float* res = residual != nullptr ? residual + row * cols : nullptr;
    ForEachGroup<N, Cached>(lane, cols, [&](int i, int64_t j) {
      const F gv = row_g.Take(i, false, [&] { return F::Load(gr + j); });
      const F hv = row_h.Take(i, false, [&] { return hat(j); });
      F o = res != nullptr ? F::Load(res + j) : F();
      const Weights<N, W> wj = LoadWeights<N>(w, j);
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const float v =
            Centered
                ? k::LayerNormBackwardInput<float>(gv.v[e], wj.v, e, hv.v[e], r, mean_gh, mean_gh_h)
                : k::RmsNormBackwardInput<float>(gv.v[e], wj.v, e, hv.v[e], r, mean_gh_h);
        o.v[e] = res != nullptr ? k::Add(o.v[e], v) : v;
      }
      o.Store(out + j);
      if (gx16 != nullptr) StoreRounded<N, Wide>(gx16 + row * cols + j, o.v);
      if constexpr (Sums) {
        F sgh = F::Load(own_gh + j), sg;
        if constexpr (Centered) sg = F::Load(own_g + j);
#pragma unroll
        for (int e = 0; e < N; ++e) {
          sgh.v[e] += gv.v[e] * hv.v[e];
          if constexpr (Centered) sg.v[e] += gv.v[e];
        }
        sgh.Store(own_gh + j);
        if constexpr (Centered) sg.Store(own_g + j);
      }
    });
  }
  if constexpr (!Sums) return;
  __syncthreads();
  for (int64_t j = threadIdx.x; j < kStats * cols; j += blockDim.x) {
    float total = 0.0f;
    for (int v = 0; v < warps; ++v) total += sums[static_cast<int64_t>(v) * kStats * cols + j];
    if (partial != nullptr) {
      partial[static_cast<int64_t>(blockIdx.x) * kStats * cols + j] = total;
    } else if (j < cols) {
      if (gw != nullptr) gw[j] += total;
    } else if (gb != nullptr) {
      gb[j - cols] += total;
    }
  }
}

// ---- Causal softmax, one warp per row of T scores; row r is query t = r % T.

// In place on scores, or, when probs16 is not null, into probs16 rounded (the scores are
// then only read: the exps are recomputed in the last pass instead of stored).
__global__ void CausalSoftmaxForwardKernel(float* scores, uint16_t* probs16, int64_t rows,
                                           int64_t T) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const int64_t t = row % T;
  float* p = scores + row * T;
  float m = -INFINITY;
  for (int64_t s = lane; s <= t; s += 32) m = fmaxf(m, p[s]);
  m = WarpMax(m);
  uint16_t* out = probs16 != nullptr ? probs16 + row * T : nullptr;
  float sum = 0.0f;
  for (int64_t s = lane; s <= t; s += 32) {
    const float e = k::SoftmaxExp(p[s], m);
    if (out == nullptr) p[s] = e;
    sum += e;
  }
  const float inv = 1.0f / WarpSum(sum);
  for (int64_t s = lane; s < T; s += 32) {
    if (k::CausalMasked(t, s)) {
      if (out != nullptr) {
        out[s] = 0;
      } else {
        p[s] = 0.0f;
      }
    } else if (out != nullptr) {
      out[s] = core::FloatToBf16Bits(k::SoftmaxNormalize(k::SoftmaxExp(p[s], m), inv));
    } else {
      p[s] = k::SoftmaxNormalize(p[s], inv);
    }
  }
}

// In place on g, or, when out16 is not null, into out16 rounded (g then only read). P:
// float or bf16 bits.
template <typename P>
__global__ void CausalSoftmaxBackwardKernel(const P* p, float* g, uint16_t* out16, int64_t rows,
                                            int64_t T, float scale) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const int64_t t = row % T;
  const P* pr = p + row * T;
  float* gr = g + row * T;
  float dot = 0.0f;
  for (int64_t s = lane; s <= t; s += 32) dot += gr[s] * k::Load(pr, s);
  dot = WarpSum(dot);
  uint16_t* out = out16 != nullptr ? out16 + row * T : nullptr;
  for (int64_t s = lane; s < T; s += 32) {
    const float v =
        k::CausalMasked(t, s) ? 0.0f : k::SoftmaxBackward(k::Load(pr, s), gr[s], dot, scale);
    if (out != nullptr) {
      out[s] = core::FloatToBf16Bits(v);
    } else {
      gr[s] = v;
    }
  }
}

// ---- Cross-entropy, one block per row of V logits.

// The gradient of element j goes to grad (fp32) or, when grad16 is set, to grad16 rounded
// once to bf16.
__device__ __forceinline__ void PutGrad(float* grad, uint16_t* grad16, int64_t j, float g) {
  if (grad16 != nullptr) {
    grad16[j] = core::FloatToBf16Bits(g);
  } else {
    grad[j] = g;
  }
}

// Four logits of a row as they are stored: one 16-byte fp32 load or one 8-byte bf16 load.
template <typename X>
struct FourOf;
template <>
struct FourOf<float> {
  using type = float4;
};
template <>
struct FourOf<uint16_t> {
  using type = uint2;
};

// Four stored logits as floats (bf16 widened exactly).
__device__ __forceinline__ float4 Widen(const float4& v) { return v; }
__device__ __forceinline__ float4 Widen(const uint2& q) {
  return make_float4(core::Bf16BitsToFloat(static_cast<uint16_t>(q.x)),
                     core::Bf16BitsToFloat(static_cast<uint16_t>(q.x >> 16)),
                     core::Bf16BitsToFloat(static_cast<uint16_t>(q.y)),
                     core::Bf16BitsToFloat(static_cast<uint16_t>(q.y >> 16)));
}

// Logits 4 j4 .. 4 j4 + 3 of a row (16- or 8-byte aligned) as stored, and as floats.
template <typename X>
__device__ __forceinline__ typename FourOf<X>::type LoadFourRaw(const X* row, int64_t j4) {
  return reinterpret_cast<const typename FourOf<X>::type*>(row)[j4];
}
template <typename X>
__device__ __forceinline__ float4 LoadFour(const X* row, int64_t j4) {
  return Widen(LoadFourRaw(row, j4));
}

// Whether the cross-entropy kernels move four logits a load: V % 4 == 0, the logits aligned
// for LoadFour and the gradient `out` 16-byte aligned (PutGradFour).
template <typename X>
__host__ __device__ inline bool FourLogitsALoad(const X* logits, int64_t V, const void* out) {
  return V % 4 == 0 && reinterpret_cast<uintptr_t>(logits) % (4 * sizeof(X)) == 0 &&
         reinterpret_cast<uintptr_t>(out) % 16 == 0;
}

// The sum of exp(x - m) over the four logits of v (in double from the first term on).
__device__ __forceinline__ double ExpSumFour(const float4& v, float m) {
  return static_cast<double>(k::CrossEntropyExp<float>(v.x, m)) +
         k::CrossEntropyExp<float>(v.y, m) + k::CrossEntropyExp<float>(v.z, m) +
         k::CrossEntropyExp<float>(v.w, m);
}

// The gradients of logits 4 j4 .. 4 j4 + 3 of a row (values v) into the row's grad (fp32)
// or, when grad16 is set, grad16 rounded: one 16-byte or 8-byte store.
__device__ __forceinline__ void PutGradFour(float* grad, uint16_t* grad16, int64_t j4,
                                            const float4& v, float m, float log_sum, int64_t target,
                                            float inv_n) {
  const int64_t e = 4 * j4;
  const float4 g = make_float4(k::CrossEntropyGrad<float>(v.x, m, log_sum, e == target, inv_n),
                               k::CrossEntropyGrad<float>(v.y, m, log_sum, e + 1 == target, inv_n),
                               k::CrossEntropyGrad<float>(v.z, m, log_sum, e + 2 == target, inv_n),
                               k::CrossEntropyGrad<float>(v.w, m, log_sum, e + 3 == target, inv_n));
  if (grad16 != nullptr) {
    reinterpret_cast<uint2*>(grad16)[j4] =
        make_uint2(core::Bf16PairBits(g.x, g.y), core::Bf16PairBits(g.z, g.w));
  } else {
    reinterpret_cast<float4*>(grad)[j4] = g;
  }
}

// X: fp32 or bf16 logits (kernels::Load widens them exactly).
template <typename X>
__global__ void CrossEntropyKernel(const X* logits, const int32_t* targets, int64_t rows, int64_t V,
                                   double inv_n, float* grad, double* row_loss, uint16_t* grad16) {
  __shared__ float fscratch[32];
  __shared__ double dscratch[32];
  const int64_t row = blockIdx.x;
  if (row >= rows) return;
  const X* x = logits + row * V;
  float* gr = grad16 != nullptr ? nullptr : grad + row * V;
  uint16_t* gr16 = grad16 != nullptr ? grad16 + row * V : nullptr;
  const int32_t target = targets[row];
  // One read for the max and the sum: each thread keeps its running max m and its sum of
  // exp(x - m), rescaled when m grows (FlashAttention's online softmax); four elements per
  // load when the rows are aligned for it (the launcher's `four`).
  const bool four = FourLogitsALoad(
      logits, V, grad16 != nullptr ? static_cast<void*>(grad16) : static_cast<void*>(grad));
  float m = -INFINITY;
  double sum = 0.0;
  const auto take = [&](float chunk_max) {
    if (chunk_max > m) {
      if (m != -INFINITY) sum *= exp(static_cast<double>(m) - chunk_max);
      m = chunk_max;
    }
  };
  if (four) {
    for (int64_t j = threadIdx.x; j < V / 4; j += blockDim.x) {
      const float4 v = LoadFour(x, j);
      take(fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w)));
      sum += ExpSumFour(v, m);
    }
  } else {
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
      const float v = k::Load(x, j);
      take(v);
      sum += k::CrossEntropyExp<float>(v, m);
    }
  }
  const float row_max = BlockMax(m, fscratch);
  sum = BlockSum(m == -INFINITY ? 0.0 : sum * exp(static_cast<double>(m) - row_max), dscratch);
  m = row_max;
  const double log_sum = log(sum);
  const bool valid = target >= 0 && target < V;
  if (threadIdx.x == 0) {
    row_loss[row] =
        valid ? k::CrossEntropyRowLoss<double>(sum, static_cast<double>(m), k::Load(x, target))
              : 0.0;
  }
  const float log_sum_f = static_cast<float>(log_sum);
  const float inv_n_f = static_cast<float>(inv_n);
  if (four) {
    for (int64_t j = threadIdx.x; j < V / 4; j += blockDim.x) {
      PutGradFour(gr, gr16, j, LoadFour(x, j), m, log_sum_f, target, inv_n_f);
    }
  } else {
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
      PutGrad(gr, gr16, j,
              k::CrossEntropyGrad<float>(k::Load(x, j), m, log_sum_f, j == target, inv_n_f));
    }
  }
}

// CrossEntropyKernel's results with the row staged in shared memory (dynamic, V logits as
// they are stored: V * sizeof(X) bytes; V % 4 == 0 and the rows aligned for LoadFour): the
// logits are read from device memory once. Each block takes rows blockIdx.x, blockIdx.x +
// gridDim.x, ...: it copies the row in (kInFlight loads in flight a thread), takes the
// maximum, then sums exp(x - max) and writes the gradient from shared memory, widening each
// staged bf16 logit exactly as LoadFour does. A bf16 row takes half a float row's shared
// memory, so two blocks share an SM and one copies its row in while the other computes.
// CrossEntropyKernel re-reads its row for the gradient, and with a few hundred 200 KB rows
// in flight that second read comes from device memory.
template <typename X>
__global__ void __launch_bounds__(1024)
    CrossEntropyStagedKernel(const X* logits, const int32_t* targets, int64_t rows, int64_t V,
                             double inv_n, float* grad, double* row_loss, uint16_t* grad16) {
  using Four = typename FourOf<X>::type;
  extern __shared__ float4 staged_storage[];  // float4: 16-byte aligned for either type
  Four* staged = reinterpret_cast<Four*>(staged_storage);
  const X* row_x = reinterpret_cast<const X*>(staged_storage);
  __shared__ float fscratch[32];
  __shared__ double dscratch[32];
  constexpr int kInFlight = 16 / sizeof(Four) * 4;  // 64 bytes a thread: 4 fp32, 8 bf16 loads
  const int64_t n4 = V / 4, step = blockDim.x;
  const float inv_n_f = static_cast<float>(inv_n);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const X* x = logits + row * V;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < n4; j += kInFlight * step) {
      Four v[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        if (j + u * step < n4) v[u] = LoadFourRaw(x, j + u * step);
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        if (j + u * step < n4) {
          staged[j + u * step] = v[u];
          const float4 f = Widen(v[u]);
          m = fmaxf(m, fmaxf(fmaxf(f.x, f.y), fmaxf(f.z, f.w)));
        }
      }
    }
    m = BlockMax(m, fscratch);  // its barriers also publish the staged row
    double sum = 0.0;
    for (int64_t j = threadIdx.x; j < n4; j += step) {
      sum += ExpSumFour(Widen(staged[j]), m);
    }
    sum = BlockSum(sum, dscratch);
    const int32_t target = targets[row];
    const bool valid = target >= 0 && target < V;
    if (threadIdx.x == 0) {
      row_loss[row] = valid ? k::CrossEntropyRowLoss<double>(sum, static_cast<double>(m),
                                                             k::Load(row_x, target))
                            : 0.0;
    }
    const float log_sum_f = static_cast<float>(log(sum));
    for (int64_t j = threadIdx.x; j < n4; j += step) {
      PutGradFour(grad16 != nullptr ? nullptr : grad + row * V,
                  grad16 != nullptr ? grad16 + row * V : nullptr, j, Widen(staged[j]), m, log_sum_f,
                  target, inv_n_f);
    }
    __syncthreads();  // every thread is done with the staged row before the next one lands
  }
}

}  // namespace

cudaError_t GeluForward(const float* x, float* y, int64_t n) {
  if (n <= 0) return cudaSuccess;
  GeluForwardKernel<<<GridFor(n), kThreads>>>(x, y, n);
  return cudaGetLastError();
}

cudaError_t GeluBackward(const float* x, const float* gy, float* gx, int64_t n) {
  if (n <= 0) return cudaSuccess;
  GeluBackwardKernel<<<GridFor(n), kThreads>>>(x, gy, gx, n);
  return cudaGetLastError();
}

cudaError_t ReluForward(const float* x, float* y, int64_t n) {
  if (n <= 0) return cudaSuccess;
  ReluForwardKernel<<<GridFor(n), kThreads>>>(x, y, n);
  return cudaGetLastError();
}

cudaError_t ReluBackward(const float* y, const float* gy, float* gx, int64_t n) {
  if (n <= 0) return cudaSuccess;
  ReluBackwardKernel<<<GridFor(n), kThreads>>>(y, gy, gx, n);
  return cudaGetLastError();
}

cudaError_t Add(const float* a, const float* b, float* out, int64_t n) {
  if (n <= 0) return cudaSuccess;
  AddKernel<<<GridFor(n), kThreads>>>(a, b, out, n);
  return cudaGetLastError();
}

cudaError_t BiasAdd(const float* x, const void* bias, bool bf16, float* out, int64_t rows,
                    int64_t cols) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const auto launch = [&](auto four, const auto* b) {
    BiasAddKernel<decltype(four)::value>
        <<<GridForColumnRows(rows), kThreads>>>(x, b, out, rows, cols);
  };
  const bool four = FourWideRows(cols, {x, out});
  const void* b = bias;
  if (bf16 && four) launch(std::true_type(), static_cast<const uint16_t*>(b));
  if (bf16 && !four) launch(std::false_type(), static_cast<const uint16_t*>(b));
  if (!bf16 && four) launch(std::true_type(), static_cast<const float*>(b));
  if (!bf16 && !four) launch(std::false_type(), static_cast<const float*>(b));
  return cudaGetLastError();
}

namespace {

template <typename X>
cudaError_t LaunchColumnSums(const X* x, const float* y, float* acc, int64_t rows, int64_t cols,
                             float* partial) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const int64_t chunks = k::ColumnSumChunks(rows, cols);
  if (chunks > 1 && partial == nullptr) return cudaErrorInvalidValue;
  const int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
  const dim3 block(32, 8);
  const dim3 grid(static_cast<unsigned int>((cols + 31) / 32), static_cast<unsigned int>(chunks));
  if (chunks == 1) {
    ColumnSumsKernel<<<grid, block>>>(x, y, acc, rows, cols, rows_per_chunk, true);
    return cudaGetLastError();
  }
  ColumnSumsKernel<<<grid, block>>>(x, y, partial, rows, cols, rows_per_chunk, false);
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  ColumnSumsFinishKernel<<<GridFor(cols), kThreads>>>(partial, cols, acc, chunks, cols);
  return cudaGetLastError();
}

}  // namespace

cudaError_t ColumnSums(const float* x, const float* y, float* acc, int64_t rows, int64_t cols,
                       float* partial) {
  return LaunchColumnSums(x, y, acc, rows, cols, partial);
}

cudaError_t ColumnSumsBf16(const uint16_t* x, float* acc, int64_t rows, int64_t cols,
                           float* partial) {
  return LaunchColumnSums(x, static_cast<const float*>(nullptr), acc, rows, cols, partial);
}

cudaError_t GemmEpilogue(const float* acc, int kind, const void* bias, bool bias_bf16, void* aux,
                         void* out, bool out_bf16, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const unsigned int grid = GridFor(rows * cols);
  auto launch = [&](const auto* b) {
    if (out_bf16) {
      GemmEpilogueKernel<<<grid, kThreads>>>(acc, kind, b, static_cast<uint16_t*>(aux),
                                             static_cast<uint16_t*>(out), rows, cols);
    } else {
      GemmEpilogueKernel<<<grid, kThreads>>>(acc, kind, b, static_cast<float*>(aux),
                                             static_cast<float*>(out), rows, cols);
    }
  };
  if (bias_bf16) {
    launch(static_cast<const uint16_t*>(bias));
  } else {
    launch(static_cast<const float*>(bias));
  }
  return cudaGetLastError();
}

namespace {

// Calls launch(n, wide) with the LayerNorm kernels' column grouping (see
// LayerNormBackwardKernel) as std::integral_constant N and std::bool_constant Wide: N = 4
// when cols % 4 == 0, Wide when also `wide_ok` and every row of `ptrs` is 16-byte aligned.
template <typename Launch>
void ByColumnGroups(int64_t cols, bool wide_ok, std::initializer_list<const void*> ptrs,
                    const Launch& launch) {
  if (cols % 4 != 0) {
    launch(std::integral_constant<int, 1>(), std::false_type());
  } else if (wide_ok && FourWideRows(cols, ptrs)) {
    launch(std::integral_constant<int, 4>(), std::true_type());
  } else {
    launch(std::integral_constant<int, 4>(), std::false_type());
  }
}

// launch(std::true_type()) for LayerNorm (the rows' mean kept), launch(std::false_type())
// for RMSNorm (mean null): the kernels' Centered.
template <typename Launch>
void WithCentered(bool centered, const Launch& launch) {
  if (centered) {
    launch(std::true_type());
  } else {
    launch(std::false_type());
  }
}

// LayerNormForwardKernel over the rows (RMSNorm's with mean null, b then unused).
cudaError_t LayerNormForwardLaunch(const float* x, const float* x2, float* sum, const void* w,
                                   const void* b, bool bf16, float eps, void* y, bool y_bf16,
                                   float* mean, float* rstd, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const auto launch = [&](auto n, auto wide, const auto* wp) {
    constexpr int kN = decltype(n)::value;
    constexpr bool kWide = decltype(wide)::value;
    const auto* bp = static_cast<decltype(wp)>(b);
    const auto run = [&](auto cached) {
      constexpr int kCached = decltype(cached)::value;
      WithCentered(mean != nullptr, [&](auto centered) {
        constexpr bool kCentered = decltype(centered)::value;
        if (y_bf16) {
          LayerNormForwardKernel<kN, kWide, kCached, kCentered><<<GridForRows(rows), kThreads>>>(
              x, x2, sum, wp, bp, eps, static_cast<uint16_t*>(y), mean, rstd, rows, cols);
        } else {
          LayerNormForwardKernel<kN, kWide, kCached, kCentered><<<GridForRows(rows), kThreads>>>(
              x, x2, sum, wp, bp, eps, static_cast<float*>(y), mean, rstd, rows, cols);
        }
      });
    };
    if (RowFitsCache(cols, kN)) {
      run(std::integral_constant < int, kN == 4 ? kCachedGroups : 0 > ());
    } else {
      run(std::integral_constant<int, 0>());
    }
  };
  // bf16 rows of cols % 4 == 0 are 16-byte aligned where their start is 16-byte aligned
  // and each row's 2 * cols bytes are a multiple of 16 (cols % 8 == 0).
  const bool y_wide = !y_bf16 || cols % 8 == 0;
  ByColumnGroups(cols, y_wide, {x, x2, sum, y}, [&](auto n, auto wide) {
    if (bf16) {
      launch(n, wide, static_cast<const uint16_t*>(w));
    } else {
      launch(n, wide, static_cast<const float*>(w));
    }
  });
  return cudaGetLastError();
}

// LayerNormBackwardKernel over `grid` blocks of `warps` warps (with Sums: `shared` bytes of
// shared memory); RMSNorm's with mean null (gb then unused).
template <bool Sums>
cudaError_t LayerNormBackwardLaunch(unsigned int grid, int warps, size_t shared, const float* g,
                                    const float* x, const float* mean, const float* rstd,
                                    const void* w, bool bf16, const float* residual, float* gx,
                                    uint16_t* gx16, float* gw, float* gb, float* partial,
                                    int64_t rows, int64_t cols, int64_t rows_per_block) {
  // bf16 rows are 16-byte aligned where their start is and cols % 8 == 0 (as the forward's y).
  const bool wide_ok = gx16 == nullptr || cols % 8 == 0;
  ByColumnGroups(cols, wide_ok, {g, x, residual, gx, gx16}, [&](auto n, auto wide) {
    constexpr int kN = decltype(n)::value;
    constexpr bool kWide = decltype(wide)::value;
    const auto run = [&](auto cached) {
      constexpr int kCached = decltype(cached)::value;
      WithCentered(mean != nullptr, [&](auto centered) {
        constexpr bool kCentered = decltype(centered)::value;
        k::WithStored(w, bf16, [&](const auto* wp) {
          LayerNormBackwardKernel<kN, kWide, Sums, kCached, kCentered>
              <<<grid, warps * 32, shared>>>(g, x, mean, rstd, wp, residual, gx, gx16, gw, gb,
                                             partial, rows, cols, rows_per_block);
        });
      });
    };
    if (RowFitsCache(cols, kN)) {
      run(std::integral_constant < int, kN == 4 ? kCachedGroups : 0 > ());
    } else {
      run(std::integral_constant<int, 0>());
    }
  });
  return cudaGetLastError();
}

cudaError_t LayerNormBackwardInputLaunch(const float* g, const float* x, const float* mean,
                                         const float* rstd, const void* w, bool bf16,
                                         const float* residual, float* gx, uint16_t* gx16,
                                         int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  return LayerNormBackwardLaunch<false>(GridForRows(rows), kWarpsPerBlock, 0, g, x, mean, rstd, w,
                                        bf16, residual, gx, gx16, nullptr, nullptr, nullptr, rows,
                                        cols, kWarpsPerBlock);
}

// xhat = kernels::LayerNormHat(x, mean[row], rstd[row]) (with mean null, RMSNorm's
// kernels::RmsNormHat(x, rstd[row])), one thread per element.
__global__ void LayerNormHatKernel(const float* x, const float* mean, const float* rstd,
                                   float* xhat, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / cols;
    xhat[i] = mean != nullptr ? k::LayerNormHat(x[i], mean[row], rstd[row])
                              : k::RmsNormHat(x[i], rstd[row]);
  }
}

}  // namespace

cudaError_t LayerNormForward(const float* x, const void* w, const void* b, bool bf16, float eps,
                             void* y, float* mean, float* rstd, int64_t rows, int64_t cols,
                             bool y_bf16) {
  if (mean == nullptr) return cudaErrorInvalidValue;  // a null mean is RmsNormForward's
  return LayerNormForwardLaunch(x, nullptr, nullptr, w, b, bf16, eps, y, y_bf16, mean, rstd, rows,
                                cols);
}

cudaError_t AddLayerNormForward(const float* a, const float* b, float* sum, const void* w,
                                const void* bias, bool bf16, float eps, void* y, float* mean,
                                float* rstd, int64_t rows, int64_t cols, bool y_bf16) {
  if (mean == nullptr) return cudaErrorInvalidValue;
  return LayerNormForwardLaunch(a, b, sum, w, bias, bf16, eps, y, y_bf16, mean, rstd, rows, cols);
}

cudaError_t LayerNormBackwardInput(const float* g, const float* x, const float* mean,
                                   const float* rstd, const void* w, bool bf16, float* gx,
                                   int64_t rows, int64_t cols) {
  return LayerNormBackwardInputLaunch(g, x, mean, rstd, w, bf16, nullptr, gx, nullptr, rows, cols);
}

cudaError_t LayerNormBackwardInputAdd(const float* g, const float* x, const float* mean,
                                      const float* rstd, const void* w, bool bf16,
                                      const float* residual, float* gx, int64_t rows, int64_t cols,
                                      uint16_t* gx16) {
  return LayerNormBackwardInputLaunch(g, x, mean, rstd, w, bf16, residual, gx, gx16, rows, cols);
}

cudaError_t LayerNormHat(const float* x, const float* mean, const float* rstd, float* xhat,
                         int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  LayerNormHatKernel<<<GridFor(rows * cols), kThreads>>>(x, mean, rstd, xhat, rows, cols);
  return cudaGetLastError();
}

cudaError_t LayerNormBackward(const float* g, const float* x, const float* mean, const float* rstd,
                              const void* w, bool bf16, const float* residual, float* gx, float* gw,
                              float* gb, int64_t rows, int64_t cols, float* partial,
                              uint16_t* gx16) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  if (mean == nullptr && gb != nullptr) return cudaErrorInvalidValue;  // RMSNorm: no bias
  const int stats = k::NormGradStats(mean != nullptr);
  const int warps = k::LayerNormGradWarps(cols, stats);
  const int64_t chunks = k::LayerNormGradChunks(rows, cols, stats);
  if (warps == 0 || (chunks > 1 && partial == nullptr)) return cudaErrorInvalidValue;
  const int64_t rows_per_block = (rows + chunks - 1) / chunks;
  const size_t shared = static_cast<size_t>(warps) * stats * cols * sizeof(float);
  cudaError_t err = LayerNormBackwardLaunch<true>(
      static_cast<unsigned int>(chunks), warps, shared, g, x, mean, rstd, w, bf16, residual, gx,
      gx16, gw, gb, chunks > 1 ? partial : nullptr, rows, cols, rows_per_block);
  if (chunks == 1 || err != cudaSuccess) return err;
  if (gw != nullptr) {
    ColumnSumsFinishKernel<<<GridFor(cols), kThreads>>>(partial, stats * cols, gw, chunks, cols);
  }
  if (gb != nullptr) {
    ColumnSumsFinishKernel<<<GridFor(cols), kThreads>>>(partial + cols, stats * cols, gb, chunks,
                                                        cols);
  }
  return cudaGetLastError();
}

cudaError_t RmsNormForward(const float* x, const void* w, bool bf16, float eps, void* y,
                           float* rstd, int64_t rows, int64_t cols, bool y_bf16) {
  return LayerNormForwardLaunch(x, nullptr, nullptr, w, nullptr, bf16, eps, y, y_bf16, nullptr,
                                rstd, rows, cols);
}

cudaError_t CausalSoftmaxForward(float* scores, int64_t rows, int64_t T, uint16_t* probs16) {
  if (rows <= 0 || T <= 0) return cudaSuccess;
  CausalSoftmaxForwardKernel<<<GridForRows(rows), kThreads>>>(scores, probs16, rows, T);
  return cudaGetLastError();
}

cudaError_t CausalSoftmaxBackward(const void* p, bool p_bf16, float* g, int64_t rows, int64_t T,
                                  float scale, uint16_t* out16) {
  if (rows <= 0 || T <= 0) return cudaSuccess;
  if (p_bf16) {
    CausalSoftmaxBackwardKernel<<<GridForRows(rows), kThreads>>>(static_cast<const uint16_t*>(p), g,
                                                                 out16, rows, T, scale);
  } else {
    CausalSoftmaxBackwardKernel<<<GridForRows(rows), kThreads>>>(static_cast<const float*>(p), g,
                                                                 out16, rows, T, scale);
  }
  return cudaGetLastError();
}

cudaError_t EmbeddingForward(const int32_t* ids, int64_t n_ids, const void* table, bool bf16,
                             int64_t num, int64_t dim, float* y) {
  if (n_ids <= 0 || dim <= 0) return cudaSuccess;
  const unsigned blocks = GridForColumnRows(n_ids);
  if (bf16) {
    EmbeddingForwardKernel<<<blocks, kThreads>>>(ids, n_ids, static_cast<const uint16_t*>(table),
                                                 num, dim, y);
  } else {
    EmbeddingForwardKernel<<<blocks, kThreads>>>(ids, n_ids, static_cast<const float*>(table), num,
                                                 dim, y);
  }
  return cudaGetLastError();
}

cudaError_t Fingerprint(const void* p, int64_t bytes, unsigned long long* out) {
  if (bytes < 0 || bytes % 2 != 0 || reinterpret_cast<uintptr_t>(p) % 2 != 0) {
    return cudaErrorInvalidValue;
  }
  cudaError_t err = cudaMemsetAsync(out, 0, 2 * sizeof(unsigned long long), /*stream=*/0);
  if (err != cudaSuccess || bytes == 0) return err;
  const int64_t n = bytes / 2;
  FingerprintKernel<<<GridFor(n), kThreads>>>(static_cast<const uint16_t*>(p), n, out);
  return cudaGetLastError();
}

cudaError_t EmbeddingBackwardScratchBytes(int64_t n_ids, size_t* bytes) {
  *bytes = 0;
  if (n_ids <= 0) return cudaSuccess;
  if (n_ids > 0x7fffffff) return cudaErrorInvalidValue;
  EmbeddingScratch l;
  const cudaError_t err = EmbeddingScratchLayout(static_cast<int>(n_ids), &l);
  if (err == cudaSuccess) *bytes = l.total;
  return err;
}

cudaError_t EmbeddingBackward(const int32_t* ids, int64_t n_ids, const float* g, int64_t num,
                              int64_t dim, float* gw, void* scratch, size_t scratch_bytes) {
  if (n_ids <= 0 || dim <= 0) return cudaSuccess;
  if (n_ids > 0x7fffffff) return cudaErrorInvalidValue;
  const int n = static_cast<int>(n_ids);
  EmbeddingScratch l;
  cudaError_t err = EmbeddingScratchLayout(n, &l);
  if (err != cudaSuccess) return err;
  if (scratch == nullptr || scratch_bytes < l.total) return cudaErrorInvalidValue;
  char* base = static_cast<char*>(scratch);
  auto* sorted = reinterpret_cast<int32_t*>(base + l.ids);
  auto* positions = reinterpret_cast<int32_t*>(base + l.positions);
  auto* sorted_positions = reinterpret_cast<int32_t*>(base + l.sorted_positions);
  IotaKernel<<<GridFor(n), kThreads>>>(positions, n);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  size_t temp_bytes = l.temp_bytes;
  // All 32 bits: ids outside [0, num) must not split a valid id's run.
  err = cub::DeviceRadixSort::SortPairs(base + l.temp, temp_bytes, ids, sorted, positions,
                                        sorted_positions, n, 0, 32, /*stream=*/0);
  if (err != cudaSuccess) return err;
  constexpr int kRunThreads = 128;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(n, kMaxBlocks));
  EmbeddingRunsKernel<<<blocks, kRunThreads>>>(sorted, sorted_positions, n, g, num, dim, gw);
  return cudaGetLastError();
}

namespace {

template <typename X>
cudaError_t CrossEntropyLaunch(const X* logits, const int32_t* targets, int64_t rows, int64_t V,
                               double inv_n, float* grad, double* row_loss, uint16_t* grad16) {
  if (rows <= 0 || V <= 0) return cudaSuccess;
  if (rows > 0x7fffffff) return cudaErrorInvalidValue;
  // The staged kernel where a row gives each of its threads at least one four-wide load
  // and fits in a block's shared memory. Shorter rows stay in cache between their reads
  // (a few hundred in flight, a few MB); longer ones are read twice from device memory.
  const bool four = FourLogitsALoad(
      logits, V, grad16 != nullptr ? static_cast<void*>(grad16) : static_cast<void*>(grad));
  int device = 0, shared_optin = 0, sms = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  if (cudaError_t err =
          cudaDeviceGetAttribute(&shared_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
      err != cudaSuccess) {
    return err;
  }
  if (cudaError_t err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
      err != cudaSuccess) {
    return err;
  }
  // The most dynamic shared memory a block of the staged kernel may take: the opt-in limit
  // less the kernel's static scratch.
  cudaFuncAttributes attributes;
  if (cudaError_t err = cudaFuncGetAttributes(&attributes, CrossEntropyStagedKernel<X>);
      err != cudaSuccess) {
    return err;
  }
  const int64_t most = shared_optin - static_cast<int64_t>(attributes.sharedSizeBytes);
  const int64_t bytes = V * static_cast<int64_t>(sizeof(X));
  if (four && V / 4 >= 512 && bytes <= most) {
    // The cap is that most, the same on every call: a cap of this call's row would let
    // calls with other V on other host threads lower it under each other's launches.
    if (cudaError_t err = AllowSharedMemory(CrossEntropyStagedKernel<X>, static_cast<int>(most));
        err != cudaSuccess) {
      return err;
    }
    const auto blocks_an_sm = [&](int threads, int* per_sm) {
      return cudaOccupancyMaxActiveBlocksPerMultiprocessor(per_sm, CrossEntropyStagedKernel<X>,
                                                           threads, static_cast<size_t>(bytes));
    };
    // 1024 threads a block, or 512 where that lets two blocks share an SM and 1024 does
    // not (a bf16 row of GPT-2's 50304 logits: 2 x 98 KB of shared memory; the registers of
    // two 1024-thread blocks do not fit). Each thread takes at least one four-wide load of
    // a row: V >= 4 x threads, else the unstaged kernel.
    int threads = 1024, per_sm = 0, per_sm_half = 0;
    if (cudaError_t err = blocks_an_sm(1024, &per_sm); err != cudaSuccess) return err;
    if (cudaError_t err = blocks_an_sm(512, &per_sm_half); err != cudaSuccess) return err;
    if (per_sm < 2 && per_sm_half >= 2) {
      threads = 512;
      per_sm = per_sm_half;
    }
    if (V / 4 >= threads) {
      const int64_t blocks =
          std::min<int64_t>(rows, static_cast<int64_t>(sms) * std::max(per_sm, 1));
      CrossEntropyStagedKernel<X><<<static_cast<unsigned int>(blocks), threads, bytes>>>(
          logits, targets, rows, V, inv_n, grad, row_loss, grad16);
      return cudaGetLastError();
    }
  }
  CrossEntropyKernel<X><<<static_cast<unsigned int>(rows), 512>>>(logits, targets, rows, V, inv_n,
                                                                  grad, row_loss, grad16);
  return cudaGetLastError();
}

}  // namespace

cudaError_t CrossEntropy(const float* logits, const int32_t* targets, int64_t rows, int64_t V,
                         double inv_n, float* grad, double* row_loss, uint16_t* grad16) {
  return CrossEntropyLaunch(logits, targets, rows, V, inv_n, grad, row_loss, grad16);
}
cudaError_t CrossEntropy(const uint16_t* logits, const int32_t* targets, int64_t rows, int64_t V,
                         double inv_n, float* grad, double* row_loss, uint16_t* grad16) {
  return CrossEntropyLaunch(logits, targets, rows, V, inv_n, grad, row_loss, grad16);
}

cudaError_t ScaleMatrices(float* c, int64_t batch, int64_t rows, int64_t cols, int64_t ld,
                          int64_t stride, float beta) {
  if (batch <= 0 || rows <= 0 || cols <= 0) return cudaSuccess;
  ScaleMatricesKernel<<<GridFor(batch * rows * cols), kThreads>>>(c, batch, rows, cols, ld, stride,
                                                                  beta);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace kernels
