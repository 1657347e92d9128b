#include "nn/testing/cuda_compare.h"

#include <cmath>

#include "core/allocator.h"
#include "core/random.h"
#include "nn/losses.h"
#include "nn/ops.h"
#include "nn/to_device.h"

namespace nn {
namespace cuda_compare {

core::Tensor To(const core::Tensor& t, const core::Device& d) {
  core::Tensor out = core::Tensor::Empty(t.shape(), t.dtype(), core::MemoryTag::kOther, d);
  const absl::Status s = out.CopyFrom(t);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

std::vector<float> Host(const core::Tensor& t) {
  return t.device().is_cpu() ? t.ToVector() : To(t, core::Device::Cpu()).ToVector();
}

core::Tensor Normal(const core::Shape& shape, uint64_t seed, float stddev) {
  core::Tensor t = core::Tensor::Empty(shape);
  core::Rng rng(seed);
  FillNormal(t, 0.0f, stddev, &rng);
  return t;
}

core::Tensor Ids(const core::Shape& shape, int64_t num, uint64_t seed) {
  core::Tensor t = core::Tensor::Zeros(shape, core::DType::kInt32);
  core::Rng rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) {
    t.data<int32_t>()[i] = static_cast<int32_t>(rng.NextU64() % static_cast<uint64_t>(num));
  }
  return t;
}

double RelErr(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double d = 0, w = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    d += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    w += static_cast<double>(want[i]) * want[i];
  }
  return w > 0 ? std::sqrt(d / w) : std::sqrt(d);
}

void CompareModules(core::Module& cpu, core::Module& gpu, const core::Tensor& x, double rel) {
  ASSERT_TRUE(ToDevice(gpu, kGpu).ok());
  absl::StatusOr<core::Tensor> y_cpu = cpu.Forward(x);
  absl::StatusOr<core::Tensor> y_gpu = gpu.Forward(To(x, kGpu));
  ASSERT_TRUE(y_cpu.ok()) << y_cpu.status();
  ASSERT_TRUE(y_gpu.ok()) << y_gpu.status();
  EXPECT_TRUE(y_gpu->device() == kGpu) << y_gpu->ToString();
  EXPECT_LE(RelErr(Host(*y_gpu), y_cpu->ToVector()), rel) << cpu.Describe() << " forward";
  const core::Tensor gy = Normal(y_cpu->shape(), 99);
  absl::StatusOr<core::Tensor> gx_cpu = cpu.Backward(gy);
  absl::StatusOr<core::Tensor> gx_gpu = gpu.Backward(To(gy, kGpu));
  ASSERT_TRUE(gx_cpu.ok()) << gx_cpu.status();
  ASSERT_TRUE(gx_gpu.ok()) << gx_gpu.status();
  ASSERT_EQ(gx_cpu->defined(), gx_gpu->defined());
  if (gx_cpu->defined()) {
    EXPECT_LE(RelErr(Host(*gx_gpu), gx_cpu->ToVector()), rel) << cpu.Describe() << " grad input";
  }
  const auto pc = cpu.NamedParameters();
  const auto pg = gpu.NamedParameters();
  ASSERT_EQ(pc.size(), pg.size());
  for (size_t i = 0; i < pc.size(); ++i) {
    ASSERT_TRUE(pg[i].second->grad.defined()) << pg[i].first;
    EXPECT_TRUE(pg[i].second->grad.device() == kGpu) << pg[i].first;
    EXPECT_LE(RelErr(Host(pg[i].second->grad), pc[i].second->grad.ToVector()), rel)
        << cpu.Describe() << " grad of " << pc[i].first;
  }
}

LossGradients LanguageModelGradients(core::Module& model, const core::Tensor& tokens,
                                     const core::Tensor& targets) {
  LossGradients out;
  core::Allocator& gpu = *core::Allocator::Current(kGpu);
  const int64_t before = gpu.Stats().current(core::MemoryTag::kActivation);
  absl::StatusOr<core::Tensor> logits = model.Forward(tokens);
  if (!logits.ok()) {
    ADD_FAILURE() << logits.status();
    return out;
  }
  out.activation_bytes_after_forward = gpu.Stats().current(core::MemoryTag::kActivation) - before;
  absl::StatusOr<LossResult> loss = CrossEntropyLoss(*logits, targets);
  if (!loss.ok()) {
    ADD_FAILURE() << loss.status();
    return out;
  }
  if (absl::Status s = model.Backward(loss->grad).status(); !s.ok()) {
    ADD_FAILURE() << s;
    return out;
  }
  for (const auto& [name, p] : model.NamedParameters()) out.grads.push_back(Host(p->grad));
  return out;
}

}  // namespace cuda_compare
}  // namespace nn
