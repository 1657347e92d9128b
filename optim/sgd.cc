#include "optim/sgd.h"

#include <cmath>
#include <cstddef>
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

// The CPU update of one parameter with the step's flags fixed at compile time, so the loop
// has no branches on them (GCC does not vectorise a select on a loop-invariant bool) and
// the buffer store is unconditional or absent; each element bit for bit as
// nn::kernels::SgdUpdate computes it alone.
template <bool kWeightDecay, bool kMomentum, bool kNesterov, bool kFirstStep>
FSDP_CPU_INLINE void SgdRows(float* FSDP_RESTRICT w, float* FSDP_RESTRICT buf,
                             const float* FSDP_RESTRICT g, int64_t n,
                             const nn::kernels::SgdScalars& scalars) {
  nn::kernels::SgdScalars s = scalars;
  s.use_weight_decay = kWeightDecay;
  s.use_momentum = kMomentum;
  s.nesterov = kNesterov;
  s.first_step = kFirstStep;
  float unused = 0.0f;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    nn::kernels::SgdUpdate(&w[j], kMomentum ? &buf[j] : &unused, g[j], s);
  }
}

// Picks the SgdRows instance of s's four flags, one flag per level.
template <bool... kFixed>
FSDP_CPU_INLINE void SgdDispatch(float* w, float* buf, const float* g, int64_t n,
                                 const nn::kernels::SgdScalars& s) {
  constexpr size_t kDone = sizeof...(kFixed);
  if constexpr (kDone == 4) {
    SgdRows<kFixed...>(w, buf, g, n, s);
  } else {
    const bool flags[4] = {s.use_weight_decay, s.use_momentum, s.nesterov, s.first_step};
    if (flags[kDone]) {
      SgdDispatch<kFixed..., true>(w, buf, g, n, s);
    } else {
      SgdDispatch<kFixed..., false>(w, buf, g, n, s);
    }
  }
}

// Per ISA (nn/kernels/cpu.h); buf is null without momentum.
FSDP_CPU_CLONES void SgdLoop(float* w, float* buf, const float* g, int64_t n,
                             nn::kernels::SgdScalars s) {
  SgdDispatch<>(w, buf, g, n, s);
}

absl::Status CheckOptions(const SgdOptions& o) {
  auto bad = [](const char* option, double value, const char* rule) {
    return absl::InvalidArgumentError(
        absl::StrCat("SGD: SgdOptions.", option, " is ", value, "; it must be ", rule));
  };
  if (!std::isfinite(o.lr) || o.lr < 0) return bad("lr", o.lr, "a finite number >= 0");
  if (!std::isfinite(o.momentum) || o.momentum < 0) {
    return bad("momentum", o.momentum, "a finite number >= 0");
  }
  if (!std::isfinite(o.dampening)) return bad("dampening", o.dampening, "finite");
  if (!std::isfinite(o.weight_decay) || o.weight_decay < 0) {
    return bad("weight_decay", o.weight_decay, "a finite number >= 0");
  }
  if (o.nesterov && (o.momentum <= 0 || o.dampening != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SGD: SgdOptions.nesterov requires momentum > 0 and dampening == 0 (momentum is ",
        o.momentum, ", dampening is ", o.dampening, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

SGD::SGD(std::vector<core::NamedParameter> params, const SgdOptions& options)
    : Optimizer(std::move(params), options.lr), options_(options) {}

absl::StatusOr<std::unique_ptr<SGD>> SGD::Create(std::vector<core::ParameterPtr> params,
                                                 const SgdOptions& options) {
  return Create(NameByIndex(std::move(params)), options);
}

absl::StatusOr<std::unique_ptr<SGD>> SGD::Create(std::vector<core::NamedParameter> params,
                                                 const SgdOptions& options) {
  RETURN_IF_ERROR(CheckOptions(options));
  RETURN_IF_ERROR(ValidateParameters("SGD", params));
  return std::unique_ptr<SGD>(new SGD(std::move(params), options));
}

std::vector<std::string> SGD::StateNames() const {
  if (options_.momentum == 0) return {};
  return {"momentum_buffer"};
}

absl::Status SGD::Step() {
  ASSIGN_OR_RETURN(std::vector<size_t> active, BeginStep());
  // Scalars in float, as PyTorch applies Python-float scalars to float32 tensors.
  nn::kernels::SgdScalars scalars;
  scalars.lr = static_cast<float>(lr());
  scalars.weight_decay = static_cast<float>(options_.weight_decay);
  scalars.momentum = static_cast<float>(options_.momentum);
  scalars.one_minus_dampening = static_cast<float>(1.0 - options_.dampening);
  scalars.use_weight_decay = options_.weight_decay != 0;
  scalars.use_momentum = options_.momentum != 0;
  scalars.nesterov = options_.nesterov;
#ifdef FSDP_WITH_CUDA
  // CUDA parameters, grouped by device: one fused launch per device.
  std::map<int, std::vector<cuda::SgdSegment>> on_device;
#endif
  for (size_t i : active) {
    const core::Parameter& p = param(i);
    ParamState& st = state(i);
    nn::kernels::SgdScalars s = scalars;
    s.first_step = st.steps == 1;
    float* w = p.data.data<float>();
    const float* grad = p.grad.data<float>();
    float* buf = s.use_momentum ? st.tensors[0].data<float>() : nullptr;
    const int64_t n = p.data.numel();
    if (p.data.device().is_cuda()) {
#ifdef FSDP_WITH_CUDA
      cuda::SgdSegment seg;
      seg.w = w;
      seg.g = grad;
      seg.buf = buf;
      seg.n = n;
      seg.s = s;
      on_device[p.data.device().index].push_back(seg);
      continue;
#else
      return absl::FailedPreconditionError(absl::StrCat(
          "SGD: parameter '", param_name(i), "' is on ", p.data.device().ToString(),
          " but this build has no CUDA support"));
#endif
    }
    nn::kernels::ParallelChunks(nn::IntraOpThreads(), n, n, 16, [&](int64_t b, int64_t e) {
      SgdLoop(w + b, buf != nullptr ? buf + b : nullptr, grad + b, e - b, s);
    });
  }
#ifdef FSDP_WITH_CUDA
  for (auto& [index, segments] : on_device) {
    RETURN_IF_ERROR(cuda::LaunchSegments(core::Device::Cuda(index), std::move(segments),
                                         &cuda::FusedSgd, "SGD"));
  }
#endif
  return absl::OkStatus();
}

}  // namespace optim
