// Test-only: nn::TransformerBlock and nn::Gpt written as forward-only graph modules (NOTE [Graph
// modules] in core/module.h) from nn/functional's ops and fused steps, over the hand-written
// modules' own parameters (the same ParameterPtrs under the same names), so tests can compare
// the two bit for bit (NOTE [Functional fusions] in nn/functional/fused.h).
//
//   auto gpt = nn::Gpt::Create(config).value();
//   auto graph = std::make_shared<nn::functional::testing::GraphGpt>(*gpt);
//   absl::StatusOr<core::Tensor> logits = graph->CallOne({tokens});   // gpt's logits' bits
#ifndef NN_FUNCTIONAL_TESTING_GRAPH_GPT_H_
#define NN_FUNCTIONAL_TESTING_GRAPH_GPT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/module.h"
#include "core/parameter.h"
#include "nn/gpt.h"
#include "nn/transformer.h"

namespace nn {
namespace functional {
namespace testing {

// NOTE [Functional fusions]: nn::TransformerBlock written as a forward only, on `block`'s own
// parameters (the same ParameterPtrs, under the same names). With `attention_residual_in_gemm`
// false it runs what the block runs when attention's proj cannot add the residual in its GEMM (a
// hook on it): proj as F::Linear, then the residual add and ln_2 in one pass (AddLayerNorm).
class GraphTransformerBlock : public core::Module {
 public:
  GraphTransformerBlock(const nn::TransformerBlock& block, bool attention_residual_in_gemm)
      : n_head_(block.attn()->n_head()), residual_in_gemm_(attention_residual_in_gemm) {
    for (const auto& [name, p] : block.NamedParameters()) {
      params_.push_back(RegisterParameter(name, p));
    }
  }
  std::string TypeName() const override { return "GraphTransformerBlock"; }

 protected:
  absl::StatusOr<core::Tensors> ForwardGraph(const core::Tensors& in) override;

 private:
  int64_t n_head_;
  bool residual_in_gemm_;
  std::vector<core::ParameterPtr> params_;
};

// nn::Gpt as a graph module over `gpt`'s parameters: tokens [B, T] int32 -> logits [B, T, V]
// (bf16 under bf16 weights, as the Gpt's): the token and position embeddings added by BiasAdd,
// the blocks as GraphTransformerBlocks, ln_f, and the head tied to wte (LinearForGemm).
class GraphGpt : public core::Module {
 public:
  explicit GraphGpt(const nn::Gpt& gpt);
  std::string TypeName() const override { return "GraphGpt"; }

 protected:
  absl::StatusOr<core::Tensors> ForwardGraph(const core::Tensors& inputs) override;

 private:
  core::ParameterPtr wte_, wpe_, ln_f_w_, ln_f_b_;
  std::vector<std::shared_ptr<GraphTransformerBlock>> blocks_;
};

}  // namespace testing
}  // namespace functional
}  // namespace nn

#endif  // NN_FUNCTIONAL_TESTING_GRAPH_GPT_H_
