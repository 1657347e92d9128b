// Fused causal attention kernels (kernels/cuda/flash_attention.h).
//
// One block of 4 warps per (64-row tile, batch element x head); each warp owns 16 rows of
// the block's tile and keeps everything about them in registers, as FlashAttention-2
// does: the products are mma.sync m16n8k16 (bf16 x bf16 -> fp32) whose accumulator
// layout is fixed by PTX, so the softmax runs on the accumulators where they are, and a
// score tile's accumulators become the A operand of the next product after rounding to
// bf16. Only the tiles every warp reads (K and V in the forward and dQ kernels, Q and dO in
// the dK/dV kernel) go through shared memory: the whole block copies them with cp.async
// into two buffers, the next tile's copy in flight while the warps compute on the current
// one; the warps take their fragments from them with ldmatrix (four 8 x 8 matrices an
// instruction, transposed for a B operand stored row by row of k). Rows are padded by 8
// bf16, so the eight 16-byte rows an ldmatrix phase reads fall in distinct banks. Rows
// past T are zero-filled on load, masked out of every sum, and never stored; the forward
// evaluates its mask only on the diagonal tile, the one tile of a row with masked keys.
// (The backward kernels mask every tile: a branch there costs the dK/dV kernel spills at
// its 168-register cap.)
//
// m16n8k16 fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16"), with g = lane / 4 and
// c = lane % 4: A (16 x 16, row-major) a0 = (g, 2c..2c+1), a1 = (g+8, 2c..), a2 = (g,
// 2c+8..), a3 = (g+8, 2c+8..); B (16 x 8) b0 = (rows 2c, 2c+1; column g), b1 = (rows 2c+8,
// 2c+9; column g); C (16 x 8, fp32) c0, c1 = (g, 2c), (g, 2c+1), c2, c3 = (g+8, 2c),
// (g+8, 2c+1). Two adjacent bf16 of a register: the lower column (or row) in the low half.

#include "kernels/cuda/flash_attention.h"

#include <cuda_bf16.h>

#include <cmath>

#include "kernels/cuda/launch.cuh"

