// GPU tests (tag "gpu") of the Llama layers (nn/llama.h) against their CPU twins, as
// nn/cuda_layers_test.cc does for the GPT's (its tolerances: fp32 within 1e-5 normwise,
// bf16 within a few unit roundoffs u = 2^-8 per rounded GEMM chain). Skipped, with the
// reason, where no CUDA device is usable.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/allocator.h"
#include "core/bf16_hd.h"
#include "core/op_profile.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "nn/grouped_query_attention.h"
#include "nn/llama.h"
#include "nn/losses.h"
#include "nn/rms_norm.h"
#include "nn/rotary.h"
#include "nn/swiglu.h"
#include "nn/tensor_ops.h"
#include "nn/testing/cuda_compare.h"
#include "nn/testing/gradcheck.h"
#include "nn/to_device.h"

namespace nn {
namespace {

using cuda_compare::CompareModules;
using cuda_compare::Host;
using cuda_compare::Ids;
using cuda_compare::kBf16Unit;
using cuda_compare::kFp32Rel;
using cuda_compare::kGpu;
using cuda_compare::LanguageModelGradients;
using cuda_compare::LossGradients;
using cuda_compare::Normal;
using cuda_compare::RelErr;
using cuda_compare::To;

LlamaConfig Small() {
  LlamaConfig c;
  c.vocab_size = 61;
  c.hidden_size = 32;
  c.intermediate_size = 56;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 24;
  c.seed = 9;
  return c;
}

// RMSNorm reads its weight exactly, fp32 or bf16 (no GEMM): fp32 tolerance either way.
TEST(CudaLlamaTest, RmsNormMatchesCpuWithFp32AndBf16Weights) {
  SKIP_WITHOUT_GPU();
  for (bool bf16 : {false, true}) {
    RmsNorm cpu(67), gpu(67);
    for (RmsNorm* m : {&cpu, &gpu}) {
      gradcheck::RandomizeParameters(*m, 5, 1.0f, 0.5f);
      if (bf16) {
        ASSERT_TRUE(ConvertParameters(*m, core::DType::kBFloat16).ok());
      }
    }
    CompareModules(cpu, gpu, Normal({4, 9, 67}, 9, 2.0f), kFp32Rel);
  }
}

// NOTE [GEMM epilogues]: ForwardForGemm stores the output bf16 on the device too, each
// element within one bf16 step of the CPU's (the fp32 values agree to ~1e-7, so a rounding
// may land one step apart), for rows of 67 and 4096 columns; a second device run gives the
// same bits.
TEST(CudaLlamaTest, RmsNormBf16OutputMatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (int64_t cols : {67, 4096}) {
    RmsNorm cpu(cols), gpu(cols);
    for (RmsNorm* m : {&cpu, &gpu}) {
      gradcheck::RandomizeParameters(*m, 5, 1.0f, 0.5f);
      ASSERT_TRUE(ConvertParameters(*m, core::DType::kBFloat16).ok());
    }
    ASSERT_TRUE(ToDevice(gpu, kGpu).ok());
    const core::Tensor x = Normal({3, 5, cols}, 11, 2.0f);
    absl::StatusOr<core::Tensor> c = cpu.ForwardForGemm(x);
    absl::StatusOr<core::Tensor> g = gpu.ForwardForGemm(To(x, kGpu));
    absl::StatusOr<core::Tensor> again = gpu.ForwardForGemm(To(x, kGpu));
    ASSERT_TRUE(c.ok() && g.ok() && again.ok()) << g.status();
    ASSERT_EQ(g->dtype(), core::DType::kBFloat16);
    const std::vector<float> cv = c->ToVector(), gv = Host(*g);
    EXPECT_EQ(Host(*again), gv) << "run to run";
    for (size_t i = 0; i < cv.size(); ++i) {
      ASSERT_LE(std::abs(gv[i] - cv[i]), 2 * kBf16Unit * std::abs(cv[i]) + 1e-30) << i;
    }
  }
}

// RMSNorm keeps its input and rstd, and its backward makes xhat = x * rstd again
// (kernels::RmsNormHat): with w = 1 the device's forward output is that product bit for bit,
// for rows of 67 (scalar columns), 768 (held in registers) and 4096 columns (streamed).
TEST(CudaLlamaTest, RmsNormsStoredRstdGivesTheForwardsXhatBitForBit) {
  SKIP_WITHOUT_GPU();
  for (const int64_t cols : {67, 768, 4096}) {
    SCOPED_TRACE(absl::StrCat(cols, " columns"));
    const int64_t rows = 37, n = rows * cols;
    const core::Tensor x = Normal({n}, 97, 3.0f);
    const core::Tensor w = core::Tensor::FromVector(std::vector<float>(cols, 1.0f), {cols}).value();
    core::Tensor y = To(core::Tensor::Zeros({n}), kGpu);
    core::Tensor rstd = To(core::Tensor::Zeros({rows}), kGpu);
    const absl::Status s = RmsNormForward("rms", To(x, kGpu), To(w, kGpu), 1e-5f, y, rstd);
    ASSERT_TRUE(s.ok()) << s;
    const std::vector<float> in = x.ToVector(), out = Host(y), rs = Host(rstd);
    for (int64_t r = 0; r < rows; ++r) {
      ASSERT_GT(rs[r], 0.0f) << "row " << r;
      for (int64_t j = 0; j < cols; ++j) {
        const float want = in[r * cols + j] * rs[r];  // xhat * w, w = 1
        ASSERT_EQ(std::memcmp(&want, &out[r * cols + j], sizeof(float)), 0)
            << "row " << r << " column " << j;
      }
    }
  }
}

// RMSNorm on rows that start 4 bytes off 16-byte alignment (one element into their
// buffers) takes the scalar loads of LayerNorm's kernels: the aligned rows' bits, forward
// (y, rstd) and backward with the residual and the bf16 copy (gx, gx16, the weight
// gradient in the pass), for rows held in registers (768) and streamed (4096).
TEST(CudaLlamaTest, RmsNormUnalignedRowsGiveTheAlignedBits) {
  SKIP_WITHOUT_GPU();
  for (const int64_t cols : {768, 4096}) {
    SCOPED_TRACE(absl::StrCat(cols, " columns"));
    const int64_t rows = 37, n = rows * cols;
    const core::Tensor x = Normal({n}, 101, 2.0f), g = Normal({n}, 102);
    const core::Tensor residual = Normal({n}, 103), w = Normal({cols}, 104);
    auto run = [&](int64_t shift) {
      auto at = [&](const core::Tensor& t) {
        core::Tensor wide = To(core::Tensor::Zeros({n + shift}, t.dtype()), kGpu);
        core::Tensor view = wide.View(shift, {n}).value();
        EXPECT_TRUE(view.CopyFrom(To(t, kGpu)).ok());
        return view;
      };
      const core::Tensor xd = at(x);
      core::Tensor y = at(core::Tensor::Zeros({n})), gx = at(core::Tensor::Zeros({n}));
      core::Tensor gx16 = at(core::Tensor::Zeros({n}, core::DType::kBFloat16));
      core::Tensor rstd = To(core::Tensor::Zeros({rows}), kGpu);
      core::Tensor gw = To(core::Tensor::Zeros({cols}), kGpu);
      const core::Tensor wd = To(w, kGpu);
      absl::Status s = RmsNormForward("rms", xd, wd, 1e-5f, y, rstd);
      EXPECT_TRUE(s.ok()) << s;
      s = RmsNormBackwardAdd("rms", at(g), xd, rstd, wd, at(residual), gx, gw, gx16);
      EXPECT_TRUE(s.ok()) << s;
      return std::vector<std::vector<float>>{
          Host(y), Host(rstd), Host(gx), Host(gw),
          Host(gx16.ToDType(core::DType::kFloat32, core::MemoryTag::kOther).value())};
    };
    const std::vector<std::vector<float>> aligned = run(0), shifted = run(1);
    const char* names[] = {"y", "rstd", "gx", "gw", "gx16"};
    for (size_t i = 0; i < aligned.size(); ++i) {
      EXPECT_EQ(shifted[i], aligned[i]) << names[i];
    }
  }
}

// NOTE [Fused ops] on the device: RmsNorm::BackwardAdd's one kernel within fp32 tolerance of
// the CPU's (the weight gradient too: in the kernel's pass up to 12288 columns, by the
// column sums' kernels beyond), for fp32 and bf16 weights and rows of 67 to 12800 columns;
// bit for bit the device's unfused path (Backward, then the residual added), and its bf16
// copy that sum rounded once. A residual on the host is InvalidArgument naming the module.
TEST(CudaLlamaTest, RmsNormBackwardAddMatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (int64_t cols : {67, 4096, 8192, 12800}) {
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE(absl::StrCat(cols, " columns, ", bf16 ? "bf16" : "fp32", " weight"));
      RmsNorm cpu(cols), gpu(cols);
      for (RmsNorm* m : {&cpu, &gpu}) {
        gradcheck::RandomizeParameters(*m, 5, 1.0f, 0.5f);
        if (bf16) {
          ASSERT_TRUE(ConvertParameters(*m, core::DType::kBFloat16).ok());
        }
      }
      ASSERT_TRUE(ToDevice(gpu, kGpu).ok());
      const core::Tensor x = Normal({3, 5, cols}, 12, 2.0f), g = Normal({3, 5, cols}, 13);
      const core::Tensor residual = Normal({3, 5, cols}, 14);
      core::Tensor c16, d16;
      ASSERT_TRUE(cpu.Forward(x).ok());
      absl::StatusOr<core::Tensor> c = cpu.BackwardAdd(g, residual, &c16);
      ASSERT_TRUE(gpu.Forward(To(x, kGpu)).ok());
      absl::StatusOr<core::Tensor> d = gpu.BackwardAdd(To(g, kGpu), To(residual, kGpu), &d16);
      ASSERT_TRUE(c.ok() && d.ok()) << c.status() << d.status();
      const std::vector<float> dv = Host(*d);
      EXPECT_LE(RelErr(dv, c->ToVector()), kFp32Rel);
      const std::vector<float> gw_fused = Host(gpu.weight()->grad);
      EXPECT_LE(RelErr(gw_fused, cpu.weight()->grad.ToVector()), kFp32Rel);
      ASSERT_EQ(d16.dtype(), core::DType::kBFloat16);
      const core::Tensor rounded = core::Tensor::FromVector(dv, {3, 5, cols})
                                       .value()
                                       .ToDType(core::DType::kBFloat16, core::MemoryTag::kOther)
                                       .value();
      EXPECT_EQ(Host(d16.ToDType(core::DType::kFloat32, core::MemoryTag::kOther).value()),
                rounded.ToDType(core::DType::kFloat32, core::MemoryTag::kOther).value().ToVector());
      // The unfused device path: the same input gradient bits plus the residual, and the
      // same weight gradient.
      gpu.ZeroGrad(/*set_to_none=*/true);
      ASSERT_TRUE(gpu.Forward(To(x, kGpu)).ok());
      absl::StatusOr<core::Tensor> u = gpu.Backward(To(g, kGpu));
      ASSERT_TRUE(u.ok()) << u.status();
      const std::vector<float> uv = Host(*u), rv = residual.ToVector();
      for (size_t i = 0; i < uv.size(); ++i) {
        const float sum = rv[i] + uv[i];
        ASSERT_EQ(std::memcmp(&sum, &dv[i], sizeof(float)), 0) << i;
      }
      EXPECT_EQ(Host(gpu.weight()->grad), gw_fused);
      // A residual on the host.
      ASSERT_TRUE(gpu.Forward(To(x, kGpu)).ok());
      const absl::Status s = gpu.BackwardAdd(To(g, kGpu), residual).status();
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_TRUE(absl::StrContains(s.message(), "<root> (RmsNorm)")) << s;
      EXPECT_TRUE(absl::StrContains(s.message(), "residual")) << s;
    }
  }
}

TEST(CudaLlamaTest, SwiGluMlpMatchesCpu) {
  SKIP_WITHOUT_GPU();
  SwiGluMlp cpu(24, 40, 3), gpu(24, 40, 3);
  CompareModules(cpu, gpu, Normal({3, 7, 24}, 10, 2.0f), kFp32Rel);
}

// With bf16 weights (h and the gate and up gradients stored bf16 by the fused ops: NOTE
// [GEMM epilogues]): within 4 u normwise, as the other bf16 layers.
TEST(CudaLlamaTest, Bf16SwiGluMlpMatchesCpu) {
  SKIP_WITHOUT_GPU();
  SwiGluMlp cpu(64, 176, 4), gpu(64, 176, 4);
  ASSERT_TRUE(ConvertParameters(cpu, core::DType::kBFloat16).ok());
  ASSERT_TRUE(ConvertParameters(gpu, core::DType::kBFloat16).ok());
  CompareModules(cpu, gpu, Normal({3, 37, 64}, 12, 2.0f), 4 * kBf16Unit);
}

// `t` (fp32) as the bf16 values it rounds to, each once.
std::vector<float> RoundedOnce(const std::vector<float>& t) {
  std::vector<float> out(t.size());
  for (size_t i = 0; i < t.size(); ++i) out[i] = core::Bf16BitsToFloat(core::FloatToBf16Bits(t[i]));
  return out;
}

// A bf16 output `got` of the device: the device's fp32 output `want32` rounded once, bit for
// bit, and within one bf16 step of the CPU's bf16 output `cpu16` (u = kBf16Unit each) plus
// twice the fp32 difference of the two devices' values. That difference is a few fp32 ulps
// of `scale[i]`, the size of the terms the value is computed from, not of the value: the
// device contracts products into fused multiply-adds (nvcc), the CPU loops do not, and where
// the terms cancel (silu'(a) at a near -1.28, a rotation x c - y s near 0) the value is far
// smaller than its terms. 64 ulps of the terms bound it here.
void ExpectDeviceBf16(const core::Tensor& got, const core::Tensor& want32,
                      const core::Tensor& cpu16, const std::vector<float>& scale,
                      const std::string& name) {
  ASSERT_EQ(got.dtype(), core::DType::kBFloat16) << name;
  const std::vector<float> g = Host(got), c = cpu16.ToVector();
  EXPECT_EQ(g, RoundedOnce(Host(want32))) << name;
  ASSERT_EQ(g.size(), c.size()) << name;
  ASSERT_EQ(scale.size(), c.size()) << name;
  constexpr double kFp32Terms = 2 * 64 * 0x1p-24;
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_LE(std::abs(g[i] - c[i]), 2 * kBf16Unit * std::abs(c[i]) + kFp32Terms * scale[i] + 1e-30)
        << name << " " << i;
  }
}

