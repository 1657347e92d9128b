#include "optim/adamw.h"

#include <cmath>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nn/kernels/cpu.h"
#include "nn/kernels/optim.h"
#include "nn/ops.h"
#include "nn/tensor_ops.h"

#ifdef FSDP_WITH_CUDA
#include "optim/cuda/fused.h"
#include "optim/cuda/launch.h"
#endif

namespace optim {
namespace {

// The CPU update of one flat parameter, per ISA (nn/kernels/cpu.h); each element bit for bit
// as nn::kernels::AdamWUpdate computes it alone.
FSDP_CPU_CLONES void AdamWLoop(float* FSDP_RESTRICT w, float* FSDP_RESTRICT m,
                               float* FSDP_RESTRICT v, const float* FSDP_RESTRICT g, int64_t n,
                               nn::kernels::AdamWScalars s) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) nn::kernels::AdamWUpdate(&w[j], &m[j], &v[j], g[j], s);
}

absl::Status CheckOptions(const AdamWOptions& o) {
  auto bad = [](const char* option, double value, const char* rule) {
    return absl::InvalidArgumentError(
        absl::StrCat("AdamW: AdamWOptions.", option, " is ", value, "; it must be ", rule));
  };
  if (!std::isfinite(o.lr) || o.lr < 0) return bad("lr", o.lr, "a finite number >= 0");
  if (!(o.beta1 >= 0 && o.beta1 < 1)) return bad("beta1", o.beta1, "in [0, 1)");
  if (!(o.beta2 >= 0 && o.beta2 < 1)) return bad("beta2", o.beta2, "in [0, 1)");
  if (!std::isfinite(o.eps) || o.eps <= 0) return bad("eps", o.eps, "a finite number > 0");
  if (!std::isfinite(o.weight_decay) || o.weight_decay < 0) {
    return bad("weight_decay", o.weight_decay, "a finite number >= 0");
  }
  return absl::OkStatus();
}

}  // namespace

AdamW::AdamW(std::vector<core::NamedParameter> params, const AdamWOptions& options)
    : Optimizer(std::move(params), options.lr), options_(options) {}

absl::StatusOr<std::unique_ptr<AdamW>> AdamW::Create(std::vector<core::ParameterPtr> params,
                                                     const AdamWOptions& options) {
  return Create(NameByIndex(std::move(params)), options);
}

absl::StatusOr<std::unique_ptr<AdamW>> AdamW::Create(std::vector<core::NamedParameter> params,
                                                     const AdamWOptions& options) {
  RETURN_IF_ERROR(CheckOptions(options));
  RETURN_IF_ERROR(ValidateParameters("AdamW", params));
  return std::unique_ptr<AdamW>(new AdamW(std::move(params), options));
}

absl::Status AdamW::Step() {
  ASSIGN_OR_RETURN(std::vector<size_t> active, BeginStep());
#ifdef FSDP_WITH_CUDA
  // CUDA parameters, grouped by device: one fused launch per device.
  std::map<int, std::vector<cuda::AdamWSegment>> on_device;
#endif
  for (size_t i : active) {
    const core::Parameter& p = param(i);
    ParamState& st = state(i);
    // Scalars computed in double and applied in float, as PyTorch's single-tensor AdamW
    // applies Python-float scalars to float32 tensors.
    const nn::kernels::AdamWScalars s =
        nn::kernels::MakeAdamWScalars(lr(), options_.beta1, options_.beta2, options_.eps,
                                      options_.weight_decay, st.steps);
    float* w = p.data.data<float>();
    const float* grad = p.grad.data<float>();
    float* m = st.tensors[0].data<float>();
    float* v = st.tensors[1].data<float>();
    const int64_t n = p.data.numel();
    if (p.data.device().is_cuda()) {
#ifdef FSDP_WITH_CUDA
      cuda::AdamWSegment seg;
      seg.w = w;
      seg.g = grad;
      seg.m = m;
      seg.v = v;
      seg.n = n;
      seg.s = s;
      on_device[p.data.device().index].push_back(seg);
      continue;
#else
      return absl::FailedPreconditionError(absl::StrCat(
          "AdamW: parameter '", param_name(i), "' is on ", p.data.device().ToString(),
          " but this build has no CUDA support"));
#endif
    }
    // Elements are independent: chunks on 64-byte lines over the intra-op threads.
    nn::kernels::ParallelChunks(nn::IntraOpThreads(), n, n, 16, [&](int64_t b, int64_t e) {
      AdamWLoop(w + b, m + b, v + b, grad + b, e - b, s);
    });
  }
#ifdef FSDP_WITH_CUDA
  for (auto& [index, segments] : on_device) {
    RETURN_IF_ERROR(cuda::LaunchSegments(core::Device::Cuda(index), std::move(segments),
                                         &cuda::FusedAdamW, "AdamW"));
  }
#endif
  return absl::OkStatus();
}

}  // namespace optim
