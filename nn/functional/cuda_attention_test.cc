// GPU tests (tag "gpu") of nn/functional's attention, rotary and dropout ops: outputs and
// input gradients on cuda:0 against the CPU's. Skipped, with the reason, where no CUDA
// device is usable (builds without --config=cuda, machines without a GPU).
//
// Tolerances (nn/cuda_layers_test.cc explains them): the fp32 attention agrees within
// 10 kFp32Rel of the CPU's 2-norm (GEMM sums and the softmax rows' exponentials in another
// order, through two GEMMs and a softmax); the fused bf16 path within 4 bf16 units of the
// CPU's fp32 composition, as the layers' fused attention is tested; the rotary embedding
// within kFp32Rel (the device contracts its products into fused multiply-adds, the CPU loops
// do not); dropout bit for bit (its mask is integer math, its scale one fp32 product).
#include <string>
#include <vector>

#include "core/cuda_device.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "nn/functional/attention.h"
#include "nn/functional/dropout.h"
#include "nn/functional/internal/device_test_util.h"
#include "nn/functional/rotary.h"
#include "nn/rotary.h"
#include "nn/testing/cuda_compare.h"

namespace nn {
namespace functional {
namespace {

using core::DType;
using core::Tensor;
using cuda_compare::kBf16Unit;
using cuda_compare::kFp32Rel;
using cuda_compare::Normal;
using device_test_util::AgreeOptions;
using device_test_util::DeviceFn;
using device_test_util::ExpectDevicesAgree;
using device_test_util::OneOutput;

DeviceFn Attention(bool causal, bool fused = false) {
  return [causal, fused](const std::vector<Tensor>& in, const core::Device&) {
    AttentionOptions o;
    o.causal = causal;
    o.fused = fused;
    if (in.size() > 3) o.mask = in[3];
    return OneOutput(ScaledDotProductAttention(in[0], in[1], in[2], o));
  };
}

// An int32 CPU mask of 0s and 1s, every `period`-th entry 0, and one row all 0.
Tensor IntMask(const core::Shape& shape, int period) {
  Tensor m = Tensor::Zeros(shape, DType::kInt32);
  const int64_t S = shape.back();
  for (int64_t i = 0; i < m.numel(); ++i) {
    m.data<int32_t>()[i] = (i % period == 0 || i / S == 1) ? 0 : 1;
  }
  return m;
}

TEST(CudaAttentionTest, CompositeAttentionMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  const Tensor q = Normal({2, 4, 9, 16}, 1), k = Normal({2, 2, 11, 16}, 2),
               v = Normal({2, 2, 11, 16}, 3);
  ExpectDevicesAgree("plain, grouped", Attention(false), {q, k, v}, 10 * kFp32Rel);
  ExpectDevicesAgree("causal, T < S", Attention(true), {q, k, v}, 10 * kFp32Rel);
  ExpectDevicesAgree("fp32 mask [B, 1, T, S]", Attention(false),
                     {q, k, v, Normal({2, 1, 9, 11}, 4)}, 10 * kFp32Rel);
  ExpectDevicesAgree("causal and int32 mask [T, S]", Attention(true),
                     {q, k, v, IntMask({9, 11}, 5)}, 10 * kFp32Rel);
}

// Inputs bf16 holds exactly, so that both paths start from the same values.
Tensor Bf16Exact(const core::Shape& shape, uint64_t seed) {
  return Normal(shape, seed)
      .ToDType(DType::kBFloat16, core::MemoryTag::kOther)
      .value()
      .ToDType(DType::kFloat32, core::MemoryTag::kOther)
      .value();
}

// NOTE [Attention paths]: the fused kernel on the device against the fp32 composition on
// the CPU, with a partial last tile and grouped heads.
TEST(CudaAttentionTest, FusedAttentionMatchesTheCpuComposition) {
  SKIP_WITHOUT_GPU();
  AgreeOptions composition_on_cpu;
  composition_on_cpu.cpu_fn = Attention(true, /*fused=*/false);
  for (int64_t D : {64, 128}) {
    const int64_t T = 200;
    ExpectDevicesAgree(
        "fused, D " + std::to_string(D), Attention(true, /*fused=*/true),
        {Bf16Exact({2, 4, T, D}, 1), Bf16Exact({2, 2, T, D}, 2), Bf16Exact({2, 2, T, D}, 3)},
        4 * kBf16Unit, composition_on_cpu);
  }
}

TEST(CudaAttentionTest, RotaryMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  const DeviceFn at_offset = [](const std::vector<Tensor>& in,
                                const core::Device& device) -> absl::StatusOr<std::vector<Tensor>> {
    ASSIGN_OR_RETURN(RotaryTables tables, MakeRotaryTables(40, 16, 10000.0, device));
    return OneOutput(Rotary(in[0], tables, 7));
  };
  ExpectDevicesAgree("offset", at_offset, {Normal({2, 3, 33, 16}, 1)}, kFp32Rel);
  const DeviceFn at_positions =
      [](const std::vector<Tensor>& in,
         const core::Device& device) -> absl::StatusOr<std::vector<Tensor>> {
    ASSIGN_OR_RETURN(RotaryTables tables, MakeRotaryTables(64, 16, 500000.0, device));
    return OneOutput(Rotary(in[0], tables, in[1]));
  };
  ExpectDevicesAgree("positions [B, T]", at_positions,
                     {Normal({2, 3, 33, 16}, 2), cuda_compare::Ids({2, 33}, 64, 3)}, kFp32Rel);
}

// NOTE [Dropout mask]: the device draws the CPU's mask, also for a piece at an offset.
TEST(CudaAttentionTest, DropoutMatchesTheCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  for (int64_t offset : {0, 1000003}) {
    const DeviceFn dropout = [offset](const std::vector<Tensor>& in, const core::Device&) {
      return OneOutput(Dropout(in[0], 0.3, 17, 5, true, offset));
    };
    ExpectDevicesAgree("offset " + std::to_string(offset), dropout, {Normal({300, 257}, 1)}, 0);
  }
}

}  // namespace
}  // namespace functional
}  // namespace nn
