#include "core/cuda_device.h"

#include "core/tensor.h"
#include "gtest/gtest.h"

namespace core {
namespace {

TEST(CudaDeviceTest, QueryAnswersWithoutHanging) {
  absl::StatusOr<int> n = CudaDeviceCount();
  if (!BuiltWithCuda()) {
    EXPECT_EQ(n.status().code(), absl::StatusCode::kUnavailable);
    GTEST_SKIP() << "built without CUDA: " << n.status();
  }
  if (!n.ok()) GTEST_SKIP() << n.status();
  EXPECT_GT(*n, 0);
  EXPECT_TRUE(CudaDeviceName(0).ok());
}

TEST(CudaDeviceTest, AllocateFillAndCopyBack) {
  absl::StatusOr<int> n = CudaDeviceCount();
  if (!n.ok()) GTEST_SKIP() << n.status();
  auto alloc = std::make_shared<Allocator>(Device::Cuda(0));
  ScopedAllocator scope(alloc);
  Tensor d = Tensor::Allocate({1000}, DType::kFloat32, MemoryTag::kParam, Device::Cuda(0)).value();
  EXPECT_EQ(alloc->Stats().current(MemoryTag::kParam), 4000);
  d.Fill(2.5f);
  Tensor h = Tensor::Zeros({1000});
  ASSERT_TRUE(h.CopyFrom(d).ok());
  for (float v : h.ToVector()) ASSERT_EQ(v, 2.5f);
}

}  // namespace
}  // namespace core