namespace kernels {
namespace cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kTile = static_cast<int>(kFlashTile);  // rows (queries or keys) per tile
constexpr int kWarps = kTile / 16;                    // one warp per 16 rows
constexpr int kThreads = 32 * kWarps;
constexpr int kN8 = kTile / 8;  // n8 accumulator tiles across a 64-wide score tile
constexpr float kLog2e = 1.4426950408889634f;

template <int D>
struct Dims {
  static constexpr int kLd = D + 8;  // shared-memory row stride of a [64 x D] bf16 tile
  static constexpr int kTileBytes = kTile * kLd * 2;
  // Forward: Q and two (K, V) buffers; backward: two fixed tiles (dK/dV: K, V; dQ: Q, dO)
  // and two buffers of the two streamed ones.
  static constexpr int kForwardBytes = 5 * kTileBytes;
  static constexpr int kBackwardBytes = 6 * kTileBytes;
};

// d (16 x 8 fp32) += a (16 x 16 bf16) b (16 x 8 bf16).
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t Pack(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// ldmatrix: four 8 x 8 bf16 matrices from shared memory into each lane's four registers,
// lane l giving the 16-byte-aligned address of row l % 8 of matrix l / 8. Lane (g, c)
// receives row g, columns 2c, 2c + 1 of each matrix; with .trans, column g, rows 2c,
// 2c + 1 (PTX ISA, "Warp-level matrix load instruction: ldmatrix").
__device__ __forceinline__ void LoadMatrices(uint32_t (&r)[4], const bf16* lane_row) {
  const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(lane_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(at));
}
__device__ __forceinline__ void LoadMatricesTransposed(uint32_t (&r)[4], const bf16* lane_row) {
  const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(lane_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(at));
}

// The A fragment of rows [0, 16) and columns [k0, k0 + 16) of a row-major bf16 tile `t`
// with row stride ld: matrices (rows 0-7, 8-15) x (columns k0.., k0 + 8..) are a0..a3.
__device__ __forceinline__ void LoadA(uint32_t (&a)[4], const bf16* t, int ld, int k0) {
  const int lane = threadIdx.x % 32;
  LoadMatrices(a, t + (lane % 16) * ld + k0 + (lane / 16) * 8);
}

// B fragments of n8 tiles n and n + 1 where B = T^T over columns [k0, k0 + 16) of a
// row-major tile T (row j of T is column j of B; stride ld): {b0, b1} of tile n in
// b[0], b[1], of tile n + 1 in b[2], b[3].
__device__ __forceinline__ void LoadBtPair(uint32_t (&b)[4], const bf16* t, int ld, int n,
                                           int k0) {
  const int lane = threadIdx.x % 32;
  LoadMatrices(b, t + (n * 8 + (lane & 7) + (lane >> 4) * 8) * ld + k0 + ((lane >> 3) & 1) * 8);
}

// B fragments of n8 tiles n and n + 1 where B is rows [k0, k0 + 16) of a row-major tile
// (stride ld): {b0, b1} of tile n in b[0], b[1], of tile n + 1 in b[2], b[3].
__device__ __forceinline__ void LoadBPair(uint32_t (&b)[4], const bf16* t, int ld, int n,
                                          int k0) {
  const int lane = threadIdx.x % 32;
  LoadMatricesTransposed(b, t + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + n * 8 +
                                (lane >> 4) * 8);
}

// s[n] (16 x 8 each, n < 8) = A B^T over D columns, A's rows at `a` and B's 64 rows at `b`
// (row-major bf16 tiles with row stride ld): a 16 x 64 score tile.
template <int D>
__device__ __forceinline__ void ScoresABt(float (&s)[kN8][4], const bf16* a, const bf16* b,
                                          int ld) {
#pragma unroll
  for (int n = 0; n < kN8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t fa[4];
    LoadA(fa, a, ld, kk * 16);
#pragma unroll
    for (int n = 0; n < kN8; n += 2) {
      uint32_t fb[4];
      LoadBtPair(fb, b, ld, n, kk * 16);
      Mma(s[n], fa, fb[0], fb[1]);
      Mma(s[n + 1], fa, fb[2], fb[3]);
    }
  }
}

// acc[n] (16 x 8 each, n < D/8) += P V where P (16 x 64) is given by score accumulators
// (rounded to bf16 here) and V is a row-major [64 x D] bf16 tile with row stride ld.
template <int D>
__device__ __forceinline__ void AccumulatePV(float (&acc)[D / 8][4], const float (&p)[kN8][4],
                                             const bf16* v, int ld) {
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    const uint32_t fa[4] = {Pack(p[2 * kk][0], p[2 * kk][1]), Pack(p[2 * kk][2], p[2 * kk][3]),
                            Pack(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                            Pack(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int n = 0; n < D / 8; n += 2) {
      uint32_t fb[4];
      LoadBPair(fb, v, ld, n, kk * 16);
      Mma(acc[n], fa, fb[0], fb[1]);
      Mma(acc[n + 1], fa, fb[2], fb[3]);
    }
  }
}

// Rows [r0, r0 + 64) of a [T, *] head slice (row stride `ld` elements, D columns from
// `src`) into `dst` [64 x D] with row stride Dims<D>::kLd, rows past T zero-filled: 16-byte
// cp.async copies issued by the whole block. The caller commits the group and waits for it
// (CommitCopies, WaitCopies) and then needs __syncthreads() before reading.
template <int D>
__device__ void LoadTileAsync(bf16* dst, const bf16* src, int64_t ld, int r0, int T) {
  constexpr int kChunks = D / 8;  // 8 bf16 per 16 bytes
  for (int i = threadIdx.x; i < kTile * kChunks; i += kThreads) {
    const int r = i / kChunks, c = (i % kChunks) * 8;
    const bool valid = r0 + r < T;
    const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(dst + r * Dims<D>::kLd + c));
    // A zero source size writes 16 zero bytes and reads nothing; src stays a valid address.
    const bf16* from = valid ? src + (r0 + r) * ld + c : src;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(from),
                 "r"(valid ? 16 : 0));
  }
}

__device__ __forceinline__ void CommitCopies() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most `pending` of this thread's committed copy groups are unfinished.
template <int pending>
__device__ __forceinline__ void WaitCopies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending));
}

