// GPU tests (tag "gpu") of nn/functional's fused block ops (fused.h): each op's outputs and input
// gradients on cuda:0 against the CPU's, and the block composed of them against
// nn::TransformerBlock on cuda:0 and against itself on the CPU. Skipped, with the reason, where no
// CUDA device is usable (builds without --config=cuda, machines without a GPU).
//
// Tolerances (nn/cuda_layers_test.cc explains them): fp32 within kFp32Rel of the CPU's 2-norm (1e-4
// through a GELU, whose tanh differs in the last bits on CUDA); with bf16 weights 4 bf16 units
// (kBf16Unit) normwise per op and 8 through the block's chains of rounded GEMMs. Against the
// hand-written block on one device: fp32, the same dispatch calls, so the same bits; bf16, the same
// bits but for NOTE [Functional fusions] (c), whose GEMM stores fp32 here and bf16 there, a problem
// cuBLASLt may give another algorithm, so within one bf16 unit.
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/autograd.h"
#include "core/cuda_device.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "nn/functional/fused.h"
#include "nn/functional/testing/graph_gpt.h"
#include "nn/testing/cuda_compare.h"
#include "nn/to_device.h"
#include "nn/transformer.h"

namespace nn {
namespace functional {
namespace {

using core::DType;
using core::Tensor;
using cuda_compare::Host;
using cuda_compare::kBf16Unit;
using cuda_compare::kFp32Rel;
using cuda_compare::kGpu;
using cuda_compare::Normal;
using cuda_compare::RelErr;
using cuda_compare::To;

using Fn = std::function<absl::StatusOr<std::vector<Tensor>>(const std::vector<Tensor>&)>;

// Every output and the gradient of every input, on the host.
struct Result {
  std::vector<std::vector<float>> outs, grads;
};

// fn on `inputs` copied to `device` as leaves, backward from fixed random gradients of every
// output.
Result RunOn(const core::Device& device, const Fn& fn, const std::vector<Tensor>& inputs) {
  std::vector<Tensor> in;
  for (const Tensor& t : inputs) in.push_back(core::Leaf(device.is_cpu() ? t : To(t, device)));
  Result r;
  absl::StatusOr<std::vector<Tensor>> out = fn(in);
  EXPECT_TRUE(out.ok()) << out.status();
  if (!out.ok()) return r;
  std::vector<Tensor> seeds;
  for (size_t k = 0; k < out->size(); ++k) {
    const Tensor seed = Normal((*out)[k].shape(), 99 + k);
    seeds.push_back(device.is_cpu() ? seed : To(seed, device));
    r.outs.push_back(Host((*out)[k]));
  }
  const absl::Status back = core::Backward(*out, seeds);
  EXPECT_TRUE(back.ok()) << back;
  for (const Tensor& t : in) r.grads.push_back(Host(core::LeafGrad(t)));
  return r;
}

void ExpectDevicesAgree(const std::string& what, const Fn& fn, const std::vector<Tensor>& inputs,
                        double rel) {
  SCOPED_TRACE(what);
  const Result cpu = RunOn(core::Device::Cpu(), fn, inputs);
  const Result gpu = RunOn(kGpu, fn, inputs);
  ASSERT_EQ(gpu.outs.size(), cpu.outs.size());
  for (size_t k = 0; k < cpu.outs.size(); ++k) {
    EXPECT_LE(RelErr(gpu.outs[k], cpu.outs[k]), rel) << "output " << k;
  }
  ASSERT_EQ(gpu.grads.size(), cpu.grads.size());
  for (size_t i = 0; i < cpu.grads.size(); ++i) {
    EXPECT_LE(RelErr(gpu.grads[i], cpu.grads[i]), rel) << "gradient of input " << i;
  }
}

Tensor Bf16(const Tensor& t) {
  return t.ToDType(DType::kBFloat16, core::MemoryTag::kOther).value();
}

// The ops at every place the block uses them, with weights of `dtype`.
void ExpectOpsAgree(DType dtype, double rel, double gelu_rel) {
  const auto w = [dtype](const core::Shape& shape, uint64_t seed) {
    const Tensor t = Normal(shape, seed, 0.3f);
    return dtype == DType::kBFloat16 ? Bf16(t) : t;
  };
  const int64_t B = 2, T = 37, C = 128;
  ExpectDevicesAgree(
      "ResidualLayerNorm",
      [](const std::vector<Tensor>& in) { return ResidualLayerNorm(in[0], in[1], in[2]); },
      {Normal({B, T, C}, 1), w({C}, 2), w({C}, 3)}, rel);
  ExpectDevicesAgree(
      "AddLayerNorm",
      [](const std::vector<Tensor>& in) { return AddLayerNorm(in[0], in[1], in[2], in[3]); },
      {Normal({B, T, C}, 4), Normal({B, T, C}, 5), w({C}, 6), w({C}, 7)}, rel);
  ExpectDevicesAgree(
      "LinearForGemm",
      [](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor y, LinearForGemm(in[0], in[1], in[2]));
        return std::vector<Tensor>{y};
      },
      {Normal({B, T, C}, 8), w({3 * C, C}, 9), w({3 * C}, 10)}, rel);
  ExpectDevicesAgree(
      "LinearResidual",
      [](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor y, LinearResidual(in[0], in[1], in[2], in[3]));
        return std::vector<Tensor>{y};
      },
      {Normal({B, T, C}, 11), w({C, C}, 12), w({C}, 13), Normal({B, T, C}, 14)}, rel);
  ExpectDevicesAgree(
      "LinearGelu into GeluLinear",
      [](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
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
        [n_head, options](const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
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

// The output, dL/dx and every parameter gradient (NamedParameters order), on the host.
using Values = std::vector<std::vector<float>>;

// One step of the block, hand-written (Forward/Backward) or as the graph, on the device of its
// parameters.
Values BlockStep(nn::TransformerBlock& block, bool graph, const Tensor& x, const Tensor& g) {
  const core::Device device = block.ln_1()->weight()->data.device();
  const Tensor xd = device.is_cpu() ? x : To(x, device), gd = device.is_cpu() ? g : To(g, device);
  block.ZeroGrad(/*set_to_none=*/true);
  Values v;
  if (graph) {
    const Tensor xl = core::Leaf(xd);
    // The block as a graph module (NOTE [Functional fusions]), on its parameters' device.
    auto module = std::make_shared<testing::GraphTransformerBlock>(block, true);
    absl::StatusOr<Tensor> y = module->CallOne({xl});
    EXPECT_TRUE(y.ok()) << y.status();
    if (!y.ok()) return v;
    const absl::Status back = core::Backward({*y}, {gd});
    EXPECT_TRUE(back.ok()) << back;
    v = {Host(*y), Host(core::LeafGrad(xl))};
  } else {
    absl::StatusOr<Tensor> y = block.Forward(xd);
    EXPECT_TRUE(y.ok()) << y.status();
    if (!y.ok()) return v;
    absl::StatusOr<Tensor> gx = block.Backward(gd);
    EXPECT_TRUE(gx.ok()) << gx.status();
    if (!gx.ok()) return v;
    v = {Host(*y), Host(*gx)};
  }
  for (const auto& [name, p] : block.NamedParameters()) v.push_back(Host(p->grad));
  return v;
}

void ExpectClose(const Values& got, const Values& want, double rel, bool bits) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].size(), want[i].size()) << "value " << i;
    if (bits) {
      EXPECT_EQ(std::memcmp(got[i].data(), want[i].data(), want[i].size() * sizeof(float)), 0)
          << "value " << i << " (0: output, 1: input gradient, then the parameters')";
    } else {
      EXPECT_LE(RelErr(got[i], want[i]), rel) << "value " << i;
    }
  }
}

// NOTE [Functional fusions] on cuda:0: the graph block against nn::TransformerBlock there
// (cuBLASLt, the CUDA kernels and, with bf16 weights at head width 64, the fused attention kernel),
// and against itself on the CPU.
TEST(CudaFusedTest, GraphBlockMatchesTheHandWrittenBlockAndTheCpu) {
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
      const Values cpu = BlockStep(on_cpu, /*graph=*/true, x, g);
      const Values hand = BlockStep(on_gpu, /*graph=*/false, x, g);
      const Values graph = BlockStep(on_gpu, /*graph=*/true, x, g);
      const bool fp32 = dtype == DType::kFloat32;
      ExpectClose(graph, hand, kBf16Unit, /*bits=*/fp32);
      ExpectClose(graph, cpu, fp32 ? 1e-4 : 8 * kBf16Unit, /*bits=*/false);
    }
  }
}

}  // namespace
}  // namespace functional
}  // namespace nn