// Every element's terms bounded by one size: `factor` times the largest magnitude in `ts`.
std::vector<float> UniformScale(std::initializer_list<const core::Tensor*> ts, int64_t n,
                                float factor) {
  float largest = 0.0f;
  for (const core::Tensor* t : ts) {
    for (float v : t->ToVector()) largest = std::max(largest, std::abs(v));
  }
  return std::vector<float>(n, factor * largest);
}

core::Tensor Output(const core::Shape& shape, bool bf16, const core::Device& device) {
  return core::Tensor::Zeros(shape, bf16 ? core::DType::kBFloat16 : core::DType::kFloat32,
                             core::MemoryTag::kActivation, device);
}

// NOTE [GEMM epilogues] on the device: silu(a) * b and its gradients stored bf16, each by its
// own dtype, for lengths that leave partial blocks and one that takes many grid strides.
TEST(CudaLlamaTest, SiluMulBf16OutputsMatchCpu) {
  SKIP_WITHOUT_GPU();
  for (int64_t n : {int64_t{1001}, (int64_t{1} << 22) + 3}) {
    SCOPED_TRACE(absl::StrCat(n, " elements"));
    const core::Tensor a = Normal({n}, 40, 3.0f), b = Normal({n}, 41), gh = Normal({n}, 42);
    const core::Tensor ga_d = To(a, kGpu), gb_d = To(b, kGpu), gh_d = To(gh, kGpu);
    const core::Tensor h32 = Output({n}, false, kGpu), h16 = Output({n}, true, kGpu),
                       hc = Output({n}, true, core::Device::Cpu());
    ASSERT_TRUE(SiluMulForward("cuda_llama_test", ga_d, gb_d, h32).ok());
    ASSERT_TRUE(SiluMulForward("cuda_llama_test", ga_d, gb_d, h16).ok());
    ASSERT_TRUE(SiluMulForward("cuda_llama_test", a, b, hc).ok());
    // The terms' sizes: |silu(a) b| <= |a b| for h; |gh b| (1 + |a|) for the gate gradient
    // gh b s (1 + a (1 - s)), s = sigmoid(a); |gh a| for the up gradient gh silu(a).
    const std::vector<float> av = a.ToVector(), bv = b.ToVector(), gv = gh.ToVector();
    std::vector<float> h_scale(n), ga_scale(n), gb_scale(n);
    for (int64_t i = 0; i < n; ++i) {
      h_scale[i] = std::abs(av[i] * bv[i]);
      ga_scale[i] = std::abs(gv[i] * bv[i]) * (1.0f + std::abs(av[i]));
      gb_scale[i] = std::abs(gv[i] * av[i]);
    }
    ExpectDeviceBf16(h16, h32, hc, h_scale, "h");
    const core::Tensor da32 = Output({n}, false, kGpu), db32 = Output({n}, false, kGpu);
    ASSERT_TRUE(SiluMulBackward("cuda_llama_test", ga_d, gb_d, gh_d, da32, db32).ok());
    for (auto [a16, b16] :
         {std::make_pair(true, true), std::make_pair(true, false), std::make_pair(false, true)}) {
      const core::Tensor da = Output({n}, a16, kGpu), db = Output({n}, b16, kGpu);
      const core::Tensor ca = Output({n}, a16, core::Device::Cpu()),
                         cb = Output({n}, b16, core::Device::Cpu());
      ASSERT_TRUE(SiluMulBackward("cuda_llama_test", ga_d, gb_d, gh_d, da, db).ok());
      ASSERT_TRUE(SiluMulBackward("cuda_llama_test", a, b, gh, ca, cb).ok());
      for (const auto& [got, want32, cpu, is16, scale, name] :
           {std::make_tuple(da, da32, ca, a16, &ga_scale, "gate gradient"),
            std::make_tuple(db, db32, cb, b16, &gb_scale, "up gradient")}) {
        if (is16) {
          ExpectDeviceBf16(got, want32, cpu, *scale, name);
        } else {
          EXPECT_EQ(Host(got), Host(want32)) << name;
        }
      }
    }
  }
}

