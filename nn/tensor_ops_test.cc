// CPU tests of the device-dispatching tensor ops (nn/tensor_ops.h): the batched,
// strided, mixed-dtype GEMM against a naive double reference, bounds checks, the row
// ops' defining properties and the fused ops' checks and bits. The CPU launchers under
// them are tested against the scalar bodies in kernels/cpu/kernels_test.cc; the CUDA side
// is compared with these in cuda_layers_test.
#include "nn/tensor_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/bf16_hd.h"
#include "core/random.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/ops.h"

namespace nn {
namespace {

using ::testing::HasSubstr;

core::Tensor Normal(int64_t n, uint64_t seed) {
  core::Tensor t = core::Tensor::Empty({n});
  core::Rng rng(seed);
  FillNormal(t, 0.0f, 1.0f, &rng);
  return t;
}

class MatMulTest : public ::testing::TestWithParam<std::pair<bool, bool>> {};

TEST_P(MatMulTest, BatchedStridedGemmMatchesNaiveReference) {
  const auto [ta, tb] = GetParam();
  const int64_t batch = 2, m = 5, n = 3, k = 7;
  const int64_t ra = ta ? k : m, ca = ta ? m : k, rb = tb ? n : k, cb = tb ? k : n;
  const int64_t lda = ca + 2, ldb = cb + 1, ldc = n + 3;
  const int64_t sa = ra * lda + 1, sb = rb * ldb, sc = m * ldc + 2;
  const core::Tensor a = Normal(3 + batch * sa, 1), b = Normal(batch * sb, 2);
  const core::Tensor c = Normal(batch * sc, 3);
  const std::vector<float> c0 = c.ToVector();
  GemmArgs g;
  g.trans_a = ta;
  g.trans_b = tb;
  g.batch = batch;
  g.m = m;
  g.n = n;
  g.k = k;
  g.alpha = 0.5f;
  g.beta = 2.0f;
  g.a = {a, 3, lda, sa};
  g.b = {b, 0, ldb, sb};
  g.c = {c, 0, ldc, sc};
  ASSERT_TRUE(MatMul("test", g).ok());
  const float* pa = a.data<float>() + 3;
  const float* pb = b.data<float>();
  const std::vector<float> got = c.ToVector();
  std::vector<bool> inside(got.size(), false);
  for (int64_t i = 0; i < batch; ++i) {
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t col = 0; col < n; ++col) {
        double s = 0;
        for (int64_t q = 0; q < k; ++q) {
          const double av = ta ? pa[i * sa + q * lda + r] : pa[i * sa + r * lda + q];
          const double bv = tb ? pb[i * sb + col * ldb + q] : pb[i * sb + q * ldb + col];
          s += av * bv;
        }
        const int64_t idx = i * sc + r * ldc + col;
        inside[idx] = true;
        EXPECT_NEAR(got[idx], 0.5 * s + 2.0 * c0[idx], 1e-5) << i << " " << r << " " << col;
      }
    }
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (!inside[i]) {
      EXPECT_EQ(got[i], c0[i]) << "padding element " << i << " was written";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTransposes, MatMulTest,
                         ::testing::Values(std::make_pair(false, false),
                                           std::make_pair(false, true), std::make_pair(true, false),
                                           std::make_pair(true, true)));

TEST(TensorOpsTest, Bf16OperandIsWidenedExactly) {
  const core::Tensor a = Normal(6, 4), b = Normal(6, 5);
  const core::Tensor b16 = b.ToDType(core::DType::kBFloat16, core::MemoryTag::kOther).value();
  const core::Tensor b_rounded =
      b16.ToDType(core::DType::kFloat32, core::MemoryTag::kOther).value();
  GemmArgs g;
  g.m = 2;
  g.n = 2;
  g.k = 3;
  g.a.tensor = a;
  g.b.tensor = b16;
  g.c.tensor = core::Tensor::Zeros({4});
  ASSERT_TRUE(MatMul("test", g).ok());
  const std::vector<float> got = g.c.tensor.ToVector();
  g.b.tensor = b_rounded;
  g.c.tensor = core::Tensor::Zeros({4});
  ASSERT_TRUE(MatMul("test", g).ok());
  EXPECT_EQ(got, g.c.tensor.ToVector());
}

TEST(TensorOpsTest, GemmOperandsOutsideTheirTensorAreInvalidArgument) {
  GemmArgs g;
  g.m = 2;
  g.n = 2;
  g.k = 3;
  g.a.tensor = Normal(6, 1);
  g.a.offset = 1;  // one past the end
  g.b.tensor = Normal(6, 2);
  g.c.tensor = core::Tensor::Zeros({4});
  absl::Status s = MatMul("blocks.0.attn (CausalSelfAttention)", g);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("blocks.0.attn"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("reaches outside"));
  g.a.offset = 0;
  // NOTE [GEMM epilogues]: a bf16 C cannot be accumulated into (beta != 0).
  g.c.tensor = core::Tensor::Zeros({4}, core::DType::kBFloat16);
  g.beta = 1.0f;
  s = MatMul("x", g);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("beta 0"));
  g.beta = 0.0f;
  g.c.tensor = core::Tensor::Zeros({4}, core::DType::kInt32);
  s = MatMul("x", g);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("float32"));
}

// NOTE [GEMM epilogues]: the GEMM of a [m, k] x [n, k]^T problem (a Linear's forward),
// with C fp32 or bf16 and the given epilogue.
struct EpilogueCase {
  core::Tensor a, w, bias, c, aux;
};

EpilogueCase MakeEpilogueCase(int64_t m, int64_t n, int64_t k, core::DType c_dtype) {
  EpilogueCase e;
  e.a = Normal(m * k, 11);
  e.w = Normal(n * k, 12);
  e.bias = Normal(n, 13);
  e.c = core::Tensor::Zeros({m * n}, c_dtype);
  e.aux = core::Tensor::Zeros({m * n}, c_dtype);
  return e;
}

