#include "core/allocator.h"

#include <memory>
#include <vector>

#include "core/cuda_device.h"
#include "core/tensor.h"
#include "core/testing/fake_segment_source.h"
#include "gtest/gtest.h"

namespace core {
namespace {

using testing::FakeSegmentSource;

constexpr int64_t kMiB = 1024 * 1024;

// A caching allocator on a fake device backed by host memory: the same code path as a
// CUDA allocator, with the cudaMalloc calls counted by the fake source.
class CachingAllocatorTest : public ::testing::Test {
 protected:
  std::shared_ptr<FakeSegmentSource::Counters> c_ = std::make_shared<FakeSegmentSource::Counters>();
  std::shared_ptr<Allocator> MakeAllocator(int64_t cap = 0) {
    return std::make_shared<Allocator>(Device::Cuda(0),
                                       std::make_unique<FakeSegmentSource>(c_, cap));
  }
};

TEST_F(CachingAllocatorTest, TagCountersCountRequestedBytesNotBlocksOrSegments) {
  auto a = MakeAllocator();
  EXPECT_TRUE(a->caching());
  void* p = a->Allocate(1000, MemoryTag::kParam).value();
  void* g = a->Allocate(3 * kMiB + 5, MemoryTag::kGrad).value();
  MemoryStats s = a->Stats();
  EXPECT_EQ(s.current(MemoryTag::kParam), 1000);
  EXPECT_EQ(s.current(MemoryTag::kGrad), 3 * kMiB + 5);
  EXPECT_EQ(s.current_total, 1000 + 3 * kMiB + 5);
  EXPECT_EQ(s.num_allocations, 2);
  EXPECT_EQ(s.reserved_bytes, 2 * kMiB + 20 * kMiB);  // a small and a large segment
  EXPECT_EQ(s.num_device_mallocs, 2);
  a->Free(g, 3 * kMiB + 5, MemoryTag::kGrad);
  s = a->Stats();
  EXPECT_EQ(s.current(MemoryTag::kGrad), 0);
  EXPECT_EQ(s.peak(MemoryTag::kGrad), 3 * kMiB + 5);
  EXPECT_EQ(s.peak_total, 1000 + 3 * kMiB + 5);
  EXPECT_EQ(s.num_allocations, 1);
  EXPECT_EQ(s.reserved_bytes, 22 * kMiB) << "a freed block stays cached";
  EXPECT_EQ(s.num_device_frees, 0);
  EXPECT_NE(s.PeakSummary().find("reserved=22.00MiB"), std::string::npos) << s.PeakSummary();
  // EmptyCache returns the now unused large segment, not the one holding `p`.
  EXPECT_EQ(a->EmptyCache(), 20 * kMiB);
  s = a->Stats();
  EXPECT_EQ(s.reserved_bytes, 2 * kMiB);
  EXPECT_EQ(s.peak_reserved_bytes, 22 * kMiB);
  EXPECT_EQ(s.num_device_frees, 1);
  a->ResetPeaks();
  s = a->Stats();
  EXPECT_EQ(s.peak_reserved_bytes, 2 * kMiB);
  EXPECT_EQ(s.peak_total, 1000);
  a->Free(p, 1000, MemoryTag::kParam);
  EXPECT_EQ(a->Stats().current_total, 0);
}

TEST_F(CachingAllocatorTest, TensorStepPatternCallsNoDeviceMallocAfterWarmUp) {
  auto a = MakeAllocator();
  ScopedAllocator scope(a);
  // Tensors are only allocated and freed here (their memory is host memory behind a
  // "cuda:0" label, so no element is touched).
  const auto step = [] {
    std::vector<Tensor> acts;
    Tensor params = Tensor::Empty({1 << 20}, DType::kBFloat16, MemoryTag::kParam, Device::Cuda(0));
    for (int layer = 0; layer < 6; ++layer) {
      acts.push_back(
          Tensor::Empty({64, 768}, DType::kFloat32, MemoryTag::kActivation, Device::Cuda(0)));
      acts.push_back(
          Tensor::Empty({64, 3072}, DType::kFloat32, MemoryTag::kActivation, Device::Cuda(0)));
    }
    Tensor grads = Tensor::Empty({1 << 20}, DType::kFloat32, MemoryTag::kGrad, Device::Cuda(0));
    while (!acts.empty()) acts.pop_back();
  };
  step();
  const MemoryStats warm = a->Stats();
  EXPECT_GT(warm.num_device_mallocs, 0);
  for (int i = 0; i < 5; ++i) step();
  const MemoryStats after = a->Stats();
  EXPECT_EQ(after.num_device_mallocs, warm.num_device_mallocs);
  EXPECT_EQ(after.reserved_bytes, warm.reserved_bytes);
  EXPECT_EQ(after.peak(MemoryTag::kActivation), warm.peak(MemoryTag::kActivation));
  EXPECT_EQ(after.current_total, 0);
  EXPECT_EQ(c_->allocs, warm.num_device_mallocs);
}

TEST_F(CachingAllocatorTest, OutOfMemoryRetriesAfterEmptyingTheCacheAndNamesTheTag) {
  auto a = MakeAllocator(/*cap=*/32 * kMiB);
  void* x = a->Allocate(12 * kMiB, MemoryTag::kActivation).value();
  a->Free(x, 12 * kMiB, MemoryTag::kActivation);                // cached: 12 MiB reserved, 0 in use
  void* y = a->Allocate(24 * kMiB, MemoryTag::kParam).value();  // needs the retry
  MemoryStats s = a->Stats();
  EXPECT_EQ(s.num_oom_retries, 1);
  EXPECT_EQ(s.num_device_frees, 1);
  EXPECT_EQ(s.reserved_bytes, 24 * kMiB);
  absl::StatusOr<void*> z = a->Allocate(10 * kMiB, MemoryTag::kOptim);
  ASSERT_FALSE(z.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(z.status())) << z.status();
  EXPECT_NE(z.status().message().find("tag optim"), std::string::npos) << z.status();
  EXPECT_NE(z.status().message().find("cuda:0"), std::string::npos) << z.status();
  EXPECT_EQ(a->Stats().current(MemoryTag::kOptim), 0);
  EXPECT_EQ(a->Stats().current_total, 24 * kMiB);
  a->Free(y, 24 * kMiB, MemoryTag::kParam);
}

TEST_F(CachingAllocatorTest, LimitStillAppliesToBytesInUse) {
  auto a = MakeAllocator();
  a->SetLimit(4 * kMiB);
  void* p = a->Allocate(3 * kMiB, MemoryTag::kParam).value();
  absl::StatusOr<void*> q = a->Allocate(2 * kMiB, MemoryTag::kParam);
  EXPECT_TRUE(absl::IsResourceExhausted(q.status())) << q.status();
  EXPECT_EQ(a->Stats().num_device_mallocs, 1);
  a->Free(p, 3 * kMiB, MemoryTag::kParam);
}

TEST_F(CachingAllocatorTest, DoubleFreeLeavesTheCountersAlone) {
  auto a = MakeAllocator();
  void* p = a->Allocate(100, MemoryTag::kOther).value();
  void* q = a->Allocate(100, MemoryTag::kOther).value();
  a->Free(p, 100, MemoryTag::kOther);
  a->Free(p, 100, MemoryTag::kOther);  // reported on stderr, ignored
  EXPECT_EQ(a->Stats().current_total, 100);
  EXPECT_EQ(a->Stats().num_allocations, 1);
  a->Free(q, 100, MemoryTag::kOther);
}

TEST(AllocatorTest, CpuAllocatorIsNotCachingAndReservesNothing) {
  Allocator cpu(Device::Cpu());
  EXPECT_FALSE(cpu.caching());
  EXPECT_FALSE(cpu.pinned());
  void* p = cpu.Allocate(1000, MemoryTag::kOther).value();
  EXPECT_EQ(cpu.Stats().reserved_bytes, 0);
  EXPECT_EQ(cpu.Stats().num_device_mallocs, 0);
  EXPECT_EQ(cpu.EmptyCache(), 0);
  cpu.Free(p, 1000, MemoryTag::kOther);
}

// NOTE [Host heap]: a freed block of 64 KiB or more is kept for the next allocation of its
// size; the counters see only what is in use; EmptyCache frees what is kept.
TEST(AllocatorTest, CpuAllocatorReusesFreedLargeBlocks) {
  Allocator cpu(Device::Cpu());
  const int64_t big = int64_t{256} << 10;
  void* p = cpu.Allocate(big, MemoryTag::kActivation).value();
  cpu.Free(p, big, MemoryTag::kActivation);
  EXPECT_EQ(cpu.Stats().current_total, 0);
  void* q = cpu.Allocate(big, MemoryTag::kActivation).value();
  EXPECT_EQ(q, p);
  EXPECT_EQ(cpu.Stats().current_by_tag[static_cast<int>(MemoryTag::kActivation)], big);
  void* other = cpu.Allocate(big + 4096, MemoryTag::kActivation).value();  // another size
  EXPECT_NE(other, p);
  cpu.Free(other, big + 4096, MemoryTag::kActivation);
  cpu.Free(q, big, MemoryTag::kActivation);
  EXPECT_EQ(cpu.EmptyCache(), big + (big + 4096));
  EXPECT_EQ(cpu.EmptyCache(), 0);
  // Small blocks go straight back to the heap.
  void* small = cpu.Allocate(1000, MemoryTag::kOther).value();
  cpu.Free(small, 1000, MemoryTag::kOther);
  EXPECT_EQ(cpu.EmptyCache(), 0);
}

TEST(AllocatorTest, PinnedHostAllocatesCountedHostMemory) {
  std::shared_ptr<Allocator> pinned = Allocator::PinnedHost();
  EXPECT_TRUE(pinned->device().is_cpu());
  EXPECT_EQ(pinned, Allocator::PinnedHost());
  // Page-locked exactly when CUDA is built in and a device is usable.
  EXPECT_EQ(pinned->pinned(), BuiltWithCuda() && CudaDeviceCount().ok());
  const int64_t before = pinned->Stats().current(MemoryTag::kComm);
  void* p = pinned->Allocate(4096, MemoryTag::kComm).value();
  static_cast<char*>(p)[4095] = 1;
  EXPECT_EQ(pinned->Stats().current(MemoryTag::kComm), before + 4096);
  pinned->Free(p, 4096, MemoryTag::kComm);
  EXPECT_EQ(pinned->Stats().current(MemoryTag::kComm), before);
}

TEST(AllocatorTest, CudaAllocatorIsCachingAndUnavailableWithoutAGpu) {
  Allocator gpu(Device::Cuda(0));
  EXPECT_TRUE(gpu.caching());
  if (CudaDeviceCount().ok()) GTEST_SKIP() << "a CUDA device is present";
  absl::StatusOr<void*> p = gpu.Allocate(16, MemoryTag::kOther);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kUnavailable) << p.status();
  EXPECT_NE(p.status().message().find("cuda:0"), std::string::npos) << p.status();
  EXPECT_EQ(gpu.Stats().num_oom_retries, 0);
  EXPECT_EQ(gpu.Stats().current_total, 0);
}

}  // namespace
}  // namespace core
