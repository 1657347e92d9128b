// Kernel-body building blocks shared by every kernels/ header: float/double overloads
// of the libm functions the bodies use, and loads of fp32 or bf16 weights as float (bf16
// widened by core/bf16_hd.h, the one fp32 <-> bf16 body).
// Header-only, no CUDA includes: compiles in the CPU build (plain C++) and under nvcc,
// where every function is __host__ __device__ (core/hd.h).
//
//   const uint16_t* w = ...;                 // bf16 weights (core::BFloat16 bits)
//   float wj = kernels::Load(w, j);          // exact widening to fp32
//   float y = kernels::Exp(x);               // expf on float, exp on double
#ifndef KERNELS_MATH_H_
#define KERNELS_MATH_H_

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/bf16_hd.h"
#include "core/hd.h"

namespace kernels {

FSDP_HD inline float Exp(float x) { return expf(x); }
FSDP_HD inline double Exp(double x) { return exp(x); }
FSDP_HD inline float Log(float x) { return logf(x); }
FSDP_HD inline double Log(double x) { return log(x); }
FSDP_HD inline float Log1p(float x) { return log1pf(x); }
FSDP_HD inline float Sqrt(float x) { return sqrtf(x); }
FSDP_HD inline double Sqrt(double x) { return sqrt(x); }
FSDP_HD inline float Tanh(float x) { return tanhf(x); }

// tanh(x) by a [13/6] rational approximation on x clamped to +-7.9053 (Eigen's
// generic_fast_tanh_float), x itself for |x| < 4e-4; NaN stays NaN. No calls and no
// branches the compiler cannot turn into selects, so CPU loops vectorise. Its error
// against tanh is bounded in kernels/kernels_test.cc (GELU, built on it, within 2e-7 absolute
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

// exp(x) without libm, so CPU loops vectorise (selects and integer bit operations only):
// x = n ln2 + r with n = round(x / ln2) and |r| <= ln2 / 2, e^r by Cephes' degree-7 expf
// polynomial, times 2^n built in the exponent bits. Relative error within 1.5e-7 of exp
// (2.5 ulp; measured 8e-8, kernels/kernels_test.cc) for x in [-87.33, 88.37]; 0 below
// -87.3365 (where expf returns denormals), +inf above 88.3762 (expf overflows at 88.7228;
// the row bodies only pass x <= 0); NaN stays NaN.
FSDP_HD inline float FastExp(float x) {
  const float kMax = 88.3762626647949f;   // 127.5 ln2: n <= 127
  const float kMin = -87.3365447505531f;  // -126 ln2: n >= -126 (normal 2^n)
  // Never NaN (NaN takes kMax), so the integer conversion below is defined.
  const float xc = x < kMax ? (x > kMin ? x : kMin) : kMax;
  // Round to nearest by the 1.5 * 2^23 trick (no call to rintf).
  const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float scale;
  memcpy(&scale, &bits, sizeof(scale));
  const float e = p * scale;
  return x < kMin ? 0.0f : (x <= kMax ? e : x + INFINITY);  // NaN + inf is NaN
}

// exp(x) in double without libm: as the float version with |r| <= ln2 / 2 and the degree-13
// Taylor polynomial of e^r (truncation below 5e-18); relative error within 3e-16 of exp
// (kernels/kernels_test.cc) for x in [-708.39, 709.08]; 0 below -708.3964, +inf above
// 709.0895; NaN stays NaN.
FSDP_HD inline double FastExp(double x) {
  const double kMax = 709.089565712824;                       // 1023.5 ln2: n <= 1023
  const double kMin = -708.396418532264;                      // -1022 ln2: n >= -1022
  const double xc = x < kMax ? (x > kMin ? x : kMin) : kMax;  // never NaN
  // t = round(x / ln2) + 1.5 * 2^52: its low mantissa bits hold n in two's complement.
  const double kShifter = 6755399441055744.0;
  const double t = xc * 1.4426950408889634 + kShifter;
  const double n = t - kShifter;
  const double r = (xc - n * 6.93147180369123816490e-01) - n * 1.90821492927058770002e-10;
  double p = 1.0 / 6227020800.0;  // 1/13!
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * (r * r) + r + 1.0;
  uint64_t tbits;
  memcpy(&tbits, &t, sizeof(tbits));
  const uint64_t kShifterBits = 0x4338000000000000ull;  // the bits of kShifter
  const uint64_t sbits = (tbits - kShifterBits + 1023u) << 52;
  double scale;
  memcpy(&scale, &sbits, sizeof(scale));
  const double e = p * scale;
  return x < kMin ? 0.0 : (x <= kMax ? e : x + static_cast<double>(INFINITY));
}

#if defined(__CUDACC__)
// 2^y in one MUFU.EX2 (PTX ex2.approx.ftz.f32, which exp2f uses after a range check: about
// 2 ulp); results below 2^-126 flush to zero, 2^-inf = 0, NaN stays NaN. Device code only.
__device__ inline float Exp2Approx(float y) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(y));
  return r;
#else
  return exp2f(y);  // the host pass's copy, never called
#endif
}
#endif

// e^x as the row bodies that feed sums take it: FastExp on the host; on a CUDA device
// Exp2Approx(x log2(e)), two instructions for FastExp's twenty, within about 2 ulp plus
// the rounding of x log2(e) (|x| 2^-24 relative, where x <= 0 is a logit's distance below
// its row's max); 0 below about -87.3 as FastExp. The double overload is FastExp.
FSDP_HD inline float RowExp(float x) {
#if defined(__CUDA_ARCH__)
  return Exp2Approx(x * 1.44269504088896341f);
#else
  return FastExp(x);
#endif
}
FSDP_HD inline double RowExp(double x) { return FastExp(x); }

// a + b, rounded once (residual connections, position embeddings, a fused op's add of what
// its unfused twin stores and adds). On a CUDA device __fadd_rn, which nvcc never contracts
// with a product before it into a fused multiply-add, so a fused kernel gives the bits of
// the product stored and then added (the CPU loops are compiled without contraction).
FSDP_HD inline float Add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// Element i of an fp32 or bf16 (uint16_t bits) array, as float. The one place a weight is
// read, so every body accepts either dtype.
FSDP_HD inline float Load(const float* p, int64_t i) { return p[i]; }
FSDP_HD inline float Load(const uint16_t* p, int64_t i) { return core::Bf16BitsToFloat(p[i]); }

// Stores v into element i of an fp32 or bf16 array (bf16: rounded once, to nearest even).
FSDP_HD inline void Store(float* p, int64_t i, float v) { p[i] = v; }
FSDP_HD inline void Store(uint16_t* p, int64_t i, float v) { p[i] = core::FloatToBf16Bits(v); }

// A launcher's dispatch on an array's dtype (host code): f(p) with p as float*, or as
// uint16_t* (bf16 bits) when bf16; const for a const p.
template <typename F>
void WithStored(void* p, bool bf16, const F& f) {
  if (bf16) {
    f(static_cast<uint16_t*>(p));
  } else {
    f(static_cast<float*>(p));
  }
}
template <typename F>
void WithStored(const void* p, bool bf16, const F& f) {
  if (bf16) {
    f(static_cast<const uint16_t*>(p));
  } else {
    f(static_cast<const float*>(p));
  }
}

}  // namespace kernels

#endif  // KERNELS_MATH_H_
