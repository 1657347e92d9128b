// Test-only: what nn/functional's GPU tests share (cuda_layers_test, cuda_attention_test,
// cuda_fused_test, cuda_llama_fused_test; tag "gpu") to run an op, or a step of a module, on
// cuda:0 beside the CPU and compare the two. The tensors, tolerances and SKIP_WITHOUT_GPU come
// from nn/testing/cuda_compare.h, whose tolerances nn/cuda_layers_test.cc explains.
//
//   TEST(CudaFusedTest, OpsMatchTheCpu) {
//     SKIP_WITHOUT_GPU();
//     ExpectDevicesAgree(
//         "ResidualLayerNorm",
//         [](const std::vector<Tensor>& in, const core::Device&) {
//           return ResidualLayerNorm(in[0], in[1], in[2]);
//         },
//         {Normal({2, 37, 128}, 1), Normal({128}, 2), Normal({128}, 3)}, kFp32Rel);
//   }
#ifndef NN_FUNCTIONAL_INTERNAL_DEVICE_TEST_UTIL_H_
#define NN_FUNCTIONAL_INTERNAL_DEVICE_TEST_UTIL_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/module.h"
#include "core/tensor.h"

namespace nn {
namespace functional {
namespace device_test_util {

// The function under test: its outputs for `in`, the inputs placed on `device` (passed along for
// what the function makes itself, such as rotary tables).
using DeviceFn = std::function<absl::StatusOr<std::vector<core::Tensor>>(
    const std::vector<core::Tensor>& in, const core::Device& device)>;

// `y` as the one output of a DeviceFn.
absl::StatusOr<std::vector<core::Tensor>> OneOutput(absl::StatusOr<core::Tensor> y);

// What ExpectDevicesAgree runs on the CPU, and where it places int32 inputs.
struct AgreeOptions {
  // What runs on the CPU; null: the function that runs on cuda:0.
  DeviceFn cpu_fn;
  // Whether int32 inputs (ids, targets) go to cuda:0; false: they stay on the host.
  bool ids_on_device = true;
};

// Runs `fn` on cuda:0 and on the CPU (options.cpu_fn there, where given), each on copies of
// `inputs` placed there (all but int32 ones as leaves), then backward from the same fixed random
// gradient of each output (output k's: cuda_compare::Normal(its shape, 99 + k)). Expects each
// output, and the gradient of each input that is not int32, within `rel` of the CPU's in the
// 2-norm (cuda_compare::RelErr); with `rel` 0, the same values. Failures carry `what`.
void ExpectDevicesAgree(const std::string& what, const DeviceFn& fn,
                        const std::vector<core::Tensor>& inputs, double rel,
                        const AgreeOptions& options = {});

// The output, dL/dx and every parameter gradient (NamedParameters order) of a step, on the host.
using Values = std::vector<std::vector<float>>;

// One step of `module` (Forward(x), then Backward(g)) on the device of its parameters (x and g
// copied there), from no parameter gradients: the output, dL/dx and every parameter gradient
// (NamedParameters order), on the host. A failed stage is a test failure; empty then.
Values DeviceStep(core::Module& module, const core::Tensor& x, const core::Tensor& g);

// Expects `got` to hold as many values as `want`, each of the same size and, when `bits`, the
// same bits, else within `rel` of `want`'s in the 2-norm.
void ExpectClose(const Values& got, const Values& want, double rel, bool bits);

}  // namespace device_test_util
}  // namespace functional
}  // namespace nn

#endif  // NN_FUNCTIONAL_INTERNAL_DEVICE_TEST_UTIL_H_
