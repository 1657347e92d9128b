// CPU launchers of the Llama layers' bodies (kernels/cpu/kernels.h): SwiGLU's silu(a) * b
// and the rotary embedding packed with grouped-query attention's head expansion (RMSNorm
// runs on LayerNorm's loops in kernels/cpu/kernels.cc). Compiled with CPU_LOOP_COPTS
// (kernels/cpu_loops.bzl): the rules of kernels/cpu.h, as kernels/cpu/kernels.cc.
#include <stdint.h>

#include "kernels/cpu.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu_runtime.h"
#include "kernels/elementwise.h"
#include "kernels/math.h"

namespace kernels {
namespace cpu {
namespace {

namespace k = ::kernels;

// Elementwise chunks start on 64-byte lines (16 floats).
constexpr int64_t kAlign = 16;

// ---- SwiGLU; each output fp32 or bf16 (k::Store: the fp32 value rounded once).

template <typename H>
FSDP_CPU_INLINE void SiluMulElements(const float* FSDP_RESTRICT a, const float* FSDP_RESTRICT b,
                                     H* FSDP_RESTRICT h, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) k::Store(h, i, k::SiluMulForward(a[i], b[i]));
}
#define FSDP_SILU_MUL_LOOP(H)                                                         \
  FSDP_CPU_CLONES void SiluMulLoop(const float* a, const float* b, H* h, int64_t n) { \
    SiluMulElements(a, b, h, n);                                                      \
  }
FSDP_SILU_MUL_LOOP(float)
FSDP_SILU_MUL_LOOP(uint16_t)
#undef FSDP_SILU_MUL_LOOP

template <typename GA, typename GB>
FSDP_CPU_INLINE void SiluMulBackwardElements(const float* FSDP_RESTRICT a,
                                             const float* FSDP_RESTRICT b,
                                             const float* FSDP_RESTRICT gh, GA* FSDP_RESTRICT ga,
                                             GB* FSDP_RESTRICT gb, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    k::Store(ga, i, k::SiluMulGradGate(a[i], b[i], gh[i]));
    k::Store(gb, i, k::SiluMulGradUp(a[i], gh[i]));
  }
}
#define FSDP_SILU_MUL_BACKWARD_LOOP(GA, GB)                                                 \
  FSDP_CPU_CLONES void SiluMulBackwardLoop(const float* a, const float* b, const float* gh, \
                                           GA* ga, GB* gb, int64_t n) {                     \
    SiluMulBackwardElements(a, b, gh, ga, gb, n);                                           \
  }
FSDP_SILU_MUL_BACKWARD_LOOP(float, float)
FSDP_SILU_MUL_BACKWARD_LOOP(float, uint16_t)
FSDP_SILU_MUL_BACKWARD_LOOP(uint16_t, float)
FSDP_SILU_MUL_BACKWARD_LOOP(uint16_t, uint16_t)
#undef FSDP_SILU_MUL_BACKWARD_LOOP

// ---- Rotary embedding and the grouped heads; each output fp32 or bf16.

// y = the head x of width 2 half turned by the angles whose cosines are c and sines
// sign * s (sign -1: the inverse rotation).
template <typename Y>
FSDP_CPU_INLINE void RotateHead(const float* FSDP_RESTRICT x, const float* FSDP_RESTRICT c,
                                const float* FSDP_RESTRICT s, float sign, Y* FSDP_RESTRICT y,
                                int64_t half) {
#pragma omp simd
  for (int64_t i = 0; i < half; ++i) {
    k::Store(y, i, k::RotaryRotate(x[i], x[half + i], c[i], sign * s[i], true));
  }
#pragma omp simd
  for (int64_t i = 0; i < half; ++i) {
    k::Store(y, half + i, k::RotaryRotate(x[half + i], x[i], c[i], sign * s[i], false));
  }
}

// Rows [first, end) of RotaryPackQkv.
template <typename Y>
FSDP_CPU_INLINE void RotaryPackRows(const float* FSDP_RESTRICT q, const float* FSDP_RESTRICT key,
                                    const float* FSDP_RESTRICT v, const float* cos,
                                    const float* sin, Y* FSDP_RESTRICT qkv, int64_t first,
                                    int64_t end, int64_t T, int64_t H, int64_t KV, int64_t D) {
  const int64_t C = H * D, KW = KV * D, half = D / 2, group = H / KV;
  for (int64_t r = first; r < end; ++r) {
    const float* c = cos + (r % T) * half;
    const float* s = sin + (r % T) * half;
    Y* out = qkv + r * 3 * C;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t src = r * KW + (h / group) * D;
      RotateHead(q + r * C + h * D, c, s, 1.0f, out + h * D, half);
      RotateHead(key + src, c, s, 1.0f, out + C + h * D, half);
      Y* vo = out + 2 * C + h * D;
#pragma omp simd
      for (int64_t j = 0; j < D; ++j) k::Store(vo, j, v[src + j]);
    }
  }
}
#define FSDP_ROTARY_PACK_LOOP(Y)                                                                  \
  FSDP_CPU_CLONES void RotaryPackLoop(const float* q, const float* key, const float* v,           \
                                      const float* cos, const float* sin, Y* qkv, int64_t first,  \
                                      int64_t end, int64_t T, int64_t H, int64_t KV, int64_t D) { \
    RotaryPackRows(q, key, v, cos, sin, qkv, first, end, T, H, KV, D);                            \
  }
