// GPU tests (tag "gpu"): the fused CUDA AdamW and SGD against the CPU optimizers after
// several steps. Skipped, with the reason, where no CUDA device is usable.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/cuda_device.h"
#include "core/module.h"
#include "core/parameter.h"
#include "core/random.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "optim/adamw.h"
#include "optim/sgd.h"

namespace optim {
namespace {

#define SKIP_WITHOUT_GPU()                                                        \
  do {                                                                            \
    absl::StatusOr<int> n = core::CudaDeviceCount();                              \
    if (!n.ok()) GTEST_SKIP() << "no usable CUDA device: " << n.status();         \
    if (*n == 0) GTEST_SKIP() << "no usable CUDA device: CudaDeviceCount() is 0"; \
  } while (0)

const core::Device kGpu = core::Device::Cuda(0);

core::Tensor To(const core::Tensor& t, const core::Device& d) {
  core::Tensor out = core::Tensor::Empty(t.shape(), t.dtype(), core::MemoryTag::kOther, d);
  const absl::Status s = out.CopyFrom(t);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

std::vector<float> Host(const core::Tensor& t) {
  return t.device().is_cpu() ? t.ToVector() : To(t, core::Device::Cpu()).ToVector();
}

core::Tensor Normal(int64_t n, core::Rng* rng) {
  core::Tensor t = core::Tensor::Empty({n});
  for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = rng->Normal(0.0f, 1.0f);
  return t;
}

double RelErr(const std::vector<float>& got, const std::vector<float>& want) {
  double d = 0, w = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    d += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    w += static_cast<double>(want[i]) * want[i];
  }
  return w > 0 ? std::sqrt(d / w) : std::sqrt(d);
}

// Parameters of odd sizes (one larger than a fused chunk, one empty-ish), identical on
// both devices; `steps` steps with the same gradients on both; data and state compared.
// Both sides evaluate the same fp32 formula; nvcc may contract a*b+c into one FMA, so
// elements can differ in the last bits: 1e-6 relative in the 2-norm.
template <typename MakeOpt>
void CompareOptimizers(MakeOpt make, int steps) {
  const std::vector<int64_t> sizes = {1, 7, 2048, 5001, 3};
  std::vector<core::ParameterPtr> cpu, gpu;
  core::Rng rng(1);
  for (int64_t n : sizes) {
    core::Tensor d = Normal(n, &rng);
    cpu.push_back(core::Parameter::Make(d.Clone(core::MemoryTag::kParam)));
    gpu.push_back(core::Parameter::Make(To(d, kGpu)));
  }
  std::unique_ptr<Optimizer> oc = make(cpu), og = make(gpu);
  for (int s = 0; s < steps; ++s) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (s == 1 && i == 1) {  // a parameter without a gradient this step is skipped
        cpu[i]->grad = core::Tensor();
        gpu[i]->grad = core::Tensor();
        continue;
      }
      core::Tensor g = Normal(sizes[i], &rng);
      cpu[i]->grad = g;
      gpu[i]->grad = To(g, kGpu);
    }
    ASSERT_TRUE(oc->Step().ok());
    const absl::Status st = og->Step();
    ASSERT_TRUE(st.ok()) << st;
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_TRUE(gpu[i]->data.device() == kGpu);
    EXPECT_LE(RelErr(Host(gpu[i]->data), cpu[i]->data.ToVector()), 1e-6) << "param " << i;
  }
  const auto sc = oc->StateTensors(), sg = og->StateTensors();
  ASSERT_EQ(sc.size(), sg.size());
  for (size_t i = 0; i < sc.size(); ++i) {
    EXPECT_EQ(sc[i].first, sg[i].first);
    EXPECT_TRUE(sg[i].second.device() == kGpu) << sg[i].first;
    EXPECT_LE(RelErr(Host(sg[i].second), sc[i].second.ToVector()), 1e-6) << sc[i].first;
  }
}

TEST(CudaOptimTest, FusedAdamWMatchesCpuAdamWAfterSeveralSteps) {
  SKIP_WITHOUT_GPU();
  AdamWOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  CompareOptimizers(
      [&](std::vector<core::ParameterPtr> p) -> std::unique_ptr<Optimizer> {
        return AdamW::Create(std::move(p), o).value();
      },
      5);
}

TEST(CudaOptimTest, FusedSgdWithNesterovMatchesCpuSgdAfterSeveralSteps) {
  SKIP_WITHOUT_GPU();
  SgdOptions o;
  o.lr = 0.05;
  o.momentum = 0.9;
  o.nesterov = true;
  o.weight_decay = 0.01;
  CompareOptimizers(
      [&](std::vector<core::ParameterPtr> p) -> std::unique_ptr<Optimizer> {
        return SGD::Create(std::move(p), o).value();
      },
      5);
}

TEST(CudaOptimTest, DataAndGradOnDifferentDevicesIsInvalidArgument) {
  SKIP_WITHOUT_GPU();
  core::ParameterPtr p = core::Parameter::Make(core::Tensor::Zeros({4}));
  p->grad = core::Tensor::Zeros({4}, core::DType::kFloat32, core::MemoryTag::kGrad, kGpu);
  std::unique_ptr<AdamW> opt = AdamW::Create(std::vector<core::NamedParameter>{{"w", p}}).value();
  const absl::Status s = opt->Step();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("cuda:0"), std::string::npos) << s;
  EXPECT_NE(std::string(s.message()).find("'w'"), std::string::npos) << s;
}

}  // namespace
}  // namespace optim
