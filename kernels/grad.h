// Element bodies of fsdp's gradient arithmetic: adding a reduced gradient chunk (fp32,
// or bf16 widened by core/bf16_hd.h) into the gradient shard, one element's square for a
// norm, scaling for clipping. Written once as FSDP_HD functions: the CPU launchers
// (kernels/cpu/kernels.h) and the CUDA ones (kernels/cuda/grad.cu) call the same body, so
// the CPU tests check the math the GPU runs.
//
//   dst[i] = kernels::AddTerm(dst[i], kernels::Load(bf16_src, i));
#ifndef KERNELS_GRAD_H_
#define KERNELS_GRAD_H_

#include "core/hd.h"

namespace kernels {

// Gradient accumulation: the shard's value plus the reduced chunk's.
FSDP_HD inline float AddTerm(float dst, float src) { return dst + src; }

// One gradient element's contribution to a squared L2 norm, in double.
FSDP_HD inline double SquareTerm(float g) {
  const double d = static_cast<double>(g);
  return d * d;
}

// A gradient element after clipping by `factor`.
FSDP_HD inline float ScaleTerm(float g, float factor) { return g * factor; }

}  // namespace kernels

#endif  // KERNELS_GRAD_H_
