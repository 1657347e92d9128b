#include "optim/sgd.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

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
  const float lr_f = static_cast<float>(lr());
  const float wd = static_cast<float>(options_.weight_decay);
  const float momentum = static_cast<float>(options_.momentum);
  const float one_minus_dampening = static_cast<float>(1.0 - options_.dampening);
  const bool use_wd = options_.weight_decay != 0;
  const bool use_momentum = options_.momentum != 0;
  const bool nesterov = options_.nesterov;
  for (size_t i : active) {
    const core::Parameter& p = param(i);
    ParamState& st = state(i);
    float* w = p.data.data<float>();
    const float* grad = p.grad.data<float>();
    float* buf = use_momentum ? st.tensors[0].data<float>() : nullptr;
    const bool first = st.steps == 1;
    const int64_t n = p.data.numel();
    for (int64_t j = 0; j < n; ++j) {
      float g = grad[j];
      if (use_wd) g = g + wd * w[j];
      if (use_momentum) {
        buf[j] = first ? g : buf[j] * momentum + one_minus_dampening * g;
        g = nesterov ? g + momentum * buf[j] : buf[j];
      }
      w[j] = w[j] - lr_f * g;
    }
  }
  return absl::OkStatus();
}

}  // namespace optim
