// The gradient checker: compares the gradients a backward computes with central finite
// differences of the forward, for the differentiable ops of nn/functional, custom functions
// (core::RecordFunction) and anything composed of them. Public: a user who writes an op
// checks its derivative with it.
//
//   namespace F = nn::functional;
//   absl::StatusOr<nn::gradcheck::Report> r = nn::gradcheck::CheckGradients(
//       [](const std::vector<core::Tensor>& in) -> absl::StatusOr<std::vector<core::Tensor>> {
//         ASSIGN_OR_RETURN(core::Tensor y, F::Gelu(in[0]));
//         return std::vector<core::Tensor>{y};
//       },
//       {nn::gradcheck::RandomTensor({4, 8}, /*seed=*/1)});
//   // r.ok(): the check ran; r->ok(): every element within tolerance; r->ToString() says
//   // which were not.
//
// The loss is L = sum over outputs k and elements i of out_k[i] * R_k[i], with R fixed
// N(0, 1) draws from options.seed (so every output element has its own weight), summed in
// double. Backward(outputs, R) gives the analytic gradients; each checked element of each
// fp32 input (and of each given parameter) is moved by +-eps in place and the function run
// again under core::NoGradScope; (L(+eps) - L(-eps)) / (step actually taken) is compared
// with the analytic value. The forward runs in the ops' own precision (fp32); the loss and
// the quotient are double. Inputs and parameters are restored bit for bit.
#ifndef NN_FUNCTIONAL_GRADCHECK_H_
#define NN_FUNCTIONAL_GRADCHECK_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/parameter.h"
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
  // CheckModule: also check d L / d input (ignored for non-fp32 inputs such as token ids).
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

// A function of tensors to differentiate: outputs from inputs.
using Function =
    std::function<absl::StatusOr<std::vector<core::Tensor>>(const std::vector<core::Tensor>&)>;

// The check described at the top of this file. `fn` gets the inputs as leaves (fp32 ones;
// int32 inputs such as token ids are passed as they are and not checked) and may use the
// `parameters` (checked too, by name), whose gradients it leaves in Parameter::grad.
// Inputs are labelled `names[i]`, or "input i". Outputs must be fp32 (an int32 output, such
// as argmax indices, is left out of L). Errors from `fn` or Backward are returned; tolerance
// violations are in the Report. InvalidArgument for a non-CPU or undefined input, a
// parameter that is not fp32 on the CPU, or a checked input that received no gradient.
absl::StatusOr<Report> CheckGradients(
    const Function& fn, const std::vector<core::Tensor>& inputs, const Options& options = {},
    const std::vector<std::pair<std::string, core::ParameterPtr>>& parameters = {},
    const std::vector<std::string>& names = {});

// An fp32 CPU tensor of `shape` with N(0, stddev) entries from `seed`.
core::Tensor RandomTensor(const core::Shape& shape, uint64_t seed, float stddev = 1.0f);

// Merges `other` into `into` (counts, maxima, failures).
void MergeReport(const Report& other, Report* into);

}  // namespace gradcheck
}  // namespace nn

#endif  // NN_FUNCTIONAL_GRADCHECK_H_