// Double-buffered streaming of a pair of [64 x D] tiles (K and V, or Q and dO), two per
// buffer at `pairs`: when `more`, first requests rows [next_r0, next_r0 + 64) of a (row
// stride lda) and b (ldb) into buffer 1 - cur; then waits for buffer cur (requested
// earlier) and __syncthreads(). Returns buffer cur's first tile; the second follows it.
// The caller __syncthreads() again before the next call refills the other buffer.
template <int D>
__device__ __forceinline__ const bf16* TakePair(bf16* pairs, int cur, bool more, const bf16* a, int64_t lda,
                                const bf16* b, int64_t ldb, int next_r0, int T) {
  constexpr int kPair = 2 * kTile * Dims<D>::kLd;
  if (more) {
    bf16* next = pairs + (1 - cur) * kPair;
    LoadTileAsync<D>(next, a, lda, next_r0, T);
    LoadTileAsync<D>(next + kTile * Dims<D>::kLd, b, ldb, next_r0, T);
    CommitCopies();
    WaitCopies<1>();
  } else {
    WaitCopies<0>();
  }
  __syncthreads();  // this pair's copies are visible to every warp
  return pairs + cur * kPair;
}

// Two adjacent output elements, fp32 or rounded to bf16.
__device__ __forceinline__ void StorePair(float* out, float lo, float hi) {
  *reinterpret_cast<float2*>(out) = make_float2(lo, hi);
}
__device__ __forceinline__ void StorePair(bf16* out, float lo, float hi) {
  *reinterpret_cast<__nv_bfloat162*>(out) = __floats2bfloat162_rn(lo, hi);
}

// Stores a warp's 16 x D accumulators (rows row0 + g and row0 + g + 8) into global rows of
// `dst` (fp32 or bf16, row stride ld), skipping rows at or past T.
template <int D, typename Out>
__device__ __forceinline__ void StoreRows(const float (&acc)[D / 8][4], Out* dst, int64_t ld,
                                          int row0, int T) {
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int t = row0 + g + 8 * half;
    if (t >= T) continue;
    Out* out = dst + t * ld + 2 * c;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) StorePair(out + n * 8, acc[n][2 * half], acc[n][2 * half + 1]);
  }
}

__device__ __forceinline__ float Load(const float* p) { return *p; }
__device__ __forceinline__ float Load(const bf16* p) { return __bfloat162float(*p); }

// Forward: grid (tiles, B*H), the longest query tiles first. Y: fp32 or bf16.
template <int D, typename Y>
__global__ void __launch_bounds__(kThreads) FlashForwardKernel(const bf16* __restrict__ qkv,
                                                               Y* __restrict__ y,
                                                               float* __restrict__ lse, int T,
                                                               int H, float scale_log2) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int kLd = Dims<D>::kLd;
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  bf16* sKV = sQ + kTile * kLd;  // buffer i: K at sKV + 2i tiles, V at sKV + (2i + 1) tiles

  const int tiles = (T + kTile - 1) / kTile;
  const int qt = tiles - 1 - static_cast<int>(blockIdx.x);
  const int bh = blockIdx.y, b = bh / H, h = bh % H;
  const int64_t C = static_cast<int64_t>(H) * D, ld3 = 3 * C;
  const bf16* base = qkv + static_cast<int64_t>(b) * T * ld3 + static_cast<int64_t>(h) * D;
  const int q0 = qt * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int row0 = q0 + warp * 16;  // this warp's first query

  // Q and the first K, V tile; this warp's Q rows as A fragments, kept for the whole pass.
  LoadTileAsync<D>(sQ, base, ld3, q0, T);
  LoadTileAsync<D>(sKV, base + C, ld3, 0, T);
  LoadTileAsync<D>(sKV + kTile * kLd, base + 2 * C, ld3, 0, T);
  CommitCopies();
  WaitCopies<0>();
  __syncthreads();
  uint32_t qa[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) LoadA(qa[kk], sQ + warp * 16 * kLd, kLd, kk * 16);

  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g and g + 8
  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * kTile;
    // The next K, V tile into the other buffer while this one is used.
    const bf16* sK = TakePair<D>(sKV, kt & 1, kt < qt, base + C, ld3, base + 2 * C, ld3,
                                 k0 + kTile, T);
    const bf16* sV = sK + kTile * kLd;
    float s[kN8][4];
