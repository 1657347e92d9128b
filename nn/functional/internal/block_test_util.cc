#include "nn/functional/internal/block_test_util.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/autograd.h"
#include "gtest/gtest.h"
#include "nn/functional/internal/layer_test_util.h"

namespace nn {
namespace functional {
namespace block_test_util {
namespace {

using core::Tensor;

// Appends `profile`'s ops to step->ops, less roundings and copies; counts the roundings.
void Collect(const core::OpProfile& profile, Step* step, int* converts) {
  for (const core::OpRecord& r : profile.records()) {
    if (r.name == "convert") ++*converts;
    if (r.name == "convert" || r.name == "copy") continue;
    step->ops.push_back(absl::StrCat(core::OpCategoryName(r.category), " ", r.name, " ",
                                     r.gemm.batch, "x", r.gemm.m, "x", r.gemm.n, "x", r.gemm.k));
  }
}

}  // namespace

GraphForward CallOneOf(core::Module& graph) {
  return [&graph](const Tensor& x) { return graph.CallOne({x}); };
}

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

Step RunStep(core::Module& module, const GraphForward& graph, const Tensor& x, const Tensor& g,
             const std::vector<Tensor>& prior) {
  core::OpProfile forward, backward;
  Step step;
  step.bits = StepTensors(module, graph, x, g, prior, &forward, &backward);
  if (step.bits.empty()) return step;
  int forward_converts = 0;
  Collect(forward, &step, &forward_converts);
  Collect(backward, &step, &step.backward_converts);
  return step;
}

bool ExpectSameSteps(const Step& got, const Step& want,
                     const std::vector<core::NamedParameter>& params) {
  EXPECT_EQ(got.bits.size(), 2 + params.size());
  EXPECT_EQ(want.bits.size(), 2 + params.size());
  if (got.bits.size() != 2 + params.size() || want.bits.size() != 2 + params.size()) return false;
  layer_test_util::ExpectSameBits(got.bits[0], want.bits[0], "output");
  layer_test_util::ExpectSameBits(got.bits[1], want.bits[1], "input gradient");
  for (size_t i = 0; i < params.size(); ++i) {
    layer_test_util::ExpectSameBits(got.bits[2 + i], want.bits[2 + i],
                                    params[i].first + " gradient");
  }
  EXPECT_EQ(got.ops, want.ops);
  return true;
}

bool Ran(const Step& step, const std::string& op) {
  return std::any_of(step.ops.begin(), step.ops.end(),
                     [&](const std::string& s) { return s.find(op) != std::string::npos; });
}

void ExpectAttentionPath(const Step& step, bool fused) {
  EXPECT_EQ(Ran(step, "fused_attention.backward"), fused);
  EXPECT_EQ(Ran(step, "causal_softmax.backward"), !fused);
}

}  // namespace block_test_util
}  // namespace functional
}  // namespace nn
