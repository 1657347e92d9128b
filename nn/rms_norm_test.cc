#include "nn/rms_norm.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/bf16_hd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/tensor_ops.h"
#include "nn/testing/gradcheck.h"
#include "nn/to_device.h"

namespace nn {
namespace {

using ::testing::HasSubstr;

// y = x / sqrt(mean(x^2) + eps) * w, each row in double.
std::vector<double> Reference(const std::vector<float>& x, const std::vector<float>& w,
                              double eps) {
  const size_t cols = w.size();
  std::vector<double> y(x.size());
  for (size_t r = 0; r < x.size() / cols; ++r) {
    double ms = 0.0;
    for (size_t j = 0; j < cols; ++j) ms += double{x[r * cols + j]} * x[r * cols + j];
    const double inv = 1.0 / std::sqrt(ms / cols + eps);
    for (size_t j = 0; j < cols; ++j) y[r * cols + j] = x[r * cols + j] * inv * w[j];
  }
  return y;
}

TEST(RmsNormTest, ForwardMatchesTheDefinitionAndEpsIsUsed) {
  for (float eps : {1e-6f, 0.5f}) {
    RmsNorm norm(8, eps);
    EXPECT_EQ(norm.weight()->data.ToVector(), std::vector<float>(8, 1.0f));
    EXPECT_EQ(norm.NamedParameters().size(), 1u);  // weight only
    gradcheck::RandomizeParameters(norm, 3, 1.0f, 0.5f);
    const core::Tensor x = gradcheck::RandomTensor({2, 3, 8}, 4);
    absl::StatusOr<core::Tensor> y = norm.Forward(x);
    ASSERT_TRUE(y.ok()) << y.status();
    const std::vector<double> want = Reference(x.ToVector(), norm.weight()->data.ToVector(), eps);
    const std::vector<float> got = y->ToVector();
    // fp32 statistics of 8 values: a few ulp of O(1) outputs.
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 2e-6) << i;
  }
  // A row of zeros stays zeros (eps keeps the root finite).
  RmsNorm norm(4);
  absl::StatusOr<core::Tensor> y = norm.Forward(core::Tensor::Zeros({1, 4}));
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(y->ToVector(), std::vector<float>(4, 0.0f));
}

TEST(RmsNormTest, BackwardMatchesFiniteDifferences) {
  RmsNorm norm(6);
  gradcheck::RandomizeParameters(norm, 5, 0.5f, 1.0f);
  absl::StatusOr<gradcheck::Report> r =
      gradcheck::CheckModule(norm, gradcheck::RandomTensor({2, 3, 6}, 6), {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok()) << r->ToString();
  EXPECT_EQ(r->num_checked, 36 + 6);
  EXPECT_GT(r->max_abs_numeric, 0.5);
}

// A bf16 weight is widened exactly: the layer gives the bits of an fp32 weight holding the
// rounded values, gradients included (fp32).
TEST(RmsNormTest, Bf16WeightGivesTheBitsOfItsFp32Widening) {
  RmsNorm a(16), b(16);
  gradcheck::RandomizeParameters(a, 7, 1.0f, 0.3f);
  std::vector<float> rounded = a.weight()->data.ToVector();
  for (float& v : rounded) v = core::Bf16BitsToFloat(core::FloatToBf16Bits(v));
  ASSERT_TRUE(a.weight()->data.CopyFrom(core::Tensor::FromVector(rounded, {16}).value()).ok());
  ASSERT_TRUE(b.weight()->data.CopyFrom(a.weight()->data).ok());
  ASSERT_TRUE(ConvertParameters(b, core::DType::kBFloat16).ok());
  ASSERT_EQ(b.weight()->data.dtype(), core::DType::kBFloat16);
  const core::Tensor x = gradcheck::RandomTensor({5, 16}, 8),
                     g = gradcheck::RandomTensor({5, 16}, 9);
  std::vector<std::vector<float>> out;
  for (RmsNorm* m : {&a, &b}) {
    absl::StatusOr<core::Tensor> y = m->Forward(x);
    ASSERT_TRUE(y.ok()) << y.status();
    absl::StatusOr<core::Tensor> gx = m->Backward(g);
    ASSERT_TRUE(gx.ok()) << gx.status();
    out.push_back(y->ToVector());
    out.push_back(gx->ToVector());
    out.push_back(m->weight()->grad.ToVector());
  }
  for (int i = 0; i < 3; ++i) EXPECT_EQ(out[i], out[i + 3]) << i;
}

// The bits of every element, so -0.0 and 0.0 differ.
std::vector<uint32_t> Bits(const core::Tensor& t) {
  const std::vector<float> v = t.ToVector();
  std::vector<uint32_t> bits(v.size());
  std::memcpy(bits.data(), v.data(), v.size() * sizeof(float));
  return bits;
}

// NOTE [Fused ops] through the layer: BackwardAdd(g, residual) is residual + Backward(g) bit
// for bit with the same weight gradient, and its bf16 copy is that sum rounded once, for
// fp32 and bf16 weights; like Backward, it releases the forward's cache.
TEST(RmsNormTest, BackwardAddIsTheResidualPlusBackwardBitForBit) {
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16 weight" : "fp32 weight");
    RmsNorm norm(37);
    gradcheck::RandomizeParameters(norm, 3, 1.0f, 0.5f);
    if (bf16) {
      ASSERT_TRUE(ConvertParameters(norm, core::DType::kBFloat16).ok());
    }
    const core::Tensor x = gradcheck::RandomTensor({2, 3, 37}, 4);
    const core::Tensor g = gradcheck::RandomTensor({2, 3, 37}, 5);
    const core::Tensor residual = gradcheck::RandomTensor({2, 3, 37}, 6);
    norm.ZeroGrad(/*set_to_none=*/true);
    ASSERT_TRUE(norm.Forward(x).ok());
    absl::StatusOr<core::Tensor> gx = norm.Backward(g);
    ASSERT_TRUE(gx.ok()) << gx.status();
    const std::vector<float> r = residual.ToVector(), d = gx->ToVector();
    std::vector<float> sum(r.size());
    for (size_t i = 0; i < r.size(); ++i) sum[i] = r[i] + d[i];
    const core::Tensor want = core::Tensor::FromVector(sum, residual.shape()).value();
    const std::vector<uint32_t> want_gw = Bits(norm.weight()->grad);
    for (bool with16 : {false, true}) {
      SCOPED_TRACE(with16 ? "with sum16" : "without sum16");
      norm.ZeroGrad(/*set_to_none=*/true);
      ASSERT_TRUE(norm.Forward(x).ok());
      core::Tensor sum16;
      absl::StatusOr<core::Tensor> got = norm.BackwardAdd(g, residual, with16 ? &sum16 : nullptr);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->shape(), residual.shape());
      EXPECT_EQ(Bits(*got), Bits(want));
      EXPECT_EQ(Bits(norm.weight()->grad), want_gw);
      if (with16) {
        ASSERT_TRUE(sum16.defined());
        ASSERT_EQ(sum16.dtype(), core::DType::kBFloat16);
        EXPECT_EQ(sum16.shape(), residual.shape());
        const core::Tensor rounded =
            want.ToDType(core::DType::kBFloat16, core::MemoryTag::kOther).value();
        EXPECT_EQ(Bits(sum16.ToDType(core::DType::kFloat32, core::MemoryTag::kOther).value()),
                  Bits(rounded.ToDType(core::DType::kFloat32, core::MemoryTag::kOther).value()));
      } else {
        EXPECT_FALSE(sum16.defined());
      }
      EXPECT_EQ(norm.BackwardAdd(g, residual).status().code(),
                absl::StatusCode::kFailedPrecondition);
    }
  }
}

