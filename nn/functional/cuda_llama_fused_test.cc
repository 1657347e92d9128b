// GPU tests (tag "gpu") of nn/functional's Llama fused ops (llama_fused.h): each op's outputs and
// input gradients on cuda:0 against the CPU's, and the decoder layer composed of them against
// nn::LlamaDecoderLayer on cuda:0 and against itself on the CPU. Skipped, with the reason, where
// no CUDA device is usable (builds without --config=cuda, machines without a GPU).
//
// Tolerances (nn/cuda_layers_test.cc explains them): fp32 within kFp32Rel of the CPU's 2-norm
// (1e-4 through SiLU, whose exp differs in the last bits on CUDA); with bf16 weights 4 bf16 units
// (kBf16Unit) normwise per op and 8 through the layer's chains of rounded GEMMs. Against the
// hand-written layer on one device: fp32, the same dispatch calls, so the same bits; bf16, the
// same GEMMs (NOTE [Llama functional fusions]: only (b) adds a rounding pass), checked within one
// bf16 unit.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cuda_device.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "nn/functional/fused.h"
#include "nn/functional/internal/device_test_util.h"
#include "nn/functional/internal/layer_test_util.h"
#include "nn/functional/llama_fused.h"
#include "nn/llama.h"
#include "nn/rotary.h"
#include "nn/testing/cuda_compare.h"
#include "nn/to_device.h"

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

// The ops at every place the layer uses them, with weights of `dtype`: 8 query heads of width 16
// over 2 kv heads, and 2 of width 64 (the fused attention kernel under bf16) over 1.
void ExpectOpsAgree(DType dtype, double rel, double silu_rel) {
  const auto w = [dtype](const core::Shape& shape, uint64_t seed) {
    const Tensor t = Normal(shape, seed, 0.3f);
    return dtype == DType::kBFloat16 ? Bf16(t) : t;
  };
  const int64_t B = 2, T = 37, C = 128, I = 344;
  ExpectDevicesAgree(
      "ResidualRmsNorm",
      [](const std::vector<Tensor>& in, const core::Device&) {
        return ResidualRmsNorm(in[0], in[1]);
      },
      {Normal({B, T, C}, 1), w({C}, 2)}, rel);
  ExpectDevicesAgree(
      "SwiGlu",
      [](const std::vector<Tensor>& in,
         const core::Device&) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor h, SwiGlu(in[0], in[1], in[2]));
        return std::vector<Tensor>{h};
      },
      {Normal({B, T, C}, 3), w({I, C}, 4), w({I, C}, 5)}, silu_rel);
  for (const std::pair<int64_t, int64_t>& heads : {std::pair<int64_t, int64_t>{8, 2}, {2, 1}}) {
    const int64_t n_head = heads.first, n_kv_head = heads.second, D = C / n_head;
    AttentionCoreOptions options;
    options.y_bf16 = dtype == DType::kBFloat16;
    ExpectDevicesAgree(
        absl::StrCat("RotaryQkv into CausalSelfAttentionCore, ", n_head, " heads of width ", D,
                     " over ", n_kv_head),
        [=](const std::vector<Tensor>& in,
            const core::Device& device) -> absl::StatusOr<std::vector<Tensor>> {
          ASSIGN_OR_RETURN(const nn::RotaryTables tables,
                           nn::MakeRotaryTables(T, D, 10000.0, device));
          ASSIGN_OR_RETURN(const Tensor qkv,
                           RotaryQkv(in[0], in[1], in[2], in[3], tables, n_head, n_kv_head));
          ASSIGN_OR_RETURN(Tensor y, CausalSelfAttentionCore(qkv, n_head, options));
          return std::vector<Tensor>{qkv, y};
        },
        {Normal({B, T, C}, 6), w({C, C}, 7), w({n_kv_head * D, C}, 8), w({n_kv_head * D, C}, 9)},
        rel);
  }
}

TEST(CudaLlamaFusedTest, OpsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  ExpectOpsAgree(DType::kFloat32, kFp32Rel, 1e-4);
}

TEST(CudaLlamaFusedTest, Bf16OpsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  ExpectOpsAgree(DType::kBFloat16, 4 * kBf16Unit, 4 * kBf16Unit);
}

// NOTE [Block forwards] on cuda:0: nn::LlamaDecoderLayer, composed of the fused ops (cuBLASLt, the
// CUDA kernels and, with bf16 weights at head width 64, the fused attention kernel), against itself
// on the CPU.
TEST(CudaLlamaFusedTest, TheLayerMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (const auto& [n_head, n_kv_head] : {std::pair<int64_t, int64_t>{8, 2}, {2, 1}}) {
      nn::LlamaConfig config;
      config.hidden_size = 128;
      config.intermediate_size = 344;
      config.num_attention_heads = n_head;
      config.num_key_value_heads = n_kv_head;
      SCOPED_TRACE(absl::StrCat(core::DTypeName(dtype), " weights, ", n_head, " heads of width ",
                                config.hidden_size / n_head, " over ", n_kv_head));
      // Two layers with the same weights, each used on one device only.
      nn::LlamaDecoderLayer on_cpu(config, /*seed=*/3), on_gpu(config, /*seed=*/3);
      ASSERT_TRUE(nn::ConvertParameters(on_cpu, dtype).ok());
      ASSERT_TRUE(nn::ConvertParameters(on_gpu, dtype).ok());
      ASSERT_TRUE(nn::ToDevice(on_gpu, kGpu).ok());
      const Tensor x = Normal({2, 37, 128}, 1), g = Normal({2, 37, 128}, 2);
      const Values cpu = DeviceStep(on_cpu, x, g);
      const Values gpu = DeviceStep(on_gpu, x, g);
      ExpectClose(gpu, cpu, dtype == DType::kFloat32 ? 1e-4 : 8 * kBf16Unit, /*bits=*/false);
    }
  }
}

}  // namespace
}  // namespace functional
}  // namespace nn