FSDP_ROTARY_PACK_LOOP(float)
FSDP_ROTARY_PACK_LOOP(uint16_t)
#undef FSDP_ROTARY_PACK_LOOP

// Rows [first, end) of RotaryPackQkvBackward's gq: the q columns of gqkv turned back.
template <typename G>
FSDP_CPU_INLINE void RotaryBackQRows(const float* FSDP_RESTRICT gqkv, const float* cos,
                                     const float* sin, G* FSDP_RESTRICT gq, int64_t first,
                                     int64_t end, int64_t T, int64_t H, int64_t D) {
  const int64_t C = H * D, half = D / 2;
  for (int64_t r = first; r < end; ++r) {
    const float* c = cos + (r % T) * half;
    const float* s = sin + (r % T) * half;
    const float* g = gqkv + r * 3 * C;
    for (int64_t h = 0; h < H; ++h) RotateHead(g + h * D, c, s, -1.0f, gq + r * C + h * D, half);
  }
}
// Rows [first, end) of RotaryPackQkvBackward's gk (`rotate`: turned back; gqkv's k columns
// at `offset` C) or gv (its v columns at 2C): each kv head's element the sum over its
// group's heads in head order (k::RotaryGroupSum, as the CUDA kernel adds them), a k pair
// turned back from its two sums.
template <typename G>
FSDP_CPU_INLINE void RotaryBackKvRows(const float* FSDP_RESTRICT gqkv, const float* cos,
                                      const float* sin, int64_t offset, bool rotate,
                                      G* FSDP_RESTRICT out, int64_t first, int64_t end, int64_t T,
                                      int64_t H, int64_t KV, int64_t D) {
  const int64_t C = H * D, KW = KV * D, half = D / 2, group = H / KV;
  for (int64_t r = first; r < end; ++r) {
    const float* c = cos + (r % T) * half;
    const float* s = sin + (r % T) * half;
    for (int64_t kv = 0; kv < KV; ++kv) {
      const float* g0 = gqkv + r * 3 * C + offset + kv * group * D;
      G* o = out + r * KW + kv * D;
      if (rotate) {
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const float a = k::RotaryGroupSum(g0, i, group, D);
          const float b = k::RotaryGroupSum(g0, half + i, group, D);
          k::Store(o, i, k::RotaryRotate(a, b, c[i], -1.0f * s[i], true));
          k::Store(o, half + i, k::RotaryRotate(b, a, c[i], -1.0f * s[i], false));
        }
      } else {
#pragma omp simd
        for (int64_t j = 0; j < D; ++j) k::Store(o, j, k::RotaryGroupSum(g0, j, group, D));
      }
    }
  }
}
#define FSDP_ROTARY_BACKWARD_LOOPS(G)                                                             \
  FSDP_CPU_CLONES void RotaryBackQLoop(const float* gqkv, const float* cos, const float* sin,     \
                                       G* gq, int64_t first, int64_t end, int64_t T, int64_t H,   \
                                       int64_t D) {                                               \
    RotaryBackQRows(gqkv, cos, sin, gq, first, end, T, H, D);                                     \
  }                                                                                               \
  FSDP_CPU_CLONES void RotaryBackKvLoop(                                                          \
      const float* gqkv, const float* cos, const float* sin, int64_t offset, bool rotate, G* out, \
      int64_t first, int64_t end, int64_t T, int64_t H, int64_t KV, int64_t D) {                  \
    RotaryBackKvRows(gqkv, cos, sin, offset, rotate, out, first, end, T, H, KV, D);               \
  }
