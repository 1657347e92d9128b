// Device tensors against the CPU reference: conversion, copies, fills, clones, the
// caching allocator's steady state. Tagged gpu; every test skips without a CUDA device.
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "core/bf16_hd.h"
#include "core/cuda_device.h"
#include "core/cuda_status.h"
#include "core/pinned_buffer.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace core {
namespace {

const Device kGpu = Device::Cuda(0);

class CudaTensorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<int> n = CudaDeviceCount();
    if (!n.ok() || *n == 0) {
      GTEST_SKIP() << "no CUDA device, so the device tensor tests are skipped: " << n.status();
    }
    alloc_ = std::make_shared<Allocator>(kGpu);
    scope_ = std::make_unique<ScopedAllocator>(alloc_);
  }
  void TearDown() override { scope_.reset(); }

  std::shared_ptr<Allocator> alloc_;
  std::unique_ptr<ScopedAllocator> scope_;
};

// Values where a conversion can go wrong: ties, subnormals, infinities, NaN, overflow.
std::vector<float> HardValues() {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          -2.5f,
                          1.0f / 3.0f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::denorm_min(),
                          BitsToFloat(0x3f808000u),
                          BitsToFloat(0x3f818000u),
                          BitsToFloat(0x00018000u),
                          BitsToFloat(0x007fffffu)};
  // And a spread of ordinary values, enough for several kernel blocks.
  for (int i = 0; i < 300000; ++i) v.push_back(std::sin(0.001f * i) * std::exp(0.0001f * i));
  return v;
}

std::vector<uint32_t> Bits(const std::vector<float>& v) {
  std::vector<uint32_t> out;
  for (float f : v) out.push_back(FloatToBits(f));
  return out;
}

TEST_F(CudaTensorTest, ToDTypeOnDeviceMatchesTheCpuBitForBit) {
  const std::vector<float> values = HardValues();
  const int64_t n = values.size();
  Tensor host = Tensor::FromVector(values, {n}).value();
  Tensor dev = host.To(kGpu, MemoryTag::kParam).value();
  ASSERT_EQ(dev.device(), kGpu);
  Tensor dev_bf16 = dev.ToDType(DType::kBFloat16, MemoryTag::kParam).value();
  ASSERT_EQ(dev_bf16.device(), kGpu);
  Tensor cpu_bf16 = host.ToDType(DType::kBFloat16, MemoryTag::kParam).value();
  Tensor back = Tensor::Empty({n}, DType::kBFloat16);
  ASSERT_TRUE(back.CopyFrom(dev_bf16).ok());
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(back.data<BFloat16>()[i].bits, cpu_bf16.data<BFloat16>()[i].bits)
        << "element " << i << " = " << values[i];
  }
  // bf16 -> fp32 on the device is exact.
  Tensor dev_f32 = dev_bf16.ToDType(DType::kFloat32, MemoryTag::kParam).value();
  EXPECT_EQ(Bits(dev_f32.ToVector()), Bits(cpu_bf16.ToVector()));
  EXPECT_TRUE(absl::IsInvalidArgument(dev.ToDType(DType::kInt32, MemoryTag::kOther).status()));
}

TEST_F(CudaTensorTest, CopyFromBetweenHostAndDeviceWithAndWithoutConversion) {
  const std::vector<float> values = HardValues();
  const int64_t n = values.size();
  Tensor host = Tensor::FromVector(values, {n}).value();
  Tensor ref_bf16 = host.ToDType(DType::kBFloat16, MemoryTag::kOther).value();
  const std::vector<uint32_t> want_f32 = Bits(values);
  const std::vector<uint32_t> want_rounded = Bits(ref_bf16.ToVector());

  // host fp32 -> device bf16 -> host fp32.
  Tensor d16 = Tensor::Empty({n}, DType::kBFloat16, MemoryTag::kOther, kGpu);
  ASSERT_TRUE(d16.CopyFrom(host).ok());
  Tensor h32 = Tensor::Empty({n});
  ASSERT_TRUE(h32.CopyFrom(d16).ok());
  EXPECT_EQ(Bits(h32.ToVector()), want_rounded);
  // host bf16 -> device fp32 -> host bf16.
  Tensor d32 = Tensor::Empty({n}, DType::kFloat32, MemoryTag::kOther, kGpu);
  ASSERT_TRUE(d32.CopyFrom(ref_bf16).ok());
  EXPECT_EQ(Bits(d32.ToVector()), want_rounded);
  Tensor h16 = Tensor::Empty({n}, DType::kBFloat16);
  ASSERT_TRUE(h16.CopyFrom(d32).ok());
  EXPECT_EQ(Bits(h16.ToVector()), want_rounded);
  // device fp32 -> device fp32 (no conversion), and fp32 -> bf16 device to device.
  Tensor e32 = Tensor::Empty({n}, DType::kFloat32, MemoryTag::kOther, kGpu);
  ASSERT_TRUE(e32.CopyFrom(host.To(kGpu, MemoryTag::kOther).value()).ok());
  EXPECT_EQ(Bits(e32.ToVector()), want_f32);
  Tensor e16 = Tensor::Empty({n}, DType::kBFloat16, MemoryTag::kOther, kGpu);
  ASSERT_TRUE(e16.CopyFrom(e32).ok());
  EXPECT_EQ(Bits(e16.ToVector()), want_rounded);
  // int32 round trip, and a refused int32 <-> float conversion naming both tensors.
  Tensor ints = Tensor::FromInts({1, -2, 300000}, {3}).value();
  Tensor dints = ints.To(kGpu, MemoryTag::kOther).value();
  EXPECT_EQ(dints.ToVector(), (std::vector<float>{1, -2, 300000}));
  absl::Status refused =
      Tensor::Empty({3}, DType::kFloat32, MemoryTag::kOther, kGpu).CopyFrom(ints);
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_NE(refused.message().find("cuda:0"), std::string::npos) << refused;
}

