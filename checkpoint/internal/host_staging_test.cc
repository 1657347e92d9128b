// Tests of the host side of checkpoint staging (conversion, CPU tensors in place, staging
// buffers counted by tag), and of the pinned-buffer path when a GPU is usable.
#include "checkpoint/internal/host_staging.h"

#include <cstring>
#include <memory>
#include <vector>

#include "core/allocator.h"
#include "core/cuda_device.h"
#include "gtest/gtest.h"

namespace checkpoint {
namespace internal {
namespace {

using core::DType;
using core::Tensor;

TEST(HostStagingTest, ConvertsBetweenFloat32AndBfloat16OnTheHost) {
  const Tensor in = Tensor::FromVector({1.0f, 1.0f + 1.0f / 256, -3.5f}, {3}).value();
  HostBytes half = HostBytes::Of(in, DType::kBFloat16, "t").value();
  const core::BFloat16* bf = static_cast<const core::BFloat16*>(half.data());
  EXPECT_EQ(bf[0].ToFloat(), 1.0f);
  EXPECT_EQ(bf[1].ToFloat(), 1.0f);  // halfway: to even
  EXPECT_EQ(bf[2].ToFloat(), -3.5f);
  Tensor bf_tensor = Tensor::Zeros({3}, DType::kBFloat16);
  std::memcpy(bf_tensor.raw_data(), half.data(), 6);
  Tensor back = Tensor::Zeros({3});
  ASSERT_TRUE(CopyHostToTensor(back, bf_tensor, "t").ok());
  EXPECT_EQ(back.ToVector(), (std::vector<float>{1.0f, 1.0f, -3.5f}));
  Tensor ints = Tensor::FromInts({1, 2}, {2}).value();
  absl::Status s = CopyHostToTensor(Tensor::Zeros({2}), ints, "tensor 'step'");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tensor 'step'"), std::string::npos) << s;
}

TEST(HostStagingTest, StagingBuffersAreCountedUnderTheirTag) {
  const std::shared_ptr<core::Allocator> pinned = core::Allocator::PinnedHost();
  const int64_t before = pinned->Stats().current(kStagingTag);
  {
    Tensor staged = PinnedStaging(1000, DType::kFloat32, "t").value();
    EXPECT_TRUE(staged.device().is_cpu());
    EXPECT_EQ(staged.numel(), 1000);
    EXPECT_EQ(pinned->Stats().current(kStagingTag), before + 4000);
  }
  EXPECT_EQ(pinned->Stats().current(kStagingTag), before);
  EXPECT_EQ(PinnedStaging(-1, DType::kFloat32, "tensor 'w'").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(HostStagingTest, CpuTensorsAreReadInPlaceOrConverted) {
  Tensor t = Tensor::FromVector({1, 2, 3}, {3}).value();
  HostBytes same = HostBytes::Of(t, DType::kFloat32, "t").value();
  EXPECT_EQ(same.data(), t.raw_data());  // no copy
  EXPECT_EQ(same.nbytes(), 12);
  HostBytes half = HostBytes::Of(t, DType::kBFloat16, "t").value();
  EXPECT_EQ(half.nbytes(), 6);
  const core::BFloat16* h = static_cast<const core::BFloat16*>(half.data());
  EXPECT_EQ(h[2].ToFloat(), 3.0f);
}

TEST(HostStagingTest, CopyHostToTensorOnTheCpuConverts) {
  Tensor dst = Tensor::Zeros({2}, DType::kBFloat16);
  ASSERT_TRUE(CopyHostToTensor(dst, Tensor::FromVector({5, 6}, {2}).value(), "t").ok());
  EXPECT_EQ(dst.ToVector(), (std::vector<float>{5, 6}));
  EXPECT_EQ(CopyHostToTensor(dst, Tensor::Zeros({3}), "t").code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(HostStagingTest, PinnedPathRoundTripsThroughADevice) {
  absl::StatusOr<int> n = core::CudaDeviceCount();
  if (!n.ok() || *n == 0) {
    GTEST_SKIP() << "no usable CUDA device: " << n.status();
  }
  Tensor dev =
      Tensor::Allocate({3}, DType::kFloat32, core::MemoryTag::kOther, core::Device::Cuda(0))
          .value();
  ASSERT_TRUE(CopyHostToTensor(dev, Tensor::FromVector({1.5f, 2.5f, 3.5f}, {3}).value(), "t").ok());
  HostBytes f32 = HostBytes::Of(dev, DType::kFloat32, "t").value();
  std::vector<float> got(3);
  std::memcpy(got.data(), f32.data(), 12);
  EXPECT_EQ(got, (std::vector<float>{1.5f, 2.5f, 3.5f}));
  HostBytes bf = HostBytes::Of(dev, DType::kBFloat16, "t").value();
  EXPECT_EQ(static_cast<const core::BFloat16*>(bf.data())[1].ToFloat(), 2.5f);
  // The device tensor's bytes are staged in pinned memory counted under kStagingTag.
  const std::shared_ptr<core::Allocator> pinned = core::Allocator::PinnedHost();
  const int64_t before = pinned->Stats().current(kStagingTag);
  {
    HostBytes staged = HostBytes::Of(dev, DType::kFloat32, "t").value();
    EXPECT_EQ(pinned->Stats().current(kStagingTag), before + 12);
  }
  EXPECT_EQ(pinned->Stats().current(kStagingTag), before);
}

}  // namespace
}  // namespace internal
}  // namespace checkpoint