// The case's GEMM, C = a w^T, without an epilogue.
GemmArgs LinearGemm(const EpilogueCase& e, int64_t m, int64_t n, int64_t k) {
  GemmArgs g;
  g.trans_b = true;
  g.m = m;
  g.n = n;
  g.k = k;
  g.a.tensor = e.a;
  g.b.tensor = e.w;
  g.c.tensor = e.c;
  return g;
}

absl::Status RunEpilogue(const EpilogueCase& e, int64_t m, int64_t n, int64_t k,
                         GemmEpilogue epilogue) {
  GemmArgs g = LinearGemm(e, m, n, k);
  g.epilogue = epilogue;
  if (epilogue == GemmEpilogue::kBias || epilogue == GemmEpilogue::kBiasGelu ||
      epilogue == GemmEpilogue::kBiasResidual) {
    g.bias = e.bias;
  }
  if (epilogue == GemmEpilogue::kBiasGelu || epilogue == GemmEpilogue::kDGelu ||
      epilogue == GemmEpilogue::kBiasResidual || epilogue == GemmEpilogue::kResidual) {
    g.aux = e.aux;
  }
  return MatMul("fc (Linear)", g);
}

std::vector<float> Widened(const core::Tensor& t) {
  absl::StatusOr<core::Tensor> wide =
      t.ToDType(core::DType::kFloat32, core::MemoryTag::kActivation);
  EXPECT_TRUE(wide.ok());
  return wide->ToVector();
}

std::vector<float> RoundedToBf16(std::vector<float> v) {
  for (float& x : v) x = core::Bf16BitsToFloat(core::FloatToBf16Bits(x));
  return v;
}

// Each epilogue gives, bit for bit, the plain GEMM followed by the unfused op (fp32 C), and
// a bf16 C holds those values rounded once (the aux matrix too).
TEST(GemmEpilogueTest, EachIsThePlainGemmThenTheUnfusedOpRoundedOnceForBf16) {
  const int64_t m = 6, n = 16, k = 9;
  // The plain product P.
  EpilogueCase plain = MakeEpilogueCase(m, n, k, core::DType::kFloat32);
  ASSERT_TRUE(RunEpilogue(plain, m, n, k, GemmEpilogue::kNone).ok());
  // References from the unfused ops on P.
  core::Tensor biased = core::Tensor::Zeros({m * n});
  ASSERT_TRUE(BiasAdd("ref", plain.c, plain.bias, biased).ok());
  core::Tensor pre = core::Tensor::Zeros({m * n}), gelu = core::Tensor::Zeros({m * n});
  ASSERT_TRUE(BiasAdd("ref", plain.c, plain.bias, pre).ok());
  ASSERT_TRUE(GeluForward("ref", pre, gelu).ok());
  const core::Tensor saved = Normal(m * n, 14);  // a pre-activation for the GELU gradient
  core::Tensor dgelu = core::Tensor::Zeros({m * n});
  ASSERT_TRUE(GeluBackward("ref", saved, plain.c, dgelu).ok());

  for (core::DType dtype : {core::DType::kFloat32, core::DType::kBFloat16}) {
    SCOPED_TRACE(core::DTypeName(dtype));
    const bool bf16 = dtype == core::DType::kBFloat16;
    auto expect = [&](const std::vector<float>& ref) { return bf16 ? RoundedToBf16(ref) : ref; };
    EpilogueCase e = MakeEpilogueCase(m, n, k, dtype);
    ASSERT_TRUE(RunEpilogue(e, m, n, k, GemmEpilogue::kNone).ok());
    EXPECT_EQ(Widened(e.c), expect(plain.c.ToVector()));
    ASSERT_TRUE(RunEpilogue(e, m, n, k, GemmEpilogue::kBias).ok());
    EXPECT_EQ(Widened(e.c), expect(biased.ToVector()));
    ASSERT_TRUE(RunEpilogue(e, m, n, k, GemmEpilogue::kBiasGelu).ok());
    // GELU of the unrounded pre-activation, and that pre-activation rounded in aux.
    EXPECT_EQ(Widened(e.c), expect(gelu.ToVector()));
    EXPECT_EQ(Widened(e.aux), expect(pre.ToVector()));
    // The GELU gradient reads aux as stored: give it the saved pre-activation, rounded
    // for a bf16 aux, and compare with GeluBackward of the same values.
    absl::StatusOr<core::Tensor> stored = saved.ToDType(dtype, core::MemoryTag::kActivation);
    ASSERT_TRUE(stored.ok());
    e.aux = *stored;
    ASSERT_TRUE(RunEpilogue(e, m, n, k, GemmEpilogue::kDGelu).ok());
    std::vector<float> ref = dgelu.ToVector();
    if (bf16) {
      absl::StatusOr<core::Tensor> saved_wide =
          stored->ToDType(core::DType::kFloat32, core::MemoryTag::kActivation);
      ASSERT_TRUE(saved_wide.ok());
      core::Tensor d = core::Tensor::Zeros({m * n});
      ASSERT_TRUE(GeluBackward("ref", *saved_wide, plain.c, d).ok());
      ref = d.ToVector();
    }
    EXPECT_EQ(Widened(e.c), expect(ref));
  }
  // kBiasResidual (fp32 C): aux + (P + bias), the residual added to the biased product.
  EpilogueCase r = MakeEpilogueCase(m, n, k, core::DType::kFloat32);
  r.aux = Normal(m * n, 15);
  core::Tensor with_residual = core::Tensor::Zeros({m * n});
  ASSERT_TRUE(AddTensors("ref", r.aux, biased, with_residual).ok());
  ASSERT_TRUE(RunEpilogue(r, m, n, k, GemmEpilogue::kBiasResidual).ok());
  EXPECT_EQ(r.c.ToVector(), with_residual.ToVector());
  // kResidual (fp32 C): aux + P, the residual added to the product (no bias), for fp32 and
  // bf16 operands; the residual is left as it was.
  for (core::DType dtype : {core::DType::kFloat32, core::DType::kBFloat16}) {
    SCOPED_TRACE(core::DTypeName(dtype));
    auto operands = [&] {
      EpilogueCase e = MakeEpilogueCase(m, n, k, core::DType::kFloat32);
      e.a = e.a.ToDType(dtype, core::MemoryTag::kOther).value();
      e.w = e.w.ToDType(dtype, core::MemoryTag::kOther).value();
      return e;
    };
    EpilogueCase p = operands();
    ASSERT_TRUE(RunEpilogue(p, m, n, k, GemmEpilogue::kNone).ok());
    EpilogueCase q = operands();
    q.aux = Normal(m * n, 16);
    const std::vector<float> residual = q.aux.ToVector();
    core::Tensor sum = core::Tensor::Zeros({m * n});
    ASSERT_TRUE(AddTensors("ref", q.aux, p.c, sum).ok());
    ASSERT_TRUE(RunEpilogue(q, m, n, k, GemmEpilogue::kResidual).ok());
    EXPECT_EQ(q.c.ToVector(), sum.ToVector());
    EXPECT_NE(q.c.ToVector(), p.c.ToVector());
    EXPECT_EQ(q.aux.ToVector(), residual);
  }
}

