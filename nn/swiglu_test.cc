#include "nn/swiglu.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "core/op_profile.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/tensor_ops.h"
#include "nn/testing/fused_layers.h"
#include "nn/testing/gradcheck.h"
#include "nn/to_device.h"

namespace nn {
namespace {

using ::testing::HasSubstr;

// out[r, :] = x[r, :] W^T for a row-major W [out, in], in double.
std::vector<double> Project(const std::vector<double>& x, const std::vector<float>& w, int64_t in,
                            int64_t out) {
  const int64_t rows = static_cast<int64_t>(x.size()) / in;
  std::vector<double> y(rows * out, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t i = 0; i < in; ++i) y[r * out + o] += x[r * in + i] * w[o * in + i];
    }
  }
  return y;
}

TEST(SwiGluMlpTest, ChildrenHaveHuggingFacesNamesAndNoBiases) {
  SwiGluMlp mlp(8, 20);
  std::vector<std::string> names;
  for (const auto& [name, p] : mlp.NamedParameters()) names.push_back(name);
  EXPECT_EQ(names,
            (std::vector<std::string>{"gate_proj.weight", "up_proj.weight", "down_proj.weight"}));
  EXPECT_EQ(mlp.gate_proj()->weight()->data.shape(), (core::Shape{20, 8}));
  EXPECT_EQ(mlp.down_proj()->weight()->data.shape(), (core::Shape{8, 20}));
  EXPECT_EQ(mlp.up_proj()->bias(), nullptr);
}

TEST(SwiGluMlpTest, ForwardIsDownOfSiluGateTimesUp) {
  SwiGluMlp mlp(6, 10, 3);
  gradcheck::RandomizeParameters(mlp, 4, 0.0f, 0.5f);
  const core::Tensor x = gradcheck::RandomTensor({2, 3, 6}, 5);
  absl::StatusOr<core::Tensor> y = mlp.Forward(x);
  ASSERT_TRUE(y.ok()) << y.status();
  const std::vector<float> xf = x.ToVector();
  const std::vector<double> xd(xf.begin(), xf.end());
  const std::vector<double> a = Project(xd, mlp.gate_proj()->weight()->data.ToVector(), 6, 10);
  const std::vector<double> b = Project(xd, mlp.up_proj()->weight()->data.ToVector(), 6, 10);
  std::vector<double> h(a.size());
  for (size_t i = 0; i < a.size(); ++i) h[i] = a[i] / (1.0 + std::exp(-a[i])) * b[i];
  const std::vector<double> want = Project(h, mlp.down_proj()->weight()->data.ToVector(), 10, 6);
  const std::vector<float> got = y->ToVector();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5) << i;
}

