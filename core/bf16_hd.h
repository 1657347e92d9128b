// fp32 <-> bf16 conversion written once for the host and the device (FSDP_HD): the CPU
// loops of Tensor::CopyFrom / ToDType and the CUDA conversion kernels both call these,
// so CPU tests check the math the GPU runs. Any kernel body (nn, optim) may use them.
//
//   uint16_t h = core::FloatToBf16Bits(1.0f / 3.0f);   // 0x3eab, rounded to nearest even
//   float f = core::Bf16BitsToFloat(h);                // 0.333984375
//
// core::BFloat16 (core/dtype.h) converts through these too.
#ifndef CORE_BF16_HD_H_
#define CORE_BF16_HD_H_

#include <cstdint>
#include <cstring>

#include "core/hd.h"

namespace core {

// The bits of an IEEE fp32, and back.
FSDP_HD inline uint32_t FloatToBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

FSDP_HD inline float BitsToFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

// The bf16 nearest to `f`, ties to even (as PyTorch and CUDA's __float2bfloat16_rn);
// infinities stay infinities, a value that rounds past the largest bf16 becomes an
// infinity, subnormals round like any other value (no flush to zero), and a NaN becomes
// a quiet NaN with the same sign and top payload bits.
// On a CUDA device a value that is not a NaN takes the conversion instruction (cvt.rn,
// round to nearest even: the same bits, as bf16 and fp32 share the exponent range, in one
// instruction instead of the integer sequence below).
FSDP_HD inline uint16_t FloatToBf16Bits(float f) {
#if defined(__CUDA_ARCH__)
  if (f == f) {
    uint16_t h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
  }
#endif
  const uint32_t u = FloatToBits(f);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  }
  const uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding_bias) >> 16);
}

// The fp32 with the same value as bf16 `bits` (exact).
FSDP_HD inline float Bf16BitsToFloat(uint16_t bits) {
  return BitsToFloat(static_cast<uint32_t>(bits) << 16);
}

// Two fp32 values rounded to bf16 (FloatToBf16Bits) and packed into one 32-bit word, `lo`
// in the low half: the first element of a little-endian pair, as a four-wide kernel stores
// them.
FSDP_HD inline uint32_t Bf16PairBits(float lo, float hi) {
#if defined(__CUDA_ARCH__)
  if (lo == lo && hi == hi) {  // both rounded by one cvt.rn (as FloatToBf16Bits)
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
  }
#endif
  return FloatToBf16Bits(lo) | (uint32_t{FloatToBf16Bits(hi)} << 16);
}

}  // namespace core

#endif  // CORE_BF16_HD_H_
