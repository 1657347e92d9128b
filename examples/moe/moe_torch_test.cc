// Our MoeDecoder against PyTorch: the same model written in plain float64 PyTorch
// (tools/torch_ref/moe_reference.py, which says what the file holds) from the same fp32
// weights, on random ids and targets that send tokens to every expert of every block with no
// routing choice near a tie. Our fp32 CPU model, its forward through the graph, MoeLoss
// (cross-entropy plus aux_weight times the balance loss, as MoeModule trains) and
// core::Backward, gives the loss and the balance loss within 1e-6 of the float64 ones,
// relative, and every parameter gradient (the router's through the top-2 weights and the
// balance loss) within 1e-5 of the largest magnitude of that tensor's float64 gradient
// (max |ours - reference| / max |reference|). An expert without tokens would have no
// gradient, which fails the comparison. The figures are printed.
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/autograd.h"
#include "core/status_macros.h"
#include "examples/moe/moe.h"
#include "examples/moe/moe_module.h"
#include "gtest/gtest.h"
#include "nn/testing/torch_reference.h"

namespace moe {
namespace {

using ::nn::torch_ref::GradientComparison;
using ::nn::torch_ref::GradientError;
using ::nn::torch_ref::ReferenceFile;
using ::nn::torch_ref::ReferenceTensor;

constexpr double kLossRel = 1e-6;
constexpr double kGradRatio = 1e-5;
const char kFile[] = "examples/moe/testdata/moe_ref.safetensors";

// The configuration the file's metadata describes.
absl::StatusOr<MoeConfig> Config(const ReferenceFile& f) {
  MoeConfig c;
  ASSIGN_OR_RETURN(c.vocab, f.Int("vocab"));
  ASSIGN_OR_RETURN(c.width, f.Int("width"));
  ASSIGN_OR_RETURN(c.heads, f.Int("heads"));
  ASSIGN_OR_RETURN(c.expert_hidden, f.Int("expert_hidden"));
  ASSIGN_OR_RETURN(c.experts, f.Int("experts"));
  ASSIGN_OR_RETURN(c.blocks, f.Int("blocks"));
  ASSIGN_OR_RETURN(c.max_positions, f.Int("max_positions"));
  ASSIGN_OR_RETURN(c.aux_weight, f.Double("aux_weight"));
  return c;
}

double RelativeError(double ours, double reference) {
  return std::abs(ours - reference) / std::abs(reference);
}

struct Figures {
  double loss = 0, ref_loss = 0, loss_rel = 0;
  double aux = 0, ref_aux = 0, aux_rel = 0;
  GradientComparison grads;
};

// Loads the reference, runs forward, the loss and backward, and measures the loss's and the
// balance loss's relative errors and each gradient's error ratio (failing the test for a
// tensor over kGradRatio).
absl::StatusOr<Figures> RunReference() {
  ASSIGN_OR_RETURN(const ReferenceFile f, nn::torch_ref::ReadReferenceFile(kFile));
  ASSIGN_OR_RETURN(const MoeConfig config, Config(f));
  auto model = std::make_shared<MoeDecoder>(config);
  RETURN_IF_ERROR(model->ConstructionStatus());
  RETURN_IF_ERROR(nn::torch_ref::LoadParameters(f, model->NamedParameters()));
  ASSIGN_OR_RETURN(const core::Tensor ids, f.Ints("ids"));
  ASSIGN_OR_RETURN(const core::Tensor targets, f.Ints("targets"));
  ASSIGN_OR_RETURN(const ReferenceTensor* ref_loss, f.Get("loss"));
  ASSIGN_OR_RETURN(const ReferenceTensor* ref_aux, f.Get("aux"));

  ASSIGN_OR_RETURN(const core::Tensor loss, MoeLoss(*model, ids, targets));
  RETURN_IF_ERROR(core::Backward(loss));
  core::Tensors out;
  {
    core::NoGradScope no_grad;  // the balance loss alone, the same forward again
    ASSIGN_OR_RETURN(out, model->Call({ids}));
  }

  Figures fig;
  fig.loss = loss.ToVector().at(0);
  fig.ref_loss = ref_loss->values.at(0);
  fig.loss_rel = RelativeError(fig.loss, fig.ref_loss);
  fig.aux = out.at(1).ToVector().at(0);
  fig.ref_aux = ref_aux->values.at(0);
  fig.aux_rel = RelativeError(fig.aux, fig.ref_aux);
  ASSIGN_OR_RETURN(fig.grads, nn::torch_ref::CompareGradients(f, model->NamedParameters()));
  for (const GradientError& g : fig.grads.params) {
    EXPECT_GT(g.max_reference, 0.0) << g.name;
    EXPECT_LE(g.ratio, kGradRatio) << "gradient of " << g.name << ", max |ref| " << g.max_reference;
  }
  return fig;
}

TEST(MoeTorchTest, LossAndEveryGradientMatchTheFloat64Reference) {
  absl::StatusOr<Figures> fig = RunReference();
  ASSERT_TRUE(fig.ok()) << fig.status();
  std::printf(
      "moe: loss %.10f vs float64 %.10f: relative error %.2e; balance loss %.10f vs %.10f: "
      "%.2e; worst of %zu gradients %s: max |diff| / max |ref| = %.2e\n",
      fig->loss, fig->ref_loss, fig->loss_rel, fig->aux, fig->ref_aux, fig->aux_rel,
      fig->grads.params.size(), fig->grads.worst.name.c_str(), fig->grads.worst.ratio);
  RecordProperty("loss_relative_error", absl::StrCat(fig->loss_rel));
  RecordProperty("aux_relative_error", absl::StrCat(fig->aux_rel));
  RecordProperty("worst_gradient_ratio", absl::StrCat(fig->grads.worst.ratio));
  EXPECT_LE(fig->loss_rel, kLossRel);
  EXPECT_LE(fig->aux_rel, kLossRel);
}

}  // namespace
}  // namespace moe
