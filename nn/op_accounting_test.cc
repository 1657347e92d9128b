// NOTE [Op accounting] (core/op_profile.h): the nn ops record the op list their CUDA path
// runs, with FLOPs and bytes from the shapes, on the CPU as on the GPU.
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/op_profile.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "nn/attention.h"
#include "nn/embedding.h"
#include "nn/linear.h"
#include "nn/tensor_ops.h"
#include "nn/to_device.h"
#include "nn/transformer.h"

namespace nn {
namespace {

using core::OpCategory;
using core::OpEngine;
using core::OpRecord;

core::Tensor Filled(const core::Shape& shape, float start) {
  std::vector<float> v(static_cast<size_t>(core::NumElements(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = start + 0.01f * static_cast<float>(i % 17);
  absl::StatusOr<core::Tensor> t = core::Tensor::FromVector(v, shape);
  EXPECT_TRUE(t.ok()) << t.status();
  return *t;
}

// Converts `m`'s parameters to bf16, then records one Forward and Backward of an input of
// `shape` into `profile`.
void ProfileBf16Step(core::Module& m, const core::Shape& shape, core::OpProfile* profile) {
  ASSERT_TRUE(ConvertParameters(m, core::DType::kBFloat16).ok());
  core::ScopedOpProfile on(profile);
  ASSERT_TRUE(m.Forward(Filled(shape, 0.0f)).ok());
  ASSERT_TRUE(m.Backward(Filled(shape, 0.1f)).ok());
}

// The fused bf16 block the block tests profile: B = 1, T = 8, two heads of 64.
constexpr int64_t kBlockB = 1, kBlockT = 8, kBlockH = 2, kBlockC = 64 * kBlockH;

// One Forward and Backward of that block, converted to bf16 (ProfileBf16Step).
std::vector<OpRecord> Bf16BlockStepRecords() {
  TransformerBlock block(kBlockC, kBlockH, 5);
  core::OpProfile profile;
  ProfileBf16Step(block, {kBlockB, kBlockT, kBlockC}, &profile);
  return profile.records();
}

std::vector<std::string> Names(const std::vector<OpRecord>& records) {
  std::vector<std::string> out;
  for (const OpRecord& r : records) out.push_back(r.name);
  return out;
}

TEST(OpAccountingTest, LinearRecordsItsThreeGemmsByRoleWithTheirFlops) {
  const int64_t R = 5, in = 8, out = 6;
  Linear fc(in, out, /*bias=*/true, 3);
  core::OpProfile profile;
  {
    core::ScopedOpProfile on(&profile);
    absl::StatusOr<core::Tensor> y = fc.Forward(Filled({R, in}, 0.1f));
    ASSERT_TRUE(y.ok()) << y.status();
    ASSERT_TRUE(fc.Backward(Filled({R, out}, -0.2f)).ok());
  }
  const std::vector<OpRecord>& r = profile.records();
  // The first backward creates the weight's and the bias's gradients, zeroed, before the
  // weight gradient's GEMM adds into them (with fp32 operands the bias gradient is a
  // column-sums op after it: NOTE [GEMM epilogues]). The bias rides in the forward GEMM's
  // epilogue: no op of its own.
  ASSERT_EQ(Names(r), (std::vector<std::string>{"matmul", "matmul", "zero", "zero", "matmul",
                                                "column_sums"}));
  EXPECT_EQ(r[0].category, OpCategory::kGemmForward);
  EXPECT_EQ(r[1].category, OpCategory::kGemmInputGrad);
  EXPECT_EQ(r[4].category, OpCategory::kGemmWeightGrad);
  for (int i : {0, 1, 4}) {
    // The forward also adds the bias: one more operation per output element.
    EXPECT_EQ(r[i].cost.flops, 2.0 * R * in * out + (i == 0 ? R * out : 0)) << i;
    EXPECT_EQ(r[i].cost.engine, OpEngine::kSimtFp32) << i;  // fp32 operands
  }
  // y = x W^T + b: reads x, W and b, writes y.
  EXPECT_EQ(r[0].cost.bytes, 4.0 * (R * in + in * out + R * out + out));
  // dW += g^T x (beta 1): also reads dW.
  EXPECT_EQ(r[4].cost.bytes, 4.0 * (R * out + R * in + 2 * in * out));
  EXPECT_EQ(r[2].category, OpCategory::kElementwise);
  EXPECT_EQ(r[3].category, OpCategory::kElementwise);
  EXPECT_EQ(r[5].category, OpCategory::kElementwise);
  // Each GEMM records its problem (the report's per-shape table): y [R x out] = x [R x in]
  // W^T; dx [R x in] = g [R x out] W; dW [out x in] = g^T x over R. Other ops record none.
  const auto shape = [](const OpRecord& o) {
    return std::vector<int64_t>{o.gemm.batch, o.gemm.m, o.gemm.n, o.gemm.k};
  };
  EXPECT_EQ(shape(r[0]), (std::vector<int64_t>{1, R, out, in}));
  EXPECT_EQ(shape(r[1]), (std::vector<int64_t>{1, R, in, out}));
  EXPECT_EQ(shape(r[4]), (std::vector<int64_t>{1, out, in, R}));
  EXPECT_EQ(shape(r[2]), (std::vector<int64_t>{0, 0, 0, 0}));
  EXPECT_EQ(shape(r[3]), (std::vector<int64_t>{0, 0, 0, 0}));
  EXPECT_EQ(shape(r[5]), (std::vector<int64_t>{0, 0, 0, 0}));
}

TEST(OpAccountingTest, ABf16WeightRunsOnTensorCoresAfterRoundingTheActivation) {
  const int64_t R = 4, in = 8, out = 3;
  absl::StatusOr<core::Tensor> w =
      Filled({out, in}, 0.3f).ToDType(core::DType::kBFloat16, core::MemoryTag::kParam);
  ASSERT_TRUE(w.ok()) << w.status();
  absl::StatusOr<core::Tensor> y = core::Tensor::Allocate({R, out});
  ASSERT_TRUE(y.ok());
  GemmArgs g;
  g.trans_b = true;
  g.m = R;
  g.n = out;
  g.k = in;
  g.a.tensor = Filled({R, in}, 0.5f);
  g.b.tensor = *w;
  g.c.tensor = *y;
  core::OpProfile profile;
  {
    core::ScopedOpProfile on(&profile);
    ASSERT_TRUE(MatMul("test", g).ok());
  }
  const std::vector<OpRecord>& r = profile.records();
  ASSERT_EQ(Names(r), (std::vector<std::string>{"gemm.round_operand", "matmul"}));
  EXPECT_EQ(r[0].category, OpCategory::kConvert);
  EXPECT_EQ(r[0].cost.bytes, 6.0 * R * in);  // x read as fp32, written as bf16
  EXPECT_EQ(r[1].cost.engine, OpEngine::kTensorCoreBf16);
  EXPECT_EQ(r[1].cost.bytes, 2.0 * (R * in + in * out) + 4.0 * R * out);
}

TEST(OpAccountingTest, AttentionCountsItsScoreGemmsAndSoftmaxApartFromItsLinears) {
  const int64_t B = 2, T = 4, C = 8, H = 2, hd = C / H;
  CausalSelfAttention attn(C, H, 5);
  core::OpProfile profile;
  {
    core::ScopedOpProfile on(&profile);
    ASSERT_TRUE(attn.Forward(Filled({B, T, C}, 0.0f)).ok());
    ASSERT_TRUE(attn.Backward(Filled({B, T, C}, 0.1f)).ok());
  }
  const std::vector<core::OpCategoryTotal> totals = profile.Totals();
  const core::OpCategoryTotal& a = totals[static_cast<int>(OpCategory::kAttention)];
  // Forward: B score GEMMs, one softmax, B value GEMMs. Backward: per batch element four
  // GEMMs and a softmax backward.
  EXPECT_EQ(a.ops, 2 * B + 1 + 5 * B);
  // Every attention GEMM is 2 T T hd FLOPs per head (masked entries computed too).
  EXPECT_EQ(
      a.flops -
          [&] {
            double softmax = 0;
            for (const OpRecord& r : profile.records()) {
              if (r.name.rfind("causal_softmax", 0) == 0) softmax += r.cost.flops;
            }
            return softmax;
          }(),
      6.0 * B * 2.0 * H * T * T * hd);
  // qkv and proj: one forward GEMM each, and their gradient GEMMs.
  EXPECT_EQ(totals[static_cast<int>(OpCategory::kGemmForward)].ops, 2);
  EXPECT_EQ(totals[static_cast<int>(OpCategory::kGemmInputGrad)].ops, 2);
  EXPECT_EQ(totals[static_cast<int>(OpCategory::kGemmWeightGrad)].ops, 2);
}

TEST(OpAccountingTest, ABf16AttentionRunsEveryGemmOnTensorCoresWithoutRoundingPasses) {
  // NOTE [bf16 attention]: q, k, v and the heads' gradient are stored bf16 by the GEMMs
  // that make them, the softmax ops write bf16, and no attention GEMM rounds an operand
  // itself.
  const int64_t B = 2, T = 4, C = 8, H = 2;
  CausalSelfAttention attn(C, H, 5);
  core::OpProfile profile;
  ProfileBf16Step(attn, {B, T, C}, &profile);
  int gemms = 0, converts = 0, widened = 0;
  for (const OpRecord& r : profile.records()) {
    if (r.category == OpCategory::kAttention && r.name == "matmul") {
      ++gemms;
      EXPECT_EQ(r.cost.engine, OpEngine::kTensorCoreBf16);
    }
    if (r.category == OpCategory::kConvert) ++(r.name == "gemm.widen_bias" ? widened : converts);
  }
  EXPECT_EQ(gemms, 6 * B);
  // The Linears round their own inputs and grad_outputs (qkv, proj: 2 each). q, k, v and
  // the heads' gradient need no pass: qkv's forward GEMM and proj's input-gradient GEMM
  // store them bf16 (NOTE [GEMM epilogues]). proj's bf16 bias is widened for its fp32
  // output (cuBLASLt's bias has D's type).
  EXPECT_EQ(converts, 2 + 2);
  EXPECT_EQ(widened, 1);
  for (const OpRecord& r : profile.records()) {
    EXPECT_NE(r.name, "gemm.round_operand");
  }
}

// NOTE [GEMM epilogues]: in a bf16 block every GEMM operand that a LayerNorm, a GEMM or
// the GELU produces is stored bf16 by its producer. What is still rounded by a pass of its
// own: the attention output (the unfused core's value product writes fp32), the
// residual-stream gradient entering mlp.proj, and the q, k, v gradient. The one entering
// attention's proj comes bf16 out of ln_2's backward (NOTE [Block forwards]), in its pass.
TEST(OpAccountingTest, ABf16BlockRoundsOnlyWhatNoProducerStoresBf16) {
  const int64_t B = 2, T = 4, C = 8, H = 2;
  TransformerBlock block(C, H, 5);
  core::OpProfile profile;
  ProfileBf16Step(block, {B, T, C}, &profile);
  int converts = 0, widened = 0;
  for (const OpRecord& r : profile.records()) {
    if (r.category == OpCategory::kConvert) ++(r.name == "gemm.widen_bias" ? widened : converts);
    EXPECT_NE(r.name, "bias_add");
    EXPECT_NE(r.name, "gelu.forward");
    EXPECT_NE(r.name, "gelu.backward");
  }
  EXPECT_EQ(converts, 1 + 1 + 1);
  EXPECT_EQ(widened, 2);  // the projections' bf16 biases, for their fp32 outputs
}

// NOTE [Fused attention] at GPT-2's head width: the fused kernels store the attention
// output for proj's GEMM and the q, k, v gradient for qkv's GEMMs in bf16, and ln_2's
// backward writes the residual-stream gradient entering attention's proj in bf16 too, so
// the only rounding pass left in a bf16 block is the gradient entering mlp.proj (the
// block's incoming gradient). ln_2's backward writes 2 bytes an element more for it.
TEST(OpAccountingTest, AFusedBf16BlockRoundsOnlyTheResidualGradientItReceives) {
  const double n = static_cast<double>(kBlockB) * kBlockT * kBlockC;
  int converts = 0, widened = 0, fused = 0;
  std::vector<double> backward_add_bytes;
  for (const OpRecord& r : Bf16BlockStepRecords()) {
    if (r.category == OpCategory::kConvert) ++(r.name == "gemm.widen_bias" ? widened : converts);
    fused += r.name.rfind("fused_attention", 0) == 0;
    if (r.name == "layernorm.backward_add") backward_add_bytes.push_back(r.cost.bytes);
  }
  EXPECT_EQ(fused, 2);
  EXPECT_EQ(converts, 1);
  ASSERT_EQ(backward_add_bytes.size(), 2u);  // ln_2's, then ln_1's
  EXPECT_EQ(backward_add_bytes[0] - backward_add_bytes[1], 2.0 * n);
  EXPECT_EQ(widened, 2);  // the projections' bf16 biases, for their fp32 outputs
}

// NOTE [GEMM epilogues]: under bf16 weights every Linear of a fused block sums its bias
// gradient in its weight gradient's GEMM (an add of the sums, no column-sums pass); the
// GEMM writes the out sums too.
TEST(OpAccountingTest, ABf16BlockSumsItsBiasGradientsInTheWeightGradientGemms) {
  int column_sums = 0, weight_grads = 0, adds_after_weight_grads = 0;
  const std::vector<OpRecord> r = Bf16BlockStepRecords();
  for (size_t i = 0; i < r.size(); ++i) {
    // The LayerNorms' parameter gradients are their own kernel's (category kNorm).
    column_sums += r[i].name == "column_sums";
    if (r[i].category != OpCategory::kGemmWeightGrad) continue;
    ++weight_grads;
    const double m = r[i].gemm.m, n = r[i].gemm.n, k = r[i].gemm.k;
    EXPECT_EQ(r[i].cost.bytes, 2.0 * (m * k + k * n) + 8.0 * m * n + 4.0 * m) << i;
    ASSERT_LT(i + 1, r.size());
    if (r[i + 1].name == "add" && r[i + 1].cost.bytes == 12.0 * m) ++adds_after_weight_grads;
  }
  EXPECT_EQ(column_sums, 0);
  EXPECT_EQ(weight_grads, 4);  // qkv, attention's proj, fc, the MLP's proj
  EXPECT_EQ(adds_after_weight_grads, 4);
}

// NOTE [Block forwards]: both residual adds of a block come out of the GEMMs before them
// (the bias + residual epilogue, which reads the residual): h = x + attn(ln_1(x)) out of
// attention's proj, y = h + mlp(ln_2(h)) out of the MLP's proj; no add of their own.
TEST(OpAccountingTest, AFusedBlockAddsItsResidualsInTheProjectionGemms) {
  const int64_t B = kBlockB, T = kBlockT, C = kBlockC;
  int residual_gemms = 0;
  for (const OpRecord& r : Bf16BlockStepRecords()) {
    EXPECT_FALSE(r.name == "add" && r.cost.bytes == 12.0 * B * T * C) << "a full-size add";
    EXPECT_NE(r.name, "add_layernorm.forward");
    // A proj [B T, k] x [k, C]^T with k = C or 4C; reads x, W, the bias (widened to fp32
    // from the gathered bf16: cuBLASLt's bias has D's type) and the residual, writes fp32 C.
    const double k = r.gemm.k;
    if (r.category == OpCategory::kGemmForward && r.gemm.n == C && (k == C || k == 4 * C) &&
        r.cost.bytes == 2.0 * (B * T * k + k * C) + 4.0 * C + 8.0 * B * T * C) {
      ++residual_gemms;
    }
  }
  EXPECT_EQ(residual_gemms, 2);
}

// NOTE [Fused ops]: a fused op is one kernel on every device; it records one op that
// reads one tensor fewer than the unfused pair.
TEST(OpAccountingTest, AFusedOpRecordsOneKernelReadingOneTensorFewer) {
  const int64_t rows = 3, cols = 8, n = rows * cols;
  const core::Tensor x = Filled({rows, cols}, 0.2f);
  const core::Tensor y = Filled({rows, cols}, -0.1f);
  // Residual + LayerNorm: one kernel that reads a and b once, against an add then a norm.
  const core::Tensor w = Filled({cols}, 1.0f), b = Filled({cols}, 0.0f);
  core::Tensor h = core::Tensor::Zeros({rows, cols}), out = core::Tensor::Zeros({rows, cols});
  core::Tensor mean = core::Tensor::Zeros({rows}), rstd = core::Tensor::Zeros({rows});
  core::OpProfile add_norm, add_then_norm;
  {
    core::ScopedOpProfile on(&add_norm);
    ASSERT_TRUE(AddLayerNormForward("test", x, y, w, b, 1e-5f, h, out, mean, rstd).ok());
  }
  {
    core::ScopedOpProfile on(&add_then_norm);
    ASSERT_TRUE(AddTensors("test", x, y, h).ok());
    ASSERT_TRUE(LayerNormForward("test", h, w, b, 1e-5f, out, mean, rstd).ok());
  }
  ASSERT_EQ(Names(add_norm.records()), (std::vector<std::string>{"add_layernorm.forward"}));
  EXPECT_EQ(add_norm.records()[0].category, OpCategory::kNorm);
  EXPECT_EQ(add_norm.records()[0].cost.bytes, add_then_norm.records()[0].cost.bytes +
                                                  add_then_norm.records()[1].cost.bytes -
                                                  4.0 * n);  // h is not re-read
}

// RMSNorm's backward + residual: one kernel that writes the sum, against the backward
// writing gx and an add reading it back (its bf16 copy: 2 bytes an element more).
TEST(OpAccountingTest, RmsNormBackwardAddRecordsOneKernelWithoutTheIntermediateGradient) {
  const int64_t rows = 3, cols = 8, n = rows * cols;
  const core::Tensor g = Filled({rows, cols}, 0.2f), x = Filled({rows, cols}, -0.1f);
  const core::Tensor residual = Filled({rows, cols}, 0.3f);
  const core::Tensor rstd = Filled({rows}, 1.0f), w = Filled({cols}, 1.0f);
  core::Tensor gx = core::Tensor::Zeros({rows, cols}), sum = core::Tensor::Zeros({rows, cols});
  core::Tensor gx16 = core::Tensor::Zeros({rows, cols}, core::DType::kBFloat16);
  core::OpProfile fused, fused16, unfused;
  {
    core::ScopedOpProfile on(&fused);
    ASSERT_TRUE(RmsNormBackwardAdd("test", g, x, rstd, w, residual, sum, core::Tensor()).ok());
  }
  {
    core::ScopedOpProfile on(&fused16);
    ASSERT_TRUE(
        RmsNormBackwardAdd("test", g, x, rstd, w, residual, sum, core::Tensor(), gx16).ok());
  }
  {
    core::ScopedOpProfile on(&unfused);
    ASSERT_TRUE(RmsNormBackward("test", g, x, rstd, w, gx, core::Tensor()).ok());
    ASSERT_TRUE(AddTensors("test", residual, gx, sum).ok());
  }
  ASSERT_EQ(Names(fused.records()), (std::vector<std::string>{"rmsnorm.backward_add"}));
  ASSERT_EQ(Names(unfused.records()), (std::vector<std::string>{"rmsnorm.backward", "add"}));
  const core::OpCost& c = fused.records()[0].cost;
  EXPECT_EQ(fused.records()[0].category, OpCategory::kNorm);
  EXPECT_EQ(c.launches, 1);
  // g, x, residual, gx; rstd per row; w.
  EXPECT_EQ(c.bytes, 16.0 * n + 4.0 * rows + 4.0 * cols);
  EXPECT_EQ(c.bytes, unfused.records()[0].cost.bytes + unfused.records()[1].cost.bytes -
                         8.0 * n);  // gx is not written and read back
  EXPECT_EQ(fused16.records()[0].cost.bytes - c.bytes, 2.0 * n);
}

// LayerNorm's backward takes its weight and bias gradients in the pass that computes the
// input gradient (kernels::LayerNormGradWarps), and RMSNorm's its weight gradient: they add
// bytes per column and per block, not another read of g and x, and one launch each that adds
// the blocks' sums. Rows too wide for a warp's sums in shared memory (LayerNorm's two sums
// past 6144 columns, RMSNorm's one past 12288) take the column sums' own kernels, after a
// kernel that makes xhat from x (the sums read g and xhat again).
TEST(OpAccountingTest, NormBackwardsReadTheirInputsOnceForTheParameterGradients) {
  for (const bool rms : {false, true}) {
    for (const auto& [rows, cols, fused] : std::vector<std::tuple<int64_t, int64_t, bool>>{
             {2048, 768, true}, {64, 6200, rms}, {64, 12300, false}}) {
      SCOPED_TRACE(absl::StrCat(rms ? "RMSNorm " : "LayerNorm ", rows, " x ", cols));
      const double n = static_cast<double>(rows) * cols;
      const core::Tensor g = Filled({rows, cols}, 0.3f), x = Filled({rows, cols}, -0.2f);
      const core::Tensor residual = Filled({rows, cols}, 0.1f);
      const core::Tensor mean = Filled({rows}, 0.0f), rstd = Filled({rows}, 1.0f);
      const core::Tensor w = Filled({cols}, 1.0f);
      core::Tensor gx = core::Tensor::Zeros({rows, cols});
      core::Tensor gw = core::Tensor::Zeros({cols}), gb = core::Tensor::Zeros({cols});
      const auto run = [&](bool grads) {
        return rms ? RmsNormBackwardAdd("norm", g, x, rstd, w, residual, gx,
                                        grads ? gw : core::Tensor())
                   : LayerNormBackwardAdd("norm", g, x, mean, rstd, w, residual, gx,
                                          grads ? gw : core::Tensor(), grads ? gb : core::Tensor());
      };
      core::OpProfile both, input_only;
      {
        core::ScopedOpProfile on(&both);
        ASSERT_TRUE(run(true).ok());
      }
      {
        core::ScopedOpProfile on(&input_only);
        ASSERT_TRUE(run(false).ok());
      }
      ASSERT_EQ(Names(both.records()), (std::vector<std::string>{rms ? "rmsnorm.backward_add"
                                                                     : "layernorm.backward_add"}));
      const core::OpCost& c = both.records()[0].cost;
      const core::OpCost& base = input_only.records()[0].cost;
      const int grads = rms ? 1 : 2;
      EXPECT_EQ(base.launches, 1);
      // g, x, residual, gx; mean (LayerNorm) and rstd per row; w.
      EXPECT_EQ(base.bytes, 16.0 * n + (rms ? 4.0 : 8.0) * rows + 4.0 * cols);
      if (fused) {
        // The pass, then one adding the blocks' sums per gradient.
        EXPECT_EQ(c.launches, 1 + grads);
        // Under one read of g (the column sums' own kernels below read g and x again, and
        // write and read xhat): the blocks' partial sums and the gradients...
        EXPECT_LT(c.bytes - base.bytes, 4.0 * n);
        // ...and under a quarter of it where the rows are many (the blocks capped at 528; a
        // one-warp block of 6200 columns sums only 4 rows).
        if (rows >= 2048) EXPECT_LT(c.bytes - base.bytes, 0.25 * 4.0 * n);
      } else {
        // The input gradient, xhat from x, then one column sum per gradient.
        EXPECT_EQ(c.launches, 2 + grads);
        // x read, xhat written; g * xhat (then g).
        EXPECT_GE(c.bytes - base.bytes, (rms ? 16.0 : 20.0) * n);
      }
    }
  }
}

// NOTE [GEMM epilogues]: an epilogue's operands are device-memory bytes of the GEMM that
// runs it: its bias, and its aux (read, or written by kBiasGelu) of C's size and dtype.
TEST(OpAccountingTest, AGemmEpilogueAddsItsBiasAndAuxBytesToTheGemm) {
  const int64_t m = 4, n = 8, k = 16;
  struct Case {
    GemmEpilogue epilogue;
    bool bias, aux;
  };
  for (const core::DType c_dtype : {core::DType::kFloat32, core::DType::kBFloat16}) {
    const double c_size = core::DTypeSize(c_dtype);
    double plain_bytes = -1;
    for (const Case& c :
         {Case{GemmEpilogue::kNone, false, false}, Case{GemmEpilogue::kBias, true, false},
          Case{GemmEpilogue::kBiasGelu, true, true}, Case{GemmEpilogue::kDGelu, false, true},
          Case{GemmEpilogue::kBiasResidual, true, true},
          Case{GemmEpilogue::kResidual, false, true}}) {
      // The residual epilogues take an fp32 C only.
      if (c_dtype == core::DType::kBFloat16 &&
          (c.epilogue == GemmEpilogue::kBiasResidual || c.epilogue == GemmEpilogue::kResidual)) {
        continue;
      }
      GemmArgs g;
      g.trans_b = true;
      g.m = m;
      g.n = n;
      g.k = k;
      g.a.tensor = Filled({m, k}, 0.1f);
      g.b.tensor = Filled({n, k}, 0.2f);
      g.c.tensor = core::Tensor::Zeros({m * n}, c_dtype);
      g.epilogue = c.epilogue;
      if (c.bias) g.bias = Filled({n}, 0.3f);
      if (c.aux) g.aux = core::Tensor::Zeros({m * n}, c_dtype);
      core::OpProfile profile;
      {
        core::ScopedOpProfile on(&profile);
        absl::Status s = MatMul("test", g);
        ASSERT_TRUE(s.ok()) << s;
      }
      ASSERT_EQ(profile.records().size(), 1u);
      const double bytes = profile.records()[0].cost.bytes;
      if (c.epilogue == GemmEpilogue::kNone) {
        plain_bytes = bytes;
        continue;
      }
      EXPECT_EQ(bytes - plain_bytes, (c.bias ? 4.0 * n : 0.0) + (c.aux ? c_size * m * n : 0.0))
          << static_cast<int>(c.epilogue) << " " << core::DTypeName(c_dtype);
    }
  }
}

// NOTE [Op accounting]: the fused attention records what its kernels execute: each tile
// pair's products and exponentials, the diagonal tiles whole, and its inputs and outputs
// once each (the K and V tiles streamed again for every query tile come from shared memory
// and L2). Doubling T from 2 to 4 tiles takes the pairs from 3 to 10 and the bytes x 2.
TEST(OpAccountingTest, FusedAttentionCountsItsTilePairsButReadsItsInputsOnce) {
  const int64_t B = 1, H = 1, hd = 64, C = H * hd;
  const auto record = [&](int64_t T) {
    core::OpProfile profile;
    absl::StatusOr<core::Tensor> qkv =
        Filled({B, T, 3 * C}, -0.3f).ToDType(core::DType::kBFloat16, core::MemoryTag::kActivation);
    absl::StatusOr<core::Tensor> gy =
        Filled({B, T, C}, 0.2f).ToDType(core::DType::kBFloat16, core::MemoryTag::kActivation);
    EXPECT_TRUE(qkv.ok() && gy.ok());
    const core::Tensor y = core::Tensor::Zeros({B, T, C}),
                       gqkv = core::Tensor::Zeros({B, T, 3 * C});
    const core::Tensor lse = core::Tensor::Zeros({B, H, T}), delta = core::Tensor::Zeros({B, H, T});
    core::ScopedOpProfile on(&profile);
    EXPECT_TRUE(FusedAttentionForward("test", *qkv, H, 0.125f, y, lse).ok());
    EXPECT_TRUE(FusedAttentionBackward("test", *qkv, y, *gy, lse, delta, H, 0.125f, gqkv).ok());
    return profile.records();
  };
  const std::vector<OpRecord> two = record(128), four = record(256);
  ASSERT_EQ(Names(two),
            (std::vector<std::string>{"fused_attention.forward", "fused_attention.backward"}));
  ASSERT_EQ(Names(four), Names(two));
  const double tile = 2.0 * 64 * 64 * hd;
  EXPECT_EQ(two[0].cost.flops, 3 * 2 * tile);         // S = Q K^T and P V for each of 3 pairs
  EXPECT_EQ(two[1].cost.flops, 3 * 7 * tile);         // S and dP twice, dV, dK, dQ
  EXPECT_EQ(two[0].cost.exps, 3 * (64.0 * 64 + 64));  // P, and each row's rescale
  EXPECT_EQ(two[1].cost.exps, 3 * 2 * 64.0 * 64);     // P again in both tile kernels
  for (int i : {0, 1}) {
    EXPECT_EQ(two[i].cost.engine, OpEngine::kTensorCoreMma) << i;
    EXPECT_DOUBLE_EQ(four[i].cost.flops / two[i].cost.flops, 10.0 / 3.0) << i;
    EXPECT_DOUBLE_EQ(four[i].cost.exps / two[i].cost.exps, 10.0 / 3.0) << i;
    EXPECT_DOUBLE_EQ(four[i].cost.bytes / two[i].cost.bytes, 2.0) << i;
  }
  // The forward reads q, k and v and writes y (fp32) and lse, each once.
  EXPECT_EQ(two[0].cost.bytes, 128 * (3 * C * 2 + C * 4 + 4.0 * H));
}

// NOTE [Index uploads]: the embedding's copy of its ids to the table's device is, on CUDA,
// a synchronous upload: a host sync, recorded on the CPU too, and no device copy.
TEST(OpAccountingTest, AnEmbeddingsIdUploadIsAHostSyncOnEveryDevice) {
  Embedding wte(10, 4, 1);
  absl::StatusOr<core::Tensor> ids = core::Tensor::FromInts({1, 2, 3}, {3});
  ASSERT_TRUE(ids.ok());
  core::OpProfile profile;
  {
    core::ScopedOpProfile on(&profile);
    ASSERT_TRUE(wte.Forward(*ids).ok());
  }
  const std::vector<OpRecord>& r = profile.records();
  ASSERT_EQ(Names(r), (std::vector<std::string>{"copy", "embedding.forward"}));
  EXPECT_EQ(r[0].category, OpCategory::kHostSync);
  EXPECT_EQ(r[0].cost.engine, OpEngine::kHostSync);
  EXPECT_EQ(r[0].cost.bytes, 2 * 3 * 4.0);  // read on the host, written on the device
  EXPECT_EQ(r[0].cost.launches, 0);
}

}  // namespace
}  // namespace nn