TEST(GemmEpilogueTest, MissingOrMisfitArgumentsAreInvalidArgumentNamingThem) {
  const int64_t m = 4, n = 8, k = 3;
  EpilogueCase e = MakeEpilogueCase(m, n, k, core::DType::kFloat32);
  const GemmArgs g = LinearGemm(e, m, n, k);
  auto message = [&](const GemmArgs& args) {
    const absl::Status s = MatMul("blocks.0.mlp.fc (Linear)", args);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr("blocks.0.mlp.fc"));
    return std::string(s.message());
  };
  GemmArgs no_bias = g;
  no_bias.epilogue = GemmEpilogue::kBias;
  EXPECT_THAT(message(no_bias), HasSubstr("needs a bias"));
  GemmArgs short_bias = no_bias;
  short_bias.bias = Normal(n - 1, 1);
  EXPECT_THAT(message(short_bias), HasSubstr("bias"));
  GemmArgs no_aux = g;
  no_aux.epilogue = GemmEpilogue::kDGelu;
  EXPECT_THAT(message(no_aux), HasSubstr("needs aux"));
  GemmArgs wrong_aux = no_aux;
  wrong_aux.aux = core::Tensor::Zeros({m * n}, core::DType::kBFloat16);  // C is fp32
  EXPECT_THAT(message(wrong_aux), HasSubstr("aux"));
  GemmArgs same = no_aux;
  same.aux = e.c;
  EXPECT_THAT(message(same), HasSubstr("distinct"));
  GemmArgs accumulate = no_bias;
  accumulate.bias = e.bias;
  accumulate.beta = 1.0f;
  EXPECT_THAT(message(accumulate), HasSubstr("beta 0"));
  GemmArgs strided = accumulate;
  strided.beta = 0.0f;
  strided.c.ld = n + 1;
  EXPECT_THAT(message(strided), HasSubstr("dense C"));
  GemmArgs no_residual = no_bias;
  no_residual.epilogue = GemmEpilogue::kBiasResidual;
  no_residual.bias = e.bias;
  EXPECT_THAT(message(no_residual), HasSubstr("needs aux, the residual"));
  GemmArgs bf16_residual_c = no_residual;
  bf16_residual_c.c.tensor = core::Tensor::Zeros({m * n}, core::DType::kBFloat16);
  bf16_residual_c.aux = core::Tensor::Zeros({m * n}, core::DType::kBFloat16);
  EXPECT_THAT(message(bf16_residual_c), HasSubstr("needs an fp32 C"));
  GemmArgs residual_only = g;
  residual_only.epilogue = GemmEpilogue::kResidual;
  EXPECT_THAT(message(residual_only), HasSubstr("'residual' needs aux, the residual"));
  residual_only.aux = e.c;
  EXPECT_THAT(message(residual_only), HasSubstr("distinct"));
  GemmArgs bf16_residual_only = residual_only;
  bf16_residual_only.c.tensor = core::Tensor::Zeros({m * n}, core::DType::kBFloat16);
  bf16_residual_only.aux = core::Tensor::Zeros({m * n}, core::DType::kBFloat16);
  EXPECT_THAT(message(bf16_residual_only), HasSubstr("needs an fp32 C"));
  // Nothing was written by the refused calls.
  for (float v : e.c.ToVector()) EXPECT_EQ(v, 0.0f);
}

// NOTE [GEMM epilogues]: a weight-gradient GEMM dW += g^T x with a bias gradient adds the
// column sums of g (its A, as stored: bf16 values widened) to bias_grad, and dW is the GEMM
// without one, bit for bit; C and bias_grad accumulate (beta 1, +=).
TEST(GemmEpilogueTest, BiasGradientAddsTheColumnSumsOfATheWeightGradientIsUnchanged) {
  const int64_t rows = 7, out = 5, in = 6;
  for (core::DType dtype : {core::DType::kFloat32, core::DType::kBFloat16}) {
    SCOPED_TRACE(core::DTypeName(dtype));
    const core::Tensor g = Normal(rows * out, 31).ToDType(dtype, core::MemoryTag::kOther).value();
    const core::Tensor x = Normal(rows * in, 32).ToDType(dtype, core::MemoryTag::kOther).value();
    auto dw = [&](const core::Tensor& c, const core::Tensor& sums) {
      return MatMul("blocks.0.mlp.fc (Linear)", WeightGradientGemm(rows, out, in, g, x, c, sums));
    };
    const core::Tensor c0 = Normal(out * in, 33);
    core::Tensor c_plain = c0.Clone(core::MemoryTag::kOther);
    core::Tensor c_fused = c0.Clone(core::MemoryTag::kOther);
    core::Tensor sums = core::Tensor::FromVector({1, -2, 3, 0.5f, 0}, {out}).value();
    core::Tensor want = sums.Clone(core::MemoryTag::kOther);
    ASSERT_TRUE(dw(c_plain, core::Tensor()).ok());
    ASSERT_TRUE(dw(c_fused, sums).ok());
    ASSERT_TRUE(AccumulateColumnSums("ref", g, core::Tensor(), want).ok());
    EXPECT_EQ(c_fused.ToVector(), c_plain.ToVector());
    EXPECT_EQ(sums.ToVector(), want.ToVector());
    // Twice: both accumulate.
    ASSERT_TRUE(dw(c_plain, core::Tensor()).ok());
    ASSERT_TRUE(dw(c_fused, sums).ok());
    ASSERT_TRUE(AccumulateColumnSums("ref", g, core::Tensor(), want).ok());
    EXPECT_EQ(c_fused.ToVector(), c_plain.ToVector());
    EXPECT_EQ(sums.ToVector(), want.ToVector());
  }
}

