// Fused causal attention kernels (kernels/cuda/flash_attention.h).
//
// One block per (row tile, batch element x head); each warp owns 16 rows of the block's
// tile (or two such m-tiles, a shape of the forward) and keeps everything about them in
// registers, as FlashAttention-2 does: the products are mma.sync m16n8k16 (bf16 x bf16 ->
// fp32) whose accumulator layout is fixed by PTX, so the softmax runs on the accumulators
// where they are, and a score tile's accumulators become the A operand of the next product
// after rounding to bf16. Only the tiles every warp reads (K and V in the forward and dQ
// kernels, Q and dO in the dK/dV kernel) go through shared memory, 64 rows at a time: the
// whole block copies them with cp.async into two buffers, the next tile's copy in flight
// while the warps compute on the current one; the warps take their fragments from them with
// ldmatrix (four 8 x 8 matrices an instruction, transposed for a B operand stored row by
// row of k). Rows are padded by 8 bf16, so the eight 16-byte rows an ldmatrix phase reads
// fall in distinct banks. A warp whose rows have nothing to do with a streamed tile (all
// its keys after the warp's queries, or its rows past T) skips the products in blocks of
// more than 64 rows, but still takes part in the block's copies and barriers.
//
// Masks: each kernel evaluates the causal mask (key after query) on the diagonal tile only,
// the one tile of a row (or key) where it can hold, and nothing else. Rows past T are
// zero-filled on load and their results never stored, which leaves every stored value as
// if they were masked: in the forward a query's diagonal tile is the only one with keys
// past T, and they come after it; in the dQ kernel the same holds, and a row of dQ reads
// only its own row of dS; in the dK/dV kernel a query past T has zero q and dO rows and
// reads lse = delta = 0, so its P^T entry is 1 and its dS^T entry 0, and it adds exact
// zeros to dV (1 x 0) and dK (0 x 0).
//
// Block shapes (NOTE [Flash block shapes] in flash_attention.h): `BlockShape` says how many
// warps a block has, how many 16-row m-tiles each owns, the blocks an SM the registers are
// capped for, (backward) whether a warp holds its rows' operands in registers and (dK/dV)
// whether it takes a streamed tile in two halves; the rows of a block are 16 x warps x
// m-tiles. A warp's rows lie inside one 64-row tile (16 x m-tiles divides 64), so all of
// them need the same key tiles: the tiles up to the one holding the warp's rows, and that
// diagonal tile is the only one with masked keys. Each row's arithmetic is the same in
// every shape.
//
// m16n8k16 fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16"), with g = lane / 4 and
// c = lane % 4: A (16 x 16, row-major) a0 = (g, 2c..2c+1), a1 = (g+8, 2c..), a2 = (g,
// 2c+8..), a3 = (g+8, 2c+8..); B (16 x 8) b0 = (rows 2c, 2c+1; column g), b1 = (rows 2c+8,
// 2c+9; column g); C (16 x 8, fp32) c0, c1 = (g, 2c), (g, 2c+1), c2, c3 = (g+8, 2c),
// (g+8, 2c+1). Two adjacent bf16 of a register: the lower column (or row) in the low half.

#include <cuda_bf16.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/tuning_switches.h"

namespace kernels {
namespace cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kTile = static_cast<int>(kFlashTile);  // rows (queries or keys) per tile
constexpr int kN8 = kTile / 8;  // n8 accumulator tiles across a 64-wide score tile
constexpr float kLog2e = 1.4426950408889634f;

// A block of `warps` warps, each owning `m_tiles` consecutive 16-row m-tiles, its registers
// capped so that `min_blocks` blocks fit an SM (0: no cap but the 255 of a thread; a cap of
// 1 is not the same, ptxas then spends more registers than it needs).
struct BlockShape {
  int warps, m_tiles, min_blocks;
  // Backward kernels: each warp holds the A fragments of its own rows' fixed tiles (dK/dV:
  // K and V; dQ: Q and dO) in registers for the whole pass instead of loading them from
  // shared memory for every streamed tile (32 more registers at D = 64).
  bool hold_a = false;
  // dK/dV: each streamed tile is taken as two halves of 32 queries, so a warp's score
  // accumulators are 16 x 32 (32 registers fewer); the sums run in the same order.
  bool halves = false;
};

template <int W, int M, int MinBlocks, bool HoldA = false, bool Halves = false>
struct Block {
  static_assert(kTile % (16 * M) == 0, "a warp's rows must lie inside one 64-row tile");
  static constexpr int kM = M, kMinBlocks = MinBlocks;
  static constexpr bool kHoldA = HoldA, kHalves = Halves;
  static constexpr int kThreads = 32 * W;
  static constexpr int kRows = 16 * W * M;  // rows (queries, or keys for dK/dV) a block owns
};

// Whether a warp of a block of shape S skips the streamed tiles it does not need: those of
// keys all after its queries (or the other way round for dK/dV), and all of them when its
// rows start past T. In a block of one 64-row tile every warp needs every tile, and the
// branch would only cost registers (in the dK/dV kernel, spills at its cap); where a warp
// does compute a tile it does not need, the mask zeroes it and adding zero changes nothing.
template <typename S>
__device__ constexpr bool SkipsTiles() {
  return S::kRows > kTile;
}

template <int D>
struct Dims {
  static constexpr int kLd = D + 8;  // shared-memory row stride of a [rows x D] bf16 tile
  static constexpr int kRowBytes = kLd * 2;
  // Forward: the block's Q rows and two (K, V) buffers of 64 rows; backward: the block's
  // two fixed tiles (dK/dV: K, V; dQ: Q, dO) and two buffers of the two streamed ones, and
  // for dK/dV two buffers of the streamed queries' lse and delta (kStatBytes).
  static constexpr int ForwardBytes(int rows) { return (rows + 4 * kTile) * kRowBytes; }
  static constexpr int BackwardBytes(int rows, bool kv) {
    return (2 * rows + 4 * kTile) * kRowBytes + (kv ? 2 * kStatBytes : 0);
  }
  static constexpr int kStatBytes = 2 * kTile * 4;  // a tile's lse and delta, fp32
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
__device__ __forceinline__ void LoadBtPair(uint32_t (&b)[4], const bf16* t, int ld, int n, int k0) {
  const int lane = threadIdx.x % 32;
  LoadMatrices(b, t + (n * 8 + (lane & 7) + (lane >> 4) * 8) * ld + k0 + ((lane >> 3) & 1) * 8);
}

// B fragments of n8 tiles n and n + 1 where B is rows [k0, k0 + 16) of a row-major tile
// (stride ld): {b0, b1} of tile n in b[0], b[1], of tile n + 1 in b[2], b[3].
__device__ __forceinline__ void LoadBPair(uint32_t (&b)[4], const bf16* t, int ld, int n, int k0) {
  const int lane = threadIdx.x % 32;
  LoadMatricesTransposed(
      b, t + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + n * 8 + (lane >> 4) * 8);
}

// s[n] (16 x 8 each, n < N) = A B^T over D columns, B's 8 N rows at `b` (a row-major bf16
// tile with row stride ld) and A's 16 rows given by fragments: a(kk, fa) puts the A
// fragment of columns [16 kk, 16 kk + 16) in fa. A 16 x 64 score tile (N = 8), or 16 x 32.
template <int D, int N = kN8, typename FragmentsOfA>
__device__ __forceinline__ void ScoresBt(float (&s)[N][4], FragmentsOfA&& a, const bf16* b,
                                         int ld) {
#pragma unroll
  for (int n = 0; n < N; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t fa[4];
    a(kk, fa);
#pragma unroll
    for (int n = 0; n < N; n += 2) {
      uint32_t fb[4];
      LoadBtPair(fb, b, ld, n, kk * 16);
      Mma(s[n], fa, fb[0], fb[1]);
      Mma(s[n + 1], fa, fb[2], fb[3]);
    }
  }
}

// The A fragments of a warp's 16 rows at `rows` (row-major bf16, row stride ld): loaded
// from shared memory for each product, or, when Held, once into registers (Load) and
// taken from there. Called as ScoresBt's `a`.
template <int D, bool Held>
struct RowsA {
  const bf16* rows;
  int ld;
  uint32_t held[Held ? D / 16 : 1][4];
  __device__ __forceinline__ void Load() {
    if constexpr (Held) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) LoadA(held[kk], rows, ld, kk * 16);
    }
  }
  __device__ __forceinline__ void operator()(int kk, uint32_t (&fa)[4]) const {
    if constexpr (Held) {
#pragma unroll
      for (int i = 0; i < 4; ++i) fa[i] = held[kk][i];
    } else {
      LoadA(fa, rows, ld, kk * 16);
    }
  }
};

