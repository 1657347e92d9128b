#include "core/tensor.h"

#include <cstdlib>
#include <limits>
#include <string>
#include <thread>

#include "core/cuda_device.h"
#include "core/parameter.h"
#include "gtest/gtest.h"

namespace core {
namespace {

// Each test measures with its own allocator so that other allocations in the process
// do not disturb the counts.
class TensorTest : public ::testing::Test {
 protected:
  std::shared_ptr<Allocator> alloc_ = std::make_shared<Allocator>(Device::Cpu());
  ScopedAllocator scope_{alloc_};
};

TEST_F(TensorTest, AllocationCountsBytesByTag) {
  Tensor p = Tensor::Zeros({4, 8}, DType::kFloat32, MemoryTag::kParam);
  Tensor g = Tensor::Zeros({16}, DType::kBFloat16, MemoryTag::kGrad);
  MemoryStats s = alloc_->Stats();
  EXPECT_EQ(s.current(MemoryTag::kParam), 4 * 8 * 4);
  EXPECT_EQ(s.current(MemoryTag::kGrad), 16 * 2);
  EXPECT_EQ(s.current(MemoryTag::kOptim), 0);
  EXPECT_EQ(s.current_total, 128 + 32);
  EXPECT_EQ(s.num_allocations, 2);
  p = Tensor();
  s = alloc_->Stats();
  EXPECT_EQ(s.current(MemoryTag::kParam), 0);
  EXPECT_EQ(s.peak(MemoryTag::kParam), 128);
  EXPECT_EQ(s.peak_total, 160);
}

TEST_F(TensorTest, PeakTracksHighWaterAndResets) {
  {
    Tensor a = Tensor::Empty({1000}, DType::kFloat32, MemoryTag::kActivation);
    Tensor b = Tensor::Empty({500}, DType::kFloat32, MemoryTag::kActivation);
  }
  Tensor c = Tensor::Empty({100}, DType::kFloat32, MemoryTag::kActivation);
  MemoryStats s = alloc_->Stats();
  EXPECT_EQ(s.peak(MemoryTag::kActivation), 6000);
  EXPECT_EQ(s.current(MemoryTag::kActivation), 400);
  alloc_->ResetPeaks();
  EXPECT_EQ(alloc_->Stats().peak(MemoryTag::kActivation), 400);
  EXPECT_EQ(alloc_->Stats().peak_total, 400);
}

TEST_F(TensorTest, ViewsAliasAndAllocateNothing) {
  Tensor w = Tensor::Zeros({4, 3}, DType::kFloat32, MemoryTag::kParam);
  const MemoryStats before = alloc_->Stats();
  Tensor row = w.View(3, {3}).value();
  Tensor flat = w.Flat();
  Tensor reshaped = w.Reshape({2, 6}).value();
  const MemoryStats after = alloc_->Stats();
  EXPECT_EQ(after.current_total, before.current_total);
  EXPECT_EQ(after.num_allocations, before.num_allocations);
  EXPECT_TRUE(w.SharesStorage(row));
  EXPECT_TRUE(flat.SharesStorage(reshaped));
  row.data<float>()[0] = 7.0f;
  EXPECT_EQ(w.data<float>()[3], 7.0f);
  EXPECT_EQ(reshaped.data<float>()[3], 7.0f);
  EXPECT_EQ(row.offset(), 3);
  Tensor sub = row.View(1, {2}).value();
  EXPECT_EQ(sub.offset(), 4);
}

TEST_F(TensorTest, ViewOutOfRangeIsAnError) {
  Tensor w = Tensor::Zeros({4, 3});
  EXPECT_EQ(w.View(10, {3}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w.View(-1, {1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w.Reshape({5}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(w.View(12, {0}).ok());  // an empty view at the end is fine
  EXPECT_EQ(Tensor().View(0, {1}).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(TensorTest, CloneIsIndependent) {
  Tensor a = Tensor::FromVector({1, 2, 3}, {3}).value();
  Tensor b = a.Clone(MemoryTag::kOther);
  EXPECT_FALSE(a.SharesStorage(b));
  b.data<float>()[0] = 9;
  EXPECT_EQ(a.data<float>()[0], 1);
}

TEST_F(TensorTest, CopyFromConvertsBetweenFloatAndBFloat16) {
  Tensor a = Tensor::FromVector({1.0f, -2.5f, 3.0f}, {3}).value();
  Tensor h = Tensor::Zeros({3}, DType::kBFloat16);
  ASSERT_TRUE(h.CopyFrom(a).ok());
  EXPECT_EQ(h.ToVector(), (std::vector<float>{1.0f, -2.5f, 3.0f}));
  Tensor back = h.ToDType(DType::kFloat32, MemoryTag::kOther).value();
  EXPECT_EQ(back.ToVector(), a.ToVector());
  EXPECT_EQ(Tensor::Zeros({2}).CopyFrom(a).code(), absl::StatusCode::kInvalidArgument);
  Tensor i = Tensor::Zeros({3}, DType::kInt32);
  EXPECT_EQ(i.CopyFrom(a).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(TensorTest, BadShapesAreErrorsNotCrashes) {
  EXPECT_EQ(Tensor::Allocate({2, -1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Tensor::FromVector({1, 2}, {3}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(alloc_->Stats().num_allocations, 0);
}

TEST_F(TensorTest, OverflowingSizesAreResourceExhaustedNamingShapeTagAndBytes) {
  // 2^31 * 2^31 elements fit an int64, but not times 4 bytes; 2^62 * 4 overflows too;
  // and three 2^31 dimensions overflow the element count itself.
  const Shape shapes[] = {{int64_t{1} << 31, int64_t{1} << 31},
                          {int64_t{1} << 62},
                          {int64_t{1} << 31, int64_t{1} << 31, int64_t{1} << 31}};
  for (const Shape& shape : shapes) {
    absl::StatusOr<Tensor> t = Tensor::Allocate(shape, DType::kFloat32, MemoryTag::kParam);
    ASSERT_FALSE(t.ok()) << ShapeToString(shape);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kResourceExhausted) << t.status();
    EXPECT_NE(t.status().message().find(ShapeToString(shape)), std::string::npos) << t.status();
    EXPECT_NE(t.status().message().find("tag param"), std::string::npos) << t.status();
    EXPECT_NE(t.status().message().find("exceeds 2^63"), std::string::npos) << t.status();
  }
  // A zero dimension makes any shape empty, however large the others.
  absl::StatusOr<Tensor> empty = Tensor::Allocate({int64_t{1} << 62, 0, int64_t{1} << 62});
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->numel(), 0);
  EXPECT_EQ(NumElements({int64_t{1} << 62, 8}), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(alloc_->Stats().peak_total, 0);
}

TEST_F(TensorTest, AllocationsBeyondTheHostAreResourceExhaustedWithoutTouchingMemory) {
  // 2^40 x 64 floats = 256 TiB: more than any host here, so the CPU allocator's default
  // limit (RAM + swap, or the cgroup limit) refuses it before asking the system.
  ASSERT_GT(alloc_->limit(), 0);
  absl::StatusOr<Tensor> t =
      Tensor::Allocate({int64_t{1} << 40, 64}, DType::kFloat32, MemoryTag::kParam);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kResourceExhausted) << t.status();
  EXPECT_NE(t.status().message().find("[1099511627776, 64]"), std::string::npos) << t.status();
  EXPECT_NE(t.status().message().find("281474976710656 bytes"), std::string::npos) << t.status();
  EXPECT_NE(t.status().message().find("tag param"), std::string::npos) << t.status();
  EXPECT_EQ(alloc_->Stats().peak_total, 0);
}

TEST_F(TensorTest, AllocatorLimitRefusesWhatWouldNotFitAndCountsOnlySuccesses) {
  alloc_->SetLimit(1000);
  Tensor a = Tensor::Empty({200}, DType::kFloat32, MemoryTag::kParam);  // 800 bytes
  absl::StatusOr<Tensor> b = Tensor::Allocate({51}, DType::kFloat32, MemoryTag::kGrad);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(b.status().message().find("tag grad"), std::string::npos) << b.status();
  EXPECT_NE(b.status().message().find("short by 4B"), std::string::npos) << b.status();
  // The refused block left no trace in the counters.
  EXPECT_EQ(alloc_->Stats().peak_total, 800);
  EXPECT_EQ(alloc_->Stats().num_allocations, 1);
  EXPECT_TRUE(Tensor::Allocate({50}, DType::kFloat32, MemoryTag::kGrad).ok());
  alloc_->SetLimit(0);
  EXPECT_EQ(alloc_->limit(), 0);
  EXPECT_TRUE(Tensor::Allocate({1000}, DType::kFloat32, MemoryTag::kGrad).ok());
}

TEST_F(TensorTest, ZeroSizedTensors) {
  {
    Tensor empty = Tensor::Zeros({0});
    EXPECT_EQ(alloc_->Stats().num_allocations, 1);
  }
  EXPECT_EQ(alloc_->Stats().num_allocations, 0);
  Tensor z = Tensor::Zeros({0, 5});
  EXPECT_TRUE(z.defined());
  EXPECT_EQ(z.numel(), 0);
  EXPECT_TRUE(z.CopyFrom(Tensor::Zeros({0})).ok());
  EXPECT_TRUE(z.ToVector().empty());
}

TEST_F(TensorTest, CudaTensorWithoutAGpuIsUnavailable) {
  if (CudaDeviceCount().ok()) GTEST_SKIP() << "a CUDA device is present";
  absl::StatusOr<Tensor> t =
      Tensor::Allocate({4}, DType::kFloat32, MemoryTag::kOther, Device::Cuda(0));
  EXPECT_EQ(t.status().code(), absl::StatusCode::kUnavailable) << t.status();
}

TEST_F(TensorTest, ToCopiesToAnotherPlaceAndToDTypeRefusesInt32Conversions) {
  Tensor a = Tensor::FromVector({1.0f, 2.0f, 1.0f / 3.0f}, {3}).value();
  Tensor b = a.To(Device::Cpu(), MemoryTag::kGrad).value();
  EXPECT_FALSE(b.SharesStorage(a));
  EXPECT_EQ(b.ToVector(), a.ToVector());
  EXPECT_EQ(alloc_->Stats().current(MemoryTag::kGrad), 12);
  Tensor h = a.ToDType(DType::kBFloat16, MemoryTag::kOther).value();
  EXPECT_EQ(h.ToVector(), (std::vector<float>{1.0f, 2.0f, 0.333984375f}));
  EXPECT_EQ(h.ToDType(DType::kBFloat16, MemoryTag::kOther).value().ToVector(), h.ToVector());
  absl::Status to_int = a.ToDType(DType::kInt32, MemoryTag::kOther).status();
  EXPECT_TRUE(absl::IsInvalidArgument(to_int)) << to_int;
  Tensor ints = Tensor::FromInts({1, 2, 3}, {3}).value();
  absl::Status from_int = a.CopyFrom(ints);
  EXPECT_TRUE(absl::IsInvalidArgument(from_int)) << from_int;
  EXPECT_NE(from_int.message().find("int32"), std::string::npos) << from_int;
  EXPECT_EQ(a.ToVector()[0], 1.0f) << "a refused copy must not write";
  EXPECT_TRUE(absl::IsFailedPrecondition(Tensor().To(Device::Cpu(), MemoryTag::kOther).status()));
}

TEST_F(TensorTest, FromStoragePlacesTypedViewsInsideTheStorage) {
  Tensor a = Tensor::Zeros({4}, DType::kFloat32);
  Tensor second_half = Tensor::FromStorage(a.storage(), 8, {2}, DType::kFloat32).value();
  second_half.Fill(3.0f);
  EXPECT_EQ(a.ToVector(), (std::vector<float>{0, 0, 3, 3}));
  EXPECT_TRUE(second_half.SharesStorage(a));
  Tensor as_bf16 = Tensor::FromStorage(a.storage(), 2, {7}, DType::kBFloat16).value();
  EXPECT_EQ(as_bf16.numel(), 7);
  EXPECT_TRUE(
      absl::IsInvalidArgument(Tensor::FromStorage(a.storage(), 2, {1}, DType::kFloat32).status()));
  EXPECT_TRUE(
      absl::IsInvalidArgument(Tensor::FromStorage(a.storage(), 0, {5}, DType::kFloat32).status()));
  EXPECT_TRUE(
      absl::IsInvalidArgument(Tensor::FromStorage(a.storage(), 20, {}, DType::kFloat32).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(Tensor::FromStorage(nullptr, 0, {}, DType::kInt32).status()));
}

TEST(DeviceTensorWithoutCudaTest, CopiesToADeviceTensorAreUnavailableInACpuBuild) {
  if (BuiltWithCuda()) GTEST_SKIP() << "built with CUDA";
  // A caching allocator labelled cuda:0 whose memory is host memory: lets a CPU build
  // hold a "device" tensor and check that nothing treats it as host memory.
  struct HostSource : SegmentSource {
    absl::StatusOr<void*> Allocate(int64_t n) override { return std::aligned_alloc(512, n); }
    void Free(void* p, int64_t) override { std::free(p); }
    std::string Describe() const override { return "host-backed cuda:0"; }
  };
  auto alloc = std::make_shared<Allocator>(Device::Cuda(0), std::make_unique<HostSource>());
  ScopedAllocator scope(alloc);
  Tensor d = Tensor::Empty({4}, DType::kFloat32, MemoryTag::kOther, Device::Cuda(0));
  Tensor h = Tensor::FromVector({1, 2, 3, 4}, {4}).value();
  absl::Status s = d.CopyFrom(h);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("cuda:0"), std::string::npos) << s;
  EXPECT_EQ(h.CopyFrom(d).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(d.To(Device::Cpu(), MemoryTag::kOther).status().code(), absl::StatusCode::kUnavailable);
  absl::Status fill = d.TryFill(1.0f);
  EXPECT_EQ(fill.code(), absl::StatusCode::kUnavailable) << fill;
  EXPECT_NE(fill.message().find("cuda:0"), std::string::npos) << fill;
  EXPECT_EQ(d.TryZero().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(h.TryFill(2.0f).ok());
  EXPECT_EQ(h.ToVector(), std::vector<float>(4, 2.0f));
  EXPECT_TRUE(h.TryZero().ok());
  EXPECT_EQ(h.ToVector(), std::vector<float>(4, 0.0f));
}

TEST(AllocatorTest, ScopedAllocatorsArePerThread) {
  auto a = std::make_shared<Allocator>(Device::Cpu());
  auto b = std::make_shared<Allocator>(Device::Cpu());
  std::thread t1([&] {
    ScopedAllocator s(a);
    Tensor x = Tensor::Zeros({100}, DType::kFloat32, MemoryTag::kParam);
  });
  std::thread t2([&] {
    ScopedAllocator s(b);
    Tensor x = Tensor::Zeros({10}, DType::kFloat32, MemoryTag::kParam);
  });
  t1.join();
  t2.join();
  EXPECT_EQ(a->Stats().peak(MemoryTag::kParam), 400);
  EXPECT_EQ(b->Stats().peak(MemoryTag::kParam), 40);
  EXPECT_NE(Allocator::Current(Device::Cpu()), a);
}

TEST(AllocatorTest, StorageFreedAfterScopeEndsStillCountsOnItsAllocator) {
  auto a = std::make_shared<Allocator>(Device::Cpu());
  Tensor kept;
  {
    ScopedAllocator s(a);
    kept = Tensor::Zeros({8}, DType::kFloat32, MemoryTag::kOptim);
  }
  EXPECT_EQ(a->Stats().current(MemoryTag::kOptim), 32);
  kept = Tensor();
  EXPECT_EQ(a->Stats().current(MemoryTag::kOptim), 0);
}

TEST(FormatBytesTest, Units) {
  EXPECT_EQ(FormatBytes(-1536), "-1.50KiB");
  EXPECT_EQ(FormatBytes((int64_t{1} << 40) - (int64_t{1} << 29)), "1023.50GiB");
  EXPECT_EQ(FormatBytes(int64_t{1} << 48), "256.00TiB");
  EXPECT_EQ(FormatBytes(std::numeric_limits<int64_t>::min()), "-8388608.00TiB");
  EXPECT_EQ(FormatBytes(512), "512B");
  EXPECT_EQ(FormatBytes(1536), "1.50KiB");
  EXPECT_EQ(FormatBytes(3 << 20), "3.00MiB");
}

TEST(ParameterTest, EnsureGradAllocatesZerosOnceAndChecksShape) {
  auto alloc = std::make_shared<Allocator>(Device::Cpu());
  ScopedAllocator s(alloc);
  ParameterPtr p = Parameter::Make(Tensor::Zeros({2, 3}, DType::kFloat32, MemoryTag::kParam));
  ASSERT_TRUE(p->EnsureGrad().ok());
  EXPECT_EQ(p->grad.shape(), (Shape{2, 3}));
  EXPECT_EQ(alloc->Stats().current(MemoryTag::kGrad), 24);
  p->grad.data<float>()[0] = 1;
  ASSERT_TRUE(p->EnsureGrad().ok());
  EXPECT_EQ(p->grad.data<float>()[0], 1);  // kept
  p->grad = Tensor::Zeros({5});
  EXPECT_EQ(p->EnsureGrad().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace core
