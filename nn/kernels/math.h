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
