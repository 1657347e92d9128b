// Our Gpt and Llama against PyTorch: transformers' GPT2LMHeadModel and LlamaForCausalLM
// (eager attention) run in float64 from the same fp32 weights (nn/testdata/torch_ref,
// written by tools/torch_ref/reference.py, which says what each file holds). For each
// configuration our fp32 CPU model gives the mean cross-entropy within 1e-7 of the float64
// loss, relative, and every parameter gradient within 1e-5 of the largest magnitude of
// that tensor's float64 gradient (max |ours - reference| / max |reference|). The figures
// are printed.
#include "nn/testing/torch_reference.h"

#include <memory>
#include <string>

#include "core/status_macros.h"
#include "gtest/gtest.h"
#include "nn/gpt.h"
#include "nn/llama.h"
#include "nn/tensor_ops.h"

namespace nn {
namespace {

using torch_ref::ReferenceFile;

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

// Loads the file's weights into its model and compares the loss (forward, the loss op and
// backward on the CPU) and every gradient with the file's.
absl::StatusOr<torch_ref::Comparison> RunReference(const std::string& name) {
  ASSIGN_OR_RETURN(const ReferenceFile f,
                   torch_ref::ReadReferenceFile(kDir + name + ".safetensors"));
  ASSIGN_OR_RETURN(std::shared_ptr<core::Module> model, MakeModel(f));
  ASSIGN_OR_RETURN(const core::Tensor tokens, f.Ints("ids"));
  ASSIGN_OR_RETURN(const core::Tensor target_tokens, f.Ints("targets"));
  return torch_ref::RunAndCompare(
      f, model->NamedParameters(), [&]() -> absl::StatusOr<torch_ref::Scalars> {
        ASSIGN_OR_RETURN(const core::Tensor logits, model->Forward(tokens));
        // The loss op itself (double sums, the loss returned in double; nn::CrossEntropyLoss
        // rounds it to float), then the backward of its gradient.
        ASSIGN_OR_RETURN(core::Tensor grad, core::Tensor::Allocate(logits.shape()));
        ASSIGN_OR_RETURN(const double loss,
                         CrossEntropyForwardBackward(name, logits, target_tokens, grad));
        RETURN_IF_ERROR(model->Backward(grad).status());
        return torch_ref::Scalars{{"loss", loss}};
      });
}

class TorchReferenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TorchReferenceTest, LossAndEveryGradientMatchTheFloat64Reference) {
  absl::StatusOr<torch_ref::Comparison> c = RunReference(GetParam());
  ASSERT_TRUE(c.ok()) << c.status();
  torch_ref::ExpectMatches(*c, kLossRel, kGradRatio, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Configurations, TorchReferenceTest,
                         ::testing::Values("gpt_2l_4h", "gpt_1l_2h", "gpt_3l_1h",
                                           "llama_gqa_untied", "llama_mha_tied", "llama_mqa_3l"));

}  // namespace
}  // namespace nn
