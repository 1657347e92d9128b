// Kernel-body building blocks shared by every nn/kernels header: float/double overloads
// of the libm functions the bodies use, and loads of fp32 or bf16 weights as float.
// Header-only, no CUDA includes: compiles in the CPU build (plain C++) and under nvcc,
// where every function is __host__ __device__ (core/hd.h).
//
//   const uint16_t* w = ...;                 // bf16 weights (core::BFloat16 bits)
//   float wj = nn::kernels::Load(w, j);      // exact widening to fp32
//   float y = nn::kernels::Exp(x);           // expf on float, exp on double
#ifndef NN_KERNELS_MATH_H_
#define NN_KERNELS_MATH_H_

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/hd.h"

namespace nn {
namespace kernels {

FSDP_HD inline float Exp(float x) { return expf(x); }
FSDP_HD inline double Exp(double x) { return exp(x); }
FSDP_HD inline float Log(float x) { return logf(x); }
FSDP_HD inline double Log(double x) { return log(x); }
FSDP_HD inline float Sqrt(float x) { return sqrtf(x); }
FSDP_HD inline double Sqrt(double x) { return sqrt(x); }
FSDP_HD inline float Tanh(float x) { return tanhf(x); }

// tanh(x) by a [13/6] rational approximation on x clamped to +-7.9053 (Eigen's
// generic_fast_tanh_float), x itself for |x| < 4e-4; NaN stays NaN. No calls and no
// branches the compiler cannot turn into selects, so CPU loops vectorise. Its error
// against tanh is bounded in nn/kernels_test.cc (GELU, built on it, within 2e-7 absolute
// of the exact tanh form for |x| <= 10).
FSDP_HD inline float FastTanh(float x) {
  const float kClamp = 7.90531110763549805f;
  const float xc = x > kClamp ? kClamp : (x < -kClamp ? -kClamp : x);
  const float x2 = xc * xc;
  float p = -2.76076847742355e-16f;
  p = p * x2 + 2.00018790482477e-13f;
  p = p * x2 + -8.60467152213735e-11f;
  p = p * x2 + 5.12229709037114e-08f;
  p = p * x2 + 1.48572235717979e-05f;
  p = p * x2 + 6.37261928875436e-04f;
  p = p * x2 + 4.89352455891786e-03f;
  p = p * xc;
  float q = 1.19825839466702e-06f;
  q = q * x2 + 1.18534705686654e-04f;
  q = q * x2 + 2.26843463243900e-03f;
  q = q * x2 + 4.89352518554385e-03f;
  const float ax = x < 0.0f ? -x : x;
  return ax < 0.0004f ? x : p / q;
}

// The fp32 value of bf16 `bits` (the upper half of an IEEE fp32): exact.
FSDP_HD inline float Bf16ToFloat(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

// `f` rounded to bf16, to nearest even; NaN stays a (quiet) NaN. Matches
// core::BFloat16::FromFloat bit for bit.
FSDP_HD inline uint16_t FloatToBf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((u >> 16) | 0x0040u);
  }
  const uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding_bias) >> 16);
}

// Element i of an fp32 or bf16 (uint16_t bits) array, as float. The one place a weight is
// read, so every body accepts either dtype.
FSDP_HD inline float Load(const float* p, int64_t i) { return p[i]; }
FSDP_HD inline float Load(const uint16_t* p, int64_t i) { return Bf16ToFloat(p[i]); }

}  // namespace kernels
}  // namespace nn

#endif  // NN_KERNELS_MATH_H_