TEST(GemmEpilogueTest, BiasGradientArgumentsAreCheckedAndNothingIsWrittenOnError) {
  const int64_t rows = 4, out = 3, in = 2;
  GemmArgs a = WeightGradientGemm(rows, out, in, Normal(rows * out, 41), Normal(rows * in, 42),
                                  core::Tensor::Zeros({out * in}), core::Tensor::Zeros({out}));
  a.beta = 0.0f;
  ASSERT_TRUE(MatMul("ok", a).ok());
  a.c.tensor = core::Tensor::Zeros({out * in});
  a.bias_grad = core::Tensor::Zeros({out});
  auto message = [&](const GemmArgs& args) {
    const absl::Status s = MatMul("blocks.1.attn.qkv (Linear)", args);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr("blocks.1.attn.qkv"));
    return std::string(s.message());
  };
  GemmArgs short_sums = a;
  short_sums.bias_grad = core::Tensor::Zeros({out + 1});
  EXPECT_THAT(message(short_sums), HasSubstr("bias gradient"));
  GemmArgs bf16_sums = a;
  bf16_sums.bias_grad = core::Tensor::Zeros({out}, core::DType::kBFloat16);
  EXPECT_THAT(message(bf16_sums), HasSubstr("bias gradient"));
  GemmArgs untransposed = a;
  untransposed.trans_a = false;
  untransposed.a.tensor = Normal(out * rows, 43);
  EXPECT_THAT(message(untransposed), HasSubstr("transposed, dense A"));
  GemmArgs offset = a;
  offset.a.tensor = Normal(rows * out + 1, 44);
  offset.a.offset = 1;
  EXPECT_THAT(message(offset), HasSubstr("transposed, dense A"));
  GemmArgs with_bias = a;
  with_bias.beta = 0.0f;
  with_bias.epilogue = GemmEpilogue::kBias;
  with_bias.bias = Normal(in, 45);
  EXPECT_THAT(message(with_bias), HasSubstr("no epilogue"));
  GemmArgs aliased = a;  // [1 x 1] += g^T x with the bias gradient in C's storage
  aliased.m = 1;
  aliased.n = 1;
  aliased.a.tensor = Normal(rows, 46);
  aliased.b.tensor = Normal(rows, 47);
  aliased.bias_grad = core::Tensor::Zeros({1});
  aliased.c.tensor = aliased.bias_grad;
  EXPECT_THAT(message(aliased), HasSubstr("distinct"));
  for (float v : a.c.tensor.ToVector()) EXPECT_EQ(v, 0.0f);
  for (float v : a.bias_grad.ToVector()) EXPECT_EQ(v, 0.0f);
}

// NOTE [GEMM epilogues]: a bf16 LayerNorm output holds the fp32 output rounded once, and
// the statistics (each row's mean and rstd) are those of the fp32 call.
TEST(TensorOpsTest, LayerNormsBf16OutputIsTheFp32OutputRoundedOnce) {
  const int64_t rows = 5, cols = 24, n = rows * cols;
  const core::Tensor x = Normal(n, 31), x2 = Normal(n, 32);
  const core::Tensor w = Normal(cols, 33), b = Normal(cols, 34);
  auto run = [&](core::DType dtype, bool add) {
    core::Tensor y = core::Tensor::Zeros({n}, dtype), mean = core::Tensor::Zeros({rows});
    core::Tensor rstd = core::Tensor::Zeros({rows}), h = core::Tensor::Zeros({n});
    const absl::Status s = add ? AddLayerNormForward("ln_2", x, x2, w, b, 1e-5f, h, y, mean, rstd)
                               : LayerNormForward("ln_1", x, w, b, 1e-5f, y, mean, rstd);
    EXPECT_TRUE(s.ok()) << s;
    return std::vector<std::vector<float>>{Widened(y), mean.ToVector(), rstd.ToVector()};
  };
  for (bool add : {false, true}) {
    SCOPED_TRACE(add ? "residual + LayerNorm" : "LayerNorm");
    const auto fp32 = run(core::DType::kFloat32, add);
    const auto bf16 = run(core::DType::kBFloat16, add);
    EXPECT_EQ(bf16[0], RoundedToBf16(fp32[0]));
    EXPECT_EQ(bf16[1], fp32[1]);
    EXPECT_EQ(bf16[2], fp32[2]);
  }
}