// The rotary packing stored bf16 and its backward's gq, gk, gv each by its own dtype, on the
// device, for grouped, multi-query and multi-head kv heads.
TEST(CudaLlamaTest, RotaryPackBf16OutputsMatchCpu) {
  SKIP_WITHOUT_GPU();
  struct Case {
    int64_t B, T, H, KV, D;
  };
  for (const Case& c : {Case{2, 37, 4, 2, 8}, Case{3, 19, 6, 1, 64}, Case{1, 5, 4, 4, 2}}) {
    SCOPED_TRACE(absl::StrCat(c.H, " heads, ", c.KV, " kv heads, D ", c.D));
    const int64_t C = c.H * c.D, KW = c.KV * c.D;
    const RotaryTables cpu_t = MakeRotaryTables(c.T, c.D, 10000.0, core::Device::Cpu()).value();
    const RotaryTables gpu_t = MakeRotaryTables(c.T, c.D, 10000.0, kGpu).value();
    const core::Shape qs = {c.B, c.T, C}, ks = {c.B, c.T, KW}, ps = {c.B, c.T, 3 * C};
    const core::Tensor q = Normal(qs, 43), k = Normal(ks, 44), v = Normal(ks, 45),
                       g = Normal(ps, 46);
    const core::Tensor qd = To(q, kGpu), kd = To(k, kGpu), vd = To(v, kGpu), gd = To(g, kGpu);
    const core::Tensor p32 = Output(ps, false, kGpu), p16 = Output(ps, true, kGpu),
                       pc = Output(ps, true, core::Device::Cpu());
    for (const core::Tensor* out : {&p32, &p16}) {
      ASSERT_TRUE(
          RotaryPackQkv("cuda_llama_test", qd, kd, vd, gpu_t.cos, gpu_t.sin, c.H, c.KV, *out).ok());
    }
    ASSERT_TRUE(
        RotaryPackQkv("cuda_llama_test", q, k, v, cpu_t.cos, cpu_t.sin, c.H, c.KV, pc).ok());
    // A rotated element is x c -/+ y s with |c|, |s| <= 1 (v is copied): its terms are at
    // most twice the largest input.
    ExpectDeviceBf16(p16, p32, pc, UniformScale({&q, &k, &v}, pc.numel(), 2.0f), "q, k and v");
    const core::Tensor gq32 = Output(qs, false, kGpu), gk32 = Output(ks, false, kGpu),
                       gv32 = Output(ks, false, kGpu);
    ASSERT_TRUE(RotaryPackQkvBackward("cuda_llama_test", gd, gpu_t.cos, gpu_t.sin, c.H, c.KV, gq32,
                                      gk32, gv32)
                    .ok());
    for (int mask : {7, 5, 2}) {
      const bool q16 = mask & 1, k16 = mask & 2, v16 = mask & 4;
      const core::Tensor gq = Output(qs, q16, kGpu), gk = Output(ks, k16, kGpu),
                         gv = Output(ks, v16, kGpu);
      const core::Tensor cq = Output(qs, q16, core::Device::Cpu()),
                         ck = Output(ks, k16, core::Device::Cpu()),
                         cv = Output(ks, v16, core::Device::Cpu());
      ASSERT_TRUE(
          RotaryPackQkvBackward("cuda_llama_test", gd, gpu_t.cos, gpu_t.sin, c.H, c.KV, gq, gk, gv)
              .ok());
      ASSERT_TRUE(
          RotaryPackQkvBackward("cuda_llama_test", g, cpu_t.cos, cpu_t.sin, c.H, c.KV, cq, ck, cv)
              .ok());
      for (const auto& [got, want32, cpu, is16, name] :
           {std::make_tuple(gq, gq32, cq, q16, "q gradient"),
            std::make_tuple(gk, gk32, ck, k16, "k gradient"),
            std::make_tuple(gv, gv32, cv, v16, "v gradient")}) {
        if (is16) {
          // A gradient element sums the rotated gradients of the heads that share it (k and
          // v: H / KV query heads), each at most twice the largest gradient.
          ExpectDeviceBf16(got, want32, cpu, UniformScale({&g}, cpu.numel(), 2.0f * c.H / c.KV),
                           absl::StrCat(name, ", mask ", mask));
        } else {
          EXPECT_EQ(Host(got), Host(want32)) << name << ", mask " << mask;
        }
      }
    }
  }
}