#pragma unroll
    for (int n = 0; n < kN8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int n = 0; n < kN8; n += 2) {
        uint32_t fb[4];
        LoadBtPair(fb, sK, kLd, n, kk * 16);
        Mma(s[n], qa[kk], fb[0], fb[1]);
        Mma(s[n + 1], qa[kk], fb[2], fb[3]);
      }
    }
    // Scale, mask, and the online softmax of rows g and g + 8. Only the diagonal tile has
    // keys past a query (and, the last tile, keys past T).
    float mx[2] = {-INFINITY, -INFINITY};
    if (kt == qt) {
#pragma unroll
      for (int n = 0; n < kN8; ++n) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int tk = k0 + n * 8 + 2 * c + (i & 1), tq = row0 + g + 8 * (i >> 1);
          s[n][i] = (tk > tq || tk >= T) ? -INFINITY : s[n][i] * scale_log2;
          mx[i >> 1] = fmaxf(mx[i >> 1], s[n][i]);
        }
      }
    } else {
#pragma unroll
      for (int n = 0; n < kN8; ++n) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          s[n][i] *= scale_log2;
          mx[i >> 1] = fmaxf(mx[i >> 1], s[n][i]);
        }
      }
    }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      // Key 0 is in every row's first tile, so the new max is finite from then on.
      const float m_new = fmaxf(m[r], mx[r]);
      alpha[r] = exp2f(m[r] - m_new);
      m[r] = m_new;
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int n = 0; n < kN8; ++n) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        s[n][i] = exp2f(s[n][i] - m[i >> 1]);
        l[i >> 1] += s[n][i];  // this thread's part of the row sum
      }
    }
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }
    AccumulatePV<D>(o, s, sV, kLd);
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  const float inv[2] = {1.0f / l[0], 1.0f / l[1]};
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    o[n][0] *= inv[0];
    o[n][1] *= inv[0];
    o[n][2] *= inv[1];
    o[n][3] *= inv[1];
  }
  StoreRows<D, Y>(o, y + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * D, C, row0, T);
  if (c == 0) {
    float* out = lse + static_cast<int64_t>(bh) * T;
    if (row0 + g < T) out[row0 + g] = m[0] + log2f(l[0]);
    if (row0 + g + 8 < T) out[row0 + g + 8] = m[1] + log2f(l[1]);
  }
}

// delta[b, h, t] = <gy[b, t, h], y[b, t, h]>: one warp per (b, t, h) row. Y: fp32 or bf16.
template <typename Y>
__global__ void FlashDeltaKernel(const bf16* __restrict__ gy, const Y* __restrict__ y,
                                 float* __restrict__ delta, int64_t rows, int T, int H, int D) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (r >= rows) return;
  const int lane = threadIdx.x % 32;
  const int64_t bt = r / H;
  const int h = static_cast<int>(r % H);
  const int64_t off = bt * H * D + static_cast<int64_t>(h) * D;
  float acc = 0.0f;
  for (int d = lane; d < D; d += 32) acc += __bfloat162float(gy[off + d]) * Load(y + off + d);
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

// Blocks of the dK/dV kernel kept resident per SM: at D = 64, 3 (the register cap that
// keeps them, 168, costs no spills); at D = 128 shared memory allows 2 anyway.
constexpr int KVBlocksPerSm(int D) { return D == 64 ? 3 : 1; }

