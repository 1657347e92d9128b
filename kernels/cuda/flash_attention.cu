// Fused causal attention kernels (kernels/cuda/flash_attention.h).
//
// One block of 4 warps per (64-row tile, batch element x head). Each warp owns 16 rows of
// the block's tile: it runs the WMMA products for those rows, and its 32 lanes do the
// row-wise softmax work two lanes per row (lane / 2 = the row, lane % 2 = which half of
// the 64 columns), so row statistics need one shuffle and no block barrier. Tiles shared
// by the warps (the K/V tiles of the forward and dQ kernels, the Q/dO tiles of the dK/dV
// kernel) are loaded by the whole block between __syncthreads().
//
// Shared-memory rows are padded (bf16 by 8 elements, fp32 by 4) against bank conflicts;
// every WMMA pointer stays 32-byte aligned. Rows past T are zero-filled on load, masked
// out of every sum, and never stored.
#include "kernels/cuda/flash_attention.h"

#include <cuda_bf16.h>
#include <mma.h>

#include <cmath>

namespace kernels {
namespace cuda {
namespace {

namespace wmma = nvcuda::wmma;
using bf16 = __nv_bfloat16;

constexpr int kTile = static_cast<int>(kFlashTile);  // rows (queries or keys) per tile
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kLdP = kTile + 8;  // bf16 [64 x 64] tiles (probabilities, score gradients)
constexpr int kLdS = kTile + 4;  // fp32 [64 x 64] tiles (scores, their gradients)
constexpr float kLog2e = 1.4426950408889634f;

template <int D>
struct Dims {
  static constexpr int kLdH = D + 8;  // bf16 [64 x D] tiles (q, k, v, dO)
  static constexpr int kLdO = D + 4;  // fp32 [64 x D] tiles (output accumulator, staging)
  static constexpr int kHalf = D / 2;
  static constexpr int kHeadBytes = kTile * kLdH * 2;
  static constexpr int kPBytes = kTile * kLdP * 2;
  static constexpr int kSBytes = kTile * kLdS * 4;
  static constexpr int kOBytes = kTile * kLdO * 4;
  // Forward: Q, K, V, P, S, O.
  static constexpr int kForwardBytes = 3 * kHeadBytes + kPBytes + kSBytes + kOBytes;
  // Backward (either kernel): four head tiles, two bf16 64x64 tiles, two fp32 64x64 tiles
  // (the second doubles as staging for the D-wide results), two rows of statistics.
  static constexpr int kBackwardBytes = 4 * kHeadBytes + 2 * kPBytes + 2 * kSBytes + 2 * kTile * 4;
  static_assert(2 * kSBytes >= kOBytes, "staging must fit in the two fp32 score tiles");
};

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Rows [r0, r0 + 64) of a [T, *] head slice (row stride `ld` elements, D columns from
// `src`) into `dst` [64 x D] with row stride Dims<D>::kLdH; rows past T are zeros.
// 16-byte loads; called by the whole block.
template <int D>
__device__ void LoadTile(bf16* dst, const bf16* src, int64_t ld, int r0, int T) {
  constexpr int kChunks = D / 8;  // 8 bf16 per 16 bytes
  for (int i = threadIdx.x; i < kTile * kChunks; i += kThreads) {
    const int r = i / kChunks, c = (i % kChunks) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r0 + r < T) v = *reinterpret_cast<const uint4*>(src + (r0 + r) * ld + c);
    *reinterpret_cast<uint4*>(dst + r * Dims<D>::kLdH + c) = v;
  }
}

// Rows [r0, r0 + 64) of a [T] statistic into dst[64] (zeros past T); whole block.
__device__ void LoadRowStats(float* dst, const float* src, int r0, int T) {
  for (int i = threadIdx.x; i < kTile; i += kThreads) dst[i] = r0 + i < T ? src[r0 + i] : 0.0f;
}

// out[16 x 64] (fp32, row stride kLdS) = A[16 x D] B^T where B is [64 x D]: both row-major
// with stride ld_a / ld_b (A's rows are this warp's, B's rows the 64 columns of out).
template <int D>
__device__ void ProductABt(float* out, const bf16* a, int ld_a, const bf16* b, int ld_b) {
#pragma unroll
  for (int n = 0; n < kTile / 16; ++n) {
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int k = 0; k < D / 16; ++k) {
      FragA fa;
      FragBCol fb;
      wmma::load_matrix_sync(fa, a + k * 16, ld_a);
      wmma::load_matrix_sync(fb, b + n * 16 * ld_b + k * 16, ld_b);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + n * 16, acc, kLdS, wmma::mem_row_major);
  }
}

// acc[n] += A[16 x 64] B[64 x D] for the D/16 column blocks n: A bf16 row-major (stride
// kLdP), B bf16 row-major (stride Dims<D>::kLdH).
template <int D>
__device__ void AccumulateAB(FragC (&acc)[D / 16], const bf16* a, const bf16* b) {
#pragma unroll
  for (int k = 0; k < kTile / 16; ++k) {
    FragA fa;
    wmma::load_matrix_sync(fa, a + k * 16, kLdP);
#pragma unroll
    for (int n = 0; n < D / 16; ++n) {
      FragBRow fb;
      wmma::load_matrix_sync(fb, b + k * 16 * Dims<D>::kLdH + n * 16, Dims<D>::kLdH);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

// Stores this warp's 16 x D accumulators through `stage` (fp32 [64 x D] with stride
// Dims<D>::kLdO, this warp's rows) into global rows row0 + warp*16 .. of `dst` (row
// stride ld, D columns), skipping rows at or past T. Warp-level.
template <int D>
__device__ void StoreRows(FragC (&acc)[D / 16], float* stage, float* dst, int64_t ld, int row0,
                          int T) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* mine = stage + warp * 16 * Dims<D>::kLdO;
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
    wmma::store_matrix_sync(mine + n * 16, acc[n], Dims<D>::kLdO, wmma::mem_row_major);
  }
  __syncwarp();
  for (int i = lane; i < 16 * D; i += 32) {
    const int r = i / D, c = i % D;
    const int t = row0 + warp * 16 + r;
    if (t < T) dst[t * ld + c] = mine[r * Dims<D>::kLdO + c];
  }
}

// Forward: grid (tiles, B*H), the longest query tiles first.
template <int D>
__global__ void __launch_bounds__(kThreads) FlashForwardKernel(const bf16* __restrict__ qkv,
                                                               float* __restrict__ y,
                                                               float* __restrict__ lse, int T,
                                                               int H, float scale_log2) {
  extern __shared__ __align__(128) unsigned char smem[];
  using Dm = Dims<D>;
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  bf16* sK = sQ + kTile * Dm::kLdH;
  bf16* sV = sK + kTile * Dm::kLdH;
  bf16* sP = sV + kTile * Dm::kLdH;
  float* sS = reinterpret_cast<float*>(sP + kTile * kLdP);
  float* sO = sS + kTile * kLdS;

  const int tiles = (T + kTile - 1) / kTile;
  const int qt = tiles - 1 - static_cast<int>(blockIdx.x);
  const int bh = blockIdx.y, b = bh / H, h = bh % H;
  const int64_t C = static_cast<int64_t>(H) * D, ld3 = 3 * C;
  const bf16* base = qkv + static_cast<int64_t>(b) * T * ld3 + static_cast<int64_t>(h) * D;
  const int q0 = qt * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = warp * 16 + lane / 2, half = lane % 2;
  const int tq = q0 + row;

  LoadTile<D>(sQ, base, ld3, q0, T);
  for (int i = threadIdx.x; i < kTile * Dm::kLdO; i += kThreads) sO[i] = 0.0f;
  float m = -INFINITY, l = 0.0f;  // this row's running max (log2 units) and sum
  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();  // every warp is done with the previous K and V
    LoadTile<D>(sK, base + C, ld3, k0, T);
    LoadTile<D>(sV, base + 2 * C, ld3, k0, T);
    __syncthreads();
    ProductABt<D>(sS + warp * 16 * kLdS, sQ + warp * 16 * Dm::kLdH, Dm::kLdH, sK, Dm::kLdH);
    __syncwarp();
    // Online softmax over this lane's 32 keys of its row.
    const float* srow = sS + row * kLdS + half * 32;
    float s[32];
    float mx = -INFINITY;
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      const int tk = k0 + half * 32 + c;
      s[c] = (tk > tq || tk >= T) ? -INFINITY : srow[c] * scale_log2;
      mx = fmaxf(mx, s[c]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    // Key 0 is in every row's first tile, so m_new is finite from the first tile on.
    const float m_new = fmaxf(m, mx);
    const float alpha = exp2f(m - m_new);
    float sum = 0.0f;
    bf16* prow = sP + row * kLdP + half * 32;
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      const float p = exp2f(s[c] - m_new);
      sum += p;
      prow[c] = __float2bfloat16_rn(p);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * alpha + sum;
    m = m_new;
    float* orow = sO + row * Dm::kLdO + half * Dm::kHalf;
#pragma unroll 8
    for (int c = 0; c < Dm::kHalf; ++c) orow[c] *= alpha;
    __syncwarp();
    // O (this warp's rows) += P V.
    FragC acc[D / 16];
#pragma unroll
    for (int n = 0; n < D / 16; ++n) {
      wmma::load_matrix_sync(acc[n], sO + warp * 16 * Dm::kLdO + n * 16, Dm::kLdO,
                             wmma::mem_row_major);
    }
    AccumulateAB<D>(acc, sP + warp * 16 * kLdP, sV);
#pragma unroll
    for (int n = 0; n < D / 16; ++n) {
      wmma::store_matrix_sync(sO + warp * 16 * Dm::kLdO + n * 16, acc[n], Dm::kLdO,
                              wmma::mem_row_major);
    }
    __syncwarp();
  }
  if (tq < T) {
    const float inv = 1.0f / l;
    const float* orow = sO + row * Dm::kLdO + half * Dm::kHalf;
    float* dst = y + (static_cast<int64_t>(b) * T + tq) * C + static_cast<int64_t>(h) * D +
                 half * Dm::kHalf;
#pragma unroll 8
    for (int c = 0; c < Dm::kHalf; ++c) dst[c] = orow[c] * inv;
    if (half == 0) lse[static_cast<int64_t>(bh) * T + tq] = m + log2f(l);
  }
}

// delta[b, h, t] = <gy[b, t, h], y[b, t, h]>: one warp per (b, t, h) row.
__global__ void FlashDeltaKernel(const bf16* __restrict__ gy, const float* __restrict__ y,
                                 float* __restrict__ delta, int64_t rows, int T, int H, int D) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (r >= rows) return;
  const int lane = threadIdx.x % 32;
  const int64_t bt = r / H;
  const int h = static_cast<int>(r % H);
  const int64_t off = bt * H * D + static_cast<int64_t>(h) * D;
  float acc = 0.0f;
  for (int d = lane; d < D; d += 32) acc += __bfloat162float(gy[off + d]) * y[off + d];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) {
    const int64_t b = bt / T, t = bt % T;
    delta[(b * H + h) * T + t] = acc;
  }
}

// The score scale and the same times log2(e): p = 2^(s * scale_log2 - lse) and the score
// gradient ds = scale * p * (dp - delta), zero where masked.
struct ScoreGrad {
  float scale, scale_log2;
};

// dK and dV: grid (tiles, B*H); block kt owns key tile kt and walks query tiles kt.. end.
template <int D>
__global__ void __launch_bounds__(kThreads) FlashBackwardKVKernel(
    const bf16* __restrict__ qkv, const bf16* __restrict__ gy, const float* __restrict__ lse,
    const float* __restrict__ delta, float* __restrict__ gqkv, int T, int H, ScoreGrad sg) {
  extern __shared__ __align__(128) unsigned char smem[];
  using Dm = Dims<D>;
  bf16* sK = reinterpret_cast<bf16*>(smem);
  bf16* sV = sK + kTile * Dm::kLdH;
  bf16* sQ = sV + kTile * Dm::kLdH;
  bf16* sG = sQ + kTile * Dm::kLdH;  // dO
  bf16* sPt = sG + kTile * Dm::kLdH;
  bf16* sDt = sPt + kTile * kLdP;
  float* sS = reinterpret_cast<float*>(sDt + kTile * kLdP);  // S^T, then staging
  float* sDP = sS + kTile * kLdS;                             // dP^T
  float* sL = sDP + kTile * kLdS;
  float* sDelta = sL + kTile;

  const int tiles = (T + kTile - 1) / kTile;
  const int kt = blockIdx.x;  // the most query tiles first
  const int bh = blockIdx.y, b = bh / H, h = bh % H;
  const int64_t C = static_cast<int64_t>(H) * D, ld3 = 3 * C;
  const bf16* base = qkv + static_cast<int64_t>(b) * T * ld3 + static_cast<int64_t>(h) * D;
  const bf16* gbase = gy + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * D;
  const int k0 = kt * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = warp * 16 + lane / 2, half = lane % 2;  // row: a key of the tile
  const int tk = k0 + row;

  LoadTile<D>(sK, base + C, ld3, k0, T);
  LoadTile<D>(sV, base + 2 * C, ld3, k0, T);
  FragC dk[D / 16], dv[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
    wmma::fill_fragment(dk[n], 0.0f);
    wmma::fill_fragment(dv[n], 0.0f);
  }
  for (int qt = kt; qt < tiles; ++qt) {
    const int q0 = qt * kTile;
    __syncthreads();  // every warp is done with the previous Q, dO and statistics
    LoadTile<D>(sQ, base, ld3, q0, T);
    LoadTile<D>(sG, gbase, C, q0, T);
    LoadRowStats(sL, lse + static_cast<int64_t>(bh) * T, q0, T);
    LoadRowStats(sDelta, delta + static_cast<int64_t>(bh) * T, q0, T);
    __syncthreads();
    // S^T = K Q^T and dP^T = V dO^T for this warp's 16 keys.
    ProductABt<D>(sS + warp * 16 * kLdS, sK + warp * 16 * Dm::kLdH, Dm::kLdH, sQ, Dm::kLdH);
    ProductABt<D>(sDP + warp * 16 * kLdS, sV + warp * 16 * Dm::kLdH, Dm::kLdH, sG, Dm::kLdH);
    __syncwarp();
#pragma unroll 8
    for (int c = 0; c < 32; ++c) {
      const int j = half * 32 + c, tq = q0 + j;
      const bool live = tq >= tk && tq < T && tk < T;
      const float p = live ? exp2f(sS[row * kLdS + j] * sg.scale_log2 - sL[j]) : 0.0f;
      const float ds = p * (sDP[row * kLdS + j] - sDelta[j]) * sg.scale;
      sPt[row * kLdP + j] = __float2bfloat16_rn(p);
      sDt[row * kLdP + j] = __float2bfloat16_rn(ds);
    }
    __syncwarp();
    AccumulateAB<D>(dv, sPt + warp * 16 * kLdP, sG);  // dV += P^T dO
    AccumulateAB<D>(dk, sDt + warp * 16 * kLdP, sQ);  // dK += dS^T Q
  }
  __syncthreads();  // the score tiles become staging
  float* g = gqkv + static_cast<int64_t>(b) * T * ld3 + static_cast<int64_t>(h) * D;
  StoreRows<D>(dk, sS, g + C, ld3, k0, T);
  __syncwarp();
  StoreRows<D>(dv, sS, g + 2 * C, ld3, k0, T);
}

// dQ: grid (tiles, B*H), the longest query tiles first; block qt walks key tiles 0..qt.
template <int D>
__global__ void __launch_bounds__(kThreads) FlashBackwardQKernel(
    const bf16* __restrict__ qkv, const bf16* __restrict__ gy, const float* __restrict__ lse,
    const float* __restrict__ delta, float* __restrict__ gqkv, int T, int H, ScoreGrad sg) {
  extern __shared__ __align__(128) unsigned char smem[];
  using Dm = Dims<D>;
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  bf16* sG = sQ + kTile * Dm::kLdH;
  bf16* sK = sG + kTile * Dm::kLdH;
  bf16* sV = sK + kTile * Dm::kLdH;
  bf16* sD = sV + kTile * Dm::kLdH;  // dS (the second bf16 tile is unused here)
  float* sS = reinterpret_cast<float*>(sD + 2 * kTile * kLdP);
  float* sDP = sS + kTile * kLdS;
  float* sL = sDP + kTile * kLdS;
  float* sDelta = sL + kTile;

  const int tiles = (T + kTile - 1) / kTile;
  const int qt = tiles - 1 - static_cast<int>(blockIdx.x);
  const int bh = blockIdx.y, b = bh / H, h = bh % H;
  const int64_t C = static_cast<int64_t>(H) * D, ld3 = 3 * C;
  const bf16* base = qkv + static_cast<int64_t>(b) * T * ld3 + static_cast<int64_t>(h) * D;
  const bf16* gbase = gy + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * D;
  const int q0 = qt * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = warp * 16 + lane / 2, half = lane % 2;  // row: a query of the tile
  const int tq = q0 + row;

  LoadTile<D>(sQ, base, ld3, q0, T);
  LoadTile<D>(sG, gbase, C, q0, T);
  LoadRowStats(sL, lse + static_cast<int64_t>(bh) * T, q0, T);
  LoadRowStats(sDelta, delta + static_cast<int64_t>(bh) * T, q0, T);
  FragC dq[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) wmma::fill_fragment(dq[n], 0.0f);
  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();  // every warp is done with the previous K and V
    LoadTile<D>(sK, base + C, ld3, k0, T);
    LoadTile<D>(sV, base + 2 * C, ld3, k0, T);
    __syncthreads();
    ProductABt<D>(sS + warp * 16 * kLdS, sQ + warp * 16 * Dm::kLdH, Dm::kLdH, sK, Dm::kLdH);
    ProductABt<D>(sDP + warp * 16 * kLdS, sG + warp * 16 * Dm::kLdH, Dm::kLdH, sV, Dm::kLdH);
    __syncwarp();
    const float lq = sL[row], dq_delta = sDelta[row];
#pragma unroll 8
    for (int c = 0; c < 32; ++c) {
      const int j = half * 32 + c, tk = k0 + j;
      const bool live = tk <= tq && tk < T && tq < T;
      const float p = live ? exp2f(sS[row * kLdS + j] * sg.scale_log2 - lq) : 0.0f;
      sD[row * kLdP + j] = __float2bfloat16_rn(p * (sDP[row * kLdS + j] - dq_delta) * sg.scale);
    }
    __syncwarp();
    AccumulateAB<D>(dq, sD + warp * 16 * kLdP, sK);  // dQ += dS K
  }
  __syncthreads();  // the score tiles become staging
  float* g = gqkv + static_cast<int64_t>(b) * T * ld3 + static_cast<int64_t>(h) * D;
  StoreRows<D>(dq, sS, g, ld3, q0, T);
}

