#include "fsdp/testing/graph_lm.h"

#include "absl/strings/str_cat.h"
#include "core/param_init.h"
#include "core/status_macros.h"
#include "nn/functional/functional.h"

namespace fsdp {
namespace testing {
namespace {

namespace F = ::nn::functional;

}  // namespace

GraphBlock::GraphBlock(const GraphLmConfig& c, uint64_t seed) {
  norm_ = AllocateParameter("norm", {c.width}, core::ParamInit::Normal(seed, 0, 1.0f, 0.1f));
  w1_ = AllocateParameter("w1", {c.hidden, c.width}, core::ParamInit::FanIn(seed + 1, 0, c.width));
  b1_ = AllocateParameter("b1", {c.hidden}, core::ParamInit::FanIn(seed + 2, 0, c.width));
  w2_ = AllocateParameter("w2", {c.width, c.hidden}, core::ParamInit::FanIn(seed + 3, 0, c.hidden));
  b2_ = AllocateParameter("b2", {c.width}, core::ParamInit::FanIn(seed + 4, 0, c.hidden));
}

absl::StatusOr<core::Tensors> GraphBlock::ForwardGraph(const core::Tensors& in) {
  const core::Tensor& x = in[0];
  absl::StatusOr<core::Tensor> h = F::Gelu(F::Linear(F::RmsNorm(x, norm_), w1_, b1_));
  absl::StatusOr<core::Tensor> y = F::Add(x, F::Linear(h, w2_, b2_));
  RETURN_IF_ERROR(y.status());
  return core::Tensors{*y};
}

GraphLm::GraphLm(const GraphLmConfig& c) {
  wte_ =
      AllocateParameter("wte", {c.vocab, c.width}, core::ParamInit::Normal(c.seed, 0, 0.0f, 0.5f));
  norm_ = AllocateParameter("norm", {c.width}, core::ParamInit::Normal(c.seed + 1, 0, 1.0f, 0.1f));
  for (int64_t i = 0; i < c.blocks; ++i) {
    blocks_.push_back(RegisterModule(absl::StrCat("block", i),
                                     std::make_shared<GraphBlock>(c, c.seed + 100 * (i + 1))));
  }
}

absl::StatusOr<core::Tensors> GraphLm::ForwardGraph(const core::Tensors& in) {
  absl::StatusOr<core::Tensor> h = F::Embedding(in[0], wte_);
  for (const std::shared_ptr<GraphBlock>& block : blocks_) h = block->CallOne({h});
  absl::StatusOr<core::Tensor> logits = F::Linear(F::RmsNorm(h, norm_), wte_);
  RETURN_IF_ERROR(logits.status());
  return core::Tensors{*logits};
}

}  // namespace testing
}  // namespace fsdp
