// Tests of fsdp's device arithmetic on the CPU (the FSDP_HD bodies the CUDA kernels
// launch too), and, when a GPU is usable, of the CUDA path against the CPU one.
#include "fsdp/device_ops.h"

#include <cmath>
#include <vector>

#include "core/cuda_device.h"
#include "gtest/gtest.h"

namespace fsdp {
namespace internal {
namespace {

using core::DType;
using core::Tensor;

TEST(DeviceOpsTest, AddIntoAddsFloat32AndBfloat16Sources) {
  Tensor dst = Tensor::FromVector({1, 2, 3}, {3}).value();
  ASSERT_TRUE(AddInto(dst, Tensor::FromVector({0.5f, -2, 10}, {3}).value(), "t").ok());
  EXPECT_EQ(dst.ToVector(), (std::vector<float>{1.5f, 0, 13}));
  Tensor bf = Tensor::FromVector({0.25f, 1, -1}, {3})
                  .value()
                  .ToDType(DType::kBFloat16, core::MemoryTag::kOther)
                  .value();
  ASSERT_TRUE(AddInto(dst, bf, "t").ok());
  EXPECT_EQ(dst.ToVector(), (std::vector<float>{1.75f, 1, 12}));
}

TEST(DeviceOpsTest, AddIntoRefusesMismatchesNamingTheCaller) {
  Tensor dst = Tensor::Zeros({3});
  absl::Status s = AddInto(dst, Tensor::Zeros({4}), "fsdp unit blocks.0 (TransformerBlock)");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("blocks.0"), std::string::npos) << s;
  Tensor bf_dst = Tensor::Zeros({3}, DType::kBFloat16);
  EXPECT_EQ(AddInto(bf_dst, Tensor::Zeros({3}), "u").code(), absl::StatusCode::kInvalidArgument);
}

TEST(DeviceOpsTest, ConvertRoundsToBfloat16AndWidensExactly) {
  // 1 + 2^-8 is halfway between two bf16 values: round to nearest even gives 1.
  Tensor src = Tensor::FromVector({1.0f + 1.0f / 256, 3.0f, -0.1f}, {3}).value();
  Tensor bf = Convert(src, DType::kBFloat16, core::MemoryTag::kComm, "t").value();
  EXPECT_EQ(bf.dtype(), DType::kBFloat16);
  const std::vector<float> v = bf.ToVector();
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], 3.0f);
  EXPECT_NE(v[2], -0.1f);  // rounded
  Tensor back = Convert(bf, DType::kFloat32, core::MemoryTag::kComm, "t").value();
  EXPECT_EQ(back.ToVector(), v);
}

TEST(DeviceOpsTest, SumOfSquaresIsInDoubleAndScaleMultiplies) {
  Tensor t = Tensor::FromVector({3, 4, 1e-4f}, {3}).value();
  const double expected = 9.0 + 16.0 + static_cast<double>(1e-4f) * static_cast<double>(1e-4f);
  EXPECT_EQ(SumOfSquares(t, "t").value(), expected);
  ASSERT_TRUE(Scale(t, 0.5f, "t").ok());
  EXPECT_EQ(t.ToVector(), (std::vector<float>{1.5f, 2, 0.5e-4f}));
  EXPECT_EQ(SumOfSquares(Tensor::Zeros({3}, DType::kBFloat16), "clip").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DeviceOpsTest, CudaMatchesTheCpu) {
  absl::StatusOr<int> n = core::CudaDeviceCount();
  if (!n.ok() || *n == 0) GTEST_SKIP() << "no usable CUDA device: " << n.status();
  const core::Device gpu = core::Device::Cuda(0);
  std::vector<float> a(100003), b(100003);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = std::sin(0.37f * i);
    b[i] = std::cos(0.11f * i) * 3;
  }
  Tensor ha = Tensor::FromVector(a, {static_cast<int64_t>(a.size())}).value();
  Tensor hb = Tensor::FromVector(b, {static_cast<int64_t>(b.size())}).value();
  auto to_gpu = [&](const Tensor& h) {
    Tensor d = Tensor::Allocate(h.shape(), h.dtype(), core::MemoryTag::kOther, gpu).value();
    EXPECT_TRUE(d.CopyFrom(h).ok());
    return d;
  };
  auto to_host = [&](const Tensor& d) {
    Tensor h = Tensor::Zeros(d.shape(), d.dtype());
    EXPECT_TRUE(h.CopyFrom(d).ok());
    return h.ToVector();
  };
  Tensor da = to_gpu(ha), db = to_gpu(hb);
  // bf16 conversion, then adding the bf16 copy: bitwise equal to the CPU.
  Tensor hbf = Convert(hb, DType::kBFloat16, core::MemoryTag::kOther, "cpu").value();
  Tensor dbf = Convert(db, DType::kBFloat16, core::MemoryTag::kOther, "gpu").value();
  EXPECT_EQ(to_host(dbf), hbf.ToVector());
  ASSERT_TRUE(AddInto(ha, hbf, "cpu").ok());
  ASSERT_TRUE(AddInto(da, dbf, "gpu").ok());
  EXPECT_EQ(to_host(da), ha.ToVector());
  ASSERT_TRUE(Scale(ha, 0.25f, "cpu").ok());
  ASSERT_TRUE(Scale(da, 0.25f, "gpu").ok());
  EXPECT_EQ(to_host(da), ha.ToVector());
  // The sum's order differs (tree vs loop): within 1e-12 relative in double.
  const double cpu = SumOfSquares(ha, "cpu").value();
  const double dev = SumOfSquares(da, "gpu").value();
  EXPECT_NEAR(dev, cpu, 1e-12 * cpu);
}

}  // namespace
}  // namespace internal
}  // namespace fsdp
