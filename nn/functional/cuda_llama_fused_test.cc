// GPU tests (tag "gpu") of nn/functional's Llama fused ops (llama_fused.h): each op's outputs and
// input gradients on cuda:0 against the CPU's, and the decoder layer composed of them against
// nn::LlamaDecoderLayer on cuda:0 and against itself on the CPU. Skipped, with the reason, where
// no CUDA device is usable (builds without --config=cuda, machines without a GPU).
//
// Tolerances (nn/cuda_layers_test.cc explains them): fp32 within kFp32Rel of the CPU's 2-norm
// (1e-4 through SiLU, whose exp differs in the last bits on CUDA); with bf16 weights 4 bf16 units
// (kBf16Unit) normwise per op and 8 through the layer's chains of rounded GEMMs. Against the
// hand-written layer on one device: fp32, the same dispatch calls, so the same bits; bf16, the
// same bits but for NOTE [Llama functional fusions] (c), whose GEMM stores fp32 here and bf16
// there, a problem cuBLASLt may give another algorithm, so within one bf16 unit.
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/autograd.h"
#include "core/cuda_device.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "nn/functional/fused.h"
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
using cuda_compare::Host;
using cuda_compare::kBf16Unit;
using cuda_compare::kFp32Rel;
using cuda_compare::kGpu;
using cuda_compare::Normal;
using cuda_compare::RelErr;
using cuda_compare::To;

// The ops under test, given the device they run on (for the rotary tables).
using Fn = std::function<absl::StatusOr<std::vector<Tensor>>(const core::Device&,
                                                             const std::vector<Tensor>&)>;

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
  absl::StatusOr<std::vector<Tensor>> out = fn(device, in);
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
      [](const core::Device&, const std::vector<Tensor>& in) {
        return ResidualRmsNorm(in[0], in[1]);
      },
      {Normal({B, T, C}, 1), w({C}, 2)}, rel);
  ExpectDevicesAgree(
      "SwiGlu",
      [](const core::Device&,
         const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
        ASSIGN_OR_RETURN(Tensor h, SwiGlu(in[0], in[1], in[2]));
        return std::vector<Tensor>{h};
      },
      {Normal({B, T, C}, 3), w({I, C}, 4), w({I, C}, 5)}, silu_rel);
  for (const std::pair<int64_t, int64_t> heads : {std::pair<int64_t, int64_t>{8, 2}, {2, 1}}) {
    const int64_t n_head = heads.first, n_kv_head = heads.second, D = C / n_head;
    AttentionCoreOptions options;
    options.y_bf16 = dtype == DType::kBFloat16;
    ExpectDevicesAgree(
        absl::StrCat("RotaryQkv into CausalSelfAttentionCore, ", n_head, " heads of width ", D,
                     " over ", n_kv_head),
        [=](const core::Device& device,
            const std::vector<Tensor>& in) -> absl::StatusOr<std::vector<Tensor>> {
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

// llama_fused_test's GraphLlamaDecoderLayer as a function: the hand-written layer's parameters
// through the fused ops, on their device.
absl::StatusOr<Tensor> GraphLayer(const nn::LlamaDecoderLayer& layer, const Tensor& x) {
  const nn::GroupedQueryAttention& attn = *layer.self_attn();
  const int64_t n_head = attn.n_head();
  std::vector<core::ParameterPtr> p;
  for (const auto& [name, param] : layer.NamedParameters()) p.push_back(param);
  ASSIGN_OR_RETURN(
      const nn::RotaryTables tables,
      nn::MakeRotaryTables(x.size(1), attn.hidden() / n_head, attn.rope_theta(), x.device()));
  FusedRmsNormOptions norm;
  norm.eps = layer.input_layernorm()->eps();
  ASSIGN_OR_RETURN(const std::vector<Tensor> n1, ResidualRmsNorm(x, p[0], norm));
  AttentionCoreOptions attention;
  attention.y_bf16 = p[4]->data.dtype() == DType::kBFloat16;
  ASSIGN_OR_RETURN(const Tensor h,
                   LinearResidual(CausalSelfAttentionCore(RotaryQkv(n1[1], p[1], p[2], p[3], tables,
                                                                    n_head, attn.n_kv_head()),
                                                          n_head, attention),
                                  p[4], Tensor(), n1[0]));
  norm.eps = layer.post_attention_layernorm()->eps();
  ASSIGN_OR_RETURN(const std::vector<Tensor> n2, ResidualRmsNorm(h, p[5], norm));
  return LinearResidual(SwiGlu(n2[1], p[6], p[7]), p[8], Tensor(), n2[0]);
}

// The output, dL/dx and every parameter gradient (NamedParameters order), on the host.
using Values = std::vector<std::vector<float>>;

// One step of the layer, hand-written (Forward/Backward) or as the graph, on the device of its
// parameters.
Values LayerStep(nn::LlamaDecoderLayer& layer, bool graph, const Tensor& x, const Tensor& g) {
  const core::Device device = layer.input_layernorm()->weight()->data.device();
  const Tensor xd = device.is_cpu() ? x : To(x, device), gd = device.is_cpu() ? g : To(g, device);
  layer.ZeroGrad(/*set_to_none=*/true);
  Values v;
  if (graph) {
    const Tensor xl = core::Leaf(xd);
    absl::StatusOr<Tensor> y = GraphLayer(layer, xl);
    EXPECT_TRUE(y.ok()) << y.status();
    if (!y.ok()) return v;
    const absl::Status back = core::Backward({*y}, {gd});
    EXPECT_TRUE(back.ok()) << back;
    v = {Host(*y), Host(core::LeafGrad(xl))};
  } else {
    absl::StatusOr<Tensor> y = layer.Forward(xd);
    EXPECT_TRUE(y.ok()) << y.status();
    if (!y.ok()) return v;
    absl::StatusOr<Tensor> gx = layer.Backward(gd);
    EXPECT_TRUE(gx.ok()) << gx.status();
    if (!gx.ok()) return v;
    v = {Host(*y), Host(*gx)};
  }
  for (const auto& [name, p] : layer.NamedParameters()) v.push_back(Host(p->grad));
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

// NOTE [Llama functional fusions] on cuda:0: the graph layer against nn::LlamaDecoderLayer there
// (cuBLASLt, the CUDA kernels and, with bf16 weights at head width 64, the fused attention kernel),
// and against itself on the CPU.
TEST(CudaLlamaFusedTest, GraphLayerMatchesTheHandWrittenLayerAndTheCpu) {
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
      const Values cpu = LayerStep(on_cpu, /*graph=*/true, x, g);
      const Values hand = LayerStep(on_gpu, /*graph=*/false, x, g);
      const Values graph = LayerStep(on_gpu, /*graph=*/true, x, g);
      const bool fp32 = dtype == DType::kFloat32;
      ExpectClose(graph, hand, kBf16Unit, /*bits=*/fp32);
      ExpectClose(graph, cpu, fp32 ? 1e-4 : 8 * kBf16Unit, /*bits=*/false);
    }
  }
}

}  // namespace
}  // namespace functional
}  // namespace nn
