// Our Seq2Seq against PyTorch: the same model written in plain float64 PyTorch
// (tools/torch_ref/seq2seq_reference.py, which says what the file holds) from the same fp32
// weights, on a padded batch of the reverse task's layout. Our fp32 CPU model, its forward
// through the graph, F::CrossEntropy with ignore_index and core::Backward, gives the mean
// cross-entropy over the real target tokens within 1e-6 of the float64 loss, relative, and
// every parameter gradient within 1e-5 of the largest magnitude of that tensor's float64
// gradient (max |ours - reference| / max |reference|). The figures are printed.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/autograd.h"
#include "core/status_macros.h"
#include "examples/seq2seq/reverse_task.h"
#include "examples/seq2seq/seq2seq.h"
#include "gtest/gtest.h"
#include "nn/functional/loss.h"
#include "nn/testing/torch_reference.h"

namespace seq2seq {
namespace {

using ::nn::torch_ref::ReferenceFile;
using ::nn::torch_ref::ReferenceTensor;

constexpr double kLossRel = 1e-6;
constexpr double kGradRatio = 1e-5;
const char kFile[] = "examples/seq2seq/testdata/seq2seq_ref.safetensors";

absl::StatusOr<int64_t> Int(const ReferenceFile& f, const std::string& key) {
  ASSIGN_OR_RETURN(const std::string text, f.Field(key));
  int64_t v;
  if (!absl::SimpleAtoi(text, &v)) return absl::InvalidArgumentError(key + ": " + text);
  return v;
}

// The configuration the file's metadata describes, dropout 0.
absl::StatusOr<Seq2SeqConfig> Config(const ReferenceFile& f) {
  Seq2SeqConfig c;
  ASSIGN_OR_RETURN(c.vocab, Int(f, "vocab"));
  ASSIGN_OR_RETURN(c.width, Int(f, "width"));
  ASSIGN_OR_RETURN(c.heads, Int(f, "heads"));
  ASSIGN_OR_RETURN(c.hidden, Int(f, "hidden"));
  ASSIGN_OR_RETURN(c.encoder_layers, Int(f, "encoder_layers"));
  ASSIGN_OR_RETURN(c.decoder_layers, Int(f, "decoder_layers"));
  ASSIGN_OR_RETURN(c.max_positions, Int(f, "max_positions"));
  ASSIGN_OR_RETURN(const std::string eps, f.Field("layer_norm_eps"));
  double e;
  if (!absl::SimpleAtod(eps, &e)) return absl::InvalidArgumentError("layer_norm_eps: " + eps);
  c.layer_norm_eps = static_cast<float>(e);
  c.dropout = 0.0;
  return c;
}

absl::StatusOr<core::Tensor> Ints(const ReferenceFile& f, const std::string& name) {
  ASSIGN_OR_RETURN(const ReferenceTensor* t, f.Get(name));
  if (t->dtype != "I32") return absl::InvalidArgumentError(name + " is " + t->dtype);
  const std::vector<int32_t> ids(t->values.begin(), t->values.end());
  return core::Tensor::FromInts(ids, t->shape);
}

// Copies every param.<name> into the model's parameter of that name: each model parameter
// must be in the file, F32 of its shape, and each of the file's weights a model parameter.
absl::Status LoadWeights(const ReferenceFile& f, Seq2Seq& model) {
  std::set<std::string> ours;
  for (const auto& [name, p] : model.NamedParameters()) {
    ours.insert(name);
    ASSIGN_OR_RETURN(const ReferenceTensor* w, f.Get("param." + name));
    if (w->dtype != "F32" || w->shape != p->data.shape()) {
      return absl::InvalidArgumentError(absl::StrCat("param.", name, " is ", w->dtype, " ",
                                                     core::ShapeToString(w->shape), "; ours is ",
                                                     core::ShapeToString(p->data.shape())));
    }
    float* dst = p->data.data<float>();
    for (size_t i = 0; i < w->values.size(); ++i) dst[i] = static_cast<float>(w->values[i]);
  }
  for (const auto& [key, t] : f.tensors) {
    if (key.rfind("param.", 0) == 0 && ours.count(key.substr(6)) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("the file's ", key, " is not ours"));
    }
  }
  return absl::OkStatus();
}

struct Figures {
  double loss = 0, ref_loss = 0, loss_rel = 0;
  double worst_ratio = 0;
  std::string worst_param;
  int64_t params = 0;
};

// Loads the reference, runs forward, the loss and backward, and measures the loss's relative
// error and each gradient's error ratio (failing the test for a tensor over kGradRatio).
absl::StatusOr<Figures> RunReference() {
  ASSIGN_OR_RETURN(const ReferenceFile f, nn::torch_ref::ReadReferenceFile(kFile));
  ASSIGN_OR_RETURN(const Seq2SeqConfig config, Config(f));
  auto model = std::make_shared<Seq2Seq>(config);
  RETURN_IF_ERROR(model->ConstructionStatus());
  RETURN_IF_ERROR(LoadWeights(f, *model));
  ASSIGN_OR_RETURN(const core::Tensor src, Ints(f, "src"));
  ASSIGN_OR_RETURN(const core::Tensor src_mask, Ints(f, "src_mask"));
  ASSIGN_OR_RETURN(const core::Tensor tgt, Ints(f, "tgt"));
  ASSIGN_OR_RETURN(const core::Tensor labels, Ints(f, "labels"));
  ASSIGN_OR_RETURN(const ReferenceTensor* ref_loss, f.Get("loss"));

  ASSIGN_OR_RETURN(const core::Tensor logits, model->CallOne({src, src_mask, tgt}));
  ASSIGN_OR_RETURN(const core::Tensor loss, nn::functional::CrossEntropy(logits, labels, kIgnore));
  RETURN_IF_ERROR(core::Backward(loss));

  Figures fig;
  fig.loss = loss.ToVector().at(0);
  fig.ref_loss = ref_loss->values.at(0);
  fig.loss_rel = std::abs(fig.loss - fig.ref_loss) / std::abs(fig.ref_loss);
  for (const auto& [name, p] : model->NamedParameters()) {
    ASSIGN_OR_RETURN(const ReferenceTensor* g, f.Get("grad." + name));
    if (g->dtype != "F64" || !p->grad.defined() ||
        p->grad.numel() != static_cast<int64_t>(g->values.size())) {
      return absl::InvalidArgumentError(absl::StrCat("grad.", name, " does not match ours"));
    }
    const std::vector<float> ours = p->grad.ToVector();
    double max_ref = 0, max_diff = 0;
    for (size_t i = 0; i < ours.size(); ++i) {
      max_ref = std::max(max_ref, std::abs(g->values[i]));
      max_diff = std::max(max_diff, std::abs(ours[i] - g->values[i]));
    }
    const double ratio = max_diff / max_ref;
    EXPECT_GT(max_ref, 0.0) << name;
    EXPECT_LE(ratio, kGradRatio) << "gradient of " << name << ", max |ref| " << max_ref;
    if (ratio >= fig.worst_ratio) {
      fig.worst_ratio = ratio;
      fig.worst_param = name;
    }
    ++fig.params;
  }
  return fig;
}

TEST(Seq2SeqTorchTest, LossAndEveryGradientMatchTheFloat64Reference) {
  absl::StatusOr<Figures> fig = RunReference();
  ASSERT_TRUE(fig.ok()) << fig.status();
  std::printf(
      "seq2seq: loss %.10f vs float64 %.10f: relative error %.2e; worst of %lld gradients %s: "
      "max |diff| / max |ref| = %.2e\n",
      fig->loss, fig->ref_loss, fig->loss_rel, static_cast<long long>(fig->params),
      fig->worst_param.c_str(), fig->worst_ratio);
  RecordProperty("loss_relative_error", absl::StrCat(fig->loss_rel));
  RecordProperty("worst_gradient_ratio", absl::StrCat(fig->worst_ratio));
  EXPECT_LE(fig->loss_rel, kLossRel);
}

// The batch covers what the padding mask must get right: a row of one symbol and a row
// with no padding, beside rows in between.
TEST(Seq2SeqTorchTest, TheBatchHoldsAShortestAndALongestRow) {
  absl::StatusOr<ReferenceFile> f = nn::torch_ref::ReadReferenceFile(kFile);
  ASSERT_TRUE(f.ok()) << f.status();
  absl::StatusOr<const ReferenceTensor*> mask = f->Get("src_mask");
  ASSERT_TRUE(mask.ok()) << mask.status();
  const int64_t rows = (*mask)->shape[0], s = (*mask)->shape[3];
  std::set<int64_t> lengths;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t n = 0;
    for (int64_t j = 0; j < s; ++j) n += (*mask)->values[r * s + j] != 0;
    lengths.insert(n);
  }
  EXPECT_EQ(lengths.count(1), 1u);
  EXPECT_EQ(lengths.count(s), 1u);
  EXPECT_GE(lengths.size(), 3u);
}

}  // namespace
}  // namespace seq2seq
