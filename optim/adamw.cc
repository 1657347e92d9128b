#include "optim/adamw.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

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

// torch.lerp's formula for float: exact at both ends of the weight range.
inline float Lerp(float start, float end, float weight) {
  return weight < 0.5f ? start + weight * (end - start)
                       : end - (end - start) * (1.0f - weight);
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
  const double lr_d = lr();
  const double beta1 = options_.beta1;
  const double beta2 = options_.beta2;
  // Scalars computed in double and applied in float, as PyTorch's single-tensor AdamW
  // applies Python-float scalars to float32 tensors.
  const float decay = static_cast<float>(1.0 - lr_d * options_.weight_decay);
  const float one_minus_beta1 = static_cast<float>(1.0 - beta1);
  const float beta2_f = static_cast<float>(beta2);
  const float one_minus_beta2 = static_cast<float>(1.0 - beta2);
  const float eps = static_cast<float>(options_.eps);
  for (size_t i : active) {
    const core::Parameter& p = param(i);
    ParamState& st = state(i);
    const double t = static_cast<double>(st.steps);
    const double bias_correction1 = 1.0 - std::pow(beta1, t);
    const double bias_correction2 = 1.0 - std::pow(beta2, t);
    const float neg_step_size = static_cast<float>(-lr_d / bias_correction1);
    const float bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
    float* w = p.data.data<float>();
    const float* grad = p.grad.data<float>();
    float* m = st.tensors[0].data<float>();
    float* v = st.tensors[1].data<float>();
    const int64_t n = p.data.numel();
    for (int64_t j = 0; j < n; ++j) {
      const float g = grad[j];
      w[j] = w[j] * decay;
      m[j] = Lerp(m[j], g, one_minus_beta1);
      v[j] = v[j] * beta2_f + one_minus_beta2 * g * g;  // addcmul_ order
      const float denom = std::sqrt(v[j]) / bias_correction2_sqrt + eps;
      w[j] = w[j] + neg_step_size * m[j] / denom;  // addcdiv_ order
    }
  }
  return absl::OkStatus();
}

}  // namespace optim