TEST(TensorOpsTest, ColumnSumsOfABf16InputAreThoseOfItsWidenedValues) {
  const core::Tensor x = Normal(5 * 4, 21);
  absl::StatusOr<core::Tensor> x16 =
      x.ToDType(core::DType::kBFloat16, core::MemoryTag::kActivation);
  ASSERT_TRUE(x16.ok());
  absl::StatusOr<core::Tensor> wide =
      x16->ToDType(core::DType::kFloat32, core::MemoryTag::kActivation);
  ASSERT_TRUE(wide.ok());
  core::Tensor got = core::Tensor::FromVector({1, 2, 3, 4}, {4}).value();
  core::Tensor want = core::Tensor::FromVector({1, 2, 3, 4}, {4}).value();
  ASSERT_TRUE(AccumulateColumnSums("t", *x16, core::Tensor(), got).ok());
  ASSERT_TRUE(AccumulateColumnSums("t", *wide, core::Tensor(), want).ok());
  EXPECT_EQ(got.ToVector(), want.ToVector());
  // With a second factor the input must still be fp32.
  const absl::Status s = AccumulateColumnSums("t", *x16, *wide, got);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

TEST(TensorOpsTest, ColumnSumsWithAndWithoutASecondFactor) {
  const core::Tensor x = core::Tensor::FromVector({1, 2, 3, 4, 5, 6}, {3, 2}).value();
  const core::Tensor y = core::Tensor::FromVector({2, 0, 1, 1, 0, 3}, {3, 2}).value();
  core::Tensor acc = core::Tensor::FromVector({10, 20}, {2}).value();
  ASSERT_TRUE(AccumulateColumnSums("t", x, core::Tensor(), acc).ok());
  EXPECT_EQ(acc.ToVector(), (std::vector<float>{19, 32}));
  ASSERT_TRUE(AccumulateColumnSums("t", x, y, acc).ok());
  EXPECT_EQ(acc.ToVector(), (std::vector<float>{19 + 2 + 3, 32 + 4 + 18}));
  EXPECT_EQ(AccumulateColumnSums("t", x, core::Tensor(), core::Tensor::Zeros({4})).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TensorOpsTest, CausalSoftmaxRowsSumToOneAndMaskTheFuture) {
  const int64_t T = 5;
  const core::Tensor s = Normal(2 * T * T, 6);
  ASSERT_TRUE(CausalSoftmaxForward("t", s, T).ok());
  const std::vector<float> p = s.ToVector();
  for (int64_t r = 0; r < 2 * T; ++r) {
    const int64_t t = r % T;
    double sum = 0;
    for (int64_t c = 0; c < T; ++c) {
      if (c > t) {
        EXPECT_EQ(p[r * T + c], 0.0f);
      }
      sum += p[r * T + c];
    }
    EXPECT_NEAR(sum, 1.0, 1e-6) << r;
  }
  // Backward of a constant upstream gradient is zero (softmax rows sum to one).
  core::Tensor g = core::Tensor::Empty({2 * T * T});
  g.Fill(3.0f);
  ASSERT_TRUE(CausalSoftmaxBackward("t", s, g, T, 0.5f).ok());
  for (float v : g.ToVector()) EXPECT_NEAR(v, 0.0f, 1e-6);
}

TEST(TensorOpsTest, CausalSoftmaxBf16OutputsAreTheRoundedResultsAndAreChecked) {
  const int64_t T = 6;
  const core::Tensor s = Normal(3 * T * T, 8);
  const core::Tensor ref = s.Clone(core::MemoryTag::kOther);
  ASSERT_TRUE(CausalSoftmaxForward("t", ref, T).ok());
  core::Tensor p16 =
      core::Tensor::Allocate({3 * T * T}, core::DType::kBFloat16, core::MemoryTag::kOther).value();
  ASSERT_TRUE(CausalSoftmaxForward("t", s, T, p16).ok());
  EXPECT_EQ(p16.ToVector(),
            ref.ToDType(core::DType::kBFloat16, core::MemoryTag::kOther)->ToVector());
  // The backward reads the bf16 p and writes a bf16 gradient.
  const core::Tensor g = Normal(3 * T * T, 9);
  const core::Tensor g_ref = g.Clone(core::MemoryTag::kOther);
  ASSERT_TRUE(
      CausalSoftmaxBackward(
          "t", p16.ToDType(core::DType::kFloat32, core::MemoryTag::kOther).value(), g_ref, T, 0.5f)
          .ok());
  core::Tensor out16 =
      core::Tensor::Allocate({3 * T * T}, core::DType::kBFloat16, core::MemoryTag::kOther).value();
  ASSERT_TRUE(CausalSoftmaxBackward("t", p16, g, T, 0.5f, out16).ok());
  EXPECT_EQ(out16.ToVector(),
            g_ref.ToDType(core::DType::kBFloat16, core::MemoryTag::kOther)->ToVector());
  // A bf16 output must be bf16 and as long as the scores.
  absl::Status wrong_dtype = CausalSoftmaxForward("attn", s, T, core::Tensor::Zeros({3 * T * T}));
  EXPECT_EQ(wrong_dtype.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_dtype.message().find("attn: bf16 probabilities"), std::string::npos)
      << wrong_dtype;
  core::Tensor short16 =
      core::Tensor::Allocate({T * T}, core::DType::kBFloat16, core::MemoryTag::kOther).value();
  absl::Status wrong_numel = CausalSoftmaxBackward("attn", p16, g, T, 0.5f, short16);
  EXPECT_EQ(wrong_numel.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_numel.message().find("bf16 score gradient"), std::string::npos) << wrong_numel;
}

TEST(TensorOpsTest, CrossEntropyMatchesNaiveLogSoftmax) {
  const int64_t n = 3, V = 4;
  const core::Tensor logits = Normal(n * V, 7);
  const core::Tensor targets = core::Tensor::FromInts({3, 0, 2}, {n}).value();
  const core::Tensor grad = core::Tensor::Empty({n * V});
  absl::StatusOr<double> loss = CrossEntropyForwardBackward("t", logits, targets, grad);
  ASSERT_TRUE(loss.ok()) << loss.status();
  const std::vector<float> x = logits.ToVector(), g = grad.ToVector();
  double ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    double z = 0;
    for (int64_t j = 0; j < V; ++j) z += std::exp(static_cast<double>(x[i * V + j]));
    const int tg = targets.data<int32_t>()[i];
    ref += std::log(z) - x[i * V + tg];
    for (int64_t j = 0; j < V; ++j) {
      EXPECT_NEAR(g[i * V + j], (std::exp(x[i * V + j]) / z - (j == tg)) / n, 1e-7);
    }
  }
  EXPECT_NEAR(*loss, ref / n, 1e-12);
}

TEST(TensorOpsTest, ZeroAndEmbeddingScatter) {
  core::Tensor gw = Normal(6, 8);
  ASSERT_TRUE(ZeroTensor("t", gw).ok());
  EXPECT_EQ(gw.ToVector(), std::vector<float>(6, 0.0f));
  core::Tensor table = core::Tensor::FromVector({1, 2, 3, 4, 5, 6}, {3, 2}).value();
  const core::Tensor ids = core::Tensor::FromInts({2, 0, 2}, {3}).value();
  core::Tensor y = core::Tensor::Empty({6});
  ASSERT_TRUE(EmbeddingForward("t", table, ids, y).ok());
  EXPECT_EQ(y.ToVector(), (std::vector<float>{5, 6, 1, 2, 5, 6}));
  const core::Tensor gy = core::Tensor::FromVector({1, 1, 2, 2, 3, 3}, {6}).value();
  core::Tensor gw2 = core::Tensor::Zeros({3, 2});
  ASSERT_TRUE(EmbeddingBackward("t", ids, gy, gw2).ok());
  EXPECT_EQ(gw2.ToVector(), (std::vector<float>{2, 2, 0, 0, 4, 4}));
}

// The bits of every element, so -0.0 and 0.0 differ.
std::vector<uint32_t> Bits(const core::Tensor& t) {
  const std::vector<float> v = t.ToVector();
  std::vector<uint32_t> bits(v.size());
  std::memcpy(bits.data(), v.data(), v.size() * sizeof(float));
  return bits;
}

// NOTE [Fused ops]: each fused op against the unfused ops it names, run one after the
// other on copies of the same inputs, for fp32 and bf16 weights, row lengths that are and
// are not a multiple of 8 lanes, and in place where the op allows it.
TEST(FusedOpsTest, EachGivesTheBitsOfTheUnfusedOps) {
  for (int64_t cols : {1, 8, 37, 256}) {
    for (core::DType wtype : {core::DType::kFloat32, core::DType::kBFloat16}) {
      SCOPED_TRACE(absl::StrCat("cols ", cols, " ", core::DTypeName(wtype)));
      const int64_t rows = 19, n = rows * cols;
      auto weight = [&](uint64_t seed) {
        return Normal(cols, seed).ToDType(wtype, core::MemoryTag::kOther).value();
      };
      const core::Tensor w = weight(2), lb = weight(3);
      const core::Tensor x = Normal(n, 4), a = Normal(n, 5), g = Normal(n, 6);
      auto empty = [&](int64_t k) { return core::Tensor::Empty({k}); };

      // AddLayerNormForward, into a separate sum and in place over either operand.
      core::Tensor h_ref = empty(n), ln_ref = empty(n), mean_ref = empty(rows),
                   rstd_ref = empty(rows);
      ASSERT_TRUE(AddTensors("t", x, a, h_ref).ok());
      ASSERT_TRUE(LayerNormForward("t", h_ref, w, lb, 1e-5f, ln_ref, mean_ref, rstd_ref).ok());
      for (int where = 0; where < 3; ++where) {
        SCOPED_TRACE(absl::StrCat("sum into ", where == 0   ? "a new tensor"
                                               : where == 1 ? "a"
                                                            : "b"));
        core::Tensor ca = x.Clone(core::MemoryTag::kOther);
        core::Tensor cb = a.Clone(core::MemoryTag::kOther);
        core::Tensor h = where == 0 ? empty(n) : where == 1 ? ca : cb;
        core::Tensor ln = empty(n), mean = empty(rows), rstd = empty(rows);
        ASSERT_TRUE(AddLayerNormForward("t", ca, cb, w, lb, 1e-5f, h, ln, mean, rstd).ok());
        EXPECT_EQ(Bits(h), Bits(h_ref));
        EXPECT_EQ(Bits(ln), Bits(ln_ref));
        EXPECT_EQ(Bits(mean), Bits(mean_ref));
        EXPECT_EQ(Bits(rstd), Bits(rstd_ref));
      }

      // LayerNormBackwardAdd: the LayerNorm gradient plus a residual, parameter grads too.
      core::Tensor lgx_ref = empty(n), gw_ref = Normal(cols, 8), glb_ref = Normal(cols, 9);
      ASSERT_TRUE(
          LayerNormBackward("t", g, h_ref, mean_ref, rstd_ref, w, lgx_ref, gw_ref, glb_ref).ok());
      ASSERT_TRUE(AddTensors("t", a, lgx_ref, lgx_ref).ok());
      core::Tensor lgx = empty(n), gw = Normal(cols, 8), glb = Normal(cols, 9);
      ASSERT_TRUE(LayerNormBackwardAdd("t", g, h_ref, mean_ref, rstd_ref, w, a, lgx, gw, glb).ok());
      EXPECT_EQ(Bits(lgx), Bits(lgx_ref));
      EXPECT_EQ(Bits(gw), Bits(gw_ref));
      EXPECT_EQ(Bits(glb), Bits(glb_ref));

      // With its bf16 copy: the same sum, and the copy is the sum rounded (RoundToBf16's
      // conversion).
      core::Tensor lgx2 = empty(n), gw2 = Normal(cols, 8), glb2 = Normal(cols, 9);
      core::Tensor lgx16 = core::Tensor::Empty({n}, core::DType::kBFloat16);
      ASSERT_TRUE(
          LayerNormBackwardAdd("t", g, h_ref, mean_ref, rstd_ref, w, a, lgx2, gw2, glb2, lgx16)
              .ok());
      EXPECT_EQ(Bits(lgx2), Bits(lgx_ref));
      EXPECT_EQ(Bits(gw2), Bits(gw_ref));
      const core::Tensor rounded =
          lgx_ref.ToDType(core::DType::kBFloat16, core::MemoryTag::kOther).value();
      EXPECT_EQ(Bits(lgx16.ToDType(core::DType::kFloat32, core::MemoryTag::kOther).value()),
                Bits(rounded.ToDType(core::DType::kFloat32, core::MemoryTag::kOther).value()));

      // RmsNormBackwardAdd: the RMSNorm input gradient plus a residual, the weight gradient
      // too, and its bf16 copy.
      core::Tensor y = empty(n), rms_rstd = empty(rows);
      ASSERT_TRUE(RmsNormForward("t", x, w, 1e-6f, y, rms_rstd).ok());
      core::Tensor rgx_ref = empty(n), rgw_ref = Normal(cols, 11);
      ASSERT_TRUE(RmsNormBackward("t", g, x, rms_rstd, w, rgx_ref, rgw_ref).ok());
      ASSERT_TRUE(AddTensors("t", a, rgx_ref, rgx_ref).ok());
      core::Tensor rgx = empty(n), rgx2 = empty(n), rgw = Normal(cols, 11), rgw2 = Normal(cols, 11);
      core::Tensor rgx16 = core::Tensor::Empty({n}, core::DType::kBFloat16);
      ASSERT_TRUE(RmsNormBackwardAdd("t", g, x, rms_rstd, w, a, rgx, rgw).ok());
      ASSERT_TRUE(RmsNormBackwardAdd("t", g, x, rms_rstd, w, a, rgx2, rgw2, rgx16).ok());
      EXPECT_EQ(Bits(rgx), Bits(rgx_ref));
      EXPECT_EQ(Bits(rgx2), Bits(rgx_ref));
      EXPECT_EQ(Bits(rgw), Bits(rgw_ref));
      EXPECT_EQ(Bits(rgw2), Bits(rgw_ref));
      const core::Tensor rms_rounded =
          rgx_ref.ToDType(core::DType::kBFloat16, core::MemoryTag::kOther).value();
      EXPECT_EQ(Bits(rgx16.ToDType(core::DType::kFloat32, core::MemoryTag::kOther).value()),
                Bits(rms_rounded.ToDType(core::DType::kFloat32, core::MemoryTag::kOther).value()));
    }
  }
}

TEST(FusedOpsTest, BadArgumentsAreInvalidArgumentAndWriteNothing) {
  const int64_t rows = 4, cols = 6, n = rows * cols;
  const core::Tensor x = Normal(n, 1), g = Normal(n, 3);
  core::Tensor y = core::Tensor::Zeros({n});
  absl::Status s;
  const core::Tensor w = Normal(cols, 5), lb = Normal(cols, 6);
  core::Tensor h = core::Tensor::Zeros({n}), mean = core::Tensor::Zeros({rows});
  s = AddLayerNormForward("ln_2", x, g, w, lb, 1e-5f, h, x, mean, core::Tensor::Zeros({rows}));
  EXPECT_THAT(std::string(s.message()), HasSubstr("ln_2: output and first operand"));
  s = AddLayerNormForward("ln_2", x, Normal(n - 1, 7), w, lb, 1e-5f, h, y, mean,
                          core::Tensor::Zeros({rows}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(h.ToVector(), std::vector<float>(n, 0.0f));
  s = AddLayerNormForward("ln_2", x, g, w, lb, 1e-5f, h, y, mean, mean);
  EXPECT_THAT(std::string(s.message()), HasSubstr("ln_2: mean and rstd"));
  // The statistics are one per row.
  s = AddLayerNormForward("ln_2", x, g, w, lb, 1e-5f, h, y, core::Tensor::Zeros({n}),
                          core::Tensor::Zeros({rows}));
  EXPECT_THAT(std::string(s.message()), HasSubstr("mean"));
  EXPECT_EQ(h.ToVector(), std::vector<float>(n, 0.0f));
  const core::Tensor rstd = core::Tensor::Zeros({rows});
  s = LayerNormBackwardAdd("ln_2", g, x, mean, rstd, w, y, y, core::Tensor(), core::Tensor());
  EXPECT_THAT(std::string(s.message()), HasSubstr("ln_2: grad_input and residual"));
  // The bf16 copy of grad_input is bf16 of its numel.
  core::Tensor gx = core::Tensor::Zeros({n});
  s = LayerNormBackwardAdd("ln_2", g, x, mean, rstd, w, y, gx, core::Tensor(), core::Tensor(),
                           core::Tensor::Zeros({n}));
  EXPECT_THAT(std::string(s.message()), HasSubstr("ln_2: bf16 grad_input"));
  s = LayerNormBackwardAdd("ln_2", g, x, mean, rstd, w, y, gx, core::Tensor(), core::Tensor(),
                           core::Tensor::Zeros({n - 1}, core::DType::kBFloat16));
  EXPECT_THAT(std::string(s.message()), HasSubstr("ln_2: bf16 grad_input"));
  EXPECT_EQ(gx.ToVector(), std::vector<float>(n, 0.0f));
  // RmsNormBackwardAdd: the residual is fp32 of grad_output's numel and not grad_input; the
  // bf16 copy is bf16 of its numel; the weight gradient fp32 of the weight's.
  const core::Tensor rms_rstd = Normal(rows, 9);
  core::Tensor rgw = core::Tensor::Zeros({cols});
  s = RmsNormBackwardAdd("post_attention_layernorm", g, x, rms_rstd, w, y, y, rgw);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("post_attention_layernorm: grad_input and residual"));
  s = RmsNormBackwardAdd("post_attention_layernorm", g, x, rms_rstd, w, Normal(n - 1, 10), gx, rgw);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("post_attention_layernorm: residual"));
  s = RmsNormBackwardAdd(
      "post_attention_layernorm", g, x, rms_rstd, w,
      Normal(n, 10).ToDType(core::DType::kBFloat16, core::MemoryTag::kOther).value(), gx, rgw);
  EXPECT_THAT(std::string(s.message()), HasSubstr("post_attention_layernorm: residual"));
  s = RmsNormBackwardAdd("post_attention_layernorm", g, x, rms_rstd, w, y, gx, rgw,
                         core::Tensor::Zeros({n}));
  EXPECT_THAT(std::string(s.message()), HasSubstr("post_attention_layernorm: bf16 grad_input"));
  s = RmsNormBackwardAdd("post_attention_layernorm", g, x, rms_rstd, w, y, gx, rgw,
                         core::Tensor::Zeros({n - 1}, core::DType::kBFloat16));
  EXPECT_THAT(std::string(s.message()), HasSubstr("post_attention_layernorm: bf16 grad_input"));
  s = RmsNormBackwardAdd("post_attention_layernorm", g, x, rms_rstd, w, y, gx,
                         core::Tensor::Zeros({cols + 1}));
  EXPECT_THAT(std::string(s.message()), HasSubstr("post_attention_layernorm: weight gradient"));
  // LayerNorm's ops need the mean: an undefined one is not taken for RMSNorm's.
  s = LayerNormBackward("ln_2", g, x, core::Tensor(), rstd, w, gx, core::Tensor(), core::Tensor());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("ln_2: mean is undefined"));
  s = LayerNormBackwardAdd("ln_2", g, x, core::Tensor(), rstd, w, y, gx, core::Tensor(),
                           core::Tensor());
  EXPECT_THAT(std::string(s.message()), HasSubstr("ln_2: mean is undefined"));
  s = LayerNormForward("ln_2", x, w, lb, 1e-5f, y, core::Tensor(), core::Tensor::Zeros({rows}));
  EXPECT_THAT(std::string(s.message()), HasSubstr("ln_2: mean is undefined"));
  // The forward's input: RMSNorm keeps x, not xhat, and grad_input must not be it.
  core::Tensor x_rms = x.Clone(core::MemoryTag::kOther);
  s = RmsNormBackward("input_layernorm", g, x_rms, rms_rstd, w, x_rms, rgw);
  EXPECT_THAT(std::string(s.message()), HasSubstr("input_layernorm: grad_input and input"));
  EXPECT_EQ(Bits(x_rms), Bits(x));
  EXPECT_EQ(gx.ToVector(), std::vector<float>(n, 0.0f));
  EXPECT_EQ(rgw.ToVector(), std::vector<float>(cols, 0.0f));
  // The backward reads its input after writing grad_input (the weight gradient's xhat).
  core::Tensor x_copy = x.Clone(core::MemoryTag::kOther);
  s = LayerNormBackward("ln_2", g, x_copy, mean, rstd, w, x_copy, core::Tensor(), core::Tensor());
  EXPECT_THAT(std::string(s.message()), HasSubstr("ln_2: grad_input and input"));
  EXPECT_EQ(Bits(x_copy), Bits(x));
}

