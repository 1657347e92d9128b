#include "nn/functional/gradcheck.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "core/autograd.h"
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

absl::StatusOr<Report> CheckGradients(
    const Function& fn, const std::vector<core::Tensor>& inputs, const Options& options,
    const std::vector<std::pair<std::string, core::ParameterPtr>>& parameters,
    const std::vector<std::string>& names) {
  const auto name_of = [&names](size_t i) {
    return i < names.size() ? names[i] : absl::StrCat("input ", i);
  };
  std::vector<core::Tensor> leaves;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const core::Tensor& x = inputs[i];
    if (!x.defined() || !x.device().is_cpu()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gradcheck: ", name_of(i), " must be a defined CPU tensor, got ", x.ToString()));
    }
    leaves.push_back(x.dtype() == core::DType::kFloat32 ? core::Leaf(x) : core::Detach(x));
  }
  for (const auto& [name, p] : parameters) {
    if (p == nullptr || !p->data.defined() || p->data.dtype() != core::DType::kFloat32 ||
        !p->data.device().is_cpu()) {
      return absl::InvalidArgumentError(
          absl::StrCat("gradcheck: parameter '", name, "' must be fp32 on the CPU"));
    }
    p->grad = core::Tensor();
  }
  ASSIGN_OR_RETURN(std::vector<core::Tensor> outputs, fn(leaves));
  std::vector<core::Tensor> roots, seeds;
  std::vector<std::vector<float>> weights(outputs.size());
  for (size_t k = 0; k < outputs.size(); ++k) {
    const core::Tensor& out = outputs[k];
    if (out.dtype() != core::DType::kFloat32) continue;
    const core::Tensor r = RandomTensor(out.shape(), options.seed + 7919 * k);
    weights[k] = r.ToVector();
    if (!core::RequiresGrad(out)) continue;  // depends on no checked tensor
    roots.push_back(out);
    seeds.push_back(r);
  }
  if (!roots.empty()) RETURN_IF_ERROR(core::Backward(roots, seeds));
  // L at the inputs' current contents, without a graph.
  const auto loss = [&]() -> absl::StatusOr<double> {
    core::NoGradScope no_grad;
    ASSIGN_OR_RETURN(std::vector<core::Tensor> outs, fn(leaves));
    if (outs.size() != weights.size()) {
      return absl::InternalError("gradcheck: the function's output count changed");
    }
    double s = 0.0;
    for (size_t k = 0; k < outs.size(); ++k) {
      if (weights[k].empty()) continue;
      if (static_cast<size_t>(outs[k].numel()) != weights[k].size()) {
        return absl::InternalError(
            absl::StrCat("gradcheck: output ", k, " changed to ", outs[k].ToString()));
      }
      const std::vector<float> v = outs[k].ToVector();
      for (size_t i = 0; i < v.size(); ++i) s += static_cast<double>(v[i]) * weights[k][i];
    }
    return s;
  };
  const auto at_current = [&loss](const core::Tensor&) { return loss(); };
  Report report;
  for (size_t i = 0; i < leaves.size(); ++i) {
    if (leaves[i].dtype() != core::DType::kFloat32) continue;
    core::Tensor analytic = core::LeafGrad(leaves[i]);
    if (!analytic.defined()) {
      // No gradient reached it: the analytic derivative is zero.
      analytic = core::Tensor::Zeros(leaves[i].shape());
    }
    ASSIGN_OR_RETURN(Report r, CheckFunction(at_current, leaves[i], analytic, name_of(i), options));
    MergeReport(r, &report);
  }
  for (const auto& [name, p] : parameters) {
    if (!p->requires_grad) continue;
    core::Tensor analytic = p->grad.defined() ? p->grad : core::Tensor::Zeros(p->data.shape());
    ASSIGN_OR_RETURN(Report r, CheckFunction(at_current, p->data, analytic, name, options));
    MergeReport(r, &report);
  }
  return report;
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
