#include "core/pinned_buffer.h"

#include <cstring>
#include <vector>

#include "core/cuda_device.h"
#include "gtest/gtest.h"

namespace core {
namespace {

TEST(PinnedBufferTest, TensorsOverTheBufferShareItsBytesAndKeepItAlive) {
  const int64_t before = Allocator::PinnedHost()->Stats().current(MemoryTag::kComm);
  Tensor ints;
  {
    PinnedBuffer buf = PinnedBuffer::Allocate(64, MemoryTag::kComm).value();
    ASSERT_TRUE(buf.defined());
    EXPECT_EQ(buf.size(), 64);
    EXPECT_EQ(buf.pinned(), BuiltWithCuda() && CudaDeviceCount().ok());
    EXPECT_EQ(Allocator::PinnedHost()->Stats().current(MemoryTag::kComm), before + 64);
    Tensor f = buf.AsTensor(0, {2, 4}, DType::kFloat32).value();
    EXPECT_TRUE(f.device().is_cpu());
    EXPECT_EQ(f.raw_data(), buf.data());
    f.Fill(1.5f);
    float first;
    std::memcpy(&first, buf.data(), sizeof(first));
    EXPECT_EQ(first, 1.5f);
    // A second view 32 bytes in, of another dtype, aliases the upper half.
    ints = buf.AsTensor(32, {8}, DType::kInt32).value();
    EXPECT_EQ(static_cast<char*>(ints.raw_data()), static_cast<char*>(buf.data()) + 32);
    EXPECT_TRUE(ints.SharesStorage(f));
    ints.Fill(7);
    EXPECT_EQ(f.ToVector(), (std::vector<float>{1.5f, 1.5f, 1.5f, 1.5f, 1.5f, 1.5f, 1.5f, 1.5f}));
  }
  // The buffer handle is gone; the tensor still holds the memory.
  EXPECT_EQ(Allocator::PinnedHost()->Stats().current(MemoryTag::kComm), before + 64);
  EXPECT_EQ(ints.ToVector()[7], 7.0f);
  ints = Tensor();
  EXPECT_EQ(Allocator::PinnedHost()->Stats().current(MemoryTag::kComm), before);
}

TEST(PinnedBufferTest, ViewsThatDoNotFitAreErrors) {
  PinnedBuffer buf = PinnedBuffer::Allocate(40).value();
  EXPECT_TRUE(absl::IsInvalidArgument(buf.AsTensor(0, {11}, DType::kFloat32).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(buf.AsTensor(2, {1}, DType::kFloat32).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(buf.AsTensor(-4, {1}, DType::kFloat32).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(buf.AsTensor(44, {0}, DType::kFloat32).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(buf.AsTensor(0, {-1}, DType::kFloat32).status()));
  absl::Status big = buf.AsTensor(0, {INT64_MAX, 4}, DType::kBFloat16).status();
  EXPECT_TRUE(absl::IsInvalidArgument(big)) << big;
  EXPECT_NE(big.message().find("40-byte storage"), std::string::npos) << big;
  EXPECT_TRUE(buf.AsTensor(36, {1}, DType::kFloat32).ok());
  EXPECT_TRUE(buf.AsTensor(40, {0}, DType::kFloat32).ok());
  EXPECT_TRUE(buf.AsTensor(2, {19}, DType::kBFloat16).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(PinnedBuffer().AsTensor(0, {}, DType::kInt32).status()));
}

TEST(PinnedBufferTest, BadSizesAreErrors) {
  EXPECT_TRUE(absl::IsInvalidArgument(PinnedBuffer::Allocate(-1).status()));
  absl::Status huge = PinnedBuffer::Allocate(int64_t{1} << 62).status();
  EXPECT_TRUE(absl::IsResourceExhausted(huge)) << huge;
  EXPECT_NE(huge.message().find("pinned"), std::string::npos) << huge;
  PinnedBuffer empty = PinnedBuffer::Allocate(0).value();
  EXPECT_TRUE(empty.defined());
  EXPECT_EQ(empty.size(), 0);
}

TEST(PinnedBufferTest, AllocatePinnedTensorConvertsLikeAnyCpuTensor) {
  Tensor p = Tensor::AllocatePinned({3}, DType::kBFloat16, MemoryTag::kOther).value();
  EXPECT_TRUE(p.device().is_cpu());
  EXPECT_EQ(p.storage()->pinned(), BuiltWithCuda() && CudaDeviceCount().ok());
  Tensor src = Tensor::FromVector({1.0f, -2.5f, 1.0f / 3.0f}, {3}).value();
  ASSERT_TRUE(p.CopyFrom(src).ok());
  EXPECT_EQ(p.ToVector(), (std::vector<float>{1.0f, -2.5f, 0.333984375f}));
}

}  // namespace
}  // namespace core