// A residual that is not fp32 of grad_output's shape is InvalidArgument naming the module
// (on another device too: CudaLlamaTest.RmsNormBackwardAddMatchesCpu), and writes nothing.
TEST(RmsNormTest, BackwardAddRefusesABadResidualNamingTheModule) {
  RmsNorm norm(4);
  const core::Tensor x = gradcheck::RandomTensor({2, 4}, 1);
  const core::Tensor g = gradcheck::RandomTensor({2, 4}, 2);
  const core::Tensor bf16 = gradcheck::RandomTensor({2, 4}, 3)
                                .ToDType(core::DType::kBFloat16, core::MemoryTag::kOther)
                                .value();
  for (const core::Tensor& residual : {core::Tensor(), gradcheck::RandomTensor({8}, 3),
                                       gradcheck::RandomTensor({2, 3}, 3), bf16}) {
    SCOPED_TRACE(residual.ToString());
    norm.ZeroGrad(/*set_to_none=*/true);
    ASSERT_TRUE(norm.Forward(x).ok());
    absl::StatusOr<core::Tensor> gx = norm.BackwardAdd(g, residual);
    EXPECT_EQ(gx.status().code(), absl::StatusCode::kInvalidArgument) << gx.status();
    EXPECT_THAT(std::string(gx.status().message()), HasSubstr("<root> (RmsNorm)"));
    EXPECT_THAT(std::string(gx.status().message()), HasSubstr("residual"));
    EXPECT_FALSE(norm.weight()->grad.defined());
  }
}