// Raises a kernel's dynamic shared-memory limit to `bytes` (needed past 48 KB).
template <typename Kernel>
cudaError_t AllowSharedMemory(Kernel kernel, int bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

bool LaunchFits(int64_t B, int64_t T, int64_t H) {
  return B > 0 && T > 0 && H > 0 && T <= (int64_t{1} << 30) && B * H <= 65535 &&
         (T + kTile - 1) / kTile <= (int64_t{1} << 30);
}

template <int D>
cudaError_t Forward(const uint16_t* qkv, float* y, float* lse, int64_t B, int64_t T, int64_t H,
                    float scale) {
  const int bytes = Dims<D>::kForwardBytes;
  cudaError_t err = AllowSharedMemory(FlashForwardKernel<D>, bytes);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>((T + kTile - 1) / kTile), static_cast<unsigned>(B * H));
  FlashForwardKernel<D><<<grid, kThreads, bytes>>>(reinterpret_cast<const bf16*>(qkv), y, lse,
                                                   static_cast<int>(T), static_cast<int>(H),
                                                   scale * kLog2e);
  return cudaGetLastError();
}

template <int D>
cudaError_t Backward(const uint16_t* qkv16, const float* y, const uint16_t* gy16,
                     const float* lse, float* delta, float* gqkv, int64_t B, int64_t T,
                     int64_t H, float scale) {
  const bf16* qkv = reinterpret_cast<const bf16*>(qkv16);
  const bf16* gy = reinterpret_cast<const bf16*>(gy16);
  const int64_t rows = B * T * H;
  constexpr int kRowsPerBlock = 8;
  FlashDeltaKernel<<<static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock),
                     32 * kRowsPerBlock>>>(gy, y, delta, rows, static_cast<int>(T),
                                           static_cast<int>(H), D);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const int bytes = Dims<D>::kBackwardBytes;
  if ((err = AllowSharedMemory(FlashBackwardKVKernel<D>, bytes)) != cudaSuccess) return err;
  if ((err = AllowSharedMemory(FlashBackwardQKernel<D>, bytes)) != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>((T + kTile - 1) / kTile), static_cast<unsigned>(B * H));
  const ScoreGrad sg{scale, scale * kLog2e};
  FlashBackwardKVKernel<D><<<grid, kThreads, bytes>>>(qkv, gy, lse, delta, gqkv,
                                                      static_cast<int>(T), static_cast<int>(H), sg);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  FlashBackwardQKernel<D><<<grid, kThreads, bytes>>>(qkv, gy, lse, delta, gqkv,
                                                     static_cast<int>(T), static_cast<int>(H), sg);
  return cudaGetLastError();
}

}  // namespace

