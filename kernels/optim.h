// Optimizer element updates (AdamW, SGD), written once for the CPU loops of
// kernels/optim_step.cc and the fused CUDA kernels of kernels/cuda/fused.cu, and the
// segments (one parameter's arrays and scalars) both launchers take. The per-step scalars
// are computed on the host (double, then rounded to float, as PyTorch applies Python
// floats to fp32 tensors) and the element math is fp32 in torch.optim's order of
// operations.
//
//   kernels::AdamWScalars s = kernels::MakeAdamWScalars(lr, b1, b2, eps, wd, step);
//   for (j...) kernels::AdamWUpdate(&w[j], &m[j], &v[j], g[j], s);
#ifndef KERNELS_OPTIM_H_
#define KERNELS_OPTIM_H_

#include <math.h>
#include <stdint.h>

#include "core/hd.h"
#include "kernels/math.h"

namespace kernels {

// The fp32 scalars of one AdamW step of a parameter at its `step`-th update (t >= 1).
struct AdamWScalars {
  float decay = 1.0f;            // 1 - lr * weight_decay
  float one_minus_beta1 = 0.1f;  // lerp weight of exp_avg
  float beta2 = 0.999f;
  float one_minus_beta2 = 0.001f;
  float eps = 1e-8f;
  float neg_step_size = 0.0f;          // -lr / (1 - beta1^t)
  float bias_correction2_sqrt = 1.0f;  // sqrt(1 - beta2^t)
};

// Host-side: the scalars for step t, computed in double and rounded once to float.
inline AdamWScalars MakeAdamWScalars(double lr, double beta1, double beta2, double eps,
                                     double weight_decay, int64_t t) {
  AdamWScalars s;
  const double td = static_cast<double>(t);
  s.decay = static_cast<float>(1.0 - lr * weight_decay);
  s.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  s.beta2 = static_cast<float>(beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  s.eps = static_cast<float>(eps);
  s.neg_step_size = static_cast<float>(-lr / (1.0 - pow(beta1, td)));
  s.bias_correction2_sqrt = static_cast<float>(sqrt(1.0 - pow(beta2, td)));
  return s;
}

// torch.lerp's formula for float: exact at both ends of the weight range.
FSDP_HD inline float TorchLerp(float start, float end, float weight) {
  return weight < 0.5f ? start + weight * (end - start) : end - (end - start) * (1.0f - weight);
}

// One AdamW element update of weight *w with moments *m, *v and gradient g.
FSDP_HD inline void AdamWUpdate(float* w, float* m, float* v, float g, const AdamWScalars& s) {
  float wv = *w * s.decay;
  const float mv = TorchLerp(*m, g, s.one_minus_beta1);
  const float vv = *v * s.beta2 + s.one_minus_beta2 * g * g;  // addcmul_ order
  const float denom = Sqrt(vv) / s.bias_correction2_sqrt + s.eps;
  wv = wv + s.neg_step_size * mv / denom;  // addcdiv_ order
  *w = wv;
  *m = mv;
  *v = vv;
}

// The fp32 scalars of one SGD step (torch.optim.SGD, maximize off).
struct SgdScalars {
  float lr = 0.0f;
  float weight_decay = 0.0f;
  float momentum = 0.0f;
  float one_minus_dampening = 1.0f;
  bool use_weight_decay = false;
  bool use_momentum = false;
  bool nesterov = false;
  bool first_step = false;  // the momentum buffer starts as the gradient
};

// One SGD element update of weight *w (momentum buffer *buf, unused without momentum).
FSDP_HD inline void SgdUpdate(float* w, float* buf, float g, const SgdScalars& s) {
  if (s.use_weight_decay) g = g + s.weight_decay * *w;
  if (s.use_momentum) {
    *buf = s.first_step ? g : *buf * s.momentum + s.one_minus_dampening * g;
    g = s.nesterov ? g + s.momentum * *buf : *buf;
  }
  *w = *w - s.lr * g;
}

// One parameter's AdamW update: n elements of weight, gradient and moments (all on one
// device) with the scalars of its step.
struct AdamWSegment {
  float* w = nullptr;
  const float* g = nullptr;
  float* m = nullptr;  // exp_avg
  float* v = nullptr;  // exp_avg_sq
  int64_t n = 0;
  int64_t first_chunk = 0;  // set by the CUDA launcher (kernels/cuda/fused.h)
  AdamWScalars s;
};

// One parameter's SGD update.
struct SgdSegment {
  float* w = nullptr;
  const float* g = nullptr;
  float* buf = nullptr;  // momentum buffer, or null without momentum
  int64_t n = 0;
  int64_t first_chunk = 0;  // set by the CUDA launcher (kernels/cuda/fused.h)
  SgdScalars s;
};

}  // namespace kernels

#endif  // KERNELS_OPTIM_H_
