// Element bodies of fsdp's gradient arithmetic (adding a reduced gradient chunk into
// the gradient shard, squares for norms, scaling for clipping, bf16 widening), written
// once as FSDP_HD functions (core/hd.h): fsdp/internal/device_ops.cc loops over them on
// the CPU and fsdp/cuda/grad_kernels.cu launches them on a CUDA device, so the CPU
// tests exercise the device's math.
//
//   dst[i] = fsdp::internal::AddTerm(dst[i], fsdp::internal::Bf16BitsToFloat(src[i]));
#ifndef FSDP_CUDA_GRAD_MATH_H_
#define FSDP_CUDA_GRAD_MATH_H_

#include <cstdint>
#include <cstring>

#include "core/hd.h"

namespace fsdp {
namespace internal {

// The float a bf16 bit pattern stands for (exact: bf16 is the high half of a float).
FSDP_HD inline float Bf16BitsToFloat(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

// Gradient accumulation: the shard's value plus the reduced chunk's.
FSDP_HD inline float AddTerm(float dst, float src) { return dst + src; }

// One gradient element's contribution to a squared L2 norm, in double.
FSDP_HD inline double SquareTerm(float g) {
  const double d = static_cast<double>(g);
  return d * d;
}

// A gradient element after clipping by `factor`.
FSDP_HD inline float ScaleTerm(float g, float factor) { return g * factor; }

}  // namespace internal
}  // namespace fsdp

#endif  // FSDP_CUDA_GRAD_MATH_H_
