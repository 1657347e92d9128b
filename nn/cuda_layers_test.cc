// GPU tests (tag "gpu"): every CUDA layer, the cuBLASLt GEMM and the losses against the
// CPU reference. Skipped, with the reason, where no CUDA device is usable (builds
// without --config=cuda, machines without a driver or GPU).
//
// Tolerances. fp32: the 2-norm of (CUDA - CPU) within 1e-5 of the CPU result's 2-norm
// (both are fp32 computations that differ only in summation order, ~1e-7 * sqrt(K)).
// bf16 weights: both devices round the same GEMM operands to bf16 (NOTE [bf16 GEMMs] in
// nn/linear.h, NOTE [bf16 attention] in nn/attention.h) and differ by fp32 summation
// order, except where that order moves a value across a bf16 rounding boundary: that
// operand then differs by one bf16 step, relative error at most u = 2^-8; a length-K dot
// product then errs by at most u * sum_k |a_k| |b_k|, which the tests compute on the CPU
// and use elementwise (a bound the usual case, fp32 agreement, meets easily).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/cuda_device.h"
#include "core/op_profile.h"
#include "core/random.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "nn/activations.h"
#include "nn/attention.h"
#include "nn/embedding.h"
#include "nn/gpt.h"
#include "nn/layer_norm.h"
#include "nn/linear.h"
#include "nn/losses.h"
#include "nn/ops.h"
#include "nn/tensor_ops.h"
#include "nn/testing/cuda_compare.h"
#include "nn/to_device.h"
#include "nn/transformer.h"

#ifdef FSDP_WITH_CUDA
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/kernels.h"
#include "kernels/tuning_switches.h"
#include "nn/cuda/gemm.h"
#endif

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

// ---- GEMM.

// While alive, cuBLASLt's heuristic is treated as finding nothing: plain GEMMs run through
// cublasGemmStridedBatchedEx and epilogues through the epilogue kernel.
class ForcedGemmFallback {
 public:
  explicit ForcedGemmFallback(bool on) : on_(on) { Set(on_); }
  ~ForcedGemmFallback() { Set(false); }

 private:
  static void Set(bool on) {
#ifdef FSDP_WITH_CUDA
    cuda::ForceGemmFallbackForTesting(on);
#else
    (void)on;
#endif
  }
  bool on_;
};

struct GemmCase {
  bool ta, tb;
};

class CudaGemmTest : public ::testing::TestWithParam<GemmCase> {};

// A, B, C with odd sizes, row strides wider than the matrices, offsets and a batch of 3,
// on both devices; CUDA's fp32 result must match OpenBLAS's.
TEST_P(CudaGemmTest, Fp32MatchesCpuForEveryTransposeWithOddSizesStridesAndBatches) {
  SKIP_WITHOUT_GPU();
  const GemmCase c = GetParam();
  const int64_t batch = 3, m = 37, n = 19, k = 53;
  const int64_t ra = c.ta ? k : m, ca = c.ta ? m : k, rb = c.tb ? n : k, cb = c.tb ? k : n;
  const int64_t lda = ca + 5, ldb = cb + 3, ldc = n + 7;
  const int64_t sa = ra * lda + 11, sb = rb * ldb + 2, sc = m * ldc + 1;
  const core::Tensor a = Normal({4 + batch * sa}, 1), b = Normal({3 + batch * sb}, 2);
  const core::Tensor c_cpu = Normal({batch * sc}, 3);
  const core::Tensor c_gpu = To(c_cpu, kGpu);
  GemmArgs args;
  args.trans_a = c.ta;
  args.trans_b = c.tb;
  args.batch = batch;
  args.m = m;
  args.n = n;
  args.k = k;
  args.alpha = 0.75f;
  args.beta = 0.5f;
  args.a = {a, 4, lda, sa};
  args.b = {b, 3, ldb, sb};
  args.c = {c_cpu, 0, ldc, sc};
  ASSERT_TRUE(MatMul("cpu", args).ok());
  args.a.tensor = To(a, kGpu);
  args.b.tensor = To(b, kGpu);
  // cuBLASLt, then cublasGemmStridedBatchedEx (the fallback when its heuristic finds none).
  for (bool fallback : {false, true}) {
    ForcedGemmFallback forced(fallback);
    args.c.tensor = To(Normal({batch * sc}, 3), kGpu);
    const absl::Status s = MatMul("gpu", args);
    ASSERT_TRUE(s.ok()) << s;
    // Elements outside the matrices (padding) must be untouched, inside within 1e-5.
    EXPECT_LE(RelErr(Host(args.c.tensor), c_cpu.ToVector()), kFp32Rel) << fallback;
  }
}

// bf16 x bf16 and fp32 x bf16 (the activation rounded to bf16 on the device): equal to
// the CPU product of the same bf16 values, up to fp32 summation order.
TEST_P(CudaGemmTest, Bf16AndMixedOperandsMatchTheCpuProductOfTheRoundedValues) {
  SKIP_WITHOUT_GPU();
  const GemmCase c = GetParam();
  const int64_t m = 33, n = 17, k = 65;
  const core::Tensor a = Normal({m * k}, 4), b = Normal({k * n}, 5);
  const core::Tensor a16 = a.ToDType(core::DType::kBFloat16, core::MemoryTag::kOther).value();
  const core::Tensor b16 = b.ToDType(core::DType::kBFloat16, core::MemoryTag::kOther).value();
  GemmArgs args;
  args.trans_a = c.ta;
  args.trans_b = c.tb;
  args.m = m;
  args.n = n;
  args.k = k;
  const core::Tensor want = core::Tensor::Zeros({m * n});
  args.a.tensor = a16;
  args.b.tensor = b16;
  args.c.tensor = want;
  ASSERT_TRUE(MatMul("cpu", args).ok());  // bf16 widened exactly
  for (int run = 0; run < 4; ++run) {
    const bool mixed = run % 2 == 1;
    ForcedGemmFallback forced(run >= 2);  // cublasGemmStridedBatchedEx
    const core::Tensor got =
        core::Tensor::Zeros({m * n}, core::DType::kFloat32, core::MemoryTag::kOther, kGpu);
    args.a.tensor = To(mixed ? a : a16, kGpu);  // mixed: fp32 activation, rounded on device
    args.b.tensor = To(b16, kGpu);
    args.c.tensor = got;
    const absl::Status s = MatMul("gpu", args);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_LE(RelErr(Host(got), want.ToVector()), kFp32Rel) << (mixed ? "mixed" : "bf16");
  }
}

INSTANTIATE_TEST_SUITE_P(AllTransposes, CudaGemmTest,
                         ::testing::Values(GemmCase{false, false}, GemmCase{false, true},
                                           GemmCase{true, false}, GemmCase{true, true}));

// A Linear's forward GEMM on `device`: C [m, n] (zeros, c_dtype) = x [m, k] w [n, k]^T with
// the epilogue, its bias and aux (either may be undefined), copied there.
GemmArgs LinearGemmOn(const core::Device& device, int64_t m, int64_t n, int64_t k,
                      const core::Tensor& x, const core::Tensor& w, core::DType c_dtype,
                      GemmEpilogue epilogue, const core::Tensor& bias, const core::Tensor& aux) {
  GemmArgs g;
  g.trans_b = true;
  g.m = m;
  g.n = n;
  g.k = k;
  g.a.tensor = To(x, device);
  g.b.tensor = To(w, device);
  g.c.tensor = To(core::Tensor::Zeros({m * n}, c_dtype), device);
  g.epilogue = epilogue;
  if (bias.defined()) g.bias = To(bias, device);
  if (aux.defined()) g.aux = To(aux, device);
  return g;
}

// A Linear's weight-gradient GEMM on `device`: dW [out, in] (c0 copied there) += g^T x over
// `rows` rows, with the bias gradient (sums0 copied there) += the column sums of g.
GemmArgs WeightGradientGemmOn(const core::Device& device, int64_t rows, int64_t out, int64_t in,
                              const core::Tensor& g, const core::Tensor& x, const core::Tensor& c0,
                              const core::Tensor& sums0) {
  return WeightGradientGemm(rows, out, in, To(g, device), To(x, device), To(c0, device),
                            To(sums0, device));
}

// NOTE [GEMM epilogues]: each epilogue, into fp32 and bf16 C, with bf16 and fp32 biases,
// through cuBLASLt's epilogue and through the fallback kernel, against the CPU. The
// product differs from the CPU's by fp32 summation order (kFp32Rel); cuBLASLt's GELU is
// its own tanh form (within 1e-6 (1 + |x|) of ours, so 1e-4 normwise covers it); a bf16
// C or aux may sit one rounding step away where those move a value across a bf16
// boundary (kBf16Unit normwise). The bias + residual epilogue (fp32 C only) adds in another
// order on cuBLASLt (P + residual, then the bias): one more fp32 rounding, within kFp32Rel;
// the residual epilogue (fp32 C only, no bias) adds as the CPU does.
TEST(CudaGemmEpilogueTest, EachEpilogueMatchesTheCpuOnCublasLtAndOnTheFallbackKernel) {
  SKIP_WITHOUT_GPU();
  const int64_t m = 48, n = 64, k = 40;  // n % 8 == 0: cuBLASLt's aux leading dimension
  const core::Tensor x = Normal({m * k}, 61), w = Normal({n * k}, 62), b = Normal({n}, 63);
  const core::Tensor saved = Normal({m * n}, 64);
  const core::Tensor x16 = x.ToDType(core::DType::kBFloat16, core::MemoryTag::kOther).value();
  const core::Tensor w16 = w.ToDType(core::DType::kBFloat16, core::MemoryTag::kOther).value();
  for (GemmEpilogue e :
       {GemmEpilogue::kNone, GemmEpilogue::kBias, GemmEpilogue::kBiasGelu, GemmEpilogue::kDGelu,
        GemmEpilogue::kBiasResidual, GemmEpilogue::kResidual}) {
    for (core::DType c_dtype : {core::DType::kFloat32, core::DType::kBFloat16}) {
      const bool residual = e == GemmEpilogue::kBiasResidual || e == GemmEpilogue::kResidual;
      if (residual && c_dtype == core::DType::kBFloat16) continue;
      for (bool bias16 : {false, true}) {
        for (bool fallback : {false, true}) {
          SCOPED_TRACE(absl::StrCat("epilogue ", static_cast<int>(e), " C ",
                                    core::DTypeName(c_dtype), bias16 ? " bf16 bias" : "",
                                    fallback ? " fallback" : ""));
          const core::Tensor bias =
              bias16 ? b.ToDType(core::DType::kBFloat16, core::MemoryTag::kOther).value() : b;
          const core::Tensor aux0 = saved.ToDType(c_dtype, core::MemoryTag::kOther).value();
          const bool has_bias = e == GemmEpilogue::kBias || e == GemmEpilogue::kBiasGelu ||
                                e == GemmEpilogue::kBiasResidual;
          const bool has_aux =
              e == GemmEpilogue::kBiasGelu || e == GemmEpilogue::kDGelu || residual;
          auto run = [&](const core::Device& device, const char* what) {
            GemmArgs g =
                LinearGemmOn(device, m, n, k, x16, w16, c_dtype, e,
                             has_bias ? bias : core::Tensor(), has_aux ? aux0 : core::Tensor());
            const absl::Status s = MatMul(what, g);
            EXPECT_TRUE(s.ok()) << s;
            return g;
          };
          const GemmArgs cpu = run(core::Device::Cpu(), "cpu");
          ForcedGemmFallback forced(fallback);
          const GemmArgs gpu = run(kGpu, "gpu");
          auto wide = [](const core::Tensor& t) {
            return t.ToDType(core::DType::kFloat32, core::MemoryTag::kOther).value();
          };
          const bool c16 = c_dtype == core::DType::kBFloat16;
          const bool gelu = e == GemmEpilogue::kBiasGelu || e == GemmEpilogue::kDGelu;
          const double tol = c16 ? kBf16Unit : (gelu ? 1e-4 : kFp32Rel);
          EXPECT_LE(RelErr(Host(wide(gpu.c.tensor)), wide(cpu.c.tensor).ToVector()), tol);
          if (e == GemmEpilogue::kBiasGelu) {
            EXPECT_LE(RelErr(Host(wide(gpu.aux)), wide(cpu.aux).ToVector()),
                      c16 ? kBf16Unit : kFp32Rel);
          }
        }
      }
    }
  }
}