// dK and dV: grid (tiles, B*H); block kt owns key tile kt and walks query tiles kt.. end.
// Each warp's 16 keys are the rows of its transposed score tiles S^T = K Q^T and
// dP^T = V dO^T; dV += P^T dO and dK += dS^T Q stay in registers.
template <int D, typename G>
__global__ void __launch_bounds__(kThreads, KVBlocksPerSm(D)) FlashBackwardKVKernel(
    const bf16* __restrict__ qkv, const bf16* __restrict__ gy, const float* __restrict__ lse,
    const float* __restrict__ delta, G* __restrict__ gqkv, int T, int H, ScoreGrad sg) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int kLd = Dims<D>::kLd;
  bf16* sK = reinterpret_cast<bf16*>(smem);
  bf16* sV = sK + kTile * kLd;
  bf16* sQG = sV + kTile * kLd;  // buffer i: Q at sQG + 2i tiles, dO at sQG + (2i + 1) tiles

  const int tiles = (T + kTile - 1) / kTile;
  const int kt = blockIdx.x;  // the most query tiles first
  const int bh = blockIdx.y, b = bh / H, h = bh % H;
  const int64_t C = static_cast<int64_t>(H) * D, ld3 = 3 * C;
  const bf16* base = qkv + static_cast<int64_t>(b) * T * ld3 + static_cast<int64_t>(h) * D;
  const bf16* gbase = gy + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * D;
  const int k0 = kt * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int key0 = k0 + warp * 16;  // this warp's first key

  LoadTileAsync<D>(sK, base + C, ld3, k0, T);
  LoadTileAsync<D>(sV, base + 2 * C, ld3, k0, T);
  LoadTileAsync<D>(sQG, base, ld3, k0, T);
  LoadTileAsync<D>(sQG + kTile * kLd, gbase, C, k0, T);
  CommitCopies();
  const float* lse_row = lse + static_cast<int64_t>(bh) * T;
  const float* delta_row = delta + static_cast<int64_t>(bh) * T;
  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    dk[n][0] = dk[n][1] = dk[n][2] = dk[n][3] = 0.0f;
    dv[n][0] = dv[n][1] = dv[n][2] = dv[n][3] = 0.0f;
  }
  for (int qt = kt; qt < tiles; ++qt) {
    const int q0 = qt * kTile;
    const bf16* sQ = TakePair<D>(sQG, (qt - kt) & 1, qt + 1 < tiles, base, ld3, gbase, C,
                                 q0 + kTile, T);
    const bf16* sG = sQ + kTile * kLd;  // dO
    float p[kN8][4], ds[kN8][4];
    ScoresABt<D>(p, sK + warp * 16 * kLd, sQ, kLd);   // S^T
    ScoresABt<D>(ds, sV + warp * 16 * kLd, sG, kLd);  // dP^T
    // Masked entries are only on the diagonal tile (queries before a key; keys past T)
    // and the last query tile (queries past T).
#pragma unroll
    for (int n = 0; n < kN8; ++n) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int j = n * 8 + 2 * c + (i & 1), tq = q0 + j, tk = key0 + g + 8 * (i >> 1);
        const bool live = tq >= tk && tq < T && tk < T;
        p[n][i] = live ? exp2f(p[n][i] * sg.scale_log2 - __ldg(lse_row + tq)) : 0.0f;
        ds[n][i] = live ? p[n][i] * (ds[n][i] - __ldg(delta_row + tq)) * sg.scale : 0.0f;
      }
    }
    AccumulatePV<D>(dv, p, sG, kLd);   // dV += P^T dO
    AccumulatePV<D>(dk, ds, sQ, kLd);  // dK += dS^T Q
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }
  G* g_out = gqkv + static_cast<int64_t>(b) * T * ld3 + static_cast<int64_t>(h) * D;
  StoreRows<D, G>(dk, g_out + C, ld3, key0, T);
  StoreRows<D, G>(dv, g_out + 2 * C, ld3, key0, T);
}

