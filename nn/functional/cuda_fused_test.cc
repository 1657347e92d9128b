// GPU tests (tag "gpu") of nn/functional's fused block ops (fused.h): each op's outputs and input
// gradients on cuda:0 against the CPU's, and the block composed of them against
// nn::TransformerBlock on cuda:0 and against itself on the CPU. Skipped, with the reason, where no
// CUDA device is usable (builds without --config=cuda, machines without a GPU).
//
// Tolerances (nn/cuda_layers_test.cc explains them): fp32 within kFp32Rel of the CPU's 2-norm (1e-4
// through a GELU, whose tanh differs in the last bits on CUDA); with bf16 weights 4 bf16 units
// (kBf16Unit) normwise per op and 8 through the block's chains of rounded GEMMs. Against the
// hand-written block on one device: fp32, the same dispatch calls, so the same bits; bf16, the same
// GEMMs (NOTE [Functional fusions]: only (b) adds a rounding pass), checked within one bf16 unit.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cuda_device.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "nn/functional/fused.h"
#include "nn/functional/internal/device_test_util.h"
#include "nn/functional/internal/layer_test_util.h"
#include "nn/testing/cuda_compare.h"
#include "nn/to_device.h"
#include "nn/transformer.h"

namespace nn {
namespace functional {
namespace {

using core::DType;
using core::Tensor;
using cuda_compare::kBf16Unit;
using cuda_compare::kFp32Rel;
using cuda_compare::kGpu;
using cuda_compare::Normal;
using device_test_util::DeviceStep;
using device_test_util::ExpectClose;
using device_test_util::ExpectDevicesAgree;
using device_test_util::Values;
using layer_test_util::Bf16;

// The ops at every place the block uses them, with weights of `dtype`.
void ExpectOpsAgree(DType dtype, double rel, double gelu_rel) {
  const auto w = [dtype](const core::Shape& shape, uint64_t seed) {
    const Tensor t = Normal(shape, seed, 0.3f);
    return dtype == DType::kBFloat16 ? Bf16(t) : t;
  };
  const int64_t B = 2, T = 37, C = 128;
  ExpectDevicesAgree(
      "ResidualLayerNorm",
      [](const std::vector<Tensor>& in, const core::Device&) {
        return ResidualLayerNorm(in[0], in[1], in[2]);
      },
      {Normal({B, T, C}, 1), w({C}, 2), w({C}, 3)}, rel);
  ExpectDevicesAgree(
      "AddLayerNorm",
      [](const std::vector<Tensor>& in, const core::Device&) {
        return AddLayerNorm(in[0], in[1], in[2], in[3]);
      },
      {Normal({B, T, C}, 4), Normal({B, T, C}, 5), w({C}, 6), w({C}, 7)}, rel);
  ExpectDevicesAgree(
      "LinearForGemm",
      [](const std::vector<Tensor>& in,
         const core::Device&) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor y, LinearForGemm(in[0], in[1], in[2]));
        return std::vector<Tensor>{y};
      },
      {Normal({B, T, C}, 8), w({3 * C, C}, 9), w({3 * C}, 10)}, rel);
  ExpectDevicesAgree(
      "LinearResidual",
      [](const std::vector<Tensor>& in,
         const core::Device&) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor y, LinearResidual(in[0], in[1], in[2], in[3]));
        return std::vector<Tensor>{y};
      },
      {Normal({B, T, C}, 11), w({C, C}, 12), w({C}, 13), Normal({B, T, C}, 14)}, rel);
  ExpectDevicesAgree(
      "LinearGelu into GeluLinear",
      [](const std::vector<Tensor>& in,
         const core::Device&) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(const std::vector<Tensor> hp, LinearGelu(in[0], in[1], in[2]));
        ASSIGN_OR_RETURN(Tensor y, GeluLinear(hp[0], hp[1], in[3], in[4], in[5]));
        return std::vector<Tensor>{y};
      },
      {Normal({B, T, C}, 15), w({4 * C, C}, 16), w({4 * C}, 17), w({C, 4 * C}, 18), w({C}, 19),
       Normal({B, T, C}, 20)},
      gelu_rel);
  // Head widths 8 and 64: with bf16 qkv the second is the fused kernel on CUDA and its twin on the
  // CPU.
  for (const int64_t n_head : {16, 2}) {
    AttentionCoreOptions options;
    options.y_bf16 = dtype == DType::kBFloat16;
    const Tensor qkv = Normal({B, T, 3 * C}, 21);
    ExpectDevicesAgree(
        absl::StrCat("CausalSelfAttentionCore, head width ", C / n_head),
        [n_head, options](const std::vector<Tensor>& in,
                          const core::Device&) -> absl::StatusOr<std::vector<Tensor>> {
          ASSIGN_OR_RETURN(Tensor y, CausalSelfAttentionCore(in[0], n_head, options));
          return std::vector<Tensor>{y};
        },
        {dtype == DType::kBFloat16 ? Bf16(qkv) : qkv}, rel);
  }
}

TEST(CudaFusedTest, OpsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  ExpectOpsAgree(DType::kFloat32, kFp32Rel, 1e-4);
}

TEST(CudaFusedTest, Bf16OpsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  ExpectOpsAgree(DType::kBFloat16, 4 * kBf16Unit, 4 * kBf16Unit);
}

// NOTE [Block forwards] on cuda:0: nn::TransformerBlock, composed of the fused ops (cuBLASLt, the
// CUDA kernels and, with bf16 weights at head width 64, the fused attention kernel), against itself
// on the CPU.
TEST(CudaFusedTest, TheBlockMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (const int64_t n_head : {16, 2}) {
      const int64_t C = 128;
      SCOPED_TRACE(absl::StrCat(core::DTypeName(dtype), " weights, head width ", C / n_head));
      // Two blocks with the same weights, each used on one device only.
      nn::TransformerBlock on_cpu(C, n_head, /*seed=*/3), on_gpu(C, n_head, /*seed=*/3);
      ASSERT_TRUE(nn::ConvertParameters(on_cpu, dtype).ok());
      ASSERT_TRUE(nn::ConvertParameters(on_gpu, dtype).ok());
      ASSERT_TRUE(nn::ToDevice(on_gpu, kGpu).ok());
      const Tensor x = Normal({2, 37, C}, 1), g = Normal({2, 37, C}, 2);
      const Values cpu = DeviceStep(on_cpu, x, g);
      const Values gpu = DeviceStep(on_gpu, x, g);
      ExpectClose(gpu, cpu, dtype == DType::kFloat32 ? 1e-4 : 8 * kBf16Unit, /*bits=*/false);
    }
  }
}

}  // namespace
}  // namespace functional
}  // namespace nn