// What cuBLASLt did with the GEMMs of one test case, for the test's report (RecordProperty
// and a printed line): how many fallbacks the library took (GemmEpilogueFallbacksForTesting)
// and the lines GemmTuningReport gained (which answer the tuner kept, or why the fallback
// runs). Tuning is on while it lives, so that every problem built in its scope has its
// line. cuBLASLt's choices are reported, not asserted: another GPU or cuBLASLt version may
// offer other algorithms.
class GemmChoices {
 public:
  GemmChoices() {
#ifdef FSDP_WITH_CUDA
    tuning_was_on_ = cuda::GemmTuning();
    cuda::SetGemmTuning(true);
    fallbacks_ = cuda::GemmEpilogueFallbacksForTesting();
    lines_ = cuda::GemmTuningReport().size();
#endif
  }
  ~GemmChoices() {
#ifdef FSDP_WITH_CUDA
    cuda::SetGemmTuning(tuning_was_on_);
#endif
  }
  // Fallbacks taken since construction.
  int64_t Fallbacks() const {
#ifdef FSDP_WITH_CUDA
    return cuda::GemmEpilogueFallbacksForTesting() - fallbacks_;
#else
    return 0;
#endif
  }
  // The report lines added since construction, of the problems `what` names.
  std::vector<std::string> Lines(absl::string_view what) const {
    std::vector<std::string> mine;
#ifdef FSDP_WITH_CUDA
    const std::vector<std::string> all = cuda::GemmTuningReport();
    for (size_t i = lines_; i < all.size(); ++i) {
      if (absl::StartsWith(all[i], absl::StrCat(what, ":"))) mine.push_back(all[i]);
    }
#else
    (void)what;
#endif
    return mine;
  }
  // Records `value` under "<what> <key>" (spaces as underscores) and prints it.
  static void Report(absl::string_view what, absl::string_view key, const std::string& value) {
    std::string name = absl::StrCat(what, " ", key);
    std::replace(name.begin(), name.end(), ' ', '_');
    ::testing::Test::RecordProperty(name, value);
    std::printf("%s: %s\n", name.c_str(), value.c_str());
  }

 private:
  bool tuning_was_on_ = true;
  int64_t fallbacks_ = 0;
  size_t lines_ = 0;
};

// NOTE [GEMM epilogues]: the residual epilogue adds the residual to the product once, on
// cuBLASLt or through the fallback, at a Llama's projection shapes (o_proj and down_proj
// forward, the k/v and up input gradients that add the sum so far) and at a long k that
// invites split-K. Asserted, what the library controls: a second call (the cached plan,
// after the first call tuned it) writes the first call's bits, and every element is the
// plain GEMM's plus the residual up to fp32 rounding. Whether cuBLASLt's kernel on the
// plain GEMM's grid writes exactly the plain GEMM's bits plus one addition is cuBLASLt's
// doing: reported, with the path taken and the tuner's line, not asserted.
//
// The bound. bf16 x bf16 products are exact in fp32, so the two results differ only in how
// their fp32 sums (and the residual's addition) round. A sum of k products lies within
// lambda sqrt(k) u M of the exact one, u = 2^-24 and M = sum_k |x| |w| (Higham and Mary's
// probabilistic bound, SIAM J. Sci. Comput. 2019: with lambda = 8 an element fails it with
// probability under 2 k e^-32), so the two differ by at most 2 lambda sqrt(k) u M, plus
// 4 u (|residual| + M) for the additions of the residual (split-K parts may join it one by
// one). The residual has the product's scale (standard deviation sqrt(k)), so a residual
// left out or added twice, or a product summed over part of k, breaks the bound.
TEST(CudaGemmEpilogueTest, TheResidualEpilogueIsThePlainGemmPlusTheResidual) {
  SKIP_WITHOUT_GPU();
  struct Case {
    const char* what;
    int64_t m, n, k;
    bool trans_b;  // x W^T (forward) or g W (input gradient)
  };
  const auto bf16 = [](const core::Tensor& t) {
    return t.ToDType(core::DType::kBFloat16, core::MemoryTag::kOther).value();
  };
  const auto abs_of = [](const core::Tensor& t) {
    std::vector<float> v = t.ToVector();
    for (float& e : v) e = std::abs(e);
    return core::Tensor::FromVector(v, t.shape()).value();
  };
  constexpr double kU = 1.0 / (1 << 24), kLambda = 8;
  for (const Case& c :
       {Case{"o_proj", 4096, 768, 768, true}, Case{"down_proj", 4096, 768, 2048, true},
        Case{"k_proj dx", 4096, 768, 256, false}, Case{"up_proj dx", 4096, 768, 2048, false},
        Case{"long k", 64, 64, 65536, true}}) {
    SCOPED_TRACE(c.what);
    const core::Tensor x = bf16(Normal({c.m * c.k}, 131)), w = bf16(Normal({c.n * c.k}, 132));
    const core::Tensor residual =
        Normal({c.m * c.n}, 133, static_cast<float>(std::sqrt(static_cast<double>(c.k))));
    // M = |x| op(|w|) on the CPU (fp32 sums of non-negative terms, within k u of exact).
    GemmArgs mags =
        LinearGemmOn(core::Device::Cpu(), c.m, c.n, c.k, abs_of(x), abs_of(w),
                     core::DType::kFloat32, GemmEpilogue::kNone, core::Tensor(), core::Tensor());
    mags.trans_b = c.trans_b;
    ASSERT_TRUE(MatMul(c.what, mags).ok());
    GemmChoices choices;
    GemmArgs plain = LinearGemmOn(kGpu, c.m, c.n, c.k, x, w, core::DType::kFloat32,
                                  GemmEpilogue::kNone, core::Tensor(), core::Tensor());
    plain.trans_b = c.trans_b;
    ASSERT_TRUE(MatMul(c.what, plain).ok());
    const std::vector<float> p = Host(plain.c.tensor), r = residual.ToVector();
    const std::vector<float> m = mags.c.tensor.ToVector();
    std::vector<float> first;
    for (int call = 0; call < 2; ++call) {
      GemmArgs fused = LinearGemmOn(kGpu, c.m, c.n, c.k, x, w, core::DType::kFloat32,
                                    GemmEpilogue::kResidual, core::Tensor(), residual);
      fused.trans_b = c.trans_b;
      const absl::Status s = MatMul(c.what, fused);
      ASSERT_TRUE(s.ok()) << s;
      const std::vector<float> f = Host(fused.c.tensor);
      ASSERT_EQ(f.size(), p.size());
      if (call == 0) {
        first = f;
      } else {
        ASSERT_EQ(std::memcmp(first.data(), f.data(), f.size() * sizeof(float)), 0)
            << "the second call of the same problem wrote other bits";
      }
    }
    int64_t bits_differ = 0;
    double worst = 0;  // |fused - (plain + residual)| / bound, the largest
    for (size_t i = 0; i < first.size(); ++i) {
      const float want = r[i] + p[i];
      if (std::memcmp(&want, &first[i], sizeof(float)) != 0) ++bits_differ;
      const double mag = static_cast<double>(m[i]) * (1 + c.k * kU);
      const double bound = 2 * kLambda * std::sqrt(static_cast<double>(c.k)) * kU * mag +
                           4 * kU * (std::abs(r[i]) + mag);
      const double err = std::abs(static_cast<double>(first[i]) - want);
      worst = std::max(worst, err / bound);
      ASSERT_LE(err, bound) << "element " << i << ": fused " << first[i] << ", plain + residual "
                            << want << ", residual " << r[i];
    }
    GemmChoices::Report(c.what, "path", choices.Fallbacks() > 0 ? "fallback" : "cuBLASLt");
    GemmChoices::Report(c.what, "elements_not_bit_equal_to_plain_plus_add",
                        absl::StrCat(bits_differ, " of ", first.size()));
    GemmChoices::Report(c.what, "worst_error_over_bound", absl::StrCat(worst));
    GemmChoices::Report(c.what, "tuning", absl::StrJoin(choices.Lines(c.what), " | "));
  }
}

// fp32 operands take no cuBLASLt epilogue (MatMul runs the plain GEMM and the epilogue
// kernel); the result still matches the CPU.
TEST(CudaGemmEpilogueTest, Fp32OperandsWithAnEpilogueMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  const int64_t m = 9, n = 13, k = 7;  // n odd: no aux leading dimension cuBLASLt takes
  const core::Tensor x = Normal({m * k}, 71), w = Normal({n * k}, 72), b = Normal({n}, 73);
  auto run = [&](const core::Device& device) {
    GemmArgs g = LinearGemmOn(device, m, n, k, x, w, core::DType::kFloat32, GemmEpilogue::kBiasGelu,
                              b, core::Tensor::Zeros({m * n}));
    const absl::Status s = MatMul("fc", g);
    EXPECT_TRUE(s.ok()) << s;
    return g;
  };
  const GemmArgs cpu = run(core::Device::Cpu());
  const GemmArgs gpu = run(kGpu);
  EXPECT_LE(RelErr(Host(gpu.c.tensor), cpu.c.tensor.ToVector()), kFp32Rel);
  EXPECT_LE(RelErr(Host(gpu.aux), cpu.aux.ToVector()), kFp32Rel);
}