// dQ: grid (tiles, B*H), the longest query tiles first; block qt walks key tiles 0..qt.
template <int D, typename G>
__global__ void __launch_bounds__(kThreads) FlashBackwardQKernel(
    const bf16* __restrict__ qkv, const bf16* __restrict__ gy, const float* __restrict__ lse,
    const float* __restrict__ delta, G* __restrict__ gqkv, int T, int H, ScoreGrad sg) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int kLd = Dims<D>::kLd;
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  bf16* sG = sQ + kTile * kLd;   // dO
  bf16* sKV = sG + kTile * kLd;  // buffer i: K at sKV + 2i tiles, V at sKV + (2i + 1) tiles

  const int tiles = (T + kTile - 1) / kTile;
  const int qt = tiles - 1 - static_cast<int>(blockIdx.x);
  const int bh = blockIdx.y, b = bh / H, h = bh % H;
  const int64_t C = static_cast<int64_t>(H) * D, ld3 = 3 * C;
  const bf16* base = qkv + static_cast<int64_t>(b) * T * ld3 + static_cast<int64_t>(h) * D;
  const bf16* gbase = gy + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * D;
  const int q0 = qt * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int row0 = q0 + warp * 16;  // this warp's first query

  LoadTileAsync<D>(sQ, base, ld3, q0, T);
  LoadTileAsync<D>(sG, gbase, C, q0, T);
  LoadTileAsync<D>(sKV, base + C, ld3, 0, T);
  LoadTileAsync<D>(sKV + kTile * kLd, base + 2 * C, ld3, 0, T);
  CommitCopies();
  float lq[2], dlt[2];  // rows g and g + 8
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int t = row0 + g + 8 * r;
    lq[r] = t < T ? lse[static_cast<int64_t>(bh) * T + t] : 0.0f;
    dlt[r] = t < T ? delta[static_cast<int64_t>(bh) * T + t] : 0.0f;
  }
  float dq[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * kTile;
    const bf16* sK = TakePair<D>(sKV, kt & 1, kt < qt, base + C, ld3, base + 2 * C, ld3,
                                 k0 + kTile, T);
    const bf16* sV = sK + kTile * kLd;
    float ds[kN8][4], dp[kN8][4];
    ScoresABt<D>(ds, sQ + warp * 16 * kLd, sK, kLd);  // S
    ScoresABt<D>(dp, sG + warp * 16 * kLd, sV, kLd);  // dP
    // Masked entries are only on the diagonal tile (keys after a query; keys past T) and
    // in the last query tile (queries past T).
#pragma unroll
    for (int n = 0; n < kN8; ++n) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = i >> 1, tk = k0 + n * 8 + 2 * c + (i & 1), tq = row0 + g + 8 * r;
        const bool live = tk <= tq && tk < T && tq < T;
        const float p = live ? exp2f(ds[n][i] * sg.scale_log2 - lq[r]) : 0.0f;
        ds[n][i] = p * (dp[n][i] - dlt[r]) * sg.scale;
      }
    }
    AccumulatePV<D>(dq, ds, sK, kLd);  // dQ += dS K
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }
  StoreRows<D, G>(dq, gqkv + static_cast<int64_t>(b) * T * ld3 + static_cast<int64_t>(h) * D, ld3,
               row0, T);
}

bool LaunchFits(int64_t B, int64_t T, int64_t H) {
  return B > 0 && T > 0 && H > 0 && T <= (int64_t{1} << 30) && B * H <= 65535;
}

template <int D, typename Y>
cudaError_t Forward(const bf16* qkv, Y* y, float* lse, int64_t B, int64_t T, int64_t H,
                    float scale) {
  const int bytes = Dims<D>::kForwardBytes;
  cudaError_t err = AllowSharedMemory(FlashForwardKernel<D, Y>, bytes);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>((T + kTile - 1) / kTile), static_cast<unsigned>(B * H));
  FlashForwardKernel<D, Y><<<grid, kThreads, bytes>>>(qkv, y, lse, static_cast<int>(T),
                                                      static_cast<int>(H), scale * kLog2e);
  return cudaGetLastError();
}