// NOTE [Fused attention]: the fused ops run on the CPU too, for the same head widths as
// on CUDA; another width is FailedPrecondition naming it, a mis-shaped output or an fp32
// q, k, v InvalidArgument naming the tensor.
TEST(FusedAttentionTest, HeadWidthsShapesAndDTypesAreChecked) {
  EXPECT_TRUE(FusedAttentionSupported(core::Device::Cpu(), 64));
  EXPECT_TRUE(FusedAttentionSupported(core::Device::Cpu(), 128));
  EXPECT_FALSE(FusedAttentionSupported(core::Device::Cpu(), 32));
  const core::Tensor qkv = core::Tensor::Zeros({1, 4, 384}, core::DType::kBFloat16);
  const core::Tensor y = core::Tensor::Zeros({1, 4, 128});
  const core::Tensor lse = core::Tensor::Zeros({1, 2, 4});
  absl::Status s = FusedAttentionForward("attn", qkv, 4, 0.125f, y, core::Tensor::Zeros({1, 4, 4}));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("attn"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("head width 32"));
  s = FusedAttentionForward("attn", core::Tensor::Zeros({1, 4, 384}), 2, 0.125f, y, lse);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("q, k and v"));
  s = FusedAttentionForward("attn", qkv, 2, 0.125f, core::Tensor::Zeros({1, 4, 64}), lse);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("attention output"));
  s = FusedAttentionBackward("attn", qkv, y, core::Tensor::Zeros({1, 4, 128}), lse, lse, 2, 0.125f,
                             core::Tensor::Zeros({1, 4, 384}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("its gradient"));
  EXPECT_TRUE(FusedAttentionForward("attn", qkv, 2, 0.125f, y, lse).ok());
}