TEST_F(CudaTensorTest, CopiesIntoViewsTouchOnlyTheView) {
  Tensor whole = Tensor::Zeros({4, 1000}, DType::kFloat32, MemoryTag::kOther, kGpu);
  Tensor row = whole.View(1000 * 2 + 0, {1000}).value();
  Tensor src = Tensor::Empty({1000});
  for (int i = 0; i < 1000; ++i) src.data<float>()[i] = i * 0.5f;
  ASSERT_TRUE(row.CopyFrom(src).ok());
  const std::vector<float> all = whole.ToVector();
  for (int r = 0; r < 4; ++r) {
    for (int i = 0; i < 1000; ++i) {
      ASSERT_EQ(all[r * 1000 + i], r == 2 ? i * 0.5f : 0.0f) << r << "," << i;
    }
  }
  // Device -> host out of a view at an odd offset, with conversion.
  Tensor part = whole.View(2 * 1000 + 3, {5}).value();
  Tensor h16 = Tensor::Empty({5}, DType::kBFloat16);
  ASSERT_TRUE(h16.CopyFrom(part).ok());
  EXPECT_EQ(h16.ToVector(), (std::vector<float>{1.5f, 2.0f, 2.5f, 3.0f, 3.5f}));
}

TEST_F(CudaTensorTest, FillAndZeroMatchTheCpu) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kInt32}) {
    for (float value : {0.0f, -1.0f, 1.0f / 3.0f, 65504.5f}) {
      Tensor d = Tensor::Empty({3, 70001}, dtype, MemoryTag::kOther, kGpu);
      d.Fill(value);
      Tensor h = Tensor::Empty({3, 70001}, dtype);
      h.Fill(value);
      EXPECT_EQ(d.ToVector(), h.ToVector()) << DTypeName(dtype) << " " << value;
    }
    Tensor d = Tensor::Empty({1001}, dtype, MemoryTag::kOther, kGpu);
    d.Fill(5.0f);
    Tensor middle = d.View(10, {981}).value();
    middle.Zero();
    const std::vector<float> got = d.ToVector();
    for (int i = 0; i < 1001; ++i) {
      ASSERT_EQ(got[i], (i >= 10 && i < 991) ? 0.0f : 5.0f) << DTypeName(dtype) << " " << i;
    }
  }
  ASSERT_TRUE(cuda::Synchronize(kGpu).ok());
}