// fp32, and bf16 on the unfused path (4 u, as CausalSelfAttention's), for grouped,
// multi-query and multi-head kv heads.
TEST(CudaLlamaTest, GroupedQueryAttentionMatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (int64_t kv : {4, 2, 1}) {
    SCOPED_TRACE(absl::StrCat(kv, " kv heads"));
    GroupedQueryAttention cpu(32, 4, kv, 10000.0, 5), gpu(32, 4, kv, 10000.0, 5);
    CompareModules(cpu, gpu, Normal({3, 37, 32}, 13), kFp32Rel);
    GroupedQueryAttention cpu16(32, 4, kv, 10000.0, 6), gpu16(32, 4, kv, 10000.0, 6);
    ASSERT_TRUE(ConvertParameters(cpu16, core::DType::kBFloat16).ok());
    ASSERT_TRUE(ConvertParameters(gpu16, core::DType::kBFloat16).ok());
    CompareModules(cpu16, gpu16, Normal({3, 37, 32}, 14), 4 * kBf16Unit);
  }
}

// NOTE [Grouped-query attention] through NOTE [Fused attention]: at head width 64 the bf16
// layer on CUDA runs the fused kernels on the expanded heads; against the unfused CPU path
// within 4 u normwise, with the fused ops in the profile.
TEST(CudaLlamaTest, FusedBf16GroupedQueryAttentionMatchesTheUnfusedPath) {
  SKIP_WITHOUT_GPU();
  const int64_t H = 4, KV = 2, C = H * 64, B = 2, T = 130;
  GroupedQueryAttention cpu(C, H, KV, 10000.0, 7), gpu(C, H, KV, 10000.0, 7);
  cpu.set_fused(false);
  ASSERT_TRUE(ConvertParameters(cpu, core::DType::kBFloat16).ok());
  ASSERT_TRUE(ConvertParameters(gpu, core::DType::kBFloat16).ok());
  core::OpProfile profile;
  {
    core::ScopedOpProfile on(&profile);
    CompareModules(cpu, gpu, Normal({B, T, C}, 31), 4 * kBf16Unit);
  }
  int fused = 0;
  for (const core::OpRecord& r : profile.records()) {
    fused += absl::StartsWith(r.name, "fused_attention");
  }
  EXPECT_EQ(fused, 2);  // the GPU's forward and backward; the CPU's unfused path none
}