// acc[i][n] (16 x 8 each, n < D/8) += P_i V for each of M m-tiles i, where P_i (16 x 8 N)
// is given by score accumulators p[i] (rounded to bf16 here) and V is a row-major [8 N x D]
// bf16 tile with row stride ld; each fragment of V serves all M products. The k-steps run
// over V's rows in order, so a 64-row product taken as two 32-row ones (N = 4, the second
// with p and V from row 32) adds the same terms in the same order.
template <int D, int M, int N = kN8>
__device__ __forceinline__ void AccumulatePV(float (*acc)[D / 8][4], const float (*p)[N][4],
                                             const bf16* v, int ld) {
#pragma unroll
  for (int kk = 0; kk < N / 2; ++kk) {
    uint32_t fa[M][4];
#pragma unroll
    for (int i = 0; i < M; ++i) {
      fa[i][0] = Pack(p[i][2 * kk][0], p[i][2 * kk][1]);
      fa[i][1] = Pack(p[i][2 * kk][2], p[i][2 * kk][3]);
      fa[i][2] = Pack(p[i][2 * kk + 1][0], p[i][2 * kk + 1][1]);
      fa[i][3] = Pack(p[i][2 * kk + 1][2], p[i][2 * kk + 1][3]);
    }
#pragma unroll
    for (int n = 0; n < D / 8; n += 2) {
      uint32_t fb[4];
      LoadBPair(fb, v, ld, n, kk * 16);
#pragma unroll
      for (int i = 0; i < M; ++i) {
        Mma(acc[i][n], fa[i], fb[0], fb[1]);
        Mma(acc[i][n + 1], fa[i], fb[2], fb[3]);
      }
    }
  }
}

// Multiplies a warp's 16 x D accumulators by `top` in rows g and by `bottom` in rows g + 8.
template <int D>
__device__ __forceinline__ void ScaleRows(float (&acc)[D / 8][4], float top, float bottom) {
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    acc[n][0] *= top;
    acc[n][1] *= top;
    acc[n][2] *= bottom;
    acc[n][3] *= bottom;
  }
}

// Rows [r0, r0 + Rows) of a [T, *] head slice (row stride `ld` elements, D columns from
// `src`) into `dst` [Rows x D] with row stride Dims<D>::kLd, rows past T zero-filled:
// 16-byte cp.async copies issued by the block's `Threads` threads. A thread copies the same
// 16-byte column of every (Threads / (D / 8))-th row, so its addresses are computed once and
// the copies are unrolled; only a range that reaches past T checks its rows. The caller
// commits the group and waits for it (CommitCopies, WaitCopies) and then needs
// __syncthreads() before reading.
// One 16-byte cp.async from global `from` to shared address `to`, of which `src_bytes` (16
// or 0) are read and the rest zero-filled; with 0, `from` is read from nowhere but must be
// a valid address.
__device__ __forceinline__ void CopyAsync16(unsigned to, const void* from, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(from),
               "r"(src_bytes));
}

template <int D, int Rows, int Threads>
__device__ __forceinline__ void LoadRowsAsync(bf16* dst, const bf16* src, int64_t ld, int r0,
                                              int T) {
  constexpr int kChunks = D / 8;            // 8 bf16 per 16 bytes
  constexpr int kStep = Threads / kChunks;  // rows one pass of the block copies
  static_assert(Threads % kChunks == 0 && Rows % kStep == 0, "whole rows a pass");
  const int r = static_cast<int>(threadIdx.x) / kChunks;
  const int c = (static_cast<int>(threadIdx.x) % kChunks) * 8;
  const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(dst + r * Dims<D>::kLd + c));
  const bf16* from = src + (r0 + r) * ld + c;
  const int64_t step = kStep * ld;
  if (r0 + Rows <= T) {
#pragma unroll
    for (int j = 0; j < Rows / kStep; ++j) {
      CopyAsync16(to + j * kStep * Dims<D>::kRowBytes, from + j * step, 16);
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < Rows / kStep; ++j) {
    const bool valid = r0 + r + j * kStep < T;
    CopyAsync16(to + j * kStep * Dims<D>::kRowBytes, valid ? from + j * step : src, valid ? 16 : 0);
  }
}

__device__ __forceinline__ void CommitCopies() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most `pending` of this thread's committed copy groups are unfinished.
template <int pending>
__device__ __forceinline__ void WaitCopies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending));
}

// No copies besides the pair's (TakePair).
struct NoMoreCopies {
  __device__ void operator()(int /*buffer*/, int /*r0*/) const {}
};

// Rows [r0, r0 + 64) of the statistics rows lse_row and delta_row (fp32, T each) into
// dst[0, 64) and dst[64, 128), rows past T zero-filled: 4-byte cp.async copies, one a thread
// of the block's first 128. Commit, wait and __syncthreads() as for LoadRowsAsync.
template <int Threads>
__device__ __forceinline__ void LoadStatsAsync(float* dst, const float* lse_row,
                                               const float* delta_row, int r0, int T) {
  static_assert(Threads >= 2 * kTile, "one copy a thread");
  const int i = static_cast<int>(threadIdx.x);
  if (i >= 2 * kTile) return;
  const int t = r0 + i % kTile;
  const bool valid = t < T;
  const float* from = valid ? (i < kTile ? lse_row : delta_row) + t : lse_row;
  const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(dst + i));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(to), "l"(from),
               "r"(valid ? 4 : 0));
}