// NOTE [GEMM epilogues]: a weight-gradient GEMM dW += g^T x with a bias gradient, through
// cuBLASLt's BGRADB and through the fallback (the plain GEMM, then the column sums of g),
// with beta 1 onto a nonzero dW and bias_grad: against the CPU (fp32 summation order,
// kFp32Rel), and the same bits when repeated from the same state.
TEST(CudaGemmEpilogueTest, WeightGradientGemmsBiasGradientMatchesCpuAndRepeatsBitForBit) {
  SKIP_WITHOUT_GPU();
  struct Shape {
    int64_t rows, out, in;
  };
  for (const Shape& sh : {Shape{1000, 48, 64}, Shape{257, 37, 24}}) {
    const core::Tensor g = Normal({sh.rows * sh.out}, 81)
                               .ToDType(core::DType::kBFloat16, core::MemoryTag::kOther)
                               .value();
    const core::Tensor x = Normal({sh.rows * sh.in}, 82)
                               .ToDType(core::DType::kBFloat16, core::MemoryTag::kOther)
                               .value();
    const core::Tensor c0 = Normal({sh.out * sh.in}, 83), sums0 = Normal({sh.out}, 84);
    auto run = [&](const core::Device& device) {
      GemmArgs a = WeightGradientGemmOn(device, sh.rows, sh.out, sh.in, g, x, c0, sums0);
      const absl::Status s = MatMul("blocks.0.attn.qkv (Linear)", a);
      EXPECT_TRUE(s.ok()) << s;
      return a;
    };
    const GemmArgs cpu = run(core::Device::Cpu());
    for (bool fallback : {false, true}) {
      SCOPED_TRACE(
          absl::StrCat(sh.rows, " x ", sh.out, " x ", sh.in, fallback ? " fallback" : " cuBLASLt"));
      ForcedGemmFallback forced(fallback);
      const GemmArgs gpu = run(kGpu), again = run(kGpu);
      EXPECT_LE(RelErr(Host(gpu.c.tensor), cpu.c.tensor.ToVector()), kFp32Rel);
      EXPECT_LE(RelErr(Host(gpu.bias_grad), cpu.bias_grad.ToVector()), kFp32Rel);
      EXPECT_EQ(Host(again.c.tensor), Host(gpu.c.tensor));
      EXPECT_EQ(Host(again.bias_grad), Host(gpu.bias_grad));
    }
  }
}

// NOTE [GEMM epilogues]: the epilogues a bf16 GPT's Linears ask for, at GPT-2's widths over
// 1,024 tokens: qkv's bias into bf16, fc's bias + GELU into bf16 with its bf16
// pre-activation, fc's GELU gradient into bf16, and the projections' bias + residual into
// the fp32 residual stream with the bf16 bias of the gathered parameters (widened by
// MatMul, as cuBLASLt wants D's type). Asserted, what the library controls: each result
// matches the CPU (the tolerances of EachEpilogueMatchesTheCpuOnCublasLtAndOnTheFallbackKernel),
// a second call of the cached problem writes the first's bits, and the library hands each
// problem to cuBLASLt: where the fallback kernel runs instead, GemmTuningReport's line for
// the problem says cuBLASLt offered no algorithm or refused the one it offered, never that
// the library passed cuBLASLt by (operands, alignment and leading dimensions qualify here).
// Which path ran and what the tuner chose are reported, not asserted: another GPU or
// cuBLASLt version may answer otherwise.
TEST(CudaGemmEpilogueTest, TheBf16GptsEpiloguesGoToCublasLtAtGpt2Widths) {
  SKIP_WITHOUT_GPU();
  struct Case {
    const char* what;
    GemmEpilogue epilogue;
    core::DType c_dtype;
    int64_t n, k;
    bool trans_b;  // x W^T (forward) or g W (input gradient)
  };
  const int64_t m = 1024;
  const auto bf16 = [](const core::Tensor& t) {
    return t.ToDType(core::DType::kBFloat16, core::MemoryTag::kOther).value();
  };
  const auto wide = [](const core::Tensor& t) {
    return Host(t.ToDType(core::DType::kFloat32, core::MemoryTag::kOther).value());
  };
  for (const Case& c :
       {Case{"attn.qkv", GemmEpilogue::kBias, core::DType::kBFloat16, 2304, 768, true},
        Case{"mlp.fc", GemmEpilogue::kBiasGelu, core::DType::kBFloat16, 3072, 768, true},
        Case{"mlp.proj dx", GemmEpilogue::kDGelu, core::DType::kBFloat16, 3072, 768, false},
        Case{"attn.proj", GemmEpilogue::kBiasResidual, core::DType::kFloat32, 768, 768, true},
        Case{"mlp.proj", GemmEpilogue::kBiasResidual, core::DType::kFloat32, 768, 3072, true}}) {
    SCOPED_TRACE(c.what);
    const bool has_bias = c.epilogue != GemmEpilogue::kDGelu;
    const bool has_aux = c.epilogue != GemmEpilogue::kBias;
    const core::Tensor x = bf16(Normal({m * c.k}, 91)), w = bf16(Normal({c.n * c.k}, 92));
    const core::Tensor aux =
        Normal({m * c.n}, 93).ToDType(c.c_dtype, core::MemoryTag::kOther).value();
    const core::Tensor bias = has_bias ? bf16(Normal({c.n}, 94)) : core::Tensor();
    auto run = [&](const core::Device& device) {
      GemmArgs g = LinearGemmOn(device, m, c.n, c.k, x, w, c.c_dtype, c.epilogue, bias,
                                has_aux ? aux : core::Tensor());
      g.trans_b = c.trans_b;
      const absl::Status s = MatMul(c.what, g);
      EXPECT_TRUE(s.ok()) << s;
      return g;
    };
    const GemmArgs cpu = run(core::Device::Cpu());
    GemmChoices choices;
    const GemmArgs gpu = run(kGpu), again = run(kGpu);
    const bool gelu = c.epilogue == GemmEpilogue::kBiasGelu || c.epilogue == GemmEpilogue::kDGelu;
    const bool c16 = c.c_dtype == core::DType::kBFloat16;
    EXPECT_LE(RelErr(wide(gpu.c.tensor), wide(cpu.c.tensor)),
              c16 ? kBf16Unit : (gelu ? 1e-4 : kFp32Rel));
    if (c.epilogue == GemmEpilogue::kBiasGelu) {
      EXPECT_LE(RelErr(wide(gpu.aux), wide(cpu.aux)), kBf16Unit);
    }
    const auto same_bits = [&](const core::Tensor& a, const core::Tensor& b) {
      const std::vector<float> va = wide(a), vb = wide(b);
      return va.size() == vb.size() &&
             std::memcmp(va.data(), vb.data(), va.size() * sizeof(float)) == 0;
    };
    EXPECT_TRUE(same_bits(again.c.tensor, gpu.c.tensor)) << "the second call wrote other bits";
    const std::vector<std::string> lines = choices.Lines(c.what);
    if (choices.Fallbacks() > 0) {
      const bool cublaslt_declined = std::any_of(lines.begin(), lines.end(), [](const auto& l) {
        return absl::StrContains(l, "no cuBLASLt algorithm") || absl::StrContains(l, "refused");
      });
      EXPECT_TRUE(cublaslt_declined)
          << "the fallback ran " << choices.Fallbacks()
          << " times without cuBLASLt declining the problem; its report lines: "
          << absl::StrJoin(lines, " | ");
    }
    GemmChoices::Report(c.what, "path", choices.Fallbacks() > 0 ? "fallback" : "cuBLASLt");
    GemmChoices::Report(c.what, "tuning", absl::StrJoin(lines, " | "));
  }
}

// The tuner's check (kernels::cuda::Fingerprint): the same bytes give the same fingerprint
// on every run, one flipped bit or two swapped words another, and the nonzero words are
// counted; an odd length or address is refused.
TEST(CudaGemmEpilogueTest, FingerprintTellsAFlippedBitAndSwappedWords) {
  SKIP_WITHOUT_GPU();
#ifdef FSDP_WITH_CUDA
  const int64_t n = 100003;
  const core::Tensor host = Normal({n}, 121);
  host.data<float>()[7] = 0.0f;  // two zero words
  const core::Device cpu = core::Device::Cpu();
  auto fingerprint = [&](const core::Tensor& values) {
    const core::Tensor t = To(values, kGpu);
    const core::Tensor out = To(core::Tensor::Zeros({4}, core::DType::kInt32), kGpu);
    EXPECT_EQ(kernels::cuda::Fingerprint(t.raw_data(), 4 * n,
                                         static_cast<unsigned long long*>(out.raw_data())),
              cudaSuccess);
    const core::Tensor back = To(out, cpu);
    std::array<uint64_t, 2> v;
    std::memcpy(v.data(), back.raw_data(), sizeof(v));
    return v;
  };
  const auto base = fingerprint(host);
  EXPECT_EQ(fingerprint(host), base);
  uint64_t nonzero = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, host.data<float>() + i, 4);
    nonzero += (bits & 0xffffu) != 0;
    nonzero += (bits >> 16) != 0;
  }
  EXPECT_EQ(base[1], nonzero);
  const core::Tensor flipped = To(host, cpu);
  uint32_t bits;
  std::memcpy(&bits, flipped.data<float>() + n - 1, 4);
  bits ^= 1u << 20;
  std::memcpy(flipped.data<float>() + n - 1, &bits, 4);
  EXPECT_NE(fingerprint(flipped)[0], base[0]);
  const core::Tensor swapped = To(host, cpu);
  std::swap(swapped.data<float>()[10], swapped.data<float>()[11]);
  EXPECT_NE(fingerprint(swapped)[0], base[0]);
  const core::Tensor t = To(host, kGpu);
  const core::Tensor out = To(core::Tensor::Zeros({4}, core::DType::kInt32), kGpu);
  auto* fp = static_cast<unsigned long long*>(out.raw_data());
  EXPECT_EQ(kernels::cuda::Fingerprint(t.raw_data(), 3, fp), cudaErrorInvalidValue);
  EXPECT_EQ(kernels::cuda::Fingerprint(static_cast<const char*>(t.raw_data()) + 1, 2, fp),
            cudaErrorInvalidValue);
#endif
}

