// Checkpoints and safetensors written from CUDA tensors load on the CPU path, and
// files written from CPU tensors load into CUDA tensors: the format does not record the
// device. Tagged gpu; skips (saying why) without a usable GPU.
#include <cstdlib>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "checkpoint/sharded.h"
#include "core/cuda_device.h"
#include "gtest/gtest.h"

namespace checkpoint {
namespace {

using core::DType;
using core::Tensor;

std::string Root(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp != nullptr ? tmp : "/tmp") + "/device_ckpt_" + name;
}

class DeviceCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<int> n = core::CudaDeviceCount();
    if (!n.ok() || *n == 0) GTEST_SKIP() << "no usable CUDA device: " << n.status();
  }
  Tensor OnGpu(const Tensor& h) {
    Tensor d =
        Tensor::Allocate(h.shape(), h.dtype(), core::MemoryTag::kOther, core::Device::Cuda(0))
            .value();
    EXPECT_TRUE(d.CopyFrom(h).ok());
    return d;
  }
  std::vector<float> FromGpu(const Tensor& d) {
    Tensor h = Tensor::Zeros(d.shape(), d.dtype());
    EXPECT_TRUE(h.CopyFrom(d).ok());
    return h.ToVector();
  }
};

TEST_F(DeviceCheckpointTest, ShardedSaveFromTheDeviceLoadsOnTheCpuAndBack) {
  std::vector<float> values(1000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.25f * static_cast<float>(i) - 7;
  Tensor host = Tensor::FromVector(values, {10, 100}).value();
  Tensor dev = OnGpu(host);
  // Three tensors from device memory: the whole buffer, a view at an offset (a rank lists
  // each tensor once), and the buffer stored as bf16.
  TensorSlice a{"w", {10, 100}, DType::kFloat32, 0, 1000, dev.Flat()};
  TensorSlice b{"tail", {400}, DType::kFloat32, 0, 400, dev.View(600, {400}).value()};
  TensorSlice c{"w16", {1000}, DType::kBFloat16, 0, 1000, dev.Flat()};
  const std::string dir = Root("sharded");
  absl::Status saved = Save(dir, {a, b, c});
  ASSERT_TRUE(saved.ok()) << saved;
  auto full = LoadFull(dir, {"w", "tail", "w16"});
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ((*full)[0].second.ToVector(), values);  // CPU load of a device save: exact
  EXPECT_EQ((*full)[1].second.ToVector(),
            std::vector<float>(values.begin() + 600, values.end()));  // the view's offset
  EXPECT_EQ((*full)[2].second.dtype(), DType::kBFloat16);
  // Load into device tensors, one converting bf16 -> fp32.
  Tensor back =
      Tensor::Allocate({1000}, DType::kFloat32, core::MemoryTag::kOther, core::Device::Cuda(0))
          .value();
  Tensor back16 =
      Tensor::Allocate({1000}, DType::kFloat32, core::MemoryTag::kOther, core::Device::Cuda(0))
          .value();
  auto stats = Load(dir, {{"w", 0, 1000, back}, {"w16", 0, 1000, back16}});
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(FromGpu(back), values);
  EXPECT_EQ(FromGpu(back16), (*full)[2].second.ToVector());
  // A CPU save loads into the device the same way.
  const std::string cpu_dir = Root("sharded_cpu");
  absl::Status cpu_saved =
      Save(cpu_dir, {TensorSlice{"w", {10, 100}, DType::kFloat32, 0, 1000, host.Flat()}});
  ASSERT_TRUE(cpu_saved.ok()) << cpu_saved;
  Tensor again =
      Tensor::Allocate({1000}, DType::kFloat32, core::MemoryTag::kOther, core::Device::Cuda(0))
          .value();
  ASSERT_TRUE(Load(cpu_dir, {{"w", 0, 1000, again}}).ok());
  EXPECT_EQ(FromGpu(again), values);
}

TEST_F(DeviceCheckpointTest, SafetensorsFromTheDeviceMatchTheCpuFileByteForByte) {
  Tensor host = Tensor::FromVector({1, -2, 3.5f, 4}, {2, 2}).value();
  Tensor host16 = host.ToDType(DType::kBFloat16, core::MemoryTag::kOther).value();
  const std::string from_gpu = Root("gpu.safetensors");
  const std::string from_cpu = Root("cpu.safetensors");
  ASSERT_TRUE(ExportSafetensors(from_gpu, {{"a", OnGpu(host)}, {"b", OnGpu(host16)}}, {}).ok());
  ASSERT_TRUE(ExportSafetensors(from_cpu, {{"a", host}, {"b", host16}}, {}).ok());
  auto g = ImportSafetensors(from_gpu);
  auto c = ImportSafetensors(from_cpu);
  ASSERT_TRUE(g.ok() && c.ok());
  ASSERT_EQ(g->tensors.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(g->tensors[i].second.dtype(), c->tensors[i].second.dtype());
    EXPECT_EQ(g->tensors[i].second.ToVector(), c->tensors[i].second.ToVector());
  }
}

}  // namespace
}  // namespace checkpoint
