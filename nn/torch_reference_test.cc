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

#include "absl/strings/numbers.h"
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

absl::StatusOr<int64_t> Int(const ReferenceFile& f, const std::string& key) {
  ASSIGN_OR_RETURN(const std::string text, f.Field(key));
  int64_t v;
  if (!absl::SimpleAtoi(text, &v)) return absl::InvalidArgumentError(key + ": " + text);
  return v;
}

absl::StatusOr<double> Double(const ReferenceFile& f, const std::string& key) {
  ASSIGN_OR_RETURN(const std::string text, f.Field(key));
  double v;
  if (!absl::SimpleAtod(text, &v)) return absl::InvalidArgumentError(key + ": " + text);
  return v;
}

// The model the file's metadata describes, with default (unused) weights.
absl::StatusOr<std::shared_ptr<core::Module>> MakeModel(const ReferenceFile& f) {
  ASSIGN_OR_RETURN(const std::string kind, f.Field("model"));
  if (kind == "gpt") {
    GptConfig c;
    ASSIGN_OR_RETURN(c.vocab_size, Int(f, "vocab_size"));
    ASSIGN_OR_RETURN(c.block_size, Int(f, "block_size"));
    ASSIGN_OR_RETURN(c.n_embd, Int(f, "n_embd"));
    ASSIGN_OR_RETURN(c.n_layer, Int(f, "n_layer"));
    ASSIGN_OR_RETURN(c.n_head, Int(f, "n_head"));
    return Gpt::Create(c);
  }
  LlamaConfig c;
  ASSIGN_OR_RETURN(c.vocab_size, Int(f, "vocab_size"));
  ASSIGN_OR_RETURN(c.hidden_size, Int(f, "hidden_size"));
  ASSIGN_OR_RETURN(c.intermediate_size, Int(f, "intermediate_size"));
  ASSIGN_OR_RETURN(c.num_hidden_layers, Int(f, "num_hidden_layers"));
  ASSIGN_OR_RETURN(c.num_attention_heads, Int(f, "num_attention_heads"));
  ASSIGN_OR_RETURN(c.num_key_value_heads, Int(f, "num_key_value_heads"));
  ASSIGN_OR_RETURN(c.max_position_embeddings, Int(f, "max_position_embeddings"));
  ASSIGN_OR_RETURN(const double eps, Double(f, "rms_norm_eps"));
  c.rms_norm_eps = static_cast<float>(eps);
  ASSIGN_OR_RETURN(c.rope_theta, Double(f, "rope_theta"));
  ASSIGN_OR_RETURN(const std::string tied, f.Field("tie_word_embeddings"));
  c.tie_word_embeddings = tied == "True";
  return Llama::Create(c);
}

absl::StatusOr<core::Tensor> Ints(const ReferenceTensor& t) {
  const std::vector<int32_t> ids(t.values.begin(), t.values.end());
  return core::Tensor::FromInts(ids, t.shape);
}

struct Figures {
  double loss = 0, ref_loss = 0, loss_rel = 0;
  double worst_ratio = 0;
  std::string worst_param;
};

// Loads the file's weights into its model, runs forward, the loss and backward on the CPU,
// and measures the loss's relative error and each gradient's error ratio (failing the test
// for a tensor over kGradRatio).
absl::StatusOr<Figures> RunReference(const std::string& name) {
  ASSIGN_OR_RETURN(const ReferenceFile f, torch_ref::ReadReferenceFile(kDir + name + ".safetensors"));
  ASSIGN_OR_RETURN(std::shared_ptr<core::Module> model, MakeModel(f));
  int64_t params_in_file = 0;
  for (const auto& [key, t] : f.tensors) params_in_file += key.rfind("param.", 0) == 0;
  const std::vector<core::NamedParameter> params = model->NamedParameters();
  if (params_in_file != static_cast<int64_t>(params.size())) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": the file has ", params_in_file,
                                                   " weights, the model ", params.size()));
  }
  for (const auto& [pname, p] : params) {
    ASSIGN_OR_RETURN(const ReferenceTensor* w, f.Get("param." + pname));
    if (w->shape != p->data.shape() || w->dtype != "F32") {
      return absl::InvalidArgumentError(absl::StrCat(name, ": param.", pname, " is ", w->dtype, " ",
                                                     core::ShapeToString(w->shape)));
    }
    float* dst = p->data.data<float>();
    for (size_t i = 0; i < w->values.size(); ++i) dst[i] = static_cast<float>(w->values[i]);
  }
  ASSIGN_OR_RETURN(const ReferenceTensor* ids, f.Get("ids"));
  ASSIGN_OR_RETURN(const ReferenceTensor* targets, f.Get("targets"));
  ASSIGN_OR_RETURN(const ReferenceTensor* ref_loss, f.Get("loss"));
  ASSIGN_OR_RETURN(const core::Tensor tokens, Ints(*ids));
  ASSIGN_OR_RETURN(const core::Tensor target_tokens, Ints(*targets));
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
  for (const auto& [pname, p] : params) {
    ASSIGN_OR_RETURN(const ReferenceTensor* g, f.Get("grad." + pname));
    if (g->dtype != "F64" || !p->grad.defined() || p->grad.numel() != static_cast<int64_t>(g->values.size())) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": grad.", pname, " does not match"));
    }
    const std::vector<float> ours = p->grad.ToVector();
    double max_ref = 0, max_diff = 0;
    for (size_t i = 0; i < ours.size(); ++i) {
      max_ref = std::max(max_ref, std::abs(g->values[i]));
      max_diff = std::max(max_diff, std::abs(ours[i] - g->values[i]));
    }
    const double ratio = max_diff / max_ref;
    EXPECT_LE(ratio, kGradRatio) << name << ": gradient of " << pname << ", max |ref| " << max_ref;
    EXPECT_GT(max_ref, 0.0) << name << ": " << pname;
    if (ratio >= fig.worst_ratio) {
      fig.worst_ratio = ratio;
      fig.worst_param = pname;
    }
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
              fig->worst_param.c_str(), fig->worst_ratio);
  RecordProperty("loss_relative_error", absl::StrCat(fig->loss_rel));
  RecordProperty("worst_gradient_ratio", absl::StrCat(fig->worst_ratio));
  EXPECT_LE(fig->loss_rel, kLossRel);
}

INSTANTIATE_TEST_SUITE_P(Configurations, TorchReferenceTest,
                         ::testing::Values("gpt_2l_4h", "gpt_1l_2h", "gpt_3l_1h",
                                           "llama_gqa_untied", "llama_mha_tied", "llama_mqa_3l"));

}  // namespace
}  // namespace nn