// NOTE [Fused attention]: a bf16 y or gqkv is the fp32 one rounded once, bit for bit (the
// rounding the consuming bf16 GEMM would do), and a bf16 y feeds the backward as stored.
TEST(FusedAttentionTest, Bf16OutputsAreTheFp32OutputsRoundedOnce) {
  const int64_t B = 2, T = 70, H = 2, hd = 64, C = H * hd;
  const float scale = 0.125f;
  const auto bf16 = [](const core::Tensor& t) {
    return t.ToDType(core::DType::kBFloat16, core::MemoryTag::kOther).value();
  };
  const core::Tensor qkv = bf16(Normal(B * T * 3 * C, 31).Reshape({B, T, 3 * C}).value());
  const core::Tensor gy = bf16(Normal(B * T * C, 32).Reshape({B, T, C}).value());
  const core::Tensor lse = core::Tensor::Zeros({B, H, T}), delta = core::Tensor::Zeros({B, H, T});
  core::Tensor y32 = core::Tensor::Zeros({B, T, C});
  core::Tensor y16 = core::Tensor::Zeros({B, T, C}, core::DType::kBFloat16);
  ASSERT_TRUE(FusedAttentionForward("attn", qkv, H, scale, y32, lse).ok());
  ASSERT_TRUE(FusedAttentionForward("attn", qkv, H, scale, y16, lse).ok());
  EXPECT_EQ(y16.ToVector(), bf16(y32).ToVector());

  core::Tensor g32 = core::Tensor::Zeros({B, T, 3 * C});
  core::Tensor g16 = core::Tensor::Zeros({B, T, 3 * C}, core::DType::kBFloat16);
  core::Tensor g32_from_y32 = core::Tensor::Zeros({B, T, 3 * C});
  ASSERT_TRUE(FusedAttentionBackward("attn", qkv, y16, gy, lse, delta, H, scale, g32).ok());
  ASSERT_TRUE(FusedAttentionBackward("attn", qkv, y16, gy, lse, delta, H, scale, g16).ok());
  EXPECT_EQ(g16.ToVector(), bf16(g32).ToVector());
  // The row sums <gy, y> read y as given: the rounded y moves the gradient a little.
  ASSERT_TRUE(
      FusedAttentionBackward("attn", qkv, y32, gy, lse, delta, H, scale, g32_from_y32).ok());
  EXPECT_NE(g32.ToVector(), g32_from_y32.ToVector());
  // An output of another dtype is refused, naming it.
  absl::Status s = FusedAttentionBackward("attn", qkv, y16, gy, lse, delta, H, scale,
                                          core::Tensor::Zeros({B, T, 3 * C}, core::DType::kInt32));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("q, k and v gradient"));
}

}  // namespace
}  // namespace nn
