#include "nn/testing/gradcheck.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "core/random.h"
#include "core/status_macros.h"

namespace nn {
namespace gradcheck {
namespace {

// A portable string hash (std::hash is implementation-defined), so element sampling is
// the same everywhere.
uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// Indices of the elements to check: all, or `max` distinct ones drawn from `rng`.
std::vector<int64_t> ChooseIndices(int64_t numel, int64_t max, core::Rng* rng) {
  std::vector<int64_t> idx(static_cast<size_t>(numel));
  std::iota(idx.begin(), idx.end(), 0);
  if (max <= 0 || max >= numel) return idx;
  for (int64_t i = 0; i < max; ++i) {  // partial Fisher-Yates
    const int64_t j = i + static_cast<int64_t>(rng->UniformInt(static_cast<uint64_t>(numel - i)));
    std::swap(idx[i], idx[j]);
  }
  idx.resize(static_cast<size_t>(max));
  std::sort(idx.begin(), idx.end());
  return idx;
}

void Record(const std::string& name, int64_t index, double analytic, double numeric,
            const Options& options, Report* report) {
  const double err = std::fabs(analytic - numeric);
  const double allowed = options.atol + options.rtol * std::fabs(numeric);
  const double violation = err / allowed;
  ++report->num_checked;
  report->max_abs_error = std::max(report->max_abs_error, err);
  report->max_abs_numeric = std::max(report->max_abs_numeric, std::fabs(numeric));
  Mismatch m{name, index, analytic, numeric};
  if (violation > report->max_violation || report->num_checked == 1) {
    report->max_violation = std::max(report->max_violation, violation);
    report->worst = m;
  }
  if (!(err <= allowed)) report->failures.push_back(m);  // NaN fails too
}

}  // namespace

std::string Report::ToString() const {
  std::string s = absl::StrCat(
      "checked ", num_checked, " elements, ", failures.size(), " failed; max |a-n| ", max_abs_error,
      ", max violation ", max_violation, " (worst ", worst.tensor, "[", worst.index, "]: analytic ",
      worst.analytic, " numeric ", worst.numeric, "), max |numeric| ", max_abs_numeric);
  for (size_t i = 0; i < failures.size() && i < 10; ++i) {
    const Mismatch& m = failures[i];
    absl::StrAppend(&s, "\n  ", m.tensor, "[", m.index, "]: analytic ", m.analytic, " numeric ",
                    m.numeric);
  }
  return s;
}

void MergeReport(const Report& other, Report* into) {
  if (other.num_checked == 0) return;
  if (into->num_checked == 0 || other.max_violation > into->max_violation) {
    into->worst = other.worst;
  }
  into->num_checked += other.num_checked;
  into->max_abs_error = std::max(into->max_abs_error, other.max_abs_error);
  into->max_violation = std::max(into->max_violation, other.max_violation);
  into->max_abs_numeric = std::max(into->max_abs_numeric, other.max_abs_numeric);
  into->failures.insert(into->failures.end(), other.failures.begin(), other.failures.end());
}

absl::StatusOr<Report> CheckFunction(const ScalarFunction& f, const core::Tensor& x,
                                     const core::Tensor& analytic, const std::string& name,
                                     const Options& options) {
  if (!x.defined() || x.dtype() != core::DType::kFloat32 || !x.device().is_cpu()) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradcheck: ", name, " must be fp32 on the CPU"));
  }
  if (!analytic.defined() || analytic.numel() != x.numel() ||
      analytic.dtype() != core::DType::kFloat32) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradcheck: analytic gradient of ", name, " is ",
                     analytic.defined() ? analytic.ToString() : std::string("undefined"),
                     ", expected ", x.numel(), " fp32 elements"));
  }
  // Copy: the caller's gradient tensor may be overwritten by later passes.
  const std::vector<float> grad = analytic.ToVector();
  core::Rng rng = core::Rng(options.seed).Fork(Fnv1a(name));
  Report report;
  float* data = x.data<float>();
  for (int64_t i : ChooseIndices(x.numel(), options.max_per_tensor, &rng)) {
    const float saved = data[i];
    data[i] = static_cast<float>(saved + options.eps);
    // The step actually taken after rounding to fp32.
    const double up = static_cast<double>(data[i]) - saved;
    absl::StatusOr<double> f_plus = f(x);
    data[i] = static_cast<float>(saved - options.eps);
    const double down = saved - static_cast<double>(data[i]);
    absl::StatusOr<double> f_minus = f(x);
    data[i] = saved;
    if (!f_plus.ok()) return f_plus.status();
    if (!f_minus.ok()) return f_minus.status();
    Record(name, i, grad[i], (*f_plus - *f_minus) / (up + down), options, &report);
  }
  return report;
}

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

core::Tensor RandomTensor(const core::Shape& shape, uint64_t seed, float stddev) {
  core::Tensor t = core::Tensor::Empty(shape);
  core::Rng rng(seed);
  float* d = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) d[i] = rng.Normal(0.0f, stddev);
  return t;
}

}  // namespace gradcheck
}  // namespace nn
