#include "nn/functional/internal/block_test_util.h"

#include "core/autograd.h"
#include "gtest/gtest.h"

namespace nn {
namespace functional {
namespace block_test_util {

using core::Tensor;

std::vector<Tensor> StepTensors(core::Module& module, const GraphForward& graph, const Tensor& x,
                                const Tensor& g, const std::vector<Tensor>& prior,
                                core::OpProfile* forward, core::OpProfile* backward) {
  const std::vector<core::NamedParameter> params = module.NamedParameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const bool from_prior = i < prior.size() && prior[i].defined();
    params[i].second->grad = from_prior ? prior[i].Clone(core::MemoryTag::kGrad) : Tensor();
  }
  const Tensor xl = graph ? core::Leaf(x) : x;
  absl::StatusOr<Tensor> y;
  {
    core::ScopedOpProfile on(forward);
    y = graph ? graph(xl) : module.Forward(x);
  }
  EXPECT_TRUE(y.ok()) << y.status();
  if (!y.ok()) return {};
  absl::StatusOr<Tensor> gx;
  {
    core::ScopedOpProfile on(backward);
    if (graph) {
      const absl::Status back = core::Backward({*y}, {g});
      gx = back.ok() ? absl::StatusOr<Tensor>(core::LeafGrad(xl)) : back;
    } else {
      gx = module.Backward(g);
    }
  }
  EXPECT_TRUE(gx.ok()) << gx.status();
  if (!gx.ok()) return {};
  std::vector<Tensor> bits = {*y, *gx};
  for (const auto& [name, p] : module.NamedParameters()) {
    bits.push_back(p->grad.Clone(core::MemoryTag::kOther));
  }
  return bits;
}

}  // namespace block_test_util
}  // namespace functional
}  // namespace nn
