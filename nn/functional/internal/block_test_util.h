// Test-only: what the fused-step tests share (fused_test, llama_fused_test; device_test_util for
// the GPU ones) to run one training step of a hand-written module and of its graph twin (the
// same parameters through nn/functional's ops) and compare the two bit for bit, the dispatch
// calls included.
//
//   const Step want = RunStep(*block, /*graph=*/nullptr, x, g);
//   const Step got = RunStep(*block, CallOneOf(*graph), x, g);
//   if (ExpectSameSteps(got, want, block->NamedParameters())) {
//     ExpectAttentionPath(want, /*fused=*/false);
//     EXPECT_EQ(got.backward_converts - want.backward_converts, 1);
//   }
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

// `graph`'s CallOne as a GraphForward; `graph` must outlive it.
GraphForward CallOneOf(core::Module& graph);

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

// One step's results: the output, dL/dx, every parameter gradient (NamedParameters order), the ops
// it dispatched (category, name and GEMM shape, in order) less the bf16 roundings and copies, and
// how many roundings ("convert") its backward made.
struct Step {
  std::vector<core::Tensor> bits;
  std::vector<std::string> ops;
  int backward_converts = 0;
};

// StepTensors with the ops recorded into a Step; the ops are empty after a failure.
Step RunStep(core::Module& module, const GraphForward& graph, const core::Tensor& x,
             const core::Tensor& g, const std::vector<core::Tensor>& prior = {});

// Expects `got` and `want` each to hold the output, dL/dx and the gradient of each of `params`,
// and `got` to have `want`'s bits in each (named in failures) and `want`'s ops. Returns false,
// without comparing, when either does not hold 2 + params.size() values.
bool ExpectSameSteps(const Step& got, const Step& want,
                     const std::vector<core::NamedParameter>& params);

// Whether one of `step`'s ops contains `op` ("silu_mul.backward").
bool Ran(const Step& step, const std::string& op);

// Expects `step` to have run attention's fused kernel (its CPU twin on the CPU) when `fused`, and
// the causal softmax of attention's GEMM path otherwise.
void ExpectAttentionPath(const Step& step, bool fused);

}  // namespace block_test_util
}  // namespace functional
}  // namespace nn

#endif  // NN_FUNCTIONAL_INTERNAL_BLOCK_TEST_UTIL_H_