TEST(CudaLlamaTest, LlamaWithCrossEntropyMatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (bool tied : {false, true}) {
    LlamaConfig config = Small();
    config.tie_word_embeddings = tied;
    std::shared_ptr<Llama> cpu = Llama::Create(config).value();
    std::shared_ptr<Llama> gpu = Llama::Create(config).value();
    ASSERT_TRUE(ToDevice(*gpu, kGpu).ok());
    const core::Tensor tokens = Ids({3, 24}, 61, 15), targets = Ids({3, 24}, 61, 16);
    absl::StatusOr<core::Tensor> y_cpu = cpu->Forward(tokens);
    absl::StatusOr<core::Tensor> y_gpu = gpu->Forward(tokens);  // CPU tokens, CUDA model
    ASSERT_TRUE(y_cpu.ok()) << y_cpu.status();
    ASSERT_TRUE(y_gpu.ok()) << y_gpu.status();
    EXPECT_LE(RelErr(Host(*y_gpu), y_cpu->ToVector()), kFp32Rel);
    absl::StatusOr<LossResult> l_cpu = CrossEntropyLoss(*y_cpu, targets);
    absl::StatusOr<LossResult> l_gpu = CrossEntropyLoss(*y_gpu, To(targets, kGpu));
    ASSERT_TRUE(l_cpu.ok() && l_gpu.ok());
    ASSERT_TRUE(cpu->Backward(l_cpu->grad).ok());
    ASSERT_TRUE(gpu->Backward(l_gpu->grad).ok());
    const auto pc = cpu->NamedParameters(), pg = gpu->NamedParameters();
    for (size_t i = 0; i < pc.size(); ++i) {
      EXPECT_LE(RelErr(Host(pg[i].second->grad), pc[i].second->grad.ToVector()), kFp32Rel)
          << pc[i].first;
    }
  }
}

