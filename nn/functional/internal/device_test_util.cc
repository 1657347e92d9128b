#include "nn/functional/internal/device_test_util.h"

#include <cstring>
#include <utility>

#include "core/autograd.h"
#include "gtest/gtest.h"
#include "nn/testing/cuda_compare.h"

namespace nn {
namespace functional {
namespace device_test_util {

using core::DType;
using core::Tensor;
using cuda_compare::Host;
using cuda_compare::kGpu;
using cuda_compare::Normal;
using cuda_compare::RelErr;
using cuda_compare::To;

namespace {

// What one device computed, on the host: every output, and the gradient of every input that is
// not int32.
struct Result {
  std::vector<std::vector<float>> outs, grads;
};

// `fn` on `inputs` copied to `device` (int32 ones only when `ids_on_device`), all but int32 ones
// as leaves, then backward from fixed random gradients of every output. A failure is a test
// failure; the result then holds what came before it.
Result RunOn(const core::Device& device, const DeviceFn& fn, const std::vector<Tensor>& inputs,
             bool ids_on_device) {
  std::vector<Tensor> in;
  for (const Tensor& t : inputs) {
    const bool ids = t.dtype() == DType::kInt32;
    const Tensor placed = device.is_cpu() || (ids && !ids_on_device) ? t : To(t, device);
    in.push_back(ids ? placed : core::Leaf(placed));
  }
  Result r;
  absl::StatusOr<std::vector<Tensor>> out = fn(in, device);
  EXPECT_TRUE(out.ok()) << out.status();
  if (!out.ok()) return r;
  std::vector<Tensor> seeds;
  for (size_t k = 0; k < out->size(); ++k) {
    const Tensor seed = Normal((*out)[k].shape(), 99 + k);
    seeds.push_back(device.is_cpu() ? seed : To(seed, device));
    r.outs.push_back(Host((*out)[k]));
  }
  const absl::Status back = core::Backward(*out, seeds);
  EXPECT_TRUE(back.ok()) << back;
  for (const Tensor& t : in) {
    if (t.dtype() != DType::kInt32) r.grads.push_back(Host(core::LeafGrad(t)));
  }
  return r;
}

}  // namespace

absl::StatusOr<std::vector<Tensor>> OneOutput(absl::StatusOr<Tensor> y) {
  if (!y.ok()) return y.status();
  return std::vector<Tensor>{*std::move(y)};
}

void ExpectDevicesAgree(const std::string& what, const DeviceFn& fn,
                        const std::vector<Tensor>& inputs, double rel,
                        const AgreeOptions& options) {
  SCOPED_TRACE(what);
  const Result cpu = RunOn(core::Device::Cpu(), options.cpu_fn ? options.cpu_fn : fn, inputs,
                           options.ids_on_device);
  const Result gpu = RunOn(kGpu, fn, inputs, options.ids_on_device);
  if (rel == 0) {
    EXPECT_EQ(gpu.outs, cpu.outs) << "outputs";
    EXPECT_EQ(gpu.grads, cpu.grads) << "gradients";
    return;
  }
  ASSERT_EQ(gpu.outs.size(), cpu.outs.size());
  for (size_t k = 0; k < cpu.outs.size(); ++k) {
    EXPECT_LE(RelErr(gpu.outs[k], cpu.outs[k]), rel) << "output " << k;
  }
  ASSERT_EQ(gpu.grads.size(), cpu.grads.size());
  for (size_t i = 0; i < cpu.grads.size(); ++i) {
    EXPECT_LE(RelErr(gpu.grads[i], cpu.grads[i]), rel) << "gradient of input " << i;
  }
}

Values DeviceStep(core::Module& module, const Tensor& x, const Tensor& g) {
  const std::vector<core::NamedParameter> params = module.NamedParameters();
  const core::Device device = params.front().second->data.device();
  for (const auto& [name, p] : params) p->grad = Tensor();
  absl::StatusOr<Tensor> y = module.Forward(device.is_cpu() ? x : To(x, device));
  EXPECT_TRUE(y.ok()) << y.status();
  if (!y.ok()) return {};
  absl::StatusOr<Tensor> gx = module.Backward(device.is_cpu() ? g : To(g, device));
  EXPECT_TRUE(gx.ok()) << gx.status();
  if (!gx.ok()) return {};
  Values v = {Host(*y), Host(*gx)};
  for (const auto& [name, p] : params) v.push_back(Host(p->grad));
  return v;
}

void ExpectClose(const Values& got, const Values& want, double rel, bool bits) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].size(), want[i].size()) << "value " << i;
    if (bits) {
      EXPECT_EQ(std::memcmp(got[i].data(), want[i].data(), want[i].size() * sizeof(float)), 0)
          << "value " << i << " (0: output, 1: input gradient, then the parameters')";
    } else {
      EXPECT_LE(RelErr(got[i], want[i]), rel) << "value " << i;
    }
  }
}

}  // namespace device_test_util
}  // namespace functional
}  // namespace nn
