#include "optim/sgd.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/optim.h"
#include "kernels/optim_step.h"

namespace optim {
namespace {

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
  kernels::SgdScalars scalars;
  scalars.lr = static_cast<float>(lr());
  scalars.weight_decay = static_cast<float>(options_.weight_decay);
  scalars.momentum = static_cast<float>(options_.momentum);
  scalars.one_minus_dampening = static_cast<float>(1.0 - options_.dampening);
  scalars.use_weight_decay = options_.weight_decay != 0;
  scalars.use_momentum = options_.momentum != 0;
  scalars.nesterov = options_.nesterov;
  kernels::OptimizerStep step("SGD");
  for (size_t i : active) {
    const core::Parameter& p = param(i);
    ParamState& st = state(i);
    kernels::SgdSegment seg;
    seg.s = scalars;
    seg.s.first_step = st.steps == 1;
    seg.w = p.data.data<float>();
    seg.g = p.grad.data<float>();
    seg.buf = seg.s.use_momentum ? st.tensors[0].data<float>() : nullptr;
    seg.n = p.data.numel();
    RETURN_IF_ERROR(step.Add(p.data.device(), param_name(i), seg));
  }
  return step.Finish();
}

}  // namespace optim
