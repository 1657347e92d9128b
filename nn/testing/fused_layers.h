// Test-only: checks that a layer's fused path (NOTE [Fused layers] in nn/transformer.h)
// gives the bits of the path through its children.
//
//   const auto fused = nn::fused_layers::StepBits(mlp, x, gy);
//   int calls = 0;
//   core::HookHandle h = nn::fused_layers::CountingHook(*mlp.fc(), &calls);  // fc not Fusable
//   EXPECT_EQ(nn::fused_layers::StepBits(mlp, x, gy), fused);
#ifndef NN_TESTING_FUSED_LAYERS_H_
#define NN_TESTING_FUSED_LAYERS_H_

#include <cstdint>
#include <vector>

#include "core/module.h"
#include "core/tensor.h"

namespace nn {
namespace fused_layers {

// A forward pre-hook that does nothing but count: registering it makes `m` not Fusable
// (nn/internal/validate.h).
core::HookHandle CountingHook(core::Module& m, int* calls);

// The bits of the output, the input gradient and every parameter gradient (in
// NamedParameters order) of one Forward(x) and Backward(gy) of `m`, its gradients cleared
// (set to none) first. A failing call is a test failure, and the bits gathered so far are
// returned.
std::vector<std::vector<uint32_t>> StepBits(core::Module& m, const core::Tensor& x,
                                            const core::Tensor& gy);

}  // namespace fused_layers
}  // namespace nn

#endif  // NN_TESTING_FUSED_LAYERS_H_