// Double-buffered streaming of a pair of [64 x D] tiles (K and V, or Q and dO), two per
// buffer at `pairs`, by a block of `Threads` threads: when `more`, first requests rows
// [next_r0, next_r0 + 64) of a (row stride lda) and b (ldb) into buffer 1 - cur, and
// whatever `also(1 - cur, next_r0)` copies in the same group; then waits for buffer cur
// (requested earlier) and __syncthreads(). Returns buffer cur's first tile; the second
// follows it. The caller __syncthreads() again before the next call refills the other
// buffer.
template <int D, int Threads, typename Also = NoMoreCopies>
__device__ __forceinline__ const bf16* TakePair(bf16* pairs, int cur, bool more, const bf16* a,
                                                int64_t lda, const bf16* b, int64_t ldb,
                                                int next_r0, int T, Also also = {}) {
  constexpr int kPair = 2 * kTile * Dims<D>::kLd;
  if (more) {
    bf16* next = pairs + (1 - cur) * kPair;
    LoadRowsAsync<D, kTile, Threads>(next, a, lda, next_r0, T);
    LoadRowsAsync<D, kTile, Threads>(next + kTile * Dims<D>::kLd, b, ldb, next_r0, T);
    also(1 - cur, next_r0);
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

// Forward: grid (query blocks, B*H), the longest query blocks first; a block of shape S
// owns S::kRows queries. Y: fp32 or bf16.
template <int D, typename S, typename Y>
__global__ void __launch_bounds__(S::kThreads, S::kMinBlocks)
    FlashForwardKernel(const bf16* __restrict__ qkv, Y* __restrict__ y, float* __restrict__ lse,
                       int T, int H, float scale_log2) {
  static_assert(!S::kHoldA, "the forward always holds its Q fragments");
  static_assert(!S::kHalves, "the forward's online softmax takes whole tiles");
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int kLd = Dims<D>::kLd, M = S::kM;
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  bf16* sKV = sQ + S::kRows * kLd;  // buffer i: K at sKV + 2i tiles, V at sKV + (2i + 1) tiles

  const int tiles = (T + kTile - 1) / kTile;  // key tiles
  const int blocks = (T + S::kRows - 1) / S::kRows;
  const int q0 = (blocks - 1 - static_cast<int>(blockIdx.x)) * S::kRows;
  // The block's last key tile: the one holding its last query (or T's last).
  const int last = min(tiles - 1, (q0 + S::kRows - 1) / kTile);
  const int bh = blockIdx.y, b = bh / H, h = bh % H;
  const int64_t C = static_cast<int64_t>(H) * D, ld3 = 3 * C;
  const bf16* base = qkv + static_cast<int64_t>(b) * T * ld3 + static_cast<int64_t>(h) * D;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int row0 = q0 + warp * 16 * M;  // this warp's first query
  // This warp's diagonal key tile, the last it needs (SkipsTiles).
  const int diag = row0 / kTile;

  // The block's Q and the first K, V tile; this warp's Q rows as A fragments, kept for the
  // whole pass.
  LoadRowsAsync<D, S::kRows, S::kThreads>(sQ, base, ld3, q0, T);
  LoadRowsAsync<D, kTile, S::kThreads>(sKV, base + C, ld3, 0, T);
  LoadRowsAsync<D, kTile, S::kThreads>(sKV + kTile * kLd, base + 2 * C, ld3, 0, T);
  CommitCopies();
  WaitCopies<0>();
  __syncthreads();
  uint32_t qa[M][D / 16][4];
#pragma unroll
  for (int i = 0; i < M; ++i) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      LoadA(qa[i][kk], sQ + (warp * M + i) * 16 * kLd, kLd, kk * 16);
    }
  }

  float o[M][D / 8][4];
#pragma unroll
  for (int i = 0; i < M; ++i) {
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[i][n][0] = o[i][n][1] = o[i][n][2] = o[i][n][3] = 0.0f;
  }
  // Rows g and g + 8 of each m-tile.
  float m[M][2], l[M][2];
#pragma unroll
  for (int i = 0; i < M; ++i) m[i][0] = m[i][1] = -INFINITY, l[i][0] = l[i][1] = 0.0f;
  for (int kt = 0; kt <= last; ++kt) {
    const int k0 = kt * kTile;
    // The next K, V tile into the other buffer while this one is used.
    const bf16* sK = TakePair<D, S::kThreads>(sKV, kt & 1, kt < last, base + C, ld3, base + 2 * C,
                                              ld3, k0 + kTile, T);
    const bf16* sV = sK + kTile * kLd;
    if (!SkipsTiles<S>() || (row0 < T && kt <= diag)) {
      float s[M][kN8][4];
#pragma unroll
      for (int i = 0; i < M; ++i) {
#pragma unroll
        for (int n = 0; n < kN8; ++n) s[i][n][0] = s[i][n][1] = s[i][n][2] = s[i][n][3] = 0.0f;
      }
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
        for (int n = 0; n < kN8; n += 2) {
          uint32_t fb[4];
          LoadBtPair(fb, sK, kLd, n, kk * 16);
#pragma unroll
          for (int i = 0; i < M; ++i) {
            Mma(s[i][n], qa[i][kk], fb[0], fb[1]);
            Mma(s[i][n + 1], qa[i][kk], fb[2], fb[3]);
          }
        }
      }
#pragma unroll
      for (int i = 0; i < M; ++i) {
        const int rowi = row0 + 16 * i;  // this m-tile's first query
        // Mask (the diagonal tile), and the online softmax of rows g and g + 8 in units of
        // log2: m is the running max of the scaled scores, the max of a row's raw scores
        // times scale_log2 (rounding keeps the order), and a probability is
        // 2^(s * scale_log2 - m), one fused multiply-add as the backward recomputes it.
        float mx[2] = {-INFINITY, -INFINITY};
        if (kt >= diag) {
#pragma unroll
          for (int n = 0; n < kN8; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int tk = k0 + n * 8 + 2 * c + (e & 1), tq = rowi + g + 8 * (e >> 1);
              if (tk > tq) s[i][n][e] = -INFINITY;
              mx[e >> 1] = fmaxf(mx[e >> 1], s[i][n][e]);
            }
          }
        } else {
#pragma unroll
          for (int n = 0; n < kN8; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], s[i][n][e]);
          }
        }
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
          // Key 0 is in every row's first tile, so the new max is finite from then on.
          const float m_new = fmaxf(m[i][r], mx[r] * scale_log2);
          alpha[r] = Exp2Approx(m[i][r] - m_new);
          m[i][r] = m_new;
          l[i][r] *= alpha[r];
        }
#pragma unroll
        for (int n = 0; n < kN8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            s[i][n][e] = Exp2Approx(fmaf(s[i][n][e], scale_log2, -m[i][e >> 1]));
            l[i][e >> 1] += s[i][n][e];  // this thread's part of the row sum
          }
        }
        // The outputs' rescale by alpha, unless no row of the warp changed its max (alpha
        // 1 everywhere: multiplying by it would change nothing).
        if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
          ScaleRows<D>(o[i], alpha[0], alpha[1]);
        }
      }
      AccumulatePV<D, M>(o, s, sV, kLd);
    }
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }
  Y* y_head = y + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * D;