// NOTE [GEMM tuning] (nn/cuda/gemm.h): a tuned problem writes the bits of cuBLASLt's first
// answer, on its tuning call (which runs the candidates on the real outputs, or on a copy
// of C when beta is 1) and on later calls with other operands; with a bias + GELU (its
// aux), a bias gradient (beta 1 onto a nonzero dW) and a bias + residual. Shapes no other
// test uses, so the first tuned call here is the problem's first; each has a report line
// (problems built untuned have none; printed for the bundle's log).
TEST(CudaGemmEpilogueTest, TunedGemmsWriteTheFirstAnswersBitsAndRepeatThem) {
  SKIP_WITHOUT_GPU();
#ifdef FSDP_WITH_CUDA
  const int64_t rows = 1536, in = 640, out = 1280;
  const auto bf16 = [](const core::Tensor& t) {
    return t.ToDType(core::DType::kBFloat16, core::MemoryTag::kOther).value();
  };
  // The operands of one call, drawn from `seed`.
  struct Operands {
    core::Tensor x, w, bias, residual, g, dw0, db0;
  };
  const auto operands = [&](uint64_t seed) {
    return Operands{bf16(Normal({rows * in}, seed)),
                    bf16(Normal({out * in}, seed + 1)),
                    bf16(Normal({out}, seed + 2)),
                    Normal({rows * out}, seed + 3),
                    bf16(Normal({rows * out}, seed + 4)),
                    Normal({out * in}, seed + 5),
                    Normal({out}, seed + 6)};
  };
  struct Case {
    const char* what;
    std::function<GemmArgs(const Operands&)> args;
  };
  const std::vector<Case> cases = {
      {"tuned plain",
       [&](const Operands& o) {
         return LinearGemmOn(kGpu, rows, out, in, o.x, o.w, core::DType::kFloat32,
                             GemmEpilogue::kNone, core::Tensor(), core::Tensor());
       }},
      {"tuned bias + GELU",
       [&](const Operands& o) {
         return LinearGemmOn(kGpu, rows, out, in, o.x, o.w, core::DType::kBFloat16,
                             GemmEpilogue::kBiasGelu, o.bias,
                             core::Tensor::Zeros({rows * out}, core::DType::kBFloat16));
       }},
      {"tuned bias + residual",
       [&](const Operands& o) {
         return LinearGemmOn(kGpu, rows, out, in, o.x, o.w, core::DType::kFloat32,
                             GemmEpilogue::kBiasResidual, o.bias, o.residual);
       }},
      {"tuned weight gradient",
       [&](const Operands& o) {
         return WeightGradientGemmOn(kGpu, rows, out, in, o.g, o.x, o.dw0, o.db0);
       }},
  };
  const bool was_on = cuda::GemmTuning();
  const size_t lines_before = cuda::GemmTuningReport().size();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    auto results = [&](bool tune, const Operands& o) {
      cuda::SetGemmTuning(tune);
      GemmArgs a = c.args(o);
      const absl::Status s = MatMul(c.what, a);
      cuda::SetGemmTuning(was_on);
      EXPECT_TRUE(s.ok()) << s;
      std::vector<std::vector<float>> r = {
          Host(a.c.tensor.ToDType(core::DType::kFloat32, core::MemoryTag::kOther).value())};
      if (a.epilogue == GemmEpilogue::kBiasGelu) {
        r.push_back(Host(a.aux.ToDType(core::DType::kFloat32, core::MemoryTag::kOther).value()));
      }
      if (a.bias_grad.defined()) r.push_back(Host(a.bias_grad));
      return r;
    };
    const Operands first = operands(111), second = operands(211);
    const auto untuned = results(false, first);
    EXPECT_EQ(results(true, first), untuned);  // the tuning call
    EXPECT_EQ(results(true, second), results(false, second));
  }
  const std::vector<std::string> report = cuda::GemmTuningReport();
  for (const Case& c : cases) {
    const auto tuned_line = [&](const std::string& line) { return absl::StartsWith(line, c.what); };
    EXPECT_TRUE(std::any_of(report.begin() + lines_before, report.end(), tuned_line))
        << c.what << " has no tuning report";
  }
  for (size_t i = lines_before; i < report.size(); ++i) std::printf("%s\n", report[i].c_str());
#endif
}

// ---- Layers, fp32.

TEST(CudaLayersTest, LinearMatchesCpu) {
  SKIP_WITHOUT_GPU();
  Linear cpu(45, 23, true, 7), gpu(45, 23, true, 7);
  CompareModules(cpu, gpu, Normal({3, 5, 45}, 8), kFp32Rel);
}

TEST(CudaLayersTest, LayerNormMatchesCpu) {
  SKIP_WITHOUT_GPU();
  LayerNorm cpu(67), gpu(67);
  // Non-trivial affine parameters.
  for (LayerNorm* ln : {&cpu, &gpu}) {
    core::Rng rng(5);
    FillNormal(ln->weight()->data, 1.0f, 0.5f, &rng);
    FillNormal(ln->bias()->data, 0.0f, 0.5f, &rng);
  }
  CompareModules(cpu, gpu, Normal({4, 9, 67}, 9, 2.0f), kFp32Rel);
}

TEST(CudaLayersTest, GeluAndReluMatchCpu) {
  SKIP_WITHOUT_GPU();
  GELU gc, gg;
  CompareModules(gc, gg, Normal({1000}, 10, 3.0f), kFp32Rel);
  ReLU rc, rg;
  CompareModules(rc, rg, Normal({7, 11}, 11), kFp32Rel);
}

TEST(CudaLayersTest, EmbeddingMatchesCpuWithRepeatedIds) {
  SKIP_WITHOUT_GPU();
  Embedding cpu(13, 37, 3), gpu(13, 37, 3);
  // 60 ids over 13 rows: rows repeat, so the scatter-add accumulates.
  CompareModules(cpu, gpu, Ids({4, 15}, 13, 12), kFp32Rel);
}

// The embedding gradient sums each id's rows in position order on both devices (the ids
// sorted stably on CUDA, no atomics): the same bits as the CPU's loop, on every run, with
// ids repeated hundreds of times, ids outside the table skipped, and a gradient that
// already holds values (accumulation).
TEST(CudaLayersTest, EmbeddingGradientHasTheCpuBitsWithRepeatedIds) {
  SKIP_WITHOUT_GPU();
  const int64_t num = 50, dim = 67, n = 3000;
  core::Tensor ids = Ids({n}, num, 71);
  ids.data<int32_t>()[5] = -1;
  ids.data<int32_t>()[17] = static_cast<int32_t>(num);
  const core::Tensor g = Normal({n, dim}, 72);
  const core::Tensor start = Normal({num, dim}, 73);
  std::vector<std::vector<float>> results;
  for (const core::Device device : {core::Device::Cpu(), kGpu, kGpu}) {
    const core::Tensor gw = To(start, device);
    ASSERT_TRUE(EmbeddingBackward("wte", To(ids, device), To(g, device), gw).ok());
    results.push_back(Host(gw));
  }
  EXPECT_EQ(results[1], results[0]);  // the CPU's bits
  EXPECT_EQ(results[2], results[1]);  // run to run
  EXPECT_NE(results[0], Host(start));
}

TEST(CudaLayersTest, CausalSelfAttentionMatchesCpu) {
  SKIP_WITHOUT_GPU();
  CausalSelfAttention cpu(24, 4, 5), gpu(24, 4, 5);
  CompareModules(cpu, gpu, Normal({3, 37, 24}, 13), kFp32Rel);
}

TEST(CudaLayersTest, TransformerBlockMatchesCpu) {
  SKIP_WITHOUT_GPU();
  TransformerBlock cpu(32, 4, 6), gpu(32, 4, 6);
  CompareModules(cpu, gpu, Normal({2, 19, 32}, 14), kFp32Rel);
}

TEST(CudaLayersTest, GptWithCrossEntropyMatchesCpu) {
  SKIP_WITHOUT_GPU();
  GptConfig config;
  config.vocab_size = 61;
  config.block_size = 24;
  config.n_embd = 32;
  config.n_layer = 2;
  config.n_head = 4;
  config.seed = 9;
  std::shared_ptr<Gpt> cpu = Gpt::Create(config).value();
  std::shared_ptr<Gpt> gpu = Gpt::Create(config).value();
  ASSERT_TRUE(ToDevice(*gpu, kGpu).ok());
  const core::Tensor tokens = Ids({3, 24}, 61, 15), targets = Ids({3, 24}, 61, 16);
  absl::StatusOr<core::Tensor> y_cpu = cpu->Forward(tokens);
  absl::StatusOr<core::Tensor> y_gpu = gpu->Forward(tokens);  // CPU tokens, CUDA model
  ASSERT_TRUE(y_cpu.ok()) << y_cpu.status();
  ASSERT_TRUE(y_gpu.ok()) << y_gpu.status();
  EXPECT_LE(RelErr(Host(*y_gpu), y_cpu->ToVector()), kFp32Rel);
  absl::StatusOr<LossResult> l_cpu = CrossEntropyLoss(*y_cpu, targets);
  absl::StatusOr<LossResult> l_gpu = CrossEntropyLoss(*y_gpu, To(targets, kGpu));
  ASSERT_TRUE(l_cpu.ok()) << l_cpu.status();
  ASSERT_TRUE(l_gpu.ok()) << l_gpu.status();
  EXPECT_NEAR(l_gpu->loss, l_cpu->loss, kFp32Rel * std::abs(l_cpu->loss));
  EXPECT_TRUE(l_gpu->grad.device() == kGpu);
  EXPECT_LE(RelErr(Host(l_gpu->grad), l_cpu->grad.ToVector()), kFp32Rel);
  ASSERT_TRUE(cpu->Backward(l_cpu->grad).ok());
  ASSERT_TRUE(gpu->Backward(l_gpu->grad).ok());
  const auto pc = cpu->NamedParameters();
  const auto pg = gpu->NamedParameters();
  for (size_t i = 0; i < pc.size(); ++i) {
    EXPECT_LE(RelErr(Host(pg[i].second->grad), pc[i].second->grad.ToVector()), kFp32Rel)
        << pc[i].first;
  }
}

// NOTE [Activation checkpointing] (core/module.h) on the device: every block's
// activations dropped after the forward and recomputed in the backward give the plain
// model's loss gradient and parameter gradients bit for bit, and hold fewer activation
// bytes after the forward.
TEST(CudaLayersTest, CheckpointedBlocksGiveThePlainGptsGradientsBitForBit) {
  SKIP_WITHOUT_GPU();
  GptConfig config;
  config.vocab_size = 61;
  config.block_size = 24;
  config.n_embd = 64;
  config.n_layer = 3;
  config.n_head = 4;
  config.seed = 11;
  std::shared_ptr<Gpt> plain = Gpt::Create(config).value();
  std::shared_ptr<Gpt> checkpointed = Gpt::Create(config).value();
  ASSERT_TRUE(ToDevice(*plain, kGpu).ok());
  ASSERT_TRUE(ToDevice(*checkpointed, kGpu).ok());
  for (const auto& block : checkpointed->blocks()->modules())
    block->set_checkpoint_activations(true);
  const core::Tensor tokens = Ids({3, 24}, 61, 21), targets = To(Ids({3, 24}, 61, 22), kGpu);
  const LossGradients want = LanguageModelGradients(*plain, tokens, targets);
  const LossGradients got = LanguageModelGradients(*checkpointed, tokens, targets);
  EXPECT_EQ(got.grads, want.grads);
  EXPECT_LT(got.activation_bytes_after_forward, want.activation_bytes_after_forward);
}