// NOTE [Activation checkpointing] on the device: checkpointed decoder layers give the plain
// model's gradients bit for bit and hold fewer activation bytes after the forward.
TEST(CudaLlamaTest, CheckpointedLayersGiveThePlainGradientsBitForBit) {
  SKIP_WITHOUT_GPU();
  std::shared_ptr<Llama> plain = Llama::Create(Small()).value();
  std::shared_ptr<Llama> checkpointed = Llama::Create(Small()).value();
  ASSERT_TRUE(ToDevice(*plain, kGpu).ok());
  ASSERT_TRUE(ToDevice(*checkpointed, kGpu).ok());
  for (const auto& layer : checkpointed->layers()->modules())
    layer->set_checkpoint_activations(true);
  const core::Tensor tokens = Ids({3, 24}, 61, 21), targets = To(Ids({3, 24}, 61, 22), kGpu);
  const LossGradients want = LanguageModelGradients(*plain, tokens, targets);
  const LossGradients got = LanguageModelGradients(*checkpointed, tokens, targets);
  EXPECT_EQ(got.grads, want.grads);
  EXPECT_LT(got.activation_bytes_after_forward, want.activation_bytes_after_forward);
}

// A whole bf16 Llama: as Bf16GptLossWithinTheDerivedRoundingBound, with 2 + 7 L roundings per
// logit (per layer the inputs of q/k/v_proj, o_proj, gate/up_proj and down_proj, the
// packed q/k/v and the probabilities; then lm_head's input, and the logit itself, stored
// bf16: NOTE [bf16 logits] in nn/gpt.h).
TEST(CudaLlamaTest, Bf16LlamaLossWithinTheDerivedRoundingBound) {
  SKIP_WITHOUT_GPU();
  const LlamaConfig config = Small();
  std::shared_ptr<Llama> cpu = Llama::Create(config).value();
  std::shared_ptr<Llama> gpu = Llama::Create(config).value();
  ASSERT_TRUE(ConvertParameters(*cpu, core::DType::kBFloat16).ok());
  ASSERT_TRUE(ConvertParameters(*gpu, core::DType::kBFloat16).ok());
  ASSERT_TRUE(ToDevice(*gpu, kGpu).ok());
  const core::Tensor tokens = Ids({4, 16}, 61, 30), targets = Ids({4, 16}, 61, 31);
  absl::StatusOr<core::Tensor> y_cpu = cpu->Forward(tokens);
  absl::StatusOr<core::Tensor> y_gpu = gpu->Forward(tokens);
  ASSERT_TRUE(y_cpu.ok() && y_gpu.ok()) << y_gpu.status();
  const double bound = (2 + 7 * config.num_hidden_layers) * kBf16Unit;
  EXPECT_EQ(y_gpu->dtype(), core::DType::kBFloat16);
  EXPECT_LE(RelErr(Host(*y_gpu), y_cpu->ToVector()), bound);
  absl::StatusOr<LossResult> l_cpu = CrossEntropyLoss(*y_cpu, targets);
  absl::StatusOr<LossResult> l_gpu = CrossEntropyLoss(*y_gpu, targets, gpu->logits_grad_dtype());
  ASSERT_TRUE(l_cpu.ok() && l_gpu.ok());
  EXPECT_NEAR(l_gpu->loss, l_cpu->loss, bound * std::abs(l_cpu->loss));
  ASSERT_TRUE(gpu->Backward(l_gpu->grad).ok());
  for (const auto& [name, p] : gpu->NamedParameters()) {
    EXPECT_EQ(p->grad.dtype(), core::DType::kFloat32) << name;
  }
}

}  // namespace
}  // namespace nn
