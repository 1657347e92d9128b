// Test-only: one training step of a module, or of a forward through nn/functional's ops on its
// parameters, for the GPU tests to compare across devices (device_test_util).
//
//   std::vector<core::Tensor> y_gx_grads = StepTensors(*block, /*graph=*/nullptr, x, g);
#ifndef NN_FUNCTIONAL_INTERNAL_BLOCK_TEST_UTIL_H_
#define NN_FUNCTIONAL_INTERNAL_BLOCK_TEST_UTIL_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/module.h"
#include "core/op_profile.h"
#include "core/tensor.h"

namespace nn {
namespace functional {
namespace block_test_util {

// A graph twin's forward: the output for `x`, through ops that record their nodes on the
// autograd graph.
using GraphForward = std::function<absl::StatusOr<core::Tensor>(const core::Tensor& x)>;

// One step of `module`, on the devices of x, g and its parameters. Each parameter's gradient
// starts as a copy of its entry of `prior` (NamedParameters order; a missing or undefined entry:
// none). With `graph` null the step is the hand-written module.Forward(x) and Backward(g); else
// `graph` on x as a leaf, then core::Backward from g. Returns the output, dL/dx and a copy of
// every parameter gradient (NamedParameters order). A failed stage is a test failure, and the
// result is then empty. The forward's ops record into `forward`, the backward's into
// `backward`, where not null.
std::vector<core::Tensor> StepTensors(core::Module& module, const GraphForward& graph,
                                      const core::Tensor& x, const core::Tensor& g,
                                      const std::vector<core::Tensor>& prior = {},
                                      core::OpProfile* forward = nullptr,
                                      core::OpProfile* backward = nullptr);

}  // namespace block_test_util
}  // namespace functional
}  // namespace nn

#endif  // NN_FUNCTIONAL_INTERNAL_BLOCK_TEST_UTIL_H_