TEST(CudaLayersTest, MismatchedDevicesAreInvalidArgumentNamingBoth) {
  SKIP_WITHOUT_GPU();
  Linear fc(4, 3);
  ASSERT_TRUE(ToDevice(fc, kGpu).ok());
  absl::StatusOr<core::Tensor> y = fc.Forward(Normal({2, 4}, 1));  // CPU input
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(y.status().message()).find("cuda:0"), std::string::npos);
  EXPECT_NE(std::string(y.status().message()).find("cpu"), std::string::npos);
}

// ---- bf16 weights.

// Linear with bf16 weights on CUDA against the CPU layer with the same bf16 weights:
// every element within u * (|x| |W|^T) (forward) and u * (|g| |W|) (input gradient) plus
// fp32 slack; the weight gradient is an fp32 GEMM (1e-5).
TEST(CudaLayersTest, LinearWithBf16WeightsWithinTheDerivedRoundingBound) {
  SKIP_WITHOUT_GPU();
  const int64_t R = 40, in = 96, out = 48;
  Linear cpu(in, out, true, 21), gpu(in, out, true, 21);
  ASSERT_TRUE(ConvertParameters(cpu, core::DType::kBFloat16).ok());
  ASSERT_TRUE(ConvertParameters(gpu, core::DType::kBFloat16).ok());
  ASSERT_TRUE(ToDevice(gpu, kGpu).ok());
  const core::Tensor x = Normal({R, in}, 22);
  absl::StatusOr<core::Tensor> y_cpu = cpu.Forward(x);
  absl::StatusOr<core::Tensor> y_gpu = gpu.Forward(To(x, kGpu));
  ASSERT_TRUE(y_cpu.ok() && y_gpu.ok()) << y_gpu.status();
  const std::vector<float> w = cpu.weight()->data.ToVector();  // [out, in], widened
  const std::vector<float> xs = x.ToVector(), yc = y_cpu->ToVector(), yg = Host(*y_gpu);
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      double mag = 0;
      for (int64_t i = 0; i < in; ++i) mag += std::abs(xs[r * in + i] * w[o * in + i]);
      const double bound = kBf16Unit * mag + 1e-5 * (mag + std::abs(yc[r * out + o]));
      ASSERT_LE(std::abs(yg[r * out + o] - yc[r * out + o]), bound) << r << ", " << o;
    }
  }
  const core::Tensor g = Normal({R, out}, 23);
  absl::StatusOr<core::Tensor> gx_cpu = cpu.Backward(g);
  absl::StatusOr<core::Tensor> gx_gpu = gpu.Backward(To(g, kGpu));
  ASSERT_TRUE(gx_cpu.ok() && gx_gpu.ok()) << gx_gpu.status();
  const std::vector<float> gs = g.ToVector(), gc = gx_cpu->ToVector(), gg = Host(*gx_gpu);
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t i = 0; i < in; ++i) {
      double mag = 0;
      for (int64_t o = 0; o < out; ++o) mag += std::abs(gs[r * out + o] * w[o * in + i]);
      const double bound = kBf16Unit * mag + 1e-5 * (mag + std::abs(gc[r * in + i]));
      ASSERT_LE(std::abs(gg[r * in + i] - gc[r * in + i]), bound) << r << ", " << i;
    }
  }
  EXPECT_EQ(gpu.weight()->grad.dtype(), core::DType::kFloat32);
  EXPECT_LE(RelErr(Host(gpu.weight()->grad), cpu.weight()->grad.ToVector()), kFp32Rel);
  EXPECT_LE(RelErr(Host(gpu.bias()->grad), cpu.bias()->grad.ToVector()), kFp32Rel);
}

// NOTE [bf16 attention]: q, k, v, the probabilities, the heads' gradient and the score
// gradient are rounded on both devices; where summation order moves one of them across a
// rounding boundary it differs by one bf16 step (u relative), and the outputs and
// gradients through the four rounded GEMM chains stay within 4 u normwise.
TEST(CudaLayersTest, Bf16CausalSelfAttentionWithinTheRoundingBound) {
  SKIP_WITHOUT_GPU();
  CausalSelfAttention cpu(24, 4, 5), gpu(24, 4, 5);
  ASSERT_TRUE(ConvertParameters(cpu, core::DType::kBFloat16).ok());
  ASSERT_TRUE(ConvertParameters(gpu, core::DType::kBFloat16).ok());
  CompareModules(cpu, gpu, Normal({3, 37, 24}, 13), 4 * kBf16Unit);
}

// NOTE [Fused attention]: at head widths 64 and 128 the bf16 layer on CUDA runs the fused
// kernels. Against the unfused path on the CPU with the same bf16 weights (the reference
// semantics): every output and gradient within 4 u normwise, as the unfused CUDA path is
// above, with T = 200 so that the last tile is partial. The op profile shows the fused ops
// ran (and no T x T softmax), and a second backward from the same forward state gives the
// same bits (no atomics).
TEST(CudaLayersTest, FusedBf16AttentionMatchesTheUnfusedPathAndRepeatsBitForBit) {
  SKIP_WITHOUT_GPU();
  for (const int64_t hd : {64, 128}) {
    SCOPED_TRACE(absl::StrCat("head width ", hd));
    const int64_t H = 2, C = H * hd, B = 2, T = 200;
    CausalSelfAttention cpu(C, H, 7), gpu(C, H, 7);
    cpu.set_fused(false);
    ASSERT_TRUE(ConvertParameters(cpu, core::DType::kBFloat16).ok());
    ASSERT_TRUE(ConvertParameters(gpu, core::DType::kBFloat16).ok());
    CompareModules(cpu, gpu, Normal({B, T, C}, 31), 4 * kBf16Unit);

    // The GPU module alone, twice from the same state, profiled.
    core::OpProfile profile;
    std::vector<std::vector<float>> runs;
    for (int run = 0; run < 2; ++run) {
      core::ScopedOpProfile on(&profile);
      gpu.ZeroGrad();
      absl::StatusOr<core::Tensor> y = gpu.Forward(To(Normal({B, T, C}, 32), kGpu));
      ASSERT_TRUE(y.ok()) << y.status();
      absl::StatusOr<core::Tensor> gx = gpu.Backward(To(Normal({B, T, C}, 33), kGpu));
      ASSERT_TRUE(gx.ok()) << gx.status();
      std::vector<float> bits = Host(*gx);
      const std::vector<float> gw = Host(gpu.qkv()->weight()->grad);
      bits.insert(bits.end(), gw.begin(), gw.end());
      runs.push_back(std::move(bits));
    }
    EXPECT_EQ(runs[0], runs[1]);
    int fused_forward = 0, fused_backward = 0, softmax = 0;
    for (const core::OpRecord& r : profile.records()) {
      fused_forward += r.name == "fused_attention.forward";
      fused_backward += r.name == "fused_attention.backward";
      softmax += absl::StartsWith(r.name, "causal_softmax");
    }
    EXPECT_EQ(fused_forward, 2);
    EXPECT_EQ(fused_backward, 2);
    EXPECT_EQ(softmax, 0);
  }
}

// The fused kernels store y and dL/dqkv in fp32 or bf16 and read y in either: each
// combination against the CPU twin's result of the same dtypes within 4 u normwise (the
// kernels' sums run in another order; a bf16 store is one rounding of that fp32 value),
// at head widths 64 and 128 and sequence lengths below, at and between whole 64-row tiles
// (192: the upper half of a 128-row block starts at T).
TEST(CudaLayersTest, FusedAttentionOutputsInFp32AndBf16MatchTheCpuTwin) {
  SKIP_WITHOUT_GPU();
  struct Size {
    int64_t T, hd;
  };
  for (const Size size : {Size{130, 64}, Size{37, 64}, Size{64, 64}, Size{192, 128}}) {
    const int64_t B = 2, T = size.T, H = 2, hd = size.hd, C = H * hd;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const auto bf16 = [](const core::Tensor& t) {
      return t.ToDType(core::DType::kBFloat16, core::MemoryTag::kOther).value();
    };
    const core::Tensor qkv = bf16(Normal({B, T, 3 * C}, 41));
    const core::Tensor gy = bf16(Normal({B, T, C}, 42));
    for (const core::DType dtype : {core::DType::kFloat32, core::DType::kBFloat16}) {
      SCOPED_TRACE(absl::StrCat("T ", T, ", head width ", hd, ", ", core::DTypeName(dtype)));
      std::vector<std::vector<float>> results[2];  // y, dL/dqkv on the CPU, then on the GPU
      for (const core::Device device : {core::Device::Cpu(), kGpu}) {
        const auto zeros = [&](const core::Shape& shape, core::DType dt) {
          return To(core::Tensor::Zeros(shape, dt), device);
        };
        const core::Tensor q = To(qkv, device), g = To(gy, device);
        core::Tensor y = zeros({B, T, C}, dtype), lse = zeros({B, H, T}, core::DType::kFloat32);
        core::Tensor delta = zeros({B, H, T}, core::DType::kFloat32);
        core::Tensor gqkv = zeros({B, T, 3 * C}, dtype);
        ASSERT_TRUE(FusedAttentionForward("attn", q, H, scale, y, lse).ok());
        ASSERT_TRUE(FusedAttentionBackward("attn", q, y, g, lse, delta, H, scale, gqkv).ok());
        results[device.is_cuda()] = {Host(y), Host(gqkv)};
      }
      EXPECT_LE(RelErr(results[1][0], results[0][0]), 4 * kBf16Unit);
      EXPECT_LE(RelErr(results[1][1], results[0][1]), 4 * kBf16Unit);
    }
  }
}

#ifdef FSDP_WITH_CUDA
// NOTE [Flash block shapes]: the tuning report of a problem size after unpinned calls with
// bf16 outputs (out_bf16) or after those and fp32 ones: tuned, it names each kernel's
// candidates and one chosen shape a kernel for each output dtype called, none of which wrote
// other bits than shape 0; with a switch in force, it says which and chose nothing.
void ExpectFlashTuningReport(const std::string& report, bool out_bf16) {
  for (const char* kernel : {"forward:", "dK/dV:", "dQ:"}) {
    EXPECT_NE(report.find(kernel), std::string::npos) << report;
  }
  const absl::StatusOr<kernels::FlashShapePolicy>& policy =
      kernels::FlashShapePolicyFromEnvironment();
  ASSERT_TRUE(policy.ok()) << policy.status();
  int chosen = 0;
  for (size_t at = report.find("(chosen)"); at != std::string::npos;
       at = report.find("(chosen)", at + 1)) {
    ++chosen;
  }
  if (policy->mode == kernels::FlashShapeMode::kTuned) {
    // One forward choice for this output dtype, one of each backward kernel (earlier
    // dtypes of this size add theirs).
    EXPECT_EQ(chosen, out_bf16 ? 3 : 6) << report;
    EXPECT_EQ(report.find("differs"), std::string::npos) << report;
  } else {
    EXPECT_TRUE(absl::StartsWith(report, "tuning off (" + policy->switch_text + "):")) << report;
    EXPECT_EQ(chosen, 0) << report;
  }
}
#endif