#pragma unroll
  for (int i = 0; i < M; ++i) {
    const int rowi = row0 + 16 * i;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[i][r] += __shfl_xor_sync(0xffffffffu, l[i][r], 1);
      l[i][r] += __shfl_xor_sync(0xffffffffu, l[i][r], 2);
    }
    ScaleRows<D>(o[i], 1.0f / l[i][0], 1.0f / l[i][1]);
    StoreRows<D, Y>(o[i], y_head, C, rowi, T);
    if (c == 0) {
      float* out = lse + static_cast<int64_t>(bh) * T;
      if (rowi + g < T) out[rowi + g] = m[i][0] + log2f(l[i][0]);
      if (rowi + g + 8 < T) out[rowi + g + 8] = m[i][1] + log2f(l[i][1]);
    }
  }
}

// delta[b, h, t] = <gy[b, t, h], y[b, t, h]>: grid (ceil(T / warps a block), B*H), one warp
// per t of the block's (b, h), so a row's place takes no 64-bit division. Y: fp32 or bf16.
template <int D, typename Y>
__global__ void FlashDeltaKernel(const bf16* __restrict__ gy, const Y* __restrict__ y,
                                 float* __restrict__ delta, int T, int H) {
  const int t = static_cast<int>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (t >= T) return;
  const int bh = blockIdx.y, b = bh / H, h = bh % H, lane = threadIdx.x % 32;
  const int64_t off = ((static_cast<int64_t>(b) * T + t) * H + h) * D;
  float acc = 0.0f;
#pragma unroll
  for (int d = lane; d < D; d += 32) acc += __bfloat162float(gy[off + d]) * Load(y + off + d);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) delta[static_cast<int64_t>(bh) * T + t] = acc;
}

// The score scale and the same times log2(e): p = 2^(s * scale_log2 - lse) (one fused
// multiply-add, as the forward computes it) and the score gradient without its factor
// `scale`, ds = p * (dp - delta), zero where masked; dK and dQ are multiplied by `scale` once,
// after their sums (ScaleRows), instead of every score gradient (the same bits where scale
// is a power of two, 1/8 at D = 64).
struct ScoreGrad {
  float scale, scale_log2;
};

// The dK/dV kernel's score gradients of one warp's 16 keys (key0..) x 8 N queries (q0..):
// on entry p = S^T and ds = dP^T, on exit p = P^T and ds = dS^T, zero at queries before a
// key when kDiagonal (the warp's diagonal tile; see "Masks" above for rows past T).
// `stats`: the queries' lse, and kTile floats further their delta, in shared memory (0 for
// a query past T).
template <bool kDiagonal, int N = kN8>
__device__ __forceinline__ void KeyScoreGrads(float (&p)[N][4], float (&ds)[N][4],
                                              const float* stats, int q0, int key0, ScoreGrad sg) {
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
#pragma unroll
  for (int n = 0; n < N; ++n) {
    // Columns 2c and 2c + 1: two queries, their statistics read once for both key rows.
    const float2 lse_q = *reinterpret_cast<const float2*>(stats + n * 8 + 2 * c);
    const float2 delta_q = *reinterpret_cast<const float2*>(stats + kTile + n * 8 + 2 * c);
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int tq = q0 + n * 8 + 2 * c + e;
      const float l = e ? lse_q.y : lse_q.x, d = e ? delta_q.y : delta_q.x;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int i = 2 * r + e;
        const bool live = !kDiagonal || tq >= key0 + g + 8 * r;
        p[n][i] = live ? Exp2Approx(fmaf(p[n][i], sg.scale_log2, -l)) : 0.0f;
        ds[n][i] = live ? p[n][i] * (ds[n][i] - d) : 0.0f;
      }
    }
  }
}

// The dQ kernel's score gradients of one warp's 16 queries (row0..) x 64 keys (k0..): on
// entry ds = S and dp = dP, on exit ds = dS, zero at keys after a query when kDiagonal (the
// warp's diagonal tile; see "Masks" above for rows past T); lq and dlt are rows g and
// g + 8's statistics.
template <bool kDiagonal>
__device__ __forceinline__ void QueryScoreGrads(float (&ds)[kN8][4], const float (&dp)[kN8][4],
                                                const float (&lq)[2], const float (&dlt)[2], int k0,
                                                int row0, ScoreGrad sg) {
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
#pragma unroll
  for (int n = 0; n < kN8; ++n) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = i >> 1;
      const bool live = !kDiagonal || k0 + n * 8 + 2 * c + (i & 1) <= row0 + g + 8 * r;
      const float p = live ? Exp2Approx(fmaf(ds[n][i], sg.scale_log2, -lq[r])) : 0.0f;
      ds[n][i] = p * (dp[n][i] - dlt[r]);
    }
  }
}

