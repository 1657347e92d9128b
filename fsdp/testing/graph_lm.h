// Test-only: a small language model written as graph modules (NOTE [Graph modules] in
// core/module.h): forward only, composed of nn/functional ops, differentiated by the graph.
// fsdp's tests wrap it to check FSDP on the graph: its hooks placed by Module::Call.
//
//   auto model = std::make_shared<fsdp::testing::GraphLm>(fsdp::testing::GraphLmConfig{});
//   absl::StatusOr<core::Tensor> logits = model->CallOne({ids});   // [B, T] -> [B, T, V]
//
// GraphLm: h = Embedding(ids, wte); each GraphBlock: h = h + W2 GELU(W1 RMSNorm(h) + b1) +
// b2; logits = RMSNorm(h) wte^T (the head tied to the embedding). Parameters come from
// core::ParamInit recipes (seeded per parameter), so deferred initialisation gives the
// eager values.
#ifndef FSDP_TESTING_GRAPH_LM_H_
#define FSDP_TESTING_GRAPH_LM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/module.h"
#include "core/parameter.h"
#include "core/tensor.h"

namespace fsdp {
namespace testing {

struct GraphLmConfig {
  int64_t vocab = 16;
  int64_t width = 16;
  int64_t hidden = 32;
  int64_t blocks = 2;
  uint64_t seed = 1;
};

// One residual MLP block: [..., width] -> [..., width].
class GraphBlock : public core::Module {
 public:
  GraphBlock(const GraphLmConfig& config, uint64_t seed);
  std::string TypeName() const override { return "GraphBlock"; }

 protected:
  absl::StatusOr<core::Tensors> ForwardGraph(const core::Tensors& inputs) override;

 private:
  core::ParameterPtr norm_, w1_, b1_, w2_, b2_;
};

class GraphLm : public core::Module {
 public:
  explicit GraphLm(const GraphLmConfig& config);
  std::string TypeName() const override { return "GraphLm"; }
  const std::vector<std::shared_ptr<GraphBlock>>& blocks() const { return blocks_; }

 protected:
  // {ids [B, T] int32} -> {logits [B, T, vocab]}.
  absl::StatusOr<core::Tensors> ForwardGraph(const core::Tensors& inputs) override;

 private:
  core::ParameterPtr wte_, norm_;
  std::vector<std::shared_ptr<GraphBlock>> blocks_;
};

}  // namespace testing
}  // namespace fsdp

#endif  // FSDP_TESTING_GRAPH_LM_H_