// The forward keeps its input for the backward, as LayerNorm does, and makes xhat = x * rstd
// again there (the forward's bits: BackwardAddIsTheResidualPlusBackwardBitForBit and the
// kernels' tests), so its activations are the output and one rstd per row, not an fp32
// xhat as large as x; the backward releases them.
TEST(RmsNormTest, ForwardKeepsItsInputInsteadOfAnXhat) {
  auto alloc = std::make_shared<core::Allocator>(core::Device::Cpu());
  core::ScopedAllocator scope(alloc);
  RmsNorm norm(64);
  const core::Tensor x = gradcheck::RandomTensor({4, 8, 64}, 1);
  const core::Tensor g = gradcheck::RandomTensor({4, 8, 64}, 2);
  const int64_t before = alloc->Stats().current(core::MemoryTag::kActivation);
  absl::StatusOr<core::Tensor> y = norm.Forward(x);
  ASSERT_TRUE(y.ok()) << y.status();
  const int64_t kept = alloc->Stats().current(core::MemoryTag::kActivation) - before;
  EXPECT_EQ(kept, static_cast<int64_t>(sizeof(float)) * (x.numel() + 4 * 8));  // y and rstd
  absl::StatusOr<core::Tensor> gx = norm.Backward(g);
  ASSERT_TRUE(gx.ok()) << gx.status();
  *y = core::Tensor();
  *gx = core::Tensor();
  EXPECT_EQ(alloc->Stats().current(core::MemoryTag::kActivation), before);
}

TEST(RmsNormTest, ReleasedActivationsRefuseABackward) {
  RmsNorm norm(4);
  ASSERT_TRUE(norm.Forward(gradcheck::RandomTensor({2, 4}, 1)).ok());
  norm.DropActivations();
  absl::StatusOr<core::Tensor> gx = norm.Backward(gradcheck::RandomTensor({2, 4}, 2));
  EXPECT_EQ(gx.status().code(), absl::StatusCode::kFailedPrecondition) << gx.status();
}

TEST(RmsNormTest, BadInputsNameTheModule) {
  RmsNorm norm(4);
  absl::StatusOr<core::Tensor> y = norm.Forward(core::Tensor::Zeros({2, 3}));
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(y.status().message()), HasSubstr("<root> (RmsNorm)"));
  EXPECT_THAT(std::string(y.status().message()), HasSubstr("[2, 3]"));
  for (float eps : {-1.0f, NAN}) {
    RmsNorm bad(4, eps);
    y = bad.Forward(core::Tensor::Zeros({4}));
    EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(y.status().message()), HasSubstr("eps"));
  }
  RmsNorm empty(0);
  EXPECT_THAT(std::string(empty.Forward(core::Tensor::Zeros({4})).status().message()),
              HasSubstr("dim must be positive"));
  // The op's output is fp32 or bf16 (a bf16 GEMM's operand), nothing else.
  const core::Tensor x = core::Tensor::Zeros({2, 4}), w = core::Tensor::Zeros({4});
  const core::Tensor rstd = core::Tensor::Zeros({2});
  const absl::Status st = RmsNormForward("rms_norm_test", x, w, 1e-6f,
                                         core::Tensor::Zeros({2, 4}, core::DType::kInt32), rstd);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("output must be float32 or bfloat16"));
}

}  // namespace
}  // namespace nn