bool FlashAttentionSupports(int64_t head_dim) { return head_dim == 64 || head_dim == 128; }

cudaError_t FlashAttentionForward(const uint16_t* qkv, float* y, float* lse, int64_t B,
                                  int64_t T, int64_t H, int64_t head_dim, float scale) {
  if (!LaunchFits(B, T, H)) return cudaErrorInvalidValue;
  if (head_dim == 64) return Forward<64>(qkv, y, lse, B, T, H, scale);
  if (head_dim == 128) return Forward<128>(qkv, y, lse, B, T, H, scale);
  return cudaErrorInvalidValue;
}

cudaError_t FlashAttentionBackward(const uint16_t* qkv, const float* y, const uint16_t* gy,
                                   const float* lse, float* delta, float* gqkv, int64_t B,
                                   int64_t T, int64_t H, int64_t head_dim, float scale) {
  if (!LaunchFits(B, T, H)) return cudaErrorInvalidValue;
  if (head_dim == 64) return Backward<64>(qkv, y, gy, lse, delta, gqkv, B, T, H, scale);
  if (head_dim == 128) return Backward<128>(qkv, y, gy, lse, delta, gqkv, B, T, H, scale);
  return cudaErrorInvalidValue;
}

}  // namespace cuda
}  // namespace kernels
