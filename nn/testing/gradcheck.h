// Test-only: checks hand-written backward passes against central finite differences.
//
//   nn::gradcheck::Options options;            // eps 1e-2, atol 1e-3, rtol 1e-2
//   absl::StatusOr<nn::gradcheck::Report> r = nn::gradcheck::CheckModule(*layer, x, options);
//   ASSERT_TRUE(r.ok()) << r.status();
//   EXPECT_TRUE(r->ok()) << r->ToString();     // every checked element within tolerance
//   EXPECT_GT(r->num_checked, 0);
//
// CheckModule uses the scalar loss L = sum_i out_i * R_i (accumulated in double) with R
// a fixed N(0, 1) tensor drawn from options.seed, so every output element contributes
// with a different weight. It runs Forward and Backward(R) once to get the analytic
// gradients (parameter grads are cleared first, so they hold exactly this backward's
// contribution), then perturbs each checked element of the input (when fp32 and
// options.check_input) and of every parameter with requires_grad by +-eps, running
// only Forward, and compares (L(+eps) - L(-eps)) / (2 eps) with the analytic value.
// An element passes when |analytic - numeric| <= atol + rtol * |numeric|. Parameters
// and inputs are restored bit for bit afterwards; the module's parameter grads are left
// holding the analytic gradients.
#ifndef NN_TESTING_GRADCHECK_H_
#define NN_TESTING_GRADCHECK_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/module.h"
#include "core/tensor.h"

namespace nn {
namespace gradcheck {

// NOTE [Gradient-check tolerance]: the defaults below (eps 1e-2, atol 1e-3, rtol 1e-2)
// are what every nn/ layer test uses for fp32. The numeric value has two error
// sources: truncation ~eps^2 |f'''| / 6 (zero for affine maps such as Linear) and fp32
// rounding of the forward ~1e-7 * sum|out_i R_i| / eps. eps = 1e-2 balances them: for a
// TransformerBlock with weights N(0, 0.5) (gradients up to ~13) the worst element sits
// at ~0.5 of the tolerance, and that ratio grows 9x at eps = 3e-2 (truncation) and 4x
// at eps = 1e-3 (rounding); for Linear it is ~0.002. A wrong formula (a missed term, a
// transposed index, an overwrite instead of an add) is off by O(|gradient|) ~ 0.1..10.
// Keep parameters and inputs O(1) (RandomizeParameters) so gradients are not all ~0.
struct Options {
  double eps = 1e-2;   // central-difference step, in the perturbed element's units
  double atol = 1e-3;  // absolute tolerance
  double rtol = 1e-2;  // tolerance relative to |numeric|
  uint64_t seed = 1;   // for the output weights R and for element sampling
  // Elements checked per tensor: 0 means all; otherwise this many distinct elements
  // chosen pseudo-randomly from `seed`.
  int64_t max_per_tensor = 0;
  // Also check d L / d input (ignored for non-fp32 inputs such as token ids).
  bool check_input = true;
};

// One element whose analytic and numeric gradients disagree.
struct Mismatch {
  std::string tensor;  // "input" or the parameter's dotted name
  int64_t index = 0;   // flat element index
  double analytic = 0.0;
  double numeric = 0.0;
};

struct Report {
  int64_t num_checked = 0;
  // Largest |analytic - numeric| over all checked elements.
  double max_abs_error = 0.0;
  // Largest |analytic - numeric| / (atol + rtol * |numeric|); <= 1 when all pass.
  double max_violation = 0.0;
  // Largest |numeric| seen: shows the gradients checked were not all ~0.
  double max_abs_numeric = 0.0;
  // Every failing element, in check order.
  std::vector<Mismatch> failures;
  // The element with the largest violation.
  Mismatch worst;

  bool ok() const { return failures.empty(); }
  // Summary plus up to 10 failures, for test messages.
  std::string ToString() const;
};

// A scalar function of one tensor's current contents, evaluated in double.
using ScalarFunction = std::function<absl::StatusOr<double>(const core::Tensor& x)>;

// Compares `analytic` (d f / d x, numel of x) with central differences of `f` at `x`,
// perturbing x's elements in place (x must be fp32 on the CPU) and restoring them.
// `name` labels mismatches. Errors from `f` are returned.
absl::StatusOr<Report> CheckFunction(const ScalarFunction& f, const core::Tensor& x,
                                     const core::Tensor& analytic, const std::string& name,
                                     const Options& options = {});

// The check described at the top of this file. Errors from Forward/Backward are
// returned; tolerance violations are reported in the Report, not as errors.
absl::StatusOr<Report> CheckModule(core::Module& module, const core::Tensor& input,
                                   const Options& options = {});

// Overwrites every fp32 parameter of `module` with N(mean, stddev) draws from `seed`,
// so gradient checks do not run at special points (LayerNorm's weight 1, bias 0).
void RandomizeParameters(core::Module& module, uint64_t seed, float mean, float stddev);

// An fp32 CPU tensor of `shape` with N(0, stddev) entries from `seed`.
core::Tensor RandomTensor(const core::Shape& shape, uint64_t seed, float stddev = 1.0f);

// int32 CPU token ids [B, T], uniform in [0, V), from `seed`.
core::Tensor RandomTokens(int64_t B, int64_t T, int64_t V, uint64_t seed);

// The population standard deviation of `v` (for checks on initialisations).
double StdDev(const std::vector<float>& v);

// Merges `other` into `into` (counts, maxima, failures).
void MergeReport(const Report& other, Report* into);

}  // namespace gradcheck
}  // namespace nn

#endif  // NN_TESTING_GRADCHECK_H_