TEST_F(CudaTensorTest, CloneOnDeviceIsAnIndependentCopy) {
  Tensor d =
      Tensor::FromVector({1, 2, 3, 4, 5, 6}, {2, 3}).value().To(kGpu, MemoryTag::kParam).value();
  const int64_t grads_before = alloc_->Stats().current(MemoryTag::kGrad);
  Tensor c = d.Clone(MemoryTag::kGrad);
  EXPECT_EQ(c.device(), kGpu);
  EXPECT_EQ(c.shape(), d.shape());
  EXPECT_FALSE(c.SharesStorage(d));
  EXPECT_EQ(alloc_->Stats().current(MemoryTag::kGrad), grads_before + 24);
  d.Fill(0.0f);
  EXPECT_EQ(c.ToVector(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(d.ToVector(), std::vector<float>(6, 0.0f));
  EXPECT_NE(c.ToString().find("cuda:0"), std::string::npos) << c.ToString();
}

TEST_F(CudaTensorTest, NoCudaMallocAfterWarmUpInARepeatedStep) {
  const auto step = [] {
    Tensor master = Tensor::Zeros({1 << 20}, DType::kFloat32, MemoryTag::kOptim, kGpu);
    Tensor params = master.ToDType(DType::kBFloat16, MemoryTag::kParam).value();
    std::vector<Tensor> acts;
    for (int layer = 0; layer < 4; ++layer) {
      acts.push_back(Tensor::Empty({16, 768}, DType::kFloat32, MemoryTag::kActivation, kGpu));
      acts.back().Fill(1.0f);
      acts.push_back(Tensor::Zeros({16, 3072}, DType::kFloat32, MemoryTag::kActivation, kGpu));
    }
    Tensor grads = Tensor::Zeros({1 << 20}, DType::kFloat32, MemoryTag::kGrad, kGpu);
    while (!acts.empty()) acts.pop_back();
    Tensor loss = Tensor::Empty({1});
    ASSERT_TRUE(loss.CopyFrom(grads.View(0, {1}).value()).ok());  // a synchronizing read
  };
  step();
  const MemoryStats warm = alloc_->Stats();
  EXPECT_GT(warm.num_device_mallocs, 0);
  for (int i = 0; i < 5; ++i) step();
  const MemoryStats after = alloc_->Stats();
  EXPECT_EQ(after.num_device_mallocs, warm.num_device_mallocs);
  EXPECT_EQ(after.reserved_bytes, warm.reserved_bytes);
  EXPECT_EQ(after.current_total, 0);
  EXPECT_GT(alloc_->EmptyCache(), 0);
  EXPECT_EQ(alloc_->Stats().reserved_bytes, 0);
  EXPECT_EQ(alloc_->Stats().num_device_frees, alloc_->Stats().num_device_mallocs);
}

TEST_F(CudaTensorTest, OutOfDeviceMemoryIsResourceExhaustedAndLeavesTheDeviceUsable) {
  absl::StatusOr<Tensor> t =
      Tensor::Allocate({int64_t{1} << 50}, DType::kFloat32, MemoryTag::kActivation, kGpu);
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(t.status())) << t.status();
  EXPECT_NE(t.status().message().find("cuda:0"), std::string::npos) << t.status();
  EXPECT_EQ(alloc_->Stats().num_oom_retries, 1);
  // The failed cudaMalloc must not be reported by the next launch.
  Tensor ok = Tensor::Zeros({10}, DType::kFloat32, MemoryTag::kOther, kGpu);
  ok.Fill(2.0f);
  EXPECT_EQ(ok.ToVector(), std::vector<float>(10, 2.0f));
}

TEST_F(CudaTensorTest, PinnedBufferStagesDeviceData) {
  PinnedBuffer buf = PinnedBuffer::Allocate(4 * 1000, MemoryTag::kComm).value();
  EXPECT_TRUE(buf.pinned());
  Tensor staged = buf.AsTensor(0, {1000}, DType::kFloat32).value();
  Tensor d = Tensor::Empty({1000}, DType::kBFloat16, MemoryTag::kOther, kGpu);
  d.Fill(-3.0f);
  ASSERT_TRUE(staged.CopyFrom(d).ok());
  EXPECT_EQ(staged.ToVector(), std::vector<float>(1000, -3.0f));
  staged.Fill(0.25f);
  ASSERT_TRUE(d.CopyFrom(staged).ok());
  staged.Fill(9.0f);  // the copy above must already have read the buffer
  EXPECT_EQ(d.ToVector(), std::vector<float>(1000, 0.25f));
}

TEST_F(CudaTensorTest, SynchronizeAndSetDeviceReportErrorsNamingTheDevice) {
  EXPECT_TRUE(cuda::Synchronize(kGpu).ok());
  EXPECT_TRUE(cuda::Synchronize(Device::Cpu()).ok());
  absl::Status bad = cuda::Synchronize(Device::Cuda(999));
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("cuda:999"), std::string::npos) << bad;
  EXPECT_TRUE(cuda::SetDevice(kGpu).ok());
}

TEST(CudaStatusTest, WithoutCudaTheDeviceHelpersAreUnavailable) {
  if (BuiltWithCuda()) GTEST_SKIP() << "built with CUDA";
  EXPECT_TRUE(cuda::Synchronize(Device::Cpu()).ok());
  EXPECT_TRUE(cuda::SetDevice(Device::Cpu()).ok());
  EXPECT_EQ(cuda::Synchronize(kGpu).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(cuda::SetDevice(kGpu).code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace core