// NOTE [Flash block shapes] in kernels/cuda/flash_attention.h: every block shape of the
// forward, dK/dV and dQ kernels writes the same bits as shape 0 (whose results the tests
// above compare with the CPU), at sizes where the last tile is partial and where whole
// warps of a 128-row block are past T. Unpinned, the first call tunes (its report names
// one chosen shape a kernel) and leaves the same bits, and so does the next call; with
// FSDP_ATTENTION_SHAPES=reference or FSDP_ATTENTION_TUNING=0 in the environment, both run
// shape 0 untuned and the report says which switch is in force.
TEST(CudaLayersTest, FusedAttentionBlockShapesWriteTheSameBits) {
  SKIP_WITHOUT_GPU();
#ifdef FSDP_WITH_CUDA
  namespace kc = kernels::cuda;
  for (const int64_t hd : {64, 128}) {
    for (const int64_t T : {37, 64, 130, 192, 200, 256}) {
      for (const core::DType dtype : {core::DType::kBFloat16, core::DType::kFloat32}) {
        SCOPED_TRACE(absl::StrCat("head width ", hd, ", T ", T, ", ", core::DTypeName(dtype)));
        const int64_t B = 2, H = 3, C = H * hd;
        const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
        const bool out_bf16 = dtype == core::DType::kBFloat16;
        const auto bf16 = [](const core::Tensor& t) {
          return To(t.ToDType(core::DType::kBFloat16, core::MemoryTag::kOther).value(), kGpu);
        };
        const auto zeros = [](const core::Shape& shape, core::DType dt) {
          return To(core::Tensor::Zeros(shape, dt), kGpu);
        };
        const core::Tensor qkv = bf16(Normal({B, T, 3 * C}, 51 + T));
        const core::Tensor gy = bf16(Normal({B, T, C}, 52 + T));
        core::Tensor y = zeros({B, T, C}, dtype), lse = zeros({B, H, T}, core::DType::kFloat32);
        core::Tensor delta = zeros({B, H, T}, core::DType::kFloat32);
        core::Tensor gqkv = zeros({B, T, 3 * C}, dtype);
        const auto* q16 = static_cast<const uint16_t*>(qkv.raw_data());
        const auto* g16 = static_cast<const uint16_t*>(gy.raw_data());
        const auto forward = [&](const kc::FlashShapes& shapes) {
          EXPECT_EQ(kc::FlashAttentionForward(q16, y.raw_data(), out_bf16,
                                              static_cast<float*>(lse.raw_data()), B, T, H, hd,
                                              scale, shapes),
                    cudaSuccess);
          std::vector<float> out = Host(y);
          const std::vector<float> l = Host(lse);
          out.insert(out.end(), l.begin(), l.end());
          return out;
        };
        const auto backward = [&](const kc::FlashShapes& shapes) {
          EXPECT_EQ(kc::FlashAttentionBackward(
                        q16, y.raw_data(), out_bf16, g16, static_cast<const float*>(lse.raw_data()),
                        static_cast<float*>(delta.raw_data()), gqkv.raw_data(), out_bf16, B, T, H,
                        hd, scale, shapes),
                    cudaSuccess);
          return Host(gqkv);
        };
        const auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
          return a.size() == b.size() &&
                 std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
        };
        const std::vector<float> y0 = forward({0, 0, 0});
        const std::vector<float> g0 = backward({0, 0, 0});
        const int forward_shapes = kc::FlashShapeCount(kc::FlashKernel::kForward, hd);
        const int kv_shapes = kc::FlashShapeCount(kc::FlashKernel::kBackwardKV, hd);
        const int q_shapes = kc::FlashShapeCount(kc::FlashKernel::kBackwardQ, hd);
        ASSERT_GE(forward_shapes, 2);
        ASSERT_GE(kv_shapes, 2);
        ASSERT_GE(q_shapes, 2);
        for (int i = 1; i < forward_shapes; ++i) {
          EXPECT_TRUE(same_bits(forward({i, 0, 0}), y0))
              << kc::FlashShapeName(kc::FlashKernel::kForward, hd, i);
        }
        // The backward reads y and lse, which every forward shape wrote the same.
        for (int i = 1; i < kv_shapes; ++i) {
          EXPECT_TRUE(same_bits(backward({0, i, 0}), g0))
              << kc::FlashShapeName(kc::FlashKernel::kBackwardKV, hd, i);
        }
        for (int i = 1; i < q_shapes; ++i) {
          EXPECT_TRUE(same_bits(backward({0, 0, i}), g0))
              << kc::FlashShapeName(kc::FlashKernel::kBackwardQ, hd, i);
        }
        // Tuned: the first call tunes, the second runs the choice.
        for (int call = 0; call < 2; ++call) {
          EXPECT_TRUE(same_bits(forward({}), y0)) << "call " << call;
          EXPECT_TRUE(same_bits(backward({}), g0)) << "call " << call;
        }
        ExpectFlashTuningReport(kc::FlashTuningReport(B, T, H, hd), out_bf16);
        // A shape out of range is refused.
        EXPECT_EQ(kc::FlashAttentionForward(q16, y.raw_data(), out_bf16,
                                            static_cast<float*>(lse.raw_data()), B, T, H, hd, scale,
                                            {forward_shapes, 0, 0}),
                  cudaErrorInvalidValue);
      }
    }
  }
#endif
}

// The fused ops refuse what they cannot run, naming the tensor: fp32 q, k and v, a head
// width without a kernel, a mis-shaped output, an output not aligned for the kernel's stores.
TEST(CudaLayersTest, FusedAttentionRejectsUnsupportedInputsNamingThem) {
  SKIP_WITHOUT_GPU();
  const auto dev = [](const core::Shape& shape, core::DType dtype) {
    return core::Tensor::Empty(shape, dtype, core::MemoryTag::kOther, kGpu);
  };
  const core::Tensor y = dev({1, 8, 128}, core::DType::kFloat32);
  const core::Tensor lse = dev({1, 2, 8}, core::DType::kFloat32);
  absl::Status s =
      FusedAttentionForward("attn", dev({1, 8, 384}, core::DType::kFloat32), 2, 0.125f, y, lse);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("q, k and v"), std::string::npos) << s;
  s = FusedAttentionForward("attn", dev({1, 8, 384}, core::DType::kBFloat16), 4, 0.125f,
                            dev({1, 8, 128}, core::DType::kFloat32),
                            dev({1, 4, 8}, core::DType::kFloat32));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("head width 32"), std::string::npos) << s;
  s = FusedAttentionForward("attn", dev({1, 8, 384}, core::DType::kBFloat16), 2, 0.125f,
                            dev({1, 8, 64}, core::DType::kFloat32), lse);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("attention output"), std::string::npos) << s;
  // An output view one element into its storage: the kernel's two-element stores would fault.
  const core::Tensor shifted =
      dev({1 + 8 * 128}, core::DType::kFloat32).View(1, {1, 8, 128}).value();
  s = FusedAttentionForward("attn", dev({1, 8, 384}, core::DType::kBFloat16), 2, 0.125f, shifted,
                            lse);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("attention output 8-byte aligned"), std::string::npos) << s;
}

// The column sums split rows across blocks (kernels::ColumnSumChunks) and add the chunks
// in order: within fp32 summation error of the CPU's double sums, and the same bits on
// every run, for one chunk and for many.
TEST(CudaLayersTest, ColumnSumsSplitAcrossBlocksMatchCpuAndRepeatBitForBit) {
  SKIP_WITHOUT_GPU();
  for (const auto& [rows, cols] :
       std::vector<std::pair<int64_t, int64_t>>{{16384, 768}, {1000, 33}, {5, 7}}) {
    SCOPED_TRACE(absl::StrCat(rows, " x ", cols));
    const core::Tensor x = Normal({rows, cols}, 40), y = Normal({rows, cols}, 41);
    const core::Tensor start = Normal({cols}, 42);
    core::Tensor cpu = start.Clone(core::MemoryTag::kOther);
    ASSERT_TRUE(AccumulateColumnSums("test", x, y, cpu).ok());
    std::vector<float> first;
    for (int run = 0; run < 2; ++run) {
      core::Tensor gpu = To(start, kGpu);
      ASSERT_TRUE(AccumulateColumnSums("test", To(x, kGpu), To(y, kGpu), gpu).ok());
      const std::vector<float> got = Host(gpu);
      EXPECT_LE(RelErr(got, cpu.ToVector()), 1e-5 * std::sqrt(static_cast<double>(rows)));
      if (run == 0) {
        first = got;
      } else {
        EXPECT_EQ(got, first) << "run to run";
      }
    }
  }
}