FSDP_ROTARY_BACKWARD_LOOPS(float)
FSDP_ROTARY_BACKWARD_LOOPS(uint16_t)
#undef FSDP_ROTARY_BACKWARD_LOOPS

}  // namespace

void SiluMulForward(const float* a, const float* b, void* h, int64_t n, bool h_bf16) {
  k::WithStored(h, h_bf16, [&](auto* hp) {
    ParallelChunks(IntraOpThreads(), n, n, kAlign,
                   [&](int64_t s, int64_t e) { SiluMulLoop(a + s, b + s, hp + s, e - s); });
  });
}

void SiluMulBackward(const float* a, const float* b, const float* gh, void* ga, void* gb, int64_t n,
                     bool ga_bf16, bool gb_bf16) {
  k::WithStored(ga, ga_bf16, [&](auto* gap) {
    k::WithStored(gb, gb_bf16, [&](auto* gbp) {
      ParallelChunks(IntraOpThreads(), n, n, kAlign, [&](int64_t s, int64_t e) {
        SiluMulBackwardLoop(a + s, b + s, gh + s, gap + s, gbp + s, e - s);
      });
    });
  });
}

void RotaryPackQkv(const float* q, const float* k, const float* v, const float* cos,
                   const float* sin, void* qkv, int64_t rows, int64_t T, int64_t H, int64_t KV,
                   int64_t D, bool qkv_bf16) {
  k::WithStored(qkv, qkv_bf16, [&](auto* out) {
    ParallelChunks(IntraOpThreads(), rows, rows * 3 * H * D, 1, [&](int64_t s, int64_t e) {
      RotaryPackLoop(q, k, v, cos, sin, out, s, e, T, H, KV, D);
    });
  });
}

void RotaryPackQkvBackward(const float* gqkv, const float* cos, const float* sin, void* gq,
                           void* gk, void* gv, int64_t rows, int64_t T, int64_t H, int64_t KV,
                           int64_t D, bool gq_bf16, bool gk_bf16, bool gv_bf16) {
  const int64_t C = H * D;
  ParallelChunks(IntraOpThreads(), rows, rows * 3 * C, 1, [&](int64_t s, int64_t e) {
    k::WithStored(gq, gq_bf16,
                  [&](auto* out) { RotaryBackQLoop(gqkv, cos, sin, out, s, e, T, H, D); });
    k::WithStored(gk, gk_bf16, [&](auto* out) {
      RotaryBackKvLoop(gqkv, cos, sin, C, /*rotate=*/true, out, s, e, T, H, KV, D);
    });
    k::WithStored(gv, gv_bf16, [&](auto* out) {
      RotaryBackKvLoop(gqkv, cos, sin, 2 * C, /*rotate=*/false, out, s, e, T, H, KV, D);
    });
  });
}

}  // namespace cpu
}  // namespace kernels
