#include "nn/testing/gradcheck.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "core/random.h"
#include "core/status_macros.h"

namespace nn {
namespace gradcheck {
absl::StatusOr<Report> CheckModule(core::Module& module, const core::Tensor& input,
                                   const Options& options) {
  ASSIGN_OR_RETURN(core::Tensor out, module.Forward(input));
  const core::Tensor weights = RandomTensor(out.shape(), options.seed);
  const std::vector<float> r = weights.ToVector();
  // L(Forward(x)) for the input check; the parameter checks evaluate it at `input`.
  auto loss = [&module, &r](const core::Tensor& x) -> absl::StatusOr<double> {
    ASSIGN_OR_RETURN(core::Tensor y, module.Forward(x));
    if (static_cast<size_t>(y.numel()) != r.size()) {
      return absl::InternalError(absl::StrCat("gradcheck: output changed to ", y.ToString()));
    }
    const float* p = y.data<float>();
    double s = 0.0;
    for (size_t i = 0; i < r.size(); ++i) s += static_cast<double>(p[i]) * r[i];
    return s;
  };

  module.ZeroGrad(/*set_to_none=*/true);
  ASSIGN_OR_RETURN(core::Tensor grad_input, module.Backward(weights));

  Report report;
  if (options.check_input && input.dtype() == core::DType::kFloat32) {
    ASSIGN_OR_RETURN(Report r_in, CheckFunction(loss, input, grad_input, "input", options));
    MergeReport(r_in, &report);
  }
  for (const auto& [name, p] : module.NamedParameters()) {
    if (!p->requires_grad) continue;
    if (!p->grad.defined()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "gradcheck: Backward of ", module.Describe(), " left no gradient for '", name, "'"));
    }
    auto loss_at_input = [&loss, &input](const core::Tensor&) { return loss(input); };
    ASSIGN_OR_RETURN(Report r_p, CheckFunction(loss_at_input, p->data, p->grad, name, options));
    MergeReport(r_p, &report);
  }
  return report;
}

void RandomizeParameters(core::Module& module, uint64_t seed, float mean, float stddev) {
  core::Rng rng(seed);
  for (const auto& [name, p] : module.NamedParameters()) {
    if (p->data.dtype() != core::DType::kFloat32) continue;
    float* d = p->data.data<float>();
    for (int64_t i = 0; i < p->data.numel(); ++i) d[i] = rng.Normal(mean, stddev);
  }
}

core::Tensor RandomTokens(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  core::Rng rng(seed);
  std::vector<int32_t> ids(B * T);
  for (int32_t& id : ids) id = static_cast<int32_t>(rng.UniformInt(V));
  return core::Tensor::FromInts(ids, {B, T}).value();
}

double StdDev(const std::vector<float>& v) {
  double s = 0.0, s2 = 0.0;
  for (float x : v) {
    s += x;
    s2 += static_cast<double>(x) * x;
  }
  const double mean = s / v.size();
  return std::sqrt(s2 / v.size() - mean * mean);
}

}  // namespace gradcheck
}  // namespace nn
