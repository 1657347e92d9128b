#include "optim/adamw.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/optim.h"
#include "kernels/optim_step.h"

namespace optim {
namespace {

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
  kernels::OptimizerStep step("AdamW");
  for (size_t i : active) {
    const core::Parameter& p = param(i);
    ParamState& st = state(i);
    kernels::AdamWSegment seg;
    seg.w = p.data.data<float>();
    seg.g = p.grad.data<float>();
    seg.m = st.tensors[0].data<float>();
    seg.v = st.tensors[1].data<float>();
    seg.n = p.data.numel();
    // Scalars computed in double and applied in float, as PyTorch's single-tensor AdamW
    // applies Python-float scalars to float32 tensors.
    seg.s = kernels::MakeAdamWScalars(lr(), options_.beta1, options_.beta2, options_.eps,
                                      options_.weight_decay, st.steps);
    RETURN_IF_ERROR(step.Add(p.data.device(), param_name(i), seg));
  }
  return step.Finish();
}

}  // namespace optim