// LayerNorm's backward with its weight and bias gradients in the same pass
// (kernels::LayerNormGradWarps; rows split over blocks by kernels::LayerNormGradChunks, the
// blocks' sums added in order; four columns a load where the rows are 16-byte aligned, four
// scalar loads where they are not, one column where cols % 4 != 0) and, for rows too wide
// for it, with the column sums' own kernels: the input gradient within fp32 order of the
// CPU's, the parameter gradients within fp32 summation error of it, the same bits on every
// run and at either alignment; each gradient only when asked for (none: the input
// gradient's kernel alone, rows in registers at 768 columns, bf16 copies of 772-column rows
// in scalar stores, and one column a lane at 42).
TEST(CudaLayersTest, LayerNormBackwardWithParameterGradientsMatchesCpuAndRepeatsBitForBit) {
  SKIP_WITHOUT_GPU();
  struct Case {
    int64_t rows, cols;
    bool residual, want_gw, want_gb, bf16_w;
  };
  for (const Case& c : std::vector<Case>{{16384, 768, true, true, true, false},
                                         {16384, 768, false, true, true, true},
                                         {5, 768, true, true, true, false},
                                         {1000, 1600, true, false, true, false},
                                         {999, 42, false, true, false, true},
                                         {64, 6200, true, true, true, false},
                                         {300, 768, false, false, false, false},
                                         {300, 772, true, false, false, false},
                                         {99, 42, true, false, false, true}}) {
    SCOPED_TRACE(absl::StrCat(c.rows, " x ", c.cols, c.residual ? " residual" : "",
                              c.want_gw ? " gw" : "", c.want_gb ? " gb" : "",
                              c.bf16_w ? " bf16 weight" : ""));
    const int64_t rows = c.rows, cols = c.cols;
    const core::Tensor g = Normal({rows, cols}, 60), x = Normal({rows, cols}, 61);
    const core::Tensor residual = Normal({rows, cols}, 62);
    const core::Tensor mean = Normal({rows}, 67), rstd = Normal({rows}, 63, 0.5f);
    core::Tensor w = Normal({cols}, 64);
    if (c.bf16_w) w = w.ToDType(core::DType::kBFloat16, core::MemoryTag::kOther).value();
    const core::Tensor gw0 = Normal({cols}, 65), gb0 = Normal({cols}, 66);
    struct Out {
      std::vector<float> gx, gw, gb, gx16;  // gx16: the bf16 copy with a residual, widened
    };
    // `shift`: g, x, residual and gx start one element into their buffers (4 bytes off
    // 16-byte alignment).
    auto run = [&](const core::Device& d, int64_t shift) {
      auto at = [&](const core::Tensor& t) {
        core::Tensor wide = To(core::Tensor::Zeros({rows * cols + shift}), d);
        core::Tensor view = wide.View(shift, {rows, cols}).value();
        EXPECT_TRUE(view.CopyFrom(To(t, d)).ok());
        return view;
      };
      core::Tensor gx = at(core::Tensor::Zeros({rows, cols}));
      core::Tensor gw = c.want_gw ? To(gw0, d) : core::Tensor();
      core::Tensor gb = c.want_gb ? To(gb0, d) : core::Tensor();
      core::Tensor gx16;
      if (c.residual) {
        core::Tensor wide16 =
            To(core::Tensor::Zeros({rows * cols + shift}, core::DType::kBFloat16), d);
        gx16 = wide16.View(shift, {rows, cols}).value();
      }
      const absl::Status s =
          c.residual ? LayerNormBackwardAdd("ln", at(g), at(x), To(mean, d), To(rstd, d), To(w, d),
                                            at(residual), gx, gw, gb, gx16)
                     : LayerNormBackward("ln", at(g), at(x), To(mean, d), To(rstd, d), To(w, d), gx,
                                         gw, gb);
      EXPECT_TRUE(s.ok()) << s;
      return Out{Host(gx), c.want_gw ? Host(gw) : std::vector<float>(),
                 c.want_gb ? Host(gb) : std::vector<float>(),
                 c.residual
                     ? Host(gx16.ToDType(core::DType::kFloat32, core::MemoryTag::kOther).value())
                     : std::vector<float>()};
    };
    const Out cpu = run(core::Device::Cpu(), 0);
    const Out first = run(kGpu, 0), second = run(kGpu, 0), shifted = run(kGpu, 1);
    const double sums_tol = 1e-5 * std::sqrt(static_cast<double>(rows));
    EXPECT_LE(RelErr(first.gx, cpu.gx), kFp32Rel);
    if (c.want_gw) {
      EXPECT_LE(RelErr(first.gw, cpu.gw), sums_tol);
    }
    if (c.want_gb) {
      EXPECT_LE(RelErr(first.gb, cpu.gb), sums_tol);
    }
    EXPECT_EQ(second.gx, first.gx) << "run to run";
    EXPECT_EQ(second.gw, first.gw) << "run to run";
    EXPECT_EQ(second.gb, first.gb) << "run to run";
    EXPECT_EQ(shifted.gx, first.gx) << "unaligned rows";
    EXPECT_EQ(shifted.gw, first.gw) << "unaligned rows";
    EXPECT_EQ(shifted.gb, first.gb) << "unaligned rows";
    if (c.residual) {
      // The bf16 copy written in the pass is the device's sum rounded once, at either
      // alignment (8-byte stores where the bf16 rows are 16-byte aligned).
      const core::Tensor rounded = core::Tensor::FromVector(first.gx, {rows * cols})
                                       .value()
                                       .ToDType(core::DType::kBFloat16, core::MemoryTag::kOther)
                                       .value();
      EXPECT_EQ(first.gx16,
                Host(rounded.ToDType(core::DType::kFloat32, core::MemoryTag::kOther).value()));
      EXPECT_EQ(shifted.gx16, first.gx16) << "unaligned rows";
    }
  }
}

// LayerNorm keeps its input and each row's mean and rstd; the backward makes xhat again as
// (x - mean) * rstd in float (kernels::LayerNormHat). With weight 1 and bias 0 the
// forward's fp32 output is its xhat (times 1 plus 0 is exact), so the device's output must
// be, bit for bit, that expression of the device's own stored statistics, as the host
// evaluates it: the statistics stored are the ones the forward used (also for the residual
// form, whose input is the stored sum).
TEST(CudaLayersTest, LayerNormsStoredStatisticsGiveTheForwardsXhatBitForBit) {
  SKIP_WITHOUT_GPU();
  for (const int64_t cols : {768, 772, 6200}) {
    const int64_t rows = 37, n = rows * cols;
    const core::Tensor x = Normal({n}, 91, 3.0f), x2 = Normal({n}, 92);
    const core::Tensor w = core::Tensor::FromVector(std::vector<float>(cols, 1.0f), {cols}).value();
    const core::Tensor b = core::Tensor::Zeros({cols});
    for (bool add : {false, true}) {
      SCOPED_TRACE(absl::StrCat(add ? "residual + LayerNorm" : "LayerNorm", ", ", cols));
      core::Tensor y = To(core::Tensor::Zeros({n}), kGpu), h = To(core::Tensor::Zeros({n}), kGpu);
      core::Tensor mean = To(core::Tensor::Zeros({rows}), kGpu);
      core::Tensor rstd = To(core::Tensor::Zeros({rows}), kGpu);
      const absl::Status s =
          add ? AddLayerNormForward("ln", To(x, kGpu), To(x2, kGpu), To(w, kGpu), To(b, kGpu),
                                    1e-5f, h, y, mean, rstd)
              : LayerNormForward("ln", To(x, kGpu), To(w, kGpu), To(b, kGpu), 1e-5f, y, mean, rstd);
      ASSERT_TRUE(s.ok()) << s;
      const std::vector<float> in = add ? Host(h) : x.ToVector(), out = Host(y);
      const std::vector<float> mu = Host(mean), rs = Host(rstd);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < cols; ++j) {
          const float hat = (in[r * cols + j] - mu[r]) * rs[r];
          const float want = hat * 1.0f + 0.0f;  // y = xhat * w + b, exact here
          ASSERT_EQ(std::memcmp(&want, &out[r * cols + j], sizeof(float)), 0)
              << "row " << r << " column " << j;
        }
      }
    }
  }
}

// A null mean selects RMSNorm only in the backward launchers (kernels/cuda/kernels.h); the
// forward ones refuse it, so a LayerNorm forward never drops its mean pass and bias unseen.
TEST(CudaLayersTest, LayerNormForwardLaunchersRefuseANullMean) {
  SKIP_WITHOUT_GPU();
#ifdef FSDP_WITH_CUDA
  const int64_t rows = 3, cols = 8, n = rows * cols;
  const core::Tensor x = To(Normal({n}, 93), kGpu), x2 = To(Normal({n}, 94), kGpu);
  const core::Tensor w = To(Normal({cols}, 95), kGpu), b = To(Normal({cols}, 96), kGpu);
  core::Tensor y = To(core::Tensor::Zeros({n}), kGpu), h = To(core::Tensor::Zeros({n}), kGpu);
  core::Tensor rstd = To(core::Tensor::Zeros({rows}), kGpu);
  EXPECT_EQ(kernels::cuda::LayerNormForward(x.data<float>(), w.raw_data(), b.raw_data(),
                                            /*bf16=*/false, 1e-5f, y.raw_data(), nullptr,
                                            rstd.data<float>(), rows, cols),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::cuda::AddLayerNormForward(
                x.data<float>(), x2.data<float>(), h.data<float>(), w.raw_data(), b.raw_data(),
                /*bf16=*/false, 1e-5f, y.raw_data(), nullptr, rstd.data<float>(), rows, cols),
            cudaErrorInvalidValue);
  EXPECT_EQ(Host(y), std::vector<float>(n, 0.0f)) << "nothing written";
  EXPECT_EQ(Host(rstd), std::vector<float>(rows, 0.0f)) << "nothing written";
#endif
}

// NOTE [GEMM epilogues]: LayerNorm (and residual + LayerNorm) storing its output bf16: the
// device's value is the CPU's up to fp32 order, so at most one bf16 step apart; the row
// statistics and the sum within fp32 order. The kernel moves four columns a load where
// every row is 16-byte aligned (cols % 4 == 0; a bf16 output also needs cols % 8 == 0) and
// four scalar ones where not, with the same bits; 772 columns give bf16 rows 8 bytes off
// alignment, and 6200 rows too wide to hold in registers.
TEST(CudaLayersTest, LayerNormBf16OutputMatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (const int64_t cols : {768, 772, 6200}) {
    const int64_t rows = 300, n = rows * cols;
    const core::Tensor x = Normal({n}, 45), x2 = Normal({n}, 46);
    const core::Tensor w = Normal({cols}, 47), b = Normal({cols}, 48);
    for (bool add : {false, true}) {
      SCOPED_TRACE(absl::StrCat(add ? "residual + LayerNorm" : "LayerNorm", ", ", cols));
      // `shift`: every [rows, cols] operand starts one element into its buffer.
      auto run = [&](const core::Device& d, int64_t shift) {
        auto at = [&](const core::Tensor& t) {
          core::Tensor wide = To(core::Tensor::Zeros({n + shift}, t.dtype()), d);
          core::Tensor view = wide.View(shift, {n}).value();
          EXPECT_TRUE(view.CopyFrom(To(t, d)).ok());
          return view;
        };
        core::Tensor y = at(core::Tensor::Zeros({n}, core::DType::kBFloat16));
        core::Tensor h = at(core::Tensor::Zeros({n}));
        core::Tensor mean = To(core::Tensor::Zeros({rows}), d);
        core::Tensor rstd = To(core::Tensor::Zeros({rows}), d);
        const absl::Status s =
            add ? AddLayerNormForward("ln", at(x), at(x2), To(w, d), To(b, d), 1e-5f, h, y, mean,
                                      rstd)
                : LayerNormForward("ln", at(x), To(w, d), To(b, d), 1e-5f, y, mean, rstd);
        EXPECT_TRUE(s.ok()) << s;
        return std::vector<std::vector<float>>{
            Host(y.ToDType(core::DType::kFloat32, core::MemoryTag::kOther).value()), Host(mean),
            Host(h), Host(rstd)};
      };
      const std::vector<std::vector<float>> cpu = run(core::Device::Cpu(), 0);
      const std::vector<std::vector<float>> gpu = run(kGpu, 0), shifted = run(kGpu, 1);
      EXPECT_LE(RelErr(gpu[0], cpu[0]), kBf16Unit);
      EXPECT_LE(RelErr(gpu[1], cpu[1]), kFp32Rel);
      if (add) {
        EXPECT_LE(RelErr(gpu[2], cpu[2]), kFp32Rel);
      }
      EXPECT_LE(RelErr(gpu[3], cpu[3]), kFp32Rel);
      EXPECT_EQ(shifted, gpu) << "unaligned rows";
    }
  }
}