// dK and dV: grid (key blocks, B*H); block kb owns keys [k0, k0 + S::kRows), k0 = kb *
// S::kRows, and walks the query tiles from k0's to the end (block 0 has the most). Each
// warp's 16 keys are the rows of its transposed score tiles S^T = K Q^T and dP^T = V dO^T;
// dV += P^T dO and dK += dS^T Q stay in registers.
template <int D, typename S, typename G>
__global__ void __launch_bounds__(S::kThreads, S::kMinBlocks)
    FlashBackwardKVKernel(const bf16* __restrict__ qkv, const bf16* __restrict__ gy,
                          const float* __restrict__ lse, const float* __restrict__ delta,
                          G* __restrict__ gqkv, int T, int H, ScoreGrad sg) {
  static_assert(S::kM == 1, "the dK/dV kernel gives each warp one m-tile");
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int kLd = Dims<D>::kLd;
  bf16* sK = reinterpret_cast<bf16*>(smem);
  bf16* sV = sK + S::kRows * kLd;
  bf16* sQG = sV + S::kRows * kLd;  // buffer i: Q at sQG + 2i tiles, dO at sQG + (2i + 1) tiles
  // Buffer i of the streamed queries' lse and delta: 2 x 64 floats at sStats + 128 i.
  float* sStats = reinterpret_cast<float*>(sQG + 4 * kTile * kLd);

  const int tiles = (T + kTile - 1) / kTile;
  const int k0 = static_cast<int>(blockIdx.x) * S::kRows;
  const int first = k0 / kTile;  // the first query tile with a query at or after k0
  const int bh = blockIdx.y, b = bh / H, h = bh % H;
  const int64_t C = static_cast<int64_t>(H) * D, ld3 = 3 * C;
  const bf16* base = qkv + static_cast<int64_t>(b) * T * ld3 + static_cast<int64_t>(h) * D;
  const bf16* gbase = gy + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * D;
  const int warp = threadIdx.x / 32;
  const int key0 = k0 + warp * 16;  // this warp's first key
  // This warp's diagonal query tile, the first it needs (SkipsTiles).
  const int diag = key0 / kTile;

  LoadRowsAsync<D, S::kRows, S::kThreads>(sK, base + C, ld3, k0, T);
  LoadRowsAsync<D, S::kRows, S::kThreads>(sV, base + 2 * C, ld3, k0, T);
  LoadRowsAsync<D, kTile, S::kThreads>(sQG, base, ld3, first * kTile, T);
  LoadRowsAsync<D, kTile, S::kThreads>(sQG + kTile * kLd, gbase, C, first * kTile, T);
  const float* lse_row = lse + static_cast<int64_t>(bh) * T;
  const float* delta_row = delta + static_cast<int64_t>(bh) * T;
  const auto stats = [&](int buffer, int r0) {
    LoadStatsAsync<S::kThreads>(sStats + buffer * 2 * kTile, lse_row, delta_row, r0, T);
  };
  stats(0, first * kTile);
  CommitCopies();
  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    dk[n][0] = dk[n][1] = dk[n][2] = dk[n][3] = 0.0f;
    dv[n][0] = dv[n][1] = dv[n][2] = dv[n][3] = 0.0f;
  }
  RowsA<D, S::kHoldA> k_rows{sK + warp * 16 * kLd, kLd}, v_rows{sV + warp * 16 * kLd, kLd};
  for (int qt = first; qt < tiles; ++qt) {
    const int q0 = qt * kTile;
    const int cur = (qt - first) & 1;
    const bf16* sQ = TakePair<D, S::kThreads>(sQG, cur, qt + 1 < tiles, base, ld3, gbase, C,
                                              q0 + kTile, T, stats);
    const bf16* sG = sQ + kTile * kLd;  // dO
    if (qt == first) {                  // K and V came with the first pair
      k_rows.Load();
      v_rows.Load();
    }
    if (!SkipsTiles<S>() || (key0 < T && qt >= diag)) {
      // The tile's queries in one part of 64, or two of 32 (Halves): dV and dK take the
      // parts' products in query order, the same sums as one part.
      constexpr int kParts = S::kHalves ? 2 : 1, kN = kN8 / kParts, kCols = 8 * kN;
#pragma unroll
      for (int part = 0; part < kParts; ++part) {
        const int c0 = part * kCols;
        const bf16* q_part = sQ + c0 * kLd;
        const bf16* g_part = sG + c0 * kLd;
        const float* stats = sStats + cur * 2 * kTile + c0;
        float p[kN][4], ds[kN][4];
        ScoresBt<D, kN>(p, k_rows, q_part, kLd);   // S^T
        ScoresBt<D, kN>(ds, v_rows, g_part, kLd);  // dP^T
        if (qt == diag) {
          KeyScoreGrads<true, kN>(p, ds, stats, q0 + c0, key0, sg);
        } else {
          KeyScoreGrads<false, kN>(p, ds, stats, q0 + c0, key0, sg);
        }
        AccumulatePV<D, 1, kN>(&dv, &p, g_part, kLd);   // dV += P^T dO
        AccumulatePV<D, 1, kN>(&dk, &ds, q_part, kLd);  // dK += dS^T Q
      }
    }
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }
  G* g_out = gqkv + static_cast<int64_t>(b) * T * ld3 + static_cast<int64_t>(h) * D;
  ScaleRows<D>(dk, sg.scale, sg.scale);  // dS's factor (ScoreGrad)
  StoreRows<D, G>(dk, g_out + C, ld3, key0, T);
  StoreRows<D, G>(dv, g_out + 2 * C, ld3, key0, T);
}

// dQ: grid (query blocks, B*H), the longest query blocks first; a block owns S::kRows
// queries and walks the key tiles up to its last query's.
template <int D, typename S, typename G>
__global__ void __launch_bounds__(S::kThreads, S::kMinBlocks)
    FlashBackwardQKernel(const bf16* __restrict__ qkv, const bf16* __restrict__ gy,
                         const float* __restrict__ lse, const float* __restrict__ delta,
                         G* __restrict__ gqkv, int T, int H, ScoreGrad sg) {
  static_assert(S::kM == 1, "the dQ kernel gives each warp one m-tile");
  static_assert(!S::kHalves, "only the dK/dV kernel takes tiles in halves");
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int kLd = Dims<D>::kLd;
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  bf16* sG = sQ + S::kRows * kLd;   // dO
  bf16* sKV = sG + S::kRows * kLd;  // buffer i: K at sKV + 2i tiles, V at sKV + (2i + 1) tiles

  const int tiles = (T + kTile - 1) / kTile;
  const int blocks = (T + S::kRows - 1) / S::kRows;
  const int q0 = (blocks - 1 - static_cast<int>(blockIdx.x)) * S::kRows;
  const int last = min(tiles - 1, (q0 + S::kRows - 1) / kTile);
  const int bh = blockIdx.y, b = bh / H, h = bh % H;
  const int64_t C = static_cast<int64_t>(H) * D, ld3 = 3 * C;
  const bf16* base = qkv + static_cast<int64_t>(b) * T * ld3 + static_cast<int64_t>(h) * D;
  const bf16* gbase = gy + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * D;
  const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4;
  const int row0 = q0 + warp * 16;  // this warp's first query
  const int diag = row0 / kTile;    // the last key tile it needs (SkipsTiles)

  LoadRowsAsync<D, S::kRows, S::kThreads>(sQ, base, ld3, q0, T);
  LoadRowsAsync<D, S::kRows, S::kThreads>(sG, gbase, C, q0, T);
  LoadRowsAsync<D, kTile, S::kThreads>(sKV, base + C, ld3, 0, T);
  LoadRowsAsync<D, kTile, S::kThreads>(sKV + kTile * kLd, base + 2 * C, ld3, 0, T);
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
  RowsA<D, S::kHoldA> q_rows{sQ + warp * 16 * kLd, kLd}, g_rows{sG + warp * 16 * kLd, kLd};
  for (int kt = 0; kt <= last; ++kt) {
    const int k0 = kt * kTile;
    const bf16* sK = TakePair<D, S::kThreads>(sKV, kt & 1, kt < last, base + C, ld3, base + 2 * C,
                                              ld3, k0 + kTile, T);
    const bf16* sV = sK + kTile * kLd;
    if (kt == 0) {  // Q and dO came with the first pair
      q_rows.Load();
      g_rows.Load();
    }
    if (!SkipsTiles<S>() || (row0 < T && kt <= diag)) {
      float ds[kN8][4], dp[kN8][4];
      ScoresBt<D>(ds, q_rows, sK, kLd);  // S
      ScoresBt<D>(dp, g_rows, sV, kLd);  // dP
      if (kt == diag) {
        QueryScoreGrads<true>(ds, dp, lq, dlt, k0, row0, sg);
      } else {
        QueryScoreGrads<false>(ds, dp, lq, dlt, k0, row0, sg);
      }
      AccumulatePV<D, 1>(&dq, &ds, sK, kLd);  // dQ += dS K
    }
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }
  ScaleRows<D>(dq, sg.scale, sg.scale);  // dS's factor (ScoreGrad)
  StoreRows<D, G>(dq, gqkv + static_cast<int64_t>(b) * T * ld3 + static_cast<int64_t>(h) * D, ld3,
                  row0, T);
}

