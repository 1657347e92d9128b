// Test-only: nn::LlamaDecoderLayer written as a forward-only graph module (NOTE [Graph modules]
// in core/module.h) from nn/functional's Llama fused steps (nn/functional/llama_fused.h), over the
// hand-written layer's own parameters, so tests compare the two bit for bit.
//
//   nn::LlamaDecoderLayer layer(config, /*seed=*/3);
//   auto graph = std::make_shared<nn::functional::testing::GraphLlamaDecoderLayer>(layer);
//   absl::StatusOr<core::Tensor> y = graph->CallOne({x});   // layer.Forward(x)'s bits
#ifndef NN_FUNCTIONAL_TESTING_GRAPH_LLAMA_H_
#define NN_FUNCTIONAL_TESTING_GRAPH_LLAMA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/module.h"
#include "core/parameter.h"
#include "nn/functional/llama_fused.h"
#include "nn/llama.h"

namespace nn {
namespace functional {
namespace testing {

// NOTE [Llama functional fusions]: nn::LlamaDecoderLayer written as a forward only, on `layer`'s
// own parameters (the same ParameterPtrs, under the same names).
class GraphLlamaDecoderLayer : public core::Module {
 public:
  explicit GraphLlamaDecoderLayer(const nn::LlamaDecoderLayer& layer)
      : n_head_(layer.self_attn()->n_head()),
        n_kv_head_(layer.self_attn()->n_kv_head()),
        head_dim_(layer.self_attn()->hidden() / layer.self_attn()->n_head()),
        rope_theta_(layer.self_attn()->rope_theta()) {
    input_norm_.eps = layer.input_layernorm()->eps();
    post_norm_.eps = layer.post_attention_layernorm()->eps();
    for (const auto& [name, p] : layer.NamedParameters()) {
      params_.push_back(RegisterParameter(name, p));
    }
  }
  std::string TypeName() const override { return "GraphLlamaDecoderLayer"; }

 protected:
  absl::StatusOr<core::Tensors> ForwardGraph(const core::Tensors& in) override;

 private:
  int64_t n_head_, n_kv_head_, head_dim_;
  double rope_theta_;
  FusedRmsNormOptions input_norm_, post_norm_;
  std::vector<core::ParameterPtr> params_;
};

}  // namespace testing
}  // namespace functional
}  // namespace nn

#endif  // NN_FUNCTIONAL_TESTING_GRAPH_LLAMA_H_
