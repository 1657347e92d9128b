// Elementwise kernel bodies: GELU (tanh form) forward and backward, ReLU, residual add,
// bias add, embedding gather, SwiGLU's silu(a) * b and the rotary position embedding. Each is one
// element's math, written once: CPU loops (kernels/cpu/kernels.cc) and CUDA grid-stride kernels
// (kernels/cuda/kernels.cu) call the same function, so the CPU tests check the math the GPU runs.
//
//   for (int64_t i = 0; i < n; ++i) y[i] = kernels::GeluTanhForward(x[i]);
#ifndef KERNELS_ELEMENTWISE_H_
#define KERNELS_ELEMENTWISE_H_

#include <stdint.h>

#include "core/hd.h"
#include "kernels/math.h"

namespace kernels {

constexpr float kGeluSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoeff = 0.044715f;

// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), PyTorch's approximate='tanh', with
// tanh from FastTanh (kernels/math.h): within 1e-6 * (1 + |x|) of the exact form
// (kernels/kernels_test.cc), about three times faster than libm's tanhf on the CPU.
FSDP_HD inline float GeluTanhForward(float x) {
  const float inner = kGeluSqrt2OverPi * (x + kGeluCoeff * x * x * x);
  return 0.5f * x * (1.0f + FastTanh(inner));
}

// d GeluTanhForward / dx at x.
FSDP_HD inline float GeluTanhDerivative(float x) {
  const float x2 = x * x;
  const float inner = kGeluSqrt2OverPi * (x + kGeluCoeff * x2 * x);
  const float t = FastTanh(inner);
  const float d_inner = kGeluSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * x2);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * d_inner;
}

// dL/dx from dL/dy = g at input x.
FSDP_HD inline float GeluTanhBackward(float x, float g) { return g * GeluTanhDerivative(x); }

// max(x, 0).
FSDP_HD inline float ReluForward(float x) { return x > 0.0f ? x : 0.0f; }

// dL/dx from the forward output y and dL/dy = g (0 where y == 0, PyTorch's convention).
FSDP_HD inline float ReluBackward(float y, float g) { return y > 0.0f ? g : 0.0f; }

// y + bias[j]: element j of a row plus the bias (fp32 or bf16).
template <typename W>
FSDP_HD inline float BiasAdd(float y, const W* bias, int64_t j) {
  return y + Load(bias, j);
}

// NOTE [GEMM epilogues] (nn/tensor_ops.h): what a GEMM does to each element p of its
// product before storing it. The numbering is nn::GemmEpilogue's.
enum GemmEpilogueKind : int {
  kGemmEpilogueNone = 0,
  kGemmEpilogueBias = 1,          // p + bias[j]
  kGemmEpilogueBiasGelu = 2,      // GELU(p + bias[j]); p + bias[j] also stored (aux)
  kGemmEpilogueDGelu = 3,         // p * GELU'(aux), aux the pre-activation as stored
  kGemmEpilogueBiasResidual = 4,  // aux + (p + bias[j]), aux the residual (read)
  kGemmEpilogueResidual = 5,      // aux + p, aux the residual (read)
};

// The pre-activation of column j: p plus the bias where the epilogue adds one.
template <typename W>
FSDP_HD inline float GemmEpiloguePre(int kind, float p, const W* bias, int64_t j) {
  return kind == kGemmEpilogueBias || kind == kGemmEpilogueBiasGelu ||
                 kind == kGemmEpilogueBiasResidual
             ? BiasAdd(p, bias, j)
             : p;
}

// Whether the epilogue reads aux (the saved pre-activation, the residual).
FSDP_HD inline bool GemmEpilogueReadsAux(int kind) {
  return kind == kGemmEpilogueDGelu || kind == kGemmEpilogueBiasResidual ||
         kind == kGemmEpilogueResidual;
}

// The value the GEMM stores from the pre-activation and `aux` (widened from its stored
// dtype) where the epilogue reads it.
FSDP_HD inline float GemmEpilogueOut(int kind, float pre, float aux) {
  if (kind == kGemmEpilogueBiasGelu) return GeluTanhForward(pre);
  if (kind == kGemmEpilogueDGelu) return GeluTanhBackward(aux, pre);
  if (kind == kGemmEpilogueBiasResidual || kind == kGemmEpilogueResidual) return aux + pre;
  return pre;
}

// True when `id` indexes a table of `num` rows.
FSDP_HD inline bool EmbeddingIdValid(int32_t id, int64_t num) { return id >= 0 && id < num; }

// Element j of row `id` of a [num, dim] table (fp32 or bf16), as float.
template <typename W>
FSDP_HD inline float EmbeddingGather(const W* table, int32_t id, int64_t dim, int64_t j) {
  return Load(table, static_cast<int64_t>(id) * dim + j);
}

// ---- SwiGLU (Llama's MLP): h = silu(a) * b with silu(a) = a * sigmoid(a)
// (torch.nn.functional.silu), a the gate projection and b the up projection.

// 1 / (1 + exp(-a)) with FastExp (kernels/math.h): 0 for a below about -88, 1 above 88.
FSDP_HD inline float Sigmoid(float a) { return 1.0f / (1.0f + FastExp(-a)); }

// silu(a) * b.
FSDP_HD inline float SiluMulForward(float a, float b) { return a * Sigmoid(a) * b; }

// dL/da of h = silu(a) * b from g = dL/dh: g b silu'(a), silu'(a) = s (1 + a (1 - s)) with
// s = sigmoid(a).
FSDP_HD inline float SiluMulGradGate(float a, float b, float g) {
  const float s = Sigmoid(a);
  return g * b * (s * (1.0f + a * (1.0f - s)));
}

// dL/db of h = silu(a) * b from g = dL/dh: g silu(a).
FSDP_HD inline float SiluMulGradUp(float a, float g) { return g * (a * Sigmoid(a)); }

// ---- Softplus: log(1 + e^x) (torch.nn.functional.softplus, beta 1), written as
// max(x, 0) + log1p(e^-|x|): no overflow for large x, and for very negative x the digits of
// e^x that log(1 + e^x) would round away. Its derivative is sigmoid(x).
FSDP_HD inline float SoftplusForward(float x) { return fmaxf(x, 0.0f) + Log1p(FastExp(-fabsf(x))); }

// dL/dx of y = softplus(x) from g = dL/dy.
FSDP_HD inline float SoftplusGrad(float x, float g) { return g * Sigmoid(x); }

// ---- Rotary position embedding, Hugging Face's convention (rotate_half): in a head of
// width 2 half, element j < half pairs with j + half and both turn by the angle
// t * inv_freq[j] of their position t: y = x cos + rotate_half(x) sin, rotate_half(x) =
// (-x[half:], x[:half]).

// Element j of the rotated head from x = x[j], partner = x[j + half] (first_half) or
// x[j - half], and c, s the cosine and sine of its angle. The inverse rotation (the
// backward: the rotation's transpose) is this with -s.
FSDP_HD inline float RotaryRotate(float x, float partner, float c, float s, bool first_half) {
  return first_half ? x * c - partner * s : x * c + partner * s;
}

// Element j of the sum of the `group` heads of width D that start at `base`, added in head
// order: a kv head's gradient from the query heads of its group.
FSDP_HD inline float RotaryGroupSum(const float* base, int64_t j, int64_t group, int64_t D) {
  float acc = base[j];
  for (int64_t m = 1; m < group; ++m) acc = Add(acc, base[m * D + j]);
  return acc;
}

}  // namespace kernels

#endif  // KERNELS_ELEMENTWISE_H_