bool LaunchFits(int64_t B, int64_t T, int64_t H) {
  return B > 0 && T > 0 && H > 0 && T <= (int64_t{1} << 30) && B * H <= 65535;
}

// ---- Block shapes (NOTE [Flash block shapes] in flash_attention.h); shape 0 of each kernel
// is the reference, 64 rows of 4 warps with the registers ptxas picks. Register counts at
// sm_90 are where ptxas -v put them; occupancy goes by 8 registers a thread: 15 warps an SM
// at 129-136, 16 at 128.
// Forward at D = 64: the reference takes 128 (4 blocks an SM; ptxas spills 16 bytes);
// capped for 3 blocks, room for every value; 128 queries of 8 warps sharing each K, V tile,
// capped for 2 blocks; two m-tiles a warp (64 scores and 64 outputs a thread, 230
// registers: each K and V fragment serves two products; too many registers at D = 128).
constexpr BlockShape kForwardShapes64[] = {{4, 1, 0}, {4, 1, 3}, {8, 1, 2}, {4, 2, 0}};
constexpr BlockShape kForwardShapes128[] = {{4, 1, 0}, {8, 1, 0}};
// dK/dV at D = 64: the reference is capped at 168 (3 blocks, 16 bytes spilled); 2 blocks
// with room for every value (233 registers); 128 keys of 8 warps sharing each Q, dO tile
// (191); the last two holding their K and V fragments (241 and 240, no spills); tiles in
// halves at 3 blocks (168, no spills), holding as well (168, 8 bytes), and 8 warps at 2
// blocks (128, 24 bytes). Whole tiles capped for 4 blocks spill over 200 bytes, in halves
// 56; holding whole tiles at 3 blocks over 100.
constexpr BlockShape kKVShapes64[] = {{4, 1, 3},
                                      {4, 1, 2},
                                      {8, 1, 0},
                                      {4, 1, 2, true},
                                      {8, 1, 0, true},
                                      {4, 1, 3, false, true},
                                      {4, 1, 3, true, true},
                                      {8, 1, 2, false, true}};
// dK/dV at D = 128: whole tiles take 255 registers (2 blocks an SM), in halves 246.
constexpr BlockShape kKVShapes128[] = {{4, 1, 0}, {8, 1, 0}, {4, 1, 0, false, true}};
// dQ at D = 64: the reference takes 127 (4 blocks an SM); 3 blocks with more registers
// (166); 128 queries of 8 warps capped for 2 blocks (128); holding the Q and dO fragments
// (166, 3 blocks; capped for 4 it spills).
constexpr BlockShape kQShapes64[] = {{4, 1, 0}, {4, 1, 3}, {8, 1, 2}, {4, 1, 0, true}};
constexpr BlockShape kQShapes128[] = {{4, 1, 0}, {8, 1, 0}};
// The shape every kernel runs with the tuner off (FSDP_ATTENTION_TUNING=0): no per-width
// default has been measured to beat the reference everywhere, so the reference.
constexpr int kUntunedShape = 0;

struct ShapeList {
  const BlockShape* shapes;
  int count;
};

template <size_t N>
constexpr ShapeList List(const BlockShape (&shapes)[N]) {
  return {shapes, static_cast<int>(N)};
}

constexpr ShapeList Shapes(FlashKernel kernel, int D) {
  if (kernel == FlashKernel::kForward) {
    return D == 64 ? List(kForwardShapes64) : List(kForwardShapes128);
  }
  if (kernel == FlashKernel::kBackwardKV) return D == 64 ? List(kKVShapes64) : List(kKVShapes128);
  return D == 64 ? List(kQShapes64) : List(kQShapes128);
}

constexpr int ShapeCount(FlashKernel kernel, int D) { return Shapes(kernel, D).count; }
constexpr BlockShape ShapeOf(FlashKernel kernel, int D, int i) {
  return Shapes(kernel, D).shapes[i];
}

// Calls f(Block<...>{}) with shape `shape` of `K` at head width D as a type.
template <FlashKernel K, int D, int I = 0, typename F>
cudaError_t WithShape(int shape, F&& f) {
  if constexpr (I < ShapeCount(K, D)) {
    if (shape == I) {
      constexpr BlockShape s = ShapeOf(K, D, I);
      return f(Block<s.warps, s.m_tiles, s.min_blocks, s.hold_a, s.halves>{});
    }
    return WithShape<K, D, I + 1>(shape, f);
  } else {
    return cudaErrorInvalidValue;
  }
}

// Calls f(std::integral_constant<int, D>{}) for a head width with kernels.
template <typename F>
cudaError_t WithHeadDim(int64_t head_dim, F&& f) {
  if (head_dim == 64) return f(std::integral_constant<int, 64>{});
  if (head_dim == 128) return f(std::integral_constant<int, 128>{});
  return cudaErrorInvalidValue;
}

// One call's arguments (the backward's are null in the forward).
struct Problem {
  const bf16* qkv;
  void* y;
  bool y_bf16;
  float* lse;
  const bf16* gy;
  float* delta;
  void* gqkv;
  bool gqkv_bf16;
  int64_t B, T, H;
  float scale;
};

dim3 Grid(const Problem& p, int rows) {
  return dim3(static_cast<unsigned>((p.T + rows - 1) / rows), static_cast<unsigned>(p.B * p.H));
}

template <int D, typename S>
cudaError_t LaunchForward(const Problem& p) {
  const int bytes = Dims<D>::ForwardBytes(S::kRows);
  const auto launch = [&](auto* y) {
    using Y = std::remove_pointer_t<decltype(y)>;
    cudaError_t err = AllowSharedMemory(FlashForwardKernel<D, S, Y>, bytes);
    if (err != cudaSuccess) return err;
    FlashForwardKernel<D, S, Y><<<Grid(p, S::kRows), S::kThreads, bytes>>>(
        p.qkv, y, p.lse, static_cast<int>(p.T), static_cast<int>(p.H), p.scale * kLog2e);
    return cudaGetLastError();
  };
  return p.y_bf16 ? launch(static_cast<bf16*>(p.y)) : launch(static_cast<float*>(p.y));
}

template <int D>
cudaError_t LaunchDelta(const Problem& p) {
  constexpr int kRowsPerBlock = 8;
  const dim3 grid(static_cast<unsigned>((p.T + kRowsPerBlock - 1) / kRowsPerBlock),
                  static_cast<unsigned>(p.B * p.H));
  const int T = static_cast<int>(p.T), H = static_cast<int>(p.H);
  if (p.y_bf16) {
    FlashDeltaKernel<D, bf16>
        <<<grid, 32 * kRowsPerBlock>>>(p.gy, static_cast<const bf16*>(p.y), p.delta, T, H);
  } else {
    FlashDeltaKernel<D, float>
        <<<grid, 32 * kRowsPerBlock>>>(p.gy, static_cast<const float*>(p.y), p.delta, T, H);
  }
  return cudaGetLastError();
}

