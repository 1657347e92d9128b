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
#include <memory>
#include <string>

#include "core/autograd.h"
#include "core/status_macros.h"
#include "examples/moe/moe.h"
#include "examples/moe/moe_module.h"
#include "gtest/gtest.h"
#include "nn/testing/torch_reference.h"

namespace moe {
namespace {

using ::nn::torch_ref::Comparison;
using ::nn::torch_ref::ReferenceFile;
using ::nn::torch_ref::Scalars;

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

// Loads the reference into the model and compares the loss (MoeLoss and backward), the
// balance loss (the same forward again) and every gradient with the file's.
absl::StatusOr<Comparison> RunReference() {
  ASSIGN_OR_RETURN(const ReferenceFile f, nn::torch_ref::ReadReferenceFile(kFile));
  ASSIGN_OR_RETURN(const MoeConfig config, Config(f));
  auto model = std::make_shared<MoeDecoder>(config);
  RETURN_IF_ERROR(model->ConstructionStatus());
  ASSIGN_OR_RETURN(const core::Tensor ids, f.Ints("ids"));
  ASSIGN_OR_RETURN(const core::Tensor targets, f.Ints("targets"));
  return nn::torch_ref::RunAndCompare(
      f, model->NamedParameters(), [&]() -> absl::StatusOr<Scalars> {
        ASSIGN_OR_RETURN(const core::Tensor loss, MoeLoss(*model, ids, targets));
        RETURN_IF_ERROR(core::Backward(loss));
        core::NoGradScope no_grad;  // the balance loss alone, the same forward again
        ASSIGN_OR_RETURN(const core::Tensors out, model->Call({ids}));
        return Scalars{{"loss", loss.ToVector().at(0)}, {"aux", out.at(1).ToVector().at(0)}};
      });
}

TEST(MoeTorchTest, LossAndEveryGradientMatchTheFloat64Reference) {
  absl::StatusOr<Comparison> c = RunReference();
  ASSERT_TRUE(c.ok()) << c.status();
  nn::torch_ref::ExpectMatches(*c, kLossRel, kGradRatio, "moe");
}

}  // namespace
}  // namespace moe
