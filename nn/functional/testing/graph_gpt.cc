#include "nn/functional/testing/graph_gpt.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nn/functional/functional.h"

namespace nn {
namespace functional {
namespace testing {

absl::StatusOr<core::Tensors> GraphTransformerBlock::ForwardGraph(const core::Tensors& in) {
  // block.NamedParameters() order: ln_1, attn.qkv, attn.proj, ln_2, mlp.fc, mlp.proj, each weight
  // then bias.
  const core::ParameterPtr &ln_1_w = params_[0], &ln_1_b = params_[1], &qkv_w = params_[2],
                           &qkv_b = params_[3], &attn_proj_w = params_[4],
                           &attn_proj_b = params_[5], &ln_2_w = params_[6], &ln_2_b = params_[7],
                           &fc_w = params_[8], &fc_b = params_[9], &proj_w = params_[10],
                           &proj_b = params_[11];
  // h = x + attn(ln_1(x)).
  ASSIGN_OR_RETURN(const std::vector<core::Tensor> n1, ResidualLayerNorm(in[0], ln_1_w, ln_1_b));
  AttentionCoreOptions attention;
  attention.y_bf16 = residual_in_gemm_ && attn_proj_w->data.dtype() == core::DType::kBFloat16;
  absl::StatusOr<core::Tensor> y =
      CausalSelfAttentionCore(LinearForGemm(n1[1], qkv_w, qkv_b), n_head_, attention);
  std::vector<core::Tensor> n2;
  if (residual_in_gemm_) {
    ASSIGN_OR_RETURN(const core::Tensor h, LinearResidual(y, attn_proj_w, attn_proj_b, n1[0]));
    ASSIGN_OR_RETURN(n2, ResidualLayerNorm(h, ln_2_w, ln_2_b));
  } else {
    ASSIGN_OR_RETURN(n2, AddLayerNorm(n1[0], Linear(y, attn_proj_w, attn_proj_b), ln_2_w, ln_2_b));
  }
  // out = h + mlp(ln_2(h)).
  ASSIGN_OR_RETURN(const std::vector<core::Tensor> fc, LinearGelu(n2[1], fc_w, fc_b));
  ASSIGN_OR_RETURN(const core::Tensor out, GeluLinear(fc[0], fc[1], proj_w, proj_b, n2[0]));
  return core::Tensors{out};
}

GraphGpt::GraphGpt(const nn::Gpt& gpt) {
  // gpt.NamedParameters(): wte, wpe, the blocks', ln_f's (lm_head's weight is wte's).
  const std::vector<core::NamedParameter> named = gpt.NamedParameters();
  wte_ = RegisterParameter(named.front().first, named[0].second);
  wpe_ = RegisterParameter(named[1].first, named[1].second);
  for (size_t l = 0; l < gpt.blocks()->NamedChildren().size(); ++l) {
    const auto& block =
        std::static_pointer_cast<nn::TransformerBlock>(gpt.blocks()->NamedChildren()[l].second);
    blocks_.push_back(RegisterModule(absl::StrCat("blocks.", l),
                                     std::make_shared<GraphTransformerBlock>(*block, true)));
  }
  ln_f_w_ = RegisterParameter(named[named.size() - 2].first, named[named.size() - 2].second);
  ln_f_b_ = RegisterParameter(named.back().first, named.back().second);
}

absl::StatusOr<core::Tensors> GraphGpt::ForwardGraph(const core::Tensors& in) {
  const core::Tensor& tokens = in[0];
  const int64_t T = tokens.size(1);
  ASSIGN_OR_RETURN(core::Tensor positions,
                   core::Tensor::Allocate({T}, core::DType::kInt32, core::MemoryTag::kActivation));
  for (int64_t t = 0; t < T; ++t) positions.data<int32_t>()[t] = static_cast<int32_t>(t);
  // x[b] = tok[b] + pos, as the Gpt adds them (nn::BiasAdd).
  absl::StatusOr<core::Tensor> x = BiasAdd(Embedding(tokens, wte_), Embedding(positions, wpe_));
  for (const std::shared_ptr<GraphTransformerBlock>& block : blocks_) x = block->CallOne({x});
  absl::StatusOr<core::Tensor> logits = LinearForGemm(LayerNorm(x, ln_f_w_, ln_f_b_), wte_);
  RETURN_IF_ERROR(logits.status());
  return core::Tensors{*logits};
}

}  // namespace testing
}  // namespace functional
}  // namespace nn
