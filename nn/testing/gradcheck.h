// Test-only: checks hand-written backward passes (core::Module's Backward) against central
// finite differences, with the public checker's types and CheckFunction
// (nn/functional/gradcheck.h).
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
#include "nn/functional/gradcheck.h"

namespace nn {
namespace gradcheck {

// The check described at the top of this file. Errors from Forward/Backward are
// returned; tolerance violations are reported in the Report, not as errors.
absl::StatusOr<Report> CheckModule(core::Module& module, const core::Tensor& input,
                                   const Options& options = {});

// Overwrites every fp32 parameter of `module` with N(mean, stddev) draws from `seed`,
// so gradient checks do not run at special points (LayerNorm's weight 1, bias 0).
void RandomizeParameters(core::Module& module, uint64_t seed, float mean, float stddev);

// int32 CPU token ids [B, T], uniform in [0, V), from `seed`.
core::Tensor RandomTokens(int64_t B, int64_t T, int64_t V, uint64_t seed);

// The population standard deviation of `v` (for checks on initialisations).
double StdDev(const std::vector<float>& v);

}  // namespace gradcheck
}  // namespace nn

#endif  // NN_TESTING_GRADCHECK_H_
