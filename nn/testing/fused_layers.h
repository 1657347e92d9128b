// Test-only: checks that a layer's fused path (NOTE [Block forwards] in nn/transformer.h)
// gives the bits of the path through its children.
//
//   const auto fused = nn::fused_layers::StepBits(mlp, x, gy);
//   int calls = 0;
//   core::HookHandle h = nn::fused_layers::CountingHook(*mlp.fc(), &calls);  // fc now called
//   EXPECT_EQ(nn::fused_layers::StepBits(mlp, x, gy), fused);
#ifndef NN_TESTING_FUSED_LAYERS_H_
#define NN_TESTING_FUSED_LAYERS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/module.h"
#include "core/tensor.h"

namespace nn {
namespace fused_layers {

// A forward pre-hook that does nothing but count: registering it makes a parent call `m` instead
// of running it inline (nn::internal::RunsInline in nn/internal/validate.h).
core::HookHandle CountingHook(core::Module& m, int* calls);

// The bits of the output, the input gradient and every parameter gradient (in
// NamedParameters order) of one Forward(x) and Backward(gy) of `m`, its gradients cleared
// (set to none) first. A failing call is a test failure, and the bits gathered so far are
// returned.
std::vector<std::vector<uint32_t>> StepBits(core::Module& m, const core::Tensor& x,
                                            const core::Tensor& gy);

// What one Forward(x) of `m` (on the CPU) costs: the conversions it records (ops named
// "convert": the bf16 roundings of NOTE [bf16 GEMMs] in nn/linear.h) and the activation
// bytes it leaves held (its caches and its output, by the CPU allocator's activation tag).
// The activations are dropped after. A failing Forward is a test failure.
struct ForwardCost {
  int converts = 0;
  int64_t held_activation_bytes = 0;
};
ForwardCost MeasureForward(core::Module& m, const core::Tensor& x);

// How many ops of each name (core::OpRecord::name: "add", "convert", "matmul", ...) one
// StepBits(m, x, gy) records, forward and backward.
std::map<std::string, int> StepOps(core::Module& m, const core::Tensor& x, const core::Tensor& gy);

// `m` run as it is, then with a CountingHook on its descendant `child` (which makes `child`
// called, not run inline): each run's forward cost, step bits and step ops, and how often the hook
// ran. The backward's conversions (the bf16 roundings of gradients for bf16 GEMMs) are the step's
// less the forward's.
struct HookComparison {
  ForwardCost plain_cost, hooked_cost;
  int plain_backward_converts = 0, hooked_backward_converts = 0;
  std::vector<std::vector<uint32_t>> plain_bits, hooked_bits;
  std::map<std::string, int> plain_ops, hooked_ops;
  int hook_calls = 0;
  // How many more ops named `name` the hooked step recorded than the plain one.
  int MoreOpsWithHook(const std::string& name) const;
};
HookComparison CompareWithHookOn(core::Module& m, core::Module& child, const core::Tensor& x,
                                 const core::Tensor& gy);
// CompareWithHookOn, expecting the same bits both ways and the hook run by each hooked
// forward (test failures otherwise); returns the comparison for the costs.
HookComparison ExpectSameBitsWithHookOn(core::Module& m, core::Module& child, const core::Tensor& x,
                                        const core::Tensor& gy);

}  // namespace fused_layers
}  // namespace nn

#endif  // NN_TESTING_FUSED_LAYERS_H_