// A bf16 input (a gradient an epilogue stored bf16) sums its widened values.
TEST(CudaLayersTest, ColumnSumsOfABf16InputMatchCpu) {
  SKIP_WITHOUT_GPU();
  const int64_t rows = 16384, cols = 768;
  const core::Tensor x =
      Normal({rows, cols}, 43).ToDType(core::DType::kBFloat16, core::MemoryTag::kOther).value();
  const core::Tensor start = Normal({cols}, 44);
  core::Tensor cpu = start.Clone(core::MemoryTag::kOther);
  ASSERT_TRUE(AccumulateColumnSums("test", x, core::Tensor(), cpu).ok());
  core::Tensor gpu = To(start, kGpu);
  ASSERT_TRUE(AccumulateColumnSums("test", To(x, kGpu), core::Tensor(), gpu).ok());
  EXPECT_LE(RelErr(Host(gpu), cpu.ToVector()), 1e-5 * std::sqrt(static_cast<double>(rows)));
}

// LayerNorm and Embedding read bf16 weights exactly (no GEMM): fp32 tolerance holds.
TEST(CudaLayersTest, LayerNormAndEmbeddingWithBf16WeightsMatchCpu) {
  SKIP_WITHOUT_GPU();
  LayerNorm lc(40), lg(40);
  for (LayerNorm* ln : {&lc, &lg}) {
    core::Rng rng(2);
    FillNormal(ln->weight()->data, 1.0f, 0.5f, &rng);
    ASSERT_TRUE(ConvertParameters(*ln, core::DType::kBFloat16).ok());
  }
  CompareModules(lc, lg, Normal({6, 40}, 3), kFp32Rel);
  Embedding ec(9, 16, 4), eg(9, 16, 4);
  ASSERT_TRUE(ConvertParameters(ec, core::DType::kBFloat16).ok());
  ASSERT_TRUE(ConvertParameters(eg, core::DType::kBFloat16).ok());
  CompareModules(ec, eg, Ids({5, 4}, 9, 5), kFp32Rel);
}

// A whole bf16 Gpt: each logit passes through 2 + 6 * n_layer roundings (per block the
// inputs of qkv, proj, fc and fc2, q/k/v and the probabilities; then lm_head's input, and
// the logit itself, stored bf16: NOTE [bf16 logits] in nn/gpt.h); each adds at most u
// relative where the devices round differently, so the logits and the loss, an average of
// smooth functions of them, stay within (2 + 6 L) u of the CPU's relative to their
// magnitude.
TEST(CudaLayersTest, Bf16GptLossWithinTheDerivedRoundingBound) {
  SKIP_WITHOUT_GPU();
  GptConfig config;
  config.vocab_size = 97;
  config.block_size = 16;
  config.n_embd = 64;
  config.n_layer = 2;
  config.n_head = 4;
  std::shared_ptr<Gpt> cpu = Gpt::Create(config).value();
  std::shared_ptr<Gpt> gpu = Gpt::Create(config).value();
  ASSERT_TRUE(ConvertParameters(*cpu, core::DType::kBFloat16).ok());
  ASSERT_TRUE(ConvertParameters(*gpu, core::DType::kBFloat16).ok());
  ASSERT_TRUE(ToDevice(*gpu, kGpu).ok());
  const core::Tensor tokens = Ids({4, 16}, 97, 30), targets = Ids({4, 16}, 97, 31);
  absl::StatusOr<core::Tensor> y_cpu = cpu->Forward(tokens);
  absl::StatusOr<core::Tensor> y_gpu = gpu->Forward(tokens);
  ASSERT_TRUE(y_cpu.ok() && y_gpu.ok()) << y_gpu.status();
  const double bound = (2 + 6 * config.n_layer) * kBf16Unit;
  EXPECT_EQ(y_gpu->dtype(), core::DType::kBFloat16);
  EXPECT_LE(RelErr(Host(*y_gpu), y_cpu->ToVector()), bound);
  absl::StatusOr<LossResult> l_cpu = CrossEntropyLoss(*y_cpu, targets);
  absl::StatusOr<LossResult> l_gpu = CrossEntropyLoss(*y_gpu, targets);
  ASSERT_TRUE(l_cpu.ok() && l_gpu.ok());
  EXPECT_NEAR(l_gpu->loss, l_cpu->loss, bound * std::abs(l_cpu->loss));
  ASSERT_TRUE(gpu->Backward(l_gpu->grad).ok());
  for (const auto& [name, p] : gpu->NamedParameters()) {
    EXPECT_EQ(p->grad.dtype(), core::DType::kFloat32) << name;
  }
}

// A bf16 GPT at GPT-2's width, head width and vocabulary (2 blocks, 4 x 256 tokens) takes
// the device step's every kernel: the fused attention (tuned on its first call), the
// register-cached LayerNorms, the GEMM epilogues, the staged cross-entropy with bf16
// gradients, the embedding gradient's sort. Two steps from the same state give the same
// loss and the same bits in every parameter's gradient (DESIGN.md: device reductions are
// deterministic), and the loss is near log V at initialisation.
TEST(CudaLayersTest, Bf16GptStepAtGpt2WidthRepeatsBitForBit) {
  SKIP_WITHOUT_GPU();
  GptConfig config;
  config.vocab_size = 50304;
  config.block_size = 256;
  config.n_embd = 768;
  config.n_layer = 2;
  config.n_head = 12;
  config.seed = 5;
  std::shared_ptr<Gpt> gpt = Gpt::Create(config).value();
  ASSERT_TRUE(ConvertParameters(*gpt, core::DType::kBFloat16).ok());
  ASSERT_TRUE(ToDevice(*gpt, kGpu).ok());
  const core::Tensor tokens = Ids({4, 256}, 50304, 60), targets = Ids({4, 256}, 50304, 61);
  std::vector<float> losses;
  std::vector<std::vector<float>> grads[2];
  for (int run = 0; run < 2; ++run) {
    gpt->ZeroGrad();
    absl::StatusOr<core::Tensor> logits = gpt->Forward(tokens);
    ASSERT_TRUE(logits.ok()) << logits.status();
    absl::StatusOr<LossResult> loss = CrossEntropyLoss(*logits, targets, gpt->logits_grad_dtype());
    ASSERT_TRUE(loss.ok()) << loss.status();
    *logits = core::Tensor();  // as the training step: the logits freed before the backward
    ASSERT_TRUE(gpt->Backward(loss->grad).ok());
    losses.push_back(loss->loss);
    for (const auto& [name, p] : gpt->NamedParameters()) grads[run].push_back(Host(p->grad));
  }
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_NEAR(losses[0], std::log(50304.0), 1.0);
  ASSERT_EQ(grads[0].size(), grads[1].size());
  const auto params = gpt->NamedParameters();
  for (size_t i = 0; i < grads[0].size(); ++i) {
    EXPECT_EQ(grads[0][i], grads[1][i]) << params[i].first;
  }
}

// Cross-entropy on every kernel path with fp32 and bf16 gradients (and bf16 logits, as a
// bf16 head gives them, with bf16 gradients): rows staged in shared memory as stored
// (with the kernel's 46-56 registers at sm_90, which keep two 1024-thread blocks off an SM:
// V = 2048, the shortest, and 4096 in 512-thread blocks, several an SM; V = 50304 with more
// rows than the grid's blocks, so each block takes several: fp32 in 1024-thread blocks, one
// an SM, bf16 in 512-thread blocks, two an SM; V = 60000 bf16: 1024 threads, one block an
// SM), and rows read twice (V = 304: four logits per load; V = 301: one; V = 60000 fp32: a
// row past a block's shared memory). The loss within fp32 summation error,
// fp32 gradients within 1e-5 normwise, bf16 gradients within one bf16 step of the CPU's
// (the fp32 values agree to ~1e-7, so a rounding may land one step apart; one step is 2^-7
// of the value at the bottom of its binade, twice the unit roundoff u = 2^-8). A second
// device run gives the same loss and gradient bits.
TEST(CudaLossesTest, CrossEntropyAndMseMatchCpu) {
  SKIP_WITHOUT_GPU();
  for (const auto& [rows, V] : std::vector<std::pair<int64_t, int64_t>>{
           {7, 301}, {7, 304}, {7, 2048}, {7, 4096}, {60, 50304}, {8, 60000}}) {
    for (const auto& [logits_dtype, dtype] : std::vector<std::pair<core::DType, core::DType>>{
             {core::DType::kFloat32, core::DType::kFloat32},
             {core::DType::kFloat32, core::DType::kBFloat16},
             {core::DType::kBFloat16, core::DType::kBFloat16}}) {
      SCOPED_TRACE(absl::StrCat("V ", V, ", logits ", core::DTypeName(logits_dtype), ", gradient ",
                                core::DTypeName(dtype)));
      const core::Tensor logits =
          Normal({5, rows, V}, 40, 3.0f).ToDType(logits_dtype, core::MemoryTag::kOther).value();
      const core::Tensor targets = Ids({5, rows}, V, 41);
      absl::StatusOr<LossResult> c = CrossEntropyLoss(logits, targets, dtype);
      absl::StatusOr<LossResult> g = CrossEntropyLoss(To(logits, kGpu), targets, dtype);
      absl::StatusOr<LossResult> again = CrossEntropyLoss(To(logits, kGpu), targets, dtype);
      ASSERT_TRUE(c.ok() && g.ok() && again.ok()) << g.status();
      EXPECT_EQ(again->loss, g->loss) << "run to run";
      EXPECT_EQ(Host(again->grad), Host(g->grad)) << "run to run";
      EXPECT_NEAR(g->loss, c->loss, 1e-6 * std::abs(c->loss));
      ASSERT_EQ(g->grad.dtype(), dtype);
      const std::vector<float> gg = Host(g->grad), cg = c->grad.ToVector();
      if (dtype == core::DType::kFloat32) {
        EXPECT_LE(RelErr(gg, cg), kFp32Rel);
      } else {
        for (size_t i = 0; i < cg.size(); ++i) {
          ASSERT_LE(std::abs(gg[i] - cg[i]), 2 * kBf16Unit * std::abs(cg[i]) + 1e-30) << i;
        }
      }
    }
  }
  const core::Tensor logits = Normal({5, 7, 301}, 40, 3.0f);
  absl::StatusOr<LossResult> bad = CrossEntropyLoss(To(logits, kGpu), Ids({5, 7}, 400, 1));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);

  const core::Tensor pred = Normal({3, 4}, 42), target = Normal({3, 4}, 43);
  absl::StatusOr<LossResult> mc = MseLoss(pred, target);
  absl::StatusOr<LossResult> mg = MseLoss(To(pred, kGpu), To(target, kGpu));
  ASSERT_TRUE(mc.ok() && mg.ok()) << mg.status();
  EXPECT_EQ(mg->loss, mc->loss);
  EXPECT_TRUE(mg->grad.device() == kGpu);
  EXPECT_EQ(Host(mg->grad), mc->grad.ToVector());
}

}  // namespace
}  // namespace nn
