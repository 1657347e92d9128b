// Our Seq2Seq against PyTorch: the same model written in plain float64 PyTorch
// (tools/torch_ref/seq2seq_reference.py, which says what the file holds) from the same fp32
// weights, on a padded batch of the reverse task's layout. Our fp32 CPU model, its forward
// through the graph, F::CrossEntropy with ignore_index and core::Backward, gives the mean
// cross-entropy over the real target tokens within 1e-6 of the float64 loss, relative, and
// every parameter gradient within 1e-5 of the largest magnitude of that tensor's float64
// gradient (max |ours - reference| / max |reference|). The figures are printed.
#include <memory>
#include <set>
#include <string>

#include "core/autograd.h"
#include "core/status_macros.h"
#include "examples/seq2seq/reverse_task.h"
#include "examples/seq2seq/seq2seq.h"
#include "gtest/gtest.h"
#include "nn/functional/loss.h"
#include "nn/testing/torch_reference.h"

namespace seq2seq {
namespace {

using ::nn::torch_ref::Comparison;
using ::nn::torch_ref::ReferenceFile;
using ::nn::torch_ref::ReferenceTensor;
using ::nn::torch_ref::Scalars;

constexpr double kLossRel = 1e-6;
constexpr double kGradRatio = 1e-5;
const char kFile[] = "examples/seq2seq/testdata/seq2seq_ref.safetensors";

// The configuration the file's metadata describes, dropout 0.
absl::StatusOr<Seq2SeqConfig> Config(const ReferenceFile& f) {
  Seq2SeqConfig c;
  ASSIGN_OR_RETURN(c.vocab, f.Int("vocab"));
  ASSIGN_OR_RETURN(c.width, f.Int("width"));
  ASSIGN_OR_RETURN(c.heads, f.Int("heads"));
  ASSIGN_OR_RETURN(c.hidden, f.Int("hidden"));
  ASSIGN_OR_RETURN(c.encoder_layers, f.Int("encoder_layers"));
  ASSIGN_OR_RETURN(c.decoder_layers, f.Int("decoder_layers"));
  ASSIGN_OR_RETURN(c.max_positions, f.Int("max_positions"));
  ASSIGN_OR_RETURN(const double eps, f.Double("layer_norm_eps"));
  c.layer_norm_eps = static_cast<float>(eps);
  c.dropout = 0.0;
  return c;
}

// Loads the reference into the model and compares the loss (forward, the loss and backward)
// and every gradient with the file's.
absl::StatusOr<Comparison> RunReference() {
  ASSIGN_OR_RETURN(const ReferenceFile f, nn::torch_ref::ReadReferenceFile(kFile));
  ASSIGN_OR_RETURN(const Seq2SeqConfig config, Config(f));
  auto model = std::make_shared<Seq2Seq>(config);
  RETURN_IF_ERROR(model->ConstructionStatus());
  ASSIGN_OR_RETURN(const core::Tensor src, f.Ints("src"));
  ASSIGN_OR_RETURN(const core::Tensor src_mask, f.Ints("src_mask"));
  ASSIGN_OR_RETURN(const core::Tensor tgt, f.Ints("tgt"));
  ASSIGN_OR_RETURN(const core::Tensor labels, f.Ints("labels"));
  return nn::torch_ref::RunAndCompare(
      f, model->NamedParameters(), [&]() -> absl::StatusOr<Scalars> {
        ASSIGN_OR_RETURN(const core::Tensor logits, model->CallOne({src, src_mask, tgt}));
        ASSIGN_OR_RETURN(const core::Tensor loss,
                         nn::functional::CrossEntropy(logits, labels, kIgnore));
        RETURN_IF_ERROR(core::Backward(loss));
        return Scalars{{"loss", loss.ToVector().at(0)}};
      });
}

TEST(Seq2SeqTorchTest, LossAndEveryGradientMatchTheFloat64Reference) {
  absl::StatusOr<Comparison> c = RunReference();
  ASSERT_TRUE(c.ok()) << c.status();
  nn::torch_ref::ExpectMatches(*c, kLossRel, kGradRatio, "seq2seq");
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
