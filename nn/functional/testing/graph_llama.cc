#include "nn/functional/testing/graph_llama.h"

#include "core/status_macros.h"
#include "nn/functional/fused.h"
#include "nn/rotary.h"

namespace nn {
namespace functional {
namespace testing {

using core::DType;
using core::Tensor;

absl::StatusOr<core::Tensors> GraphLlamaDecoderLayer::ForwardGraph(const core::Tensors& in) {
  // layer.NamedParameters() order: input_layernorm, self_attn.{q,k,v,o}_proj,
  // post_attention_layernorm, mlp.{gate,up,down}_proj, each a weight.
  const core::ParameterPtr &in_norm_w = params_[0], &q_w = params_[1], &k_w = params_[2],
                           &v_w = params_[3], &o_w = params_[4], &post_norm_w = params_[5],
                           &gate_w = params_[6], &up_w = params_[7], &down_w = params_[8];
  const Tensor& x = in[0];
  ASSIGN_OR_RETURN(const nn::RotaryTables tables,
                   nn::MakeRotaryTables(x.size(1), head_dim_, rope_theta_, x.device()));
  // h = x + self_attn(input_layernorm(x)).
  ASSIGN_OR_RETURN(const std::vector<Tensor> n1, ResidualRmsNorm(x, in_norm_w, input_norm_));
  AttentionCoreOptions attention;
  attention.y_bf16 = o_w->data.dtype() == DType::kBFloat16;
  absl::StatusOr<Tensor> y = CausalSelfAttentionCore(
      RotaryQkv(n1[1], q_w, k_w, v_w, tables, n_head_, n_kv_head_), n_head_, attention);
  ASSIGN_OR_RETURN(const Tensor h, LinearResidual(y, o_w, Tensor(), n1[0]));
  // out = h + mlp(post_attention_layernorm(h)).
  ASSIGN_OR_RETURN(const std::vector<Tensor> n2, ResidualRmsNorm(h, post_norm_w, post_norm_));
  ASSIGN_OR_RETURN(const Tensor out,
                   LinearResidual(SwiGlu(n2[1], gate_w, up_w), down_w, Tensor(), n2[0]));
  return core::Tensors{out};
}

}  // namespace testing
}  // namespace functional
}  // namespace nn
