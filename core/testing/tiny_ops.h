// Test-only: tiny differentiable CPU ops written as custom functions (core::RecordFunction),
// the way nn/functional writes its ops, for the tests of core's autograd and modules, which
// cannot depend on nn. Elementwise over equal numel; Sum reduces to a scalar.
//
//   core::Tensor x = core::Leaf(core::testing::Vec({1, 2}));
//   absl::StatusOr<core::Tensor> loss = core::testing::Sum(core::testing::Mul(x, x));
#ifndef CORE_TESTING_TINY_OPS_H_
#define CORE_TESTING_TINY_OPS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/autograd.h"
#include "core/tensor.h"

namespace core {
namespace testing {

// When set, every backward of these ops appends its op name here.
extern std::vector<std::string>* backward_log;
// Appends `what` to backward_log when it is set.
void Log(const std::string& what);

// An fp32 CPU tensor of shape {v.size()}.
Tensor Vec(std::vector<float> v);

// a * b, a + b elementwise (equal numel), each recorded under `name`.
absl::StatusOr<Tensor> Mul(Arg a, Arg b, std::string name = "Mul");
absl::StatusOr<Tensor> Add(Arg a, Arg b, std::string name = "Add");
// The sum of every element, shape {}.
absl::StatusOr<Tensor> Sum(Arg a);

}  // namespace testing
}  // namespace core

#endif  // CORE_TESTING_TINY_OPS_H_
