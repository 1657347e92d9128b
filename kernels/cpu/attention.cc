// Fused causal attention on the CPU (kernels/cpu/kernels.h): the math of
// kernels/cuda/flash_attention.cu, one (batch, head) pair per task.
#include <cmath>
#include <vector>

#include "core/bf16_hd.h"
#include "kernels/cpu.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu_runtime.h"
#include "kernels/math.h"
#include "kernels/rowwise.h"

namespace kernels {
namespace cpu {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

float Widen(uint16_t bits) { return core::Bf16BitsToFloat(bits); }
float RoundBf16(float v) { return core::Bf16BitsToFloat(core::FloatToBf16Bits(v)); }

// One head's rows as fp32 (the bf16 values widened exactly): [T, D] from a [T, ld] buffer.
std::vector<float> Head(const uint16_t* src, int64_t T, int64_t ld, int64_t D) {
  std::vector<float> out(static_cast<size_t>(T * D));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t d = 0; d < D; ++d) out[t * D + d] = Widen(src[t * ld + d]);
  }
  return out;
}

// kernels::Load and kernels::Store on a buffer whose dtype (fp32 or bf16) is a flag.
float At(const void* t, bool bf16, int64_t i) {
  return bf16 ? Load(static_cast<const uint16_t*>(t), i) : Load(static_cast<const float*>(t), i);
}
void Put(void* t, bool bf16, int64_t i, float v) {
  if (bf16) {
    Store(static_cast<uint16_t*>(t), i, v);
  } else {
    Store(static_cast<float*>(t), i, v);
  }
}

float Dot(const float* a, const float* b, int64_t D) {
  float acc = 0.0f;
  for (int64_t d = 0; d < D; ++d) acc += a[d] * b[d];
  return acc;
}

// One head's q, k and v rows, widened to fp32.
struct HeadQkv {
  std::vector<float> q, k, v;
};

// Calls f(b, h, head) for every (batch element, head) pair with that head's q, k and v from
// qkv [B, T, 3C], split over the intra-op threads.
template <typename F>
void ForEachHead(const uint16_t* qkv, int64_t B, int64_t T, int64_t H, int64_t D, const F& f) {
  const int64_t C = H * D, ld3 = 3 * C;
  ParallelChunks(IntraOpThreads(), B * H, B * H * T * T * D, 1, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) {
      const int64_t b = i / H, h = i % H;
      const uint16_t* base = qkv + b * T * ld3 + h * D;
      const HeadQkv head{Head(base, T, ld3, D), Head(base + C, T, ld3, D),
                         Head(base + 2 * C, T, ld3, D)};
      f(b, h, head);
    }
  });
}

}  // namespace

void FlashAttentionForward(const uint16_t* qkv, void* y, bool y_bf16, float* lse, int64_t B,
                           int64_t T, int64_t H, int64_t D, float scale) {
  const int64_t C = H * D;
  const float scale_log2 = scale * kLog2e;
  ForEachHead(qkv, B, T, H, D, [&](int64_t b, int64_t h, const HeadQkv& head) {
    const std::vector<float>&q = head.q, &k = head.k, &v = head.v;
    std::vector<float> o(static_cast<size_t>(D)), s(static_cast<size_t>(kFlashTile));
    for (int64_t t = 0; t < T; ++t) {
      float m = -INFINITY, l = 0.0f;
      std::fill(o.begin(), o.end(), 0.0f);
      for (int64_t k0 = 0; k0 <= t; k0 += kFlashTile) {
        const int64_t n = std::min(kFlashTile, t + 1 - k0);  // keys k0 .. k0 + n - 1 <= t
        float mx = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          s[j] = Dot(&q[t * D], &k[(k0 + j) * D], D) * scale_log2;
          mx = std::max(mx, s[j]);
        }
        const float m_new = std::max(m, mx), alpha = std::exp2(m - m_new);
        l *= alpha;
        for (float& x : o) x *= alpha;
        for (int64_t j = 0; j < n; ++j) {
          const float p = std::exp2(s[j] - m_new);
          l += p;
          const float pb = RoundBf16(p);
          const float* vj = &v[(k0 + j) * D];
          for (int64_t d = 0; d < D; ++d) o[d] += pb * vj[d];
        }
        m = m_new;
      }
      const int64_t out = (b * T + t) * C + h * D;
      for (int64_t d = 0; d < D; ++d) Put(y, y_bf16, out + d, o[d] / l);
      lse[(b * H + h) * T + t] = m + std::log2(l);
    }
  });
}

void FlashAttentionBackward(const uint16_t* qkv, const void* y, bool y_bf16, const uint16_t* gy,
                            const float* lse, float* delta, void* gqkv, bool gqkv_bf16, int64_t B,
                            int64_t T, int64_t H, int64_t D, float scale) {
  const int64_t C = H * D, ld3 = 3 * C;
  const float scale_log2 = scale * kLog2e;
  ForEachHead(qkv, B, T, H, D, [&](int64_t b, int64_t h, const HeadQkv& head) {
    const std::vector<float>&q = head.q, &k = head.k, &v = head.v;
    const std::vector<float> g = Head(gy + b * T * C + h * D, T, C, D);
    float* dl = delta + (b * H + h) * T;
    const float* ls = lse + (b * H + h) * T;
    for (int64_t t = 0; t < T; ++t) {
      // <gy, y> in the order of Dot, y widened exactly when bf16.
      const int64_t row = (b * T + t) * C + h * D;
      float acc = 0.0f;
      for (int64_t d = 0; d < D; ++d) acc += g[t * D + d] * At(y, y_bf16, row + d);
      dl[t] = acc;
    }
    std::vector<float> dq(static_cast<size_t>(T * D)), dk(dq.size()), dv(dq.size());
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j <= t; ++j) {
        const float p = std::exp2(Dot(&q[t * D], &k[j * D], D) * scale_log2 - ls[t]);
        const float dp = Dot(&g[t * D], &v[j * D], D);
        const float ds = RoundBf16(p * (dp - dl[t]) * scale), pb = RoundBf16(p);
        for (int64_t d = 0; d < D; ++d) {
          dq[t * D + d] += ds * k[j * D + d];
          dk[j * D + d] += ds * q[t * D + d];
          dv[j * D + d] += pb * g[t * D + d];
        }
      }
    }
    const int64_t out = b * T * ld3 + h * D;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t d = 0; d < D; ++d) {
        Put(gqkv, gqkv_bf16, out + t * ld3 + d, dq[t * D + d]);
        Put(gqkv, gqkv_bf16, out + t * ld3 + C + d, dk[t * D + d]);
        Put(gqkv, gqkv_bf16, out + t * ld3 + 2 * C + d, dv[t * D + d]);
      }
    }
  });
}

}  // namespace cpu
}  // namespace kernels
