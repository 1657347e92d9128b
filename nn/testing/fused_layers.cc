#include "nn/testing/fused_layers.h"

#include <cstring>

#include "absl/status/status.h"
#include "core/allocator.h"
#include "core/op_profile.h"
#include "gtest/gtest.h"

namespace nn {
namespace fused_layers {

core::HookHandle CountingHook(core::Module& m, int* calls) {
  return m.RegisterForwardPreHook([calls](core::Module&, core::Tensors&) {
    ++*calls;
    return absl::OkStatus();
  });
}

std::vector<std::vector<uint32_t>> StepBits(core::Module& m, const core::Tensor& x,
                                            const core::Tensor& gy) {
  std::vector<std::vector<uint32_t>> out;
  auto bits = [&](const core::Tensor& t) {
    const std::vector<float> v = t.ToVector();
    std::vector<uint32_t> b(v.size());
    std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
    out.push_back(b);
  };
  m.ZeroGrad(/*set_to_none=*/true);
  absl::StatusOr<core::Tensor> y = m.Forward(x);
  EXPECT_TRUE(y.ok()) << y.status();
  if (!y.ok()) return out;
  bits(*y);
  absl::StatusOr<core::Tensor> gx = m.Backward(gy);
  EXPECT_TRUE(gx.ok()) << gx.status();
  if (!gx.ok()) return out;
  bits(*gx);
  for (const auto& [name, p] : m.NamedParameters()) bits(p->grad);
  return out;
}

ForwardCost MeasureForward(core::Module& m, const core::Tensor& x) {
  core::Allocator& cpu = *core::Allocator::Current(core::Device::Cpu());
  core::OpProfile profile;
  ForwardCost cost;
  const int64_t before = cpu.Stats().current(core::MemoryTag::kActivation);
  absl::StatusOr<core::Tensor> y;
  {
    core::ScopedOpProfile on(&profile);
    y = m.Forward(x);
  }
  EXPECT_TRUE(y.ok()) << y.status();
  cost.held_activation_bytes = cpu.Stats().current(core::MemoryTag::kActivation) - before;
  for (const core::OpRecord& r : profile.records()) cost.converts += r.name == "convert";
  m.DropActivations();
  return cost;
}

namespace {

// StepBits(m, x, gy), the ops it records counted by name into *ops.
std::vector<std::vector<uint32_t>> ProfiledStepBits(core::Module& m, const core::Tensor& x,
                                                    const core::Tensor& gy,
                                                    std::map<std::string, int>* ops) {
  core::OpProfile profile;
  std::vector<std::vector<uint32_t>> bits;
  {
    core::ScopedOpProfile on(&profile);
    bits = StepBits(m, x, gy);
  }
  ops->clear();
  for (const core::OpRecord& r : profile.records()) ++(*ops)[r.name];
  return bits;
}

}  // namespace

std::map<std::string, int> StepOps(core::Module& m, const core::Tensor& x, const core::Tensor& gy) {
  std::map<std::string, int> ops;
  ProfiledStepBits(m, x, gy, &ops);
  return ops;
}

int HookComparison::MoreOpsWithHook(const std::string& name) const {
  auto count = [&](const std::map<std::string, int>& ops) {
    auto it = ops.find(name);
    return it == ops.end() ? 0 : it->second;
  };
  return count(hooked_ops) - count(plain_ops);
}

HookComparison CompareWithHookOn(core::Module& m, core::Module& child, const core::Tensor& x,
                                 const core::Tensor& gy) {
  HookComparison c;
  c.plain_cost = MeasureForward(m, x);
  c.plain_bits = ProfiledStepBits(m, x, gy, &c.plain_ops);
  core::HookHandle h = CountingHook(child, &c.hook_calls);
  c.hooked_cost = MeasureForward(m, x);
  c.hooked_bits = ProfiledStepBits(m, x, gy, &c.hooked_ops);
  c.plain_backward_converts = c.plain_ops["convert"] - c.plain_cost.converts;
  c.hooked_backward_converts = c.hooked_ops["convert"] - c.hooked_cost.converts;
  return c;
}

HookComparison ExpectSameBitsWithHookOn(core::Module& m, core::Module& child, const core::Tensor& x,
                                        const core::Tensor& gy) {
  HookComparison c = CompareWithHookOn(m, child, x, gy);
  EXPECT_EQ(c.hooked_bits, c.plain_bits) << "with a hook on " << child.Path();
  EXPECT_EQ(c.hook_calls, 2) << child.Path();
  return c;
}

}  // namespace fused_layers
}  // namespace nn
