// Tests of the host side of checkpoint staging (conversion, CPU tensors in place), and
// of the pinned-buffer path when a GPU is usable.
#include "checkpoint/internal/host_staging.h"

#include <cstring>
#include <vector>

#include "core/cuda_device.h"
#include "gtest/gtest.h"

namespace checkpoint {
namespace internal {
namespace {

using core::DType;
using core::Tensor;

TEST(HostStagingTest, ConvertsBetweenFloat32AndBfloat16OnTheHost) {
  const std::vector<float> in = {1.0f, 1.0f + 1.0f / 256, -3.5f};
  std::vector<core::BFloat16> bf(3);
  ASSERT_TRUE(ConvertHostElements(in.data(), DType::kFloat32, bf.data(), DType::kBFloat16, 3, "t").ok());
  EXPECT_EQ(bf[0].ToFloat(), 1.0f);
  EXPECT_EQ(bf[1].ToFloat(), 1.0f);  // halfway: to even
  EXPECT_EQ(bf[2].ToFloat(), -3.5f);
  std::vector<float> back(3);
  ASSERT_TRUE(ConvertHostElements(bf.data(), DType::kBFloat16, back.data(), DType::kFloat32, 3, "t").ok());
  EXPECT_EQ(back, (std::vector<float>{1.0f, 1.0f, -3.5f}));
  int32_t ints[2] = {1, 2};
  float f[2];
  absl::Status s = ConvertHostElements(ints, DType::kInt32, f, DType::kFloat32, 2, "tensor 'step'");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tensor 'step'"), std::string::npos) << s;
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
  EXPECT_EQ(CopyHostToTensor(dst, Tensor::Zeros({3}), "t").code(), absl::StatusCode::kInvalidArgument);
}

TEST(HostStagingTest, PinnedPathRoundTripsThroughADevice) {
  absl::StatusOr<int> n = core::CudaDeviceCount();
  if (!n.ok() || *n == 0) {
    EXPECT_EQ(PinnedBuffer::Allocate(16, "t").status().code() == absl::StatusCode::kUnavailable,
              !core::BuiltWithCuda());
    GTEST_SKIP() << "no usable CUDA device: " << n.status();
  }
  Tensor dev = Tensor::Allocate({3}, DType::kFloat32, core::MemoryTag::kOther,
                                core::Device::Cuda(0)).value();
  ASSERT_TRUE(CopyHostToTensor(dev, Tensor::FromVector({1.5f, 2.5f, 3.5f}, {3}).value(), "t").ok());
  HostBytes f32 = HostBytes::Of(dev, DType::kFloat32, "t").value();
  std::vector<float> got(3);
  std::memcpy(got.data(), f32.data(), 12);
  EXPECT_EQ(got, (std::vector<float>{1.5f, 2.5f, 3.5f}));
  HostBytes bf = HostBytes::Of(dev, DType::kBFloat16, "t").value();
  EXPECT_EQ(static_cast<const core::BFloat16*>(bf.data())[1].ToFloat(), 2.5f);
}

}  // namespace
}  // namespace internal
}  // namespace checkpoint