template <int D, typename Y, typename G>
cudaError_t Backward(const bf16* qkv, const Y* y, const bf16* gy, const float* lse,
                     float* delta, G* gqkv, int64_t B, int64_t T, int64_t H, float scale) {
  const int64_t rows = B * T * H;
  constexpr int kRowsPerBlock = 8;
  FlashDeltaKernel<Y><<<static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock),
                        32 * kRowsPerBlock>>>(gy, y, delta, rows, static_cast<int>(T),
                                              static_cast<int>(H), D);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const int bytes = Dims<D>::kBackwardBytes;
  if ((err = AllowSharedMemory(FlashBackwardKVKernel<D, G>, bytes)) != cudaSuccess) return err;
  if ((err = AllowSharedMemory(FlashBackwardQKernel<D, G>, bytes)) != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>((T + kTile - 1) / kTile), static_cast<unsigned>(B * H));
  const ScoreGrad sg{scale, scale * kLog2e};
  FlashBackwardKVKernel<D, G><<<grid, kThreads, bytes>>>(qkv, gy, lse, delta, gqkv,
                                                         static_cast<int>(T), static_cast<int>(H),
                                                         sg);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  FlashBackwardQKernel<D, G><<<grid, kThreads, bytes>>>(qkv, gy, lse, delta, gqkv,
                                                        static_cast<int>(T), static_cast<int>(H),
                                                        sg);
  return cudaGetLastError();
}

template <int D>
cudaError_t ForwardAs(const uint16_t* qkv, void* y, bool y_bf16, float* lse, int64_t B,
                      int64_t T, int64_t H, float scale) {
  const bf16* q = reinterpret_cast<const bf16*>(qkv);
  return y_bf16 ? Forward<D>(q, static_cast<bf16*>(y), lse, B, T, H, scale)
                : Forward<D>(q, static_cast<float*>(y), lse, B, T, H, scale);
}

template <int D, typename Y>
cudaError_t BackwardAs(const uint16_t* qkv, const Y* y, const uint16_t* gy, const float* lse,
                       float* delta, void* gqkv, bool gqkv_bf16, int64_t B, int64_t T,
                       int64_t H, float scale) {
  const bf16* q = reinterpret_cast<const bf16*>(qkv);
  const bf16* g = reinterpret_cast<const bf16*>(gy);
  return gqkv_bf16
             ? Backward<D>(q, y, g, lse, delta, static_cast<bf16*>(gqkv), B, T, H, scale)
             : Backward<D>(q, y, g, lse, delta, static_cast<float*>(gqkv), B, T, H, scale);
}

template <int D>
cudaError_t BackwardAs(const uint16_t* qkv, const void* y, bool y_bf16, const uint16_t* gy,
                       const float* lse, float* delta, void* gqkv, bool gqkv_bf16, int64_t B,
                       int64_t T, int64_t H, float scale) {
  return y_bf16 ? BackwardAs<D>(qkv, static_cast<const bf16*>(y), gy, lse, delta, gqkv,
                                gqkv_bf16, B, T, H, scale)
                : BackwardAs<D>(qkv, static_cast<const float*>(y), gy, lse, delta, gqkv,
                                gqkv_bf16, B, T, H, scale);
}

}  // namespace

cudaError_t FlashAttentionForward(const uint16_t* qkv, void* y, bool y_bf16, float* lse,
                                  int64_t B, int64_t T, int64_t H, int64_t head_dim,
                                  float scale) {
  if (!LaunchFits(B, T, H)) return cudaErrorInvalidValue;
  if (head_dim == 64) return ForwardAs<64>(qkv, y, y_bf16, lse, B, T, H, scale);
  if (head_dim == 128) return ForwardAs<128>(qkv, y, y_bf16, lse, B, T, H, scale);
  return cudaErrorInvalidValue;
}

cudaError_t FlashAttentionBackward(const uint16_t* qkv, const void* y, bool y_bf16,
                                   const uint16_t* gy, const float* lse, float* delta,
                                   void* gqkv, bool gqkv_bf16, int64_t B, int64_t T, int64_t H,
                                   int64_t head_dim, float scale) {
  if (!LaunchFits(B, T, H)) return cudaErrorInvalidValue;
  if (head_dim == 64) {
    return BackwardAs<64>(qkv, y, y_bf16, gy, lse, delta, gqkv, gqkv_bf16, B, T, H, scale);
  }
  if (head_dim == 128) {
    return BackwardAs<128>(qkv, y, y_bf16, gy, lse, delta, gqkv, gqkv_bf16, B, T, H, scale);
  }
  return cudaErrorInvalidValue;
}

}  // namespace cuda
}  // namespace kernels