// The dK/dV (kv) or dQ kernel of shape S.
template <int D, typename S, bool kv>
cudaError_t LaunchBackward(const Problem& p) {
  const int bytes = Dims<D>::BackwardBytes(S::kRows, kv);
  const ScoreGrad sg{p.scale, p.scale * kLog2e};
  const int T = static_cast<int>(p.T), H = static_cast<int>(p.H);
  const auto launch = [&](auto* g) {
    using G = std::remove_pointer_t<decltype(g)>;
    const auto kernel = [] {
      if constexpr (kv) {
        return FlashBackwardKVKernel<D, S, G>;
      } else {
        return FlashBackwardQKernel<D, S, G>;
      }
    }();
    cudaError_t err = AllowSharedMemory(kernel, bytes);
    if (err != cudaSuccess) return err;
    kernel<<<Grid(p, S::kRows), S::kThreads, bytes>>>(p.qkv, p.gy, p.lse, p.delta, g, T, H, sg);
    return cudaGetLastError();
  };
  return p.gqkv_bf16 ? launch(static_cast<bf16*>(p.gqkv)) : launch(static_cast<float*>(p.gqkv));
}

template <int D>
cudaError_t Run(FlashKernel kernel, const Problem& p, int shape) {
  switch (kernel) {
    case FlashKernel::kForward:
      return WithShape<FlashKernel::kForward, D>(
          shape, [&](auto block) { return LaunchForward<D, decltype(block)>(p); });
    case FlashKernel::kBackwardKV:
      return WithShape<FlashKernel::kBackwardKV, D>(
          shape, [&](auto block) { return LaunchBackward<D, decltype(block), true>(p); });
    case FlashKernel::kBackwardQ:
      return WithShape<FlashKernel::kBackwardQ, D>(
          shape, [&](auto block) { return LaunchBackward<D, decltype(block), false>(p); });
  }
  return cudaErrorInvalidValue;
}

// ---- The tuner (NOTE [Flash block shapes]).
struct TuneKey {
  int device, kernel;
  int64_t B, T, H, D;
  bool y_bf16, gqkv_bf16;
  bool operator<(const TuneKey& o) const {
    return std::tie(device, B, T, H, D, kernel, y_bf16, gqkv_bf16) <
           std::tie(o.device, o.B, o.T, o.H, o.D, o.kernel, o.y_bf16, o.gqkv_bf16);
  }
};

struct Choice {
  int shape;
  std::string report;
};

std::mutex& TuneMutex() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}
std::map<TuneKey, Choice>& Choices() {
  static auto* choices = new std::map<TuneKey, Choice>;
  return *choices;
}

const char* KernelName(FlashKernel kernel) {
  return kernel == FlashKernel::kForward      ? "forward"
         : kernel == FlashKernel::kBackwardKV ? "dK/dV"
                                              : "dQ";
}

// What a kernel writes, as 2-D ranges of bytes (rows of `width` bytes, `pitch` apart): y and
// lse (forward), or its columns of dL/dqkv (dK/dV: [C, 3C), dQ: [0, C) of each row).
struct Region {
  void* data;
  size_t pitch, width, rows;
};

std::vector<Region> Written(FlashKernel kernel, const Problem& p, int64_t D) {
  const int64_t C = p.H * D;
  const size_t rows = static_cast<size_t>(p.B * p.T);
  if (kernel == FlashKernel::kForward) {
    const size_t y_row = static_cast<size_t>(C) * (p.y_bf16 ? 2 : 4);
    const size_t lse_row = static_cast<size_t>(p.T) * 4;  // [B, H, T]: B H rows of T
    return {{p.y, y_row, y_row, rows}, {p.lse, lse_row, lse_row, static_cast<size_t>(p.B * p.H)}};
  }
  const size_t elem = p.gqkv_bf16 ? 2 : 4;
  const bool kv = kernel == FlashKernel::kBackwardKV;
  return {{static_cast<char*>(p.gqkv) + (kv ? C : 0) * elem, 3 * C * elem, (kv ? 2 : 1) * C * elem,
           rows}};
}

