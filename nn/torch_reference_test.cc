// Our Gpt and Llama against PyTorch: transformers' GPT2LMHeadModel and LlamaForCausalLM
// (eager attention) run in float64 from the same fp32 weights (nn/testdata/torch_ref,
// written by tools/torch_ref/reference.py, which says what each file holds). For each
// configuration our fp32 CPU model gives the mean cross-entropy within 1e-7 of the float64
// loss, relative, and every parameter gradient within 1e-5 of the largest magnitude of
// that tensor's float64 gradient (max |ours - reference| / max |reference|). The figures
// are printed.
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"
#include "nn/gpt.h"
#include "nn/llama.h"
#include "nn/tensor_ops.h"
#include "nn/testing/torch_reference.h"

namespace nn {
namespace {

using torch_ref::ReferenceFile;
using torch_ref::ReferenceTensor;

constexpr double kLossRel = 1e-7;
constexpr double kGradRatio = 1e-5;
const char kDir[] = "nn/testdata/torch_ref/";

// The model the file's metadata describes, with default (unused) weights.
absl::StatusOr<std::shared_ptr<core::Module>> MakeModel(const ReferenceFile& f) {
  ASSIGN_OR_RETURN(const std::string kind, f.Field("model"));
  if (kind == "gpt") {
    GptConfig c;
    ASSIGN_OR_RETURN(c.vocab_size, f.Int("vocab_size"));
    ASSIGN_OR_RETURN(c.block_size, f.Int("block_size"));
    ASSIGN_OR_RETURN(c.n_embd, f.Int("n_embd"));
    ASSIGN_OR_RETURN(c.n_layer, f.Int("n_layer"));
    ASSIGN_OR_RETURN(c.n_head, f.Int("n_head"));
    return Gpt::Create(c);
  }
  LlamaConfig c;
  ASSIGN_OR_RETURN(c.vocab_size, f.Int("vocab_size"));
  ASSIGN_OR_RETURN(c.hidden_size, f.Int("hidden_size"));
  ASSIGN_OR_RETURN(c.intermediate_size, f.Int("intermediate_size"));
  ASSIGN_OR_RETURN(c.num_hidden_layers, f.Int("num_hidden_layers"));
  ASSIGN_OR_RETURN(c.num_attention_heads, f.Int("num_attention_heads"));
  ASSIGN_OR_RETURN(c.num_key_value_heads, f.Int("num_key_value_heads"));
  ASSIGN_OR_RETURN(c.max_position_embeddings, f.Int("max_position_embeddings"));
  ASSIGN_OR_RETURN(const double eps, f.Double("rms_norm_eps"));
  c.rms_norm_eps = static_cast<float>(eps);
  ASSIGN_OR_RETURN(c.rope_theta, f.Double("rope_theta"));
  ASSIGN_OR_RETURN(const std::string tied, f.Field("tie_word_embeddings"));
  c.tie_word_embeddings = tied == "True";
  return Llama::Create(c);
}

struct Figures {
  double loss = 0, ref_loss = 0, loss_rel = 0;
  torch_ref::GradientComparison grads;
};

// Loads the file's weights into its model, runs forward, the loss and backward on the CPU,
// and measures the loss's relative error and each gradient's error ratio (failing the test
// for a tensor over kGradRatio).
absl::StatusOr<Figures> RunReference(const std::string& name) {
  ASSIGN_OR_RETURN(const ReferenceFile f, torch_ref::ReadReferenceFile(kDir + name + ".safetensors"));
  ASSIGN_OR_RETURN(std::shared_ptr<core::Module> model, MakeModel(f));
  const std::vector<core::NamedParameter> params = model->NamedParameters();
  RETURN_IF_ERROR(torch_ref::LoadParameters(f, params));
  ASSIGN_OR_RETURN(const core::Tensor tokens, f.Ints("ids"));
  ASSIGN_OR_RETURN(const core::Tensor target_tokens, f.Ints("targets"));
  ASSIGN_OR_RETURN(const ReferenceTensor* ref_loss, f.Get("loss"));
  ASSIGN_OR_RETURN(const core::Tensor logits, model->Forward(tokens));
  // The loss op itself (double sums, the loss returned in double; nn::CrossEntropyLoss
  // rounds it to float), then the backward of its gradient.
  ASSIGN_OR_RETURN(core::Tensor grad, core::Tensor::Allocate(logits.shape()));
  ASSIGN_OR_RETURN(const double loss,
                   CrossEntropyForwardBackward(name, logits, target_tokens, grad));
  RETURN_IF_ERROR(model->Backward(grad).status());
  Figures fig;
  fig.loss = loss;
  fig.ref_loss = ref_loss->values.at(0);
  fig.loss_rel = std::abs(loss - fig.ref_loss) / std::abs(fig.ref_loss);
  ASSIGN_OR_RETURN(fig.grads, torch_ref::CompareGradients(f, params));
  for (const torch_ref::GradientError& g : fig.grads.params) {
    EXPECT_LE(g.ratio, kGradRatio) << name << ": gradient of " << g.name << ", max |ref| "
                                   << g.max_reference;
    EXPECT_GT(g.max_reference, 0.0) << name << ": " << g.name;
  }
  return fig;
}

class TorchReferenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TorchReferenceTest, LossAndEveryGradientMatchTheFloat64Reference) {
  absl::StatusOr<Figures> fig = RunReference(GetParam());
  ASSERT_TRUE(fig.ok()) << fig.status();
  std::printf("%-18s loss %.10f vs float64 %.10f: relative error %.2e; worst gradient %s: "
              "max |diff| / max |ref| = %.2e\n",
              GetParam().c_str(), fig->loss, fig->ref_loss, fig->loss_rel,
              fig->grads.worst.name.c_str(), fig->grads.worst.ratio);
  RecordProperty("loss_relative_error", absl::StrCat(fig->loss_rel));
  RecordProperty("worst_gradient_ratio", absl::StrCat(fig->grads.worst.ratio));
  EXPECT_LE(fig->loss_rel, kLossRel);
}

INSTANTIATE_TEST_SUITE_P(Configurations, TorchReferenceTest,
                         ::testing::Values("gpt_2l_4h", "gpt_1l_2h", "gpt_3l_1h",
                                           "llama_gqa_untied", "llama_mha_tied", "llama_mqa_3l"));

}  // namespace
}  // namespace nn