TEST(SwiGluMlpTest, BackwardMatchesFiniteDifferences) {
  SwiGluMlp mlp(6, 10, 3);
  gradcheck::RandomizeParameters(mlp, 6, 0.0f, 0.5f);
  absl::StatusOr<gradcheck::Report> r =
      gradcheck::CheckModule(mlp, gradcheck::RandomTensor({2, 3, 6}, 7), {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok()) << r->ToString();
  EXPECT_EQ(r->num_checked, 36 + 3 * 60);
  EXPECT_GT(r->max_abs_numeric, 0.5);
}

// NOTE [bf16 GEMMs] (nn/linear.h): with bf16 weights and no hooks on gate and up, x is
// rounded once for both, and they keep that one copy for their weight gradients; a hook on
// up makes each round x and keep its own. Both give the same bits (output, input gradient,
// every parameter gradient); the shared path runs one conversion fewer in the forward and
// holds exactly one bf16 copy of x fewer after it.
TEST(SwiGluMlpTest, GateAndUpShareOneBf16CopyOfTheirInput) {
  const int64_t C = 24, I = 40, rows = 7;
  SwiGluMlp mlp(C, I);
  gradcheck::RandomizeParameters(mlp, 31, 0.0f, 0.3f);
  ASSERT_TRUE(ConvertParameters(mlp, core::DType::kBFloat16).ok());
  const core::Tensor x = gradcheck::RandomTensor({rows, C}, 32);
  const core::Tensor gy = gradcheck::RandomTensor({rows, C}, 33);
  const fused_layers::HookComparison c =
      fused_layers::ExpectSameBitsWithHookOn(mlp, *mlp.up_proj(), x, gy);
  EXPECT_EQ(c.plain_cost.converts, 1);   // x once (down's input is stored bf16)
  EXPECT_EQ(c.hooked_cost.converts, 2);  // x by gate and by up
  const int64_t held_more =
      c.hooked_cost.held_activation_bytes - c.plain_cost.held_activation_bytes;
  EXPECT_EQ(held_more, rows * C * 2);
}

// NOTE [GEMM epilogues]: with bf16 weights, silu(gate) * up is stored bf16 for down_proj's
// GEMM, and its gradients bf16 for gate_proj's and up_proj's GEMMs, each the fp32 value
// rounded once as the projection would round it. A hook on a projection makes the op write
// that tensor fp32, rounded by the projection: the same bits, one conversion more (down's
// input in the forward; gate's or up's gradient in the backward, where down's grad_output
// is the one conversion left).
TEST(SwiGluMlpTest, TheProductAndItsGradientsReachTheProjectionsInBf16) {
  const int64_t C = 24, I = 40, rows = 7;
  SwiGluMlp mlp(C, I);
  gradcheck::RandomizeParameters(mlp, 34, 0.0f, 0.3f);
  ASSERT_TRUE(ConvertParameters(mlp, core::DType::kBFloat16).ok());
  const core::Tensor x = gradcheck::RandomTensor({rows, C}, 35);
  const core::Tensor gy = gradcheck::RandomTensor({rows, C}, 36);
  {
    SCOPED_TRACE("down_proj");
    const fused_layers::HookComparison c =
        fused_layers::ExpectSameBitsWithHookOn(mlp, *mlp.down_proj(), x, gy);
    EXPECT_EQ(c.plain_cost.converts, 1);      // x
    EXPECT_EQ(c.hooked_cost.converts, 2);     // x, then h by down_proj
    EXPECT_EQ(c.plain_backward_converts, 1);  // down's grad_output
    EXPECT_EQ(c.hooked_backward_converts, 1);
  }
  for (Linear* proj : {mlp.gate_proj().get(), mlp.up_proj().get()}) {
    SCOPED_TRACE(proj->Path());
    const fused_layers::HookComparison c =
        fused_layers::ExpectSameBitsWithHookOn(mlp, *proj, x, gy);
    EXPECT_EQ(c.plain_backward_converts, 1);
    EXPECT_EQ(c.hooked_backward_converts, 2);  // and the hooked projection's gradient
  }
}

// The ops take each output fp32 or bf16 (rounded once) and nothing else, naming it; a bf16
// output is half the bytes in the op's recorded cost (NOTE [Op accounting]).
TEST(SwiGluMlpTest, SiluMulOutputsAreFp32OrBf16) {
  const int64_t n = 35;
  const core::Tensor a = gradcheck::RandomTensor({5, 7}, 37);
  const core::Tensor b = gradcheck::RandomTensor({5, 7}, 38);
  const core::Tensor gh = gradcheck::RandomTensor({5, 7}, 39);
  auto make = [](core::DType dtype) {
    return core::Tensor::Zeros({5, 7}, dtype, core::MemoryTag::kActivation);
  };
  auto rounded = [](const core::Tensor& t) {
    return t.ToDType(core::DType::kBFloat16, core::MemoryTag::kOther).value().ToVector();
  };
  const core::Tensor h = make(core::DType::kFloat32), h16 = make(core::DType::kBFloat16);
  const core::Tensor ga = make(core::DType::kFloat32), gb = make(core::DType::kFloat32),
                     ga16 = make(core::DType::kBFloat16), gb16 = make(core::DType::kBFloat16);
  ASSERT_TRUE(SiluMulForward("swiglu_test", a, b, h).ok());
  ASSERT_TRUE(SiluMulBackward("swiglu_test", a, b, gh, ga, gb).ok());
  core::OpProfile profile;
  {
    core::ScopedOpProfile on(&profile);
    ASSERT_TRUE(SiluMulForward("swiglu_test", a, b, h16).ok());
    ASSERT_TRUE(SiluMulBackward("swiglu_test", a, b, gh, ga16, gb).ok());
  }
  const core::Tensor gb2 = make(core::DType::kBFloat16);
  ASSERT_TRUE(SiluMulBackward("swiglu_test", a, b, gh, ga, gb2).ok());
  EXPECT_EQ(h16.ToVector(), rounded(h));
  EXPECT_EQ(ga16.ToVector(), rounded(ga));
  EXPECT_EQ(gb2.ToVector(), rounded(gb));
  ASSERT_EQ(profile.records().size(), 2u);
  EXPECT_EQ(profile.records()[0].cost.bytes, (4 + 4 + 2) * n);          // a, b; h
  EXPECT_EQ(profile.records()[1].cost.bytes, (4 + 4 + 4 + 2 + 4) * n);  // a, b, gh; ga, gb
  const core::Tensor ints = make(core::DType::kInt32);
  for (const auto& [st, name] :
       {std::make_pair(SiluMulForward("swiglu_test", a, b, ints), "output"),
        std::make_pair(SiluMulBackward("swiglu_test", a, b, gh, ints, gb16), "gate gradient"),
        std::make_pair(SiluMulBackward("swiglu_test", a, b, gh, ga16, ints), "up gradient")}) {
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(std::string(st.message()),
                HasSubstr(std::string(name) + " must be float32 or bfloat16"));
  }
  EXPECT_EQ(SiluMulForward("swiglu_test", h16, b, h).code(), absl::StatusCode::kInvalidArgument);
  // One tensor passed as an input and an output, or as both outputs, is refused by name
  // (the loops assume they do not overlap).
  core::Tensor a_copy = a.ToDType(core::DType::kFloat32, core::MemoryTag::kActivation).value();
  for (const auto& [st, names] :
       {std::make_pair(SiluMulForward("swiglu_test", a_copy, b, a_copy), "output and gate"),
        std::make_pair(SiluMulBackward("swiglu_test", a, b, gh, ga, ga),
                       "gate gradient and up gradient")}) {
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << names;
    EXPECT_THAT(std::string(st.message()), HasSubstr(std::string(names) + " must be different"));
  }
}

TEST(SwiGluMlpTest, BadSizesAndCallOrderAreReported) {
  SwiGluMlp bad(4, 0);
  absl::StatusOr<core::Tensor> y = bad.Forward(core::Tensor::Zeros({2, 4}));
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(y.status().message()), HasSubstr("intermediate must be positive"));
  SwiGluMlp mlp(4, 8);
  EXPECT_EQ(mlp.Backward(core::Tensor::Zeros({2, 4})).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(mlp.Forward(core::Tensor::Zeros({2, 4})).ok());
  mlp.DropActivations();
  EXPECT_EQ(mlp.Backward(core::Tensor::Zeros({2, 4})).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// Inline, up's input gradient adds gate's in the epilogue of its GEMM (F::SwiGlu); a hook on
// up_proj makes the layer call both projections and the engine sum their input gradients
// ("grad.add"): the same bits, with fp32 and bf16 weights.
TEST(SwiGluMlpTest, TheInputGradientsAddInTheGemms) {
  const int64_t C = 24, I = 40, rows = 7;
  for (core::DType dtype : {core::DType::kFloat32, core::DType::kBFloat16}) {
    SCOPED_TRACE(core::DTypeName(dtype));
    SwiGluMlp mlp(C, I);
    gradcheck::RandomizeParameters(mlp, 31, 0.0f, 0.3f);
    ASSERT_TRUE(ConvertParameters(mlp, dtype).ok());
    const core::Tensor x = gradcheck::RandomTensor({rows, C}, 32);
    const core::Tensor gy = gradcheck::RandomTensor({rows, C}, 33);
    const fused_layers::HookComparison c =
        fused_layers::ExpectSameBitsWithHookOn(mlp, *mlp.up_proj(), x, gy);
    EXPECT_EQ(c.MoreOpsWithHook("grad.add"), 1);
  }
}

}  // namespace
}  // namespace nn