// Fills what the kernel writes with 0xff bytes (NaN in bf16 and fp32), so that an element
// a shape leaves unwritten cannot match the reference.
cudaError_t Poison(FlashKernel kernel, const Problem& p, int64_t D) {
  for (const Region& r : Written(kernel, p, D)) {
    const cudaError_t err = cudaMemset2D(r.data, r.pitch, 0xff, r.width, r.rows);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

// What the kernel wrote, read back to the host.
cudaError_t ReadOutputs(FlashKernel kernel, const Problem& p, int64_t D,
                        std::vector<unsigned char>* out) {
  const std::vector<Region> regions = Written(kernel, p, D);
  size_t total = 0;
  for (const Region& r : regions) total += r.width * r.rows;
  out->resize(total);
  size_t at = 0;
  for (const Region& r : regions) {
    const cudaError_t err = cudaMemcpy2D(out->data() + at, r.width, r.data, r.pitch, r.width,
                                         r.rows, cudaMemcpyDeviceToHost);
    if (err != cudaSuccess) return err;
    at += r.width * r.rows;
  }
  return cudaSuccess;
}

// Runs every shape of `kernel` on p (shape 0 first, the reference), each on outputs filled
// with 0xff, keeps those that launch and write shape 0's bytes, times each kept one (the
// fastest of kTimedRuns launches) and returns the fastest in `choice`. The outputs end as
// every kept shape writes them.
template <int D>
cudaError_t Tune(FlashKernel kernel, const Problem& p, Choice* choice) {
  constexpr int kTimedRuns = 3;
  const int count = ShapeCount(kernel, D);
  std::vector<unsigned char> reference, outputs;
  cudaError_t err = Poison(kernel, p, D);
  if (err == cudaSuccess) err = Run<D>(kernel, p, 0);
  if (err == cudaSuccess) err = ReadOutputs(kernel, p, D, &reference);
  if (err != cudaSuccess) return err;
  std::vector<std::string> notes(count);
  std::vector<bool> kept(count, false);
  kept[0] = true;
  for (int i = 1; i < count; ++i) {
    if ((err = Poison(kernel, p, D)) != cudaSuccess) return err;
    err = Run<D>(kernel, p, i);
    if (err != cudaSuccess) {
      notes[i] = std::string("failed to launch (") + cudaGetErrorString(err) + ")";
      cudaGetLastError();  // a launch error is not sticky; a fault would show below
      continue;
    }
    if ((err = ReadOutputs(kernel, p, D, &outputs)) != cudaSuccess) return err;
    if (outputs != reference) {
      notes[i] = "differs from shape 0 (not used)";
    } else {
      kept[i] = true;
    }
  }
  cudaEvent_t start, stop;
  if ((err = cudaEventCreate(&start)) != cudaSuccess) return err;
  if ((err = cudaEventCreate(&stop)) != cudaSuccess) {
    cudaEventDestroy(start);
    return err;
  }
  choice->shape = 0;
  float best = 0.0f;
  for (int i = 0; i < count && err == cudaSuccess; ++i) {
    if (!kept[i]) continue;
    float fastest = 0.0f;
    for (int run = 0; run < kTimedRuns && err == cudaSuccess; ++run) {
      float ms = 0.0f;
      err = cudaEventRecord(start, 0);
      if (err == cudaSuccess) err = Run<D>(kernel, p, i);
      if (err == cudaSuccess) err = cudaEventRecord(stop, 0);
      if (err == cudaSuccess) err = cudaEventSynchronize(stop);
      if (err == cudaSuccess) err = cudaEventElapsedTime(&ms, start, stop);
      if (run == 0 || ms < fastest) fastest = ms;
    }
    char text[32];
    snprintf(text, sizeof(text), "%.3f ms", fastest);
    notes[i] = text;
    if (i == 0 || fastest < best) choice->shape = i, best = fastest;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (err != cudaSuccess) return err;
  choice->report = std::string(KernelName(kernel)) + ":";
  for (int i = 0; i < count; ++i) {
    choice->report += std::string(i == 0 ? " " : ", ") + FlashShapeName(kernel, D, i) + " " +
                      notes[i] + (i == choice->shape ? " (chosen)" : "");
  }
  return cudaSuccess;
}

// Runs `kernel` with the pinned shape; unpinned, with the shape the environment's switches
// fix, or the tuned one (tuning on the first call).
template <int D>
cudaError_t RunChosen(FlashKernel kernel, const Problem& p, int shape) {
  if (shape < -1 || shape >= ShapeCount(kernel, D)) return cudaErrorInvalidValue;
  if (shape >= 0) return Run<D>(kernel, p, shape);
  // An unknown FSDP_ATTENTION_SHAPES: nn's fused attention refuses it first, naming it.
  const absl::StatusOr<FlashShapePolicy>& policy = FlashShapePolicyFromEnvironment();
  if (!policy.ok()) return cudaErrorInvalidValue;
  if (policy->mode == FlashShapeMode::kReference) return Run<D>(kernel, p, 0);
  if (policy->mode == FlashShapeMode::kUntuned) return Run<D>(kernel, p, kUntunedShape);
  TuneKey key{0,        static_cast<int>(kernel),
              p.B,      p.T,
              p.H,      D,
              p.y_bf16, kernel != FlashKernel::kForward && p.gqkv_bf16};
  cudaError_t err = cudaGetDevice(&key.device);
  if (err != cudaSuccess) return err;
  std::lock_guard<std::mutex> lock(TuneMutex());
  auto it = Choices().find(key);
  if (it != Choices().end()) return Run<D>(kernel, p, it->second.shape);
  Choice choice;
  if ((err = Tune<D>(kernel, p, &choice)) != cudaSuccess) return err;
  Choices().emplace(key, std::move(choice));
  return cudaSuccess;  // tuning left the outputs written (every kept shape's bits)
}

}  // namespace

int FlashShapeCount(FlashKernel kernel, int64_t head_dim) {
  return FlashAttentionSupports(head_dim) ? ShapeCount(kernel, static_cast<int>(head_dim)) : 0;
}

std::string FlashShapeName(FlashKernel kernel, int64_t head_dim, int shape) {
  if (shape < 0 || shape >= FlashShapeCount(kernel, head_dim)) return "no such shape";
  const BlockShape s = ShapeOf(kernel, static_cast<int>(head_dim), shape);
  std::string name = std::to_string(16 * s.warps * s.m_tiles) +
                     (kernel == FlashKernel::kBackwardKV ? " keys, " : " queries, ") +
                     std::to_string(s.warps) + " warps";
  if (s.m_tiles > 1) name += ", " + std::to_string(s.m_tiles) + " m-tiles a warp";
  if (s.min_blocks > 1) name += ", registers for " + std::to_string(s.min_blocks) + " blocks an SM";
  if (s.hold_a) name += ", fixed operands in registers";
  if (s.halves) name += ", tiles in halves";
  return name;
}

std::string FlashTuningReport(int64_t B, int64_t T, int64_t H, int64_t head_dim) {
  const absl::StatusOr<FlashShapePolicy>& policy = FlashShapePolicyFromEnvironment();
  if (!policy.ok()) {
    return "every unpinned call fails: " + std::string(policy.status().message());
  }
  if (policy->mode != FlashShapeMode::kTuned) {
    const int shape = policy->mode == FlashShapeMode::kReference ? 0 : kUntunedShape;
    std::string report = "tuning off (" + policy->switch_text + "):";
    for (const FlashKernel kernel :
         {FlashKernel::kForward, FlashKernel::kBackwardKV, FlashKernel::kBackwardQ}) {
      report += std::string(kernel == FlashKernel::kForward ? " " : "; ") + KernelName(kernel) +
                ": " + FlashShapeName(kernel, head_dim, shape);
    }
    return report;
  }
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return "";
  std::lock_guard<std::mutex> lock(TuneMutex());
  std::string report;
  for (const auto& [key, choice] : Choices()) {
    if (key.device != device || key.B != B || key.T != T || key.H != H || key.D != head_dim) {
      continue;
    }
    report += (report.empty() ? "" : "; ") + choice.report;
  }
  return report;
}

cudaError_t FlashAttentionForward(const uint16_t* qkv, void* y, bool y_bf16, float* lse, int64_t B,
                                  int64_t T, int64_t H, int64_t head_dim, float scale,
                                  const FlashShapes& shapes) {
  if (!LaunchFits(B, T, H)) return cudaErrorInvalidValue;
  const Problem p{reinterpret_cast<const bf16*>(qkv),
                  y,
                  y_bf16,
                  lse,
                  nullptr,
                  nullptr,
                  nullptr,
                  false,
                  B,
                  T,
                  H,
                  scale};
  return WithHeadDim(head_dim, [&](auto d) {
    return RunChosen<decltype(d)::value>(FlashKernel::kForward, p, shapes.forward);
  });
}

cudaError_t FlashAttentionBackward(const uint16_t* qkv, const void* y, bool y_bf16,
                                   const uint16_t* gy, const float* lse, float* delta, void* gqkv,
                                   bool gqkv_bf16, int64_t B, int64_t T, int64_t H,
                                   int64_t head_dim, float scale, const FlashShapes& shapes) {
  if (!LaunchFits(B, T, H)) return cudaErrorInvalidValue;
  const Problem p{reinterpret_cast<const bf16*>(qkv),
                  const_cast<void*>(y),
                  y_bf16,
                  const_cast<float*>(lse),
                  reinterpret_cast<const bf16*>(gy),
                  delta,
                  gqkv,
                  gqkv_bf16,
                  B,
                  T,
                  H,
                  scale};
  return WithHeadDim(head_dim, [&](auto d) {
    constexpr int D = decltype(d)::value;
    cudaError_t err = LaunchDelta<D>(p);
    if (err == cudaSuccess) err = RunChosen<D>(FlashKernel::kBackwardKV, p, shapes.backward_kv);
    if (err == cudaSuccess) err = RunChosen<D>(FlashKernel::kBackwardQ, p, shapes.backward_q);
    return err;
  });
}

}  // namespace cuda
}  // namespace kernels
