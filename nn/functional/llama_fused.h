// The Llama decoder layer's fused steps as differentiable ops, each a custom function with its
// own backward, which nn::LlamaDecoderLayer's forward runs on its children's parameters (NOTE
// [Block forwards] in nn/transformer.h). With fused.h's
// CausalSelfAttentionCore and LinearResidual they make the whole layer.
//
//   namespace F = nn::functional;
//   // x [B, T, C]; in_norm_w, q_w, ... the layer's ParameterPtrs; tables from
//   // nn::MakeRotaryTables(T, C / n_head, rope_theta, x.device()).
//   F::FusedRmsNormOptions norm;
//   norm.eps = config.rms_norm_eps;
//   ASSIGN_OR_RETURN(std::vector<core::Tensor> n1, F::ResidualRmsNorm(x, in_norm_w, norm));
//   absl::StatusOr<core::Tensor> y = F::CausalSelfAttentionCore(
//       F::RotaryQkv(n1[1], q_w, k_w, v_w, tables, n_head, n_kv_head), n_head);
//   ASSIGN_OR_RETURN(core::Tensor h, F::LinearResidual(y, o_w, core::Tensor(), n1[0]));
//   ASSIGN_OR_RETURN(std::vector<core::Tensor> n2, F::ResidualRmsNorm(h, post_norm_w, norm));
//   absl::StatusOr<core::Tensor> out =
//       F::LinearResidual(F::SwiGlu(n2[1], gate_w, up_w), down_w, core::Tensor(), n2[0]);
//
// NOTE [Llama functional fusions]: as NOTE [Functional fusions] (fused.h) for the GPT-2 block.
// Each op issues the dispatch calls (nn/tensor_ops.h) of the layers' fused step it names (the
// reference llama_fused_test checks each op against), in its order, so a layer of them gives the
// bits of the hand-written layer it replaced. Weights that are parameter leaves get their
// gradients added into Parameter::grad by the backward's own GEMMs and passes (beta 1, made fp32
// zeros first where undefined), as the layers do; any other gets its gradient returned. Under bf16
// weights the ops keep the layer's bf16 storage: a normed output, the packed q, k, v and SwiGLU's h
// are stored bf16 where a bf16 GEMM takes them, the gradients SiLU*up and the rotary packing hand
// to the projections are bf16 inside one op, and every GEMM operand is rounded once (NOTE [bf16
// GEMMs] in nn/linear.h). Bf16 gradients pass between ops as in fused.h: under bf16 weights (c)
// the heads' gradient, which o_proj's LinearResidual stores bf16 from its GEMM,
// reaches CausalSelfAttentionCore as it is, and (b) ResidualRmsNorm's backward writes the bf16
// copy of the residual stream's gradient that o_proj's LinearResidual takes (NOTE [bf16 gradient
// copies] in core/autograd.h). (The letters are fused.h's; Llama has no GELU, (a), and its
// attention hands dL/dqkv on in fp32 either way, (d).) On CUDA the bf16 layer is checked within a
// bf16 rounding of the CPU (cuda_llama_fused_test); fp32 weights issue the same calls.
#ifndef NN_FUNCTIONAL_LLAMA_FUSED_H_
#define NN_FUNCTIONAL_LLAMA_FUSED_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/autograd.h"
#include "core/tensor.h"
#include "nn/rotary.h"

namespace nn {
namespace functional {

struct FusedRmsNormOptions {
  float eps = 1e-6f;  // nn::RmsNorm's default
  // Store `normed` bf16 when the weight is bf16, for the bf16 GEMMs that take it
  // (RmsNorm::ForwardForGemm; NOTE [GEMM epilogues]). False, or an fp32 weight: fp32.
  bool normed_for_gemm = true;
};

// {x_out, normed} for a pre-norm residual stream: x_out is x itself (the same storage, a new
// handle: the residual branch adds to it) and normed = RmsNorm(x, w) as nn::RmsNorm (dtype per
// options.normed_for_gemm). x fp32 [..., C]; w [C] fp32 or bf16. The backward takes both
// gradients and gives x's as RmsNorm'(g_normed) + g_x_out in the norm's own pass
// (RmsNorm::BackwardAdd, NOTE [Fused ops]'s RmsNormBackwardAdd): the layer's residual sum, its
// bits. w gets the norm's gradient. A gradient missing for one output counts as zeros.
// InvalidArgument "ResidualRmsNorm: ..." naming the argument, or for an eps negative or not
// finite.
absl::StatusOr<std::vector<core::Tensor>> ResidualRmsNorm(core::Arg x, core::Arg w,
                                                          const FusedRmsNormOptions& options = {});

// qkv [B, T, 3 n_head D], the grouped-query attention's q, k and v in the attention core's layout
// (CausalSelfAttentionCore with n_head): q = x q_w^T, k = x k_w^T, v = x v_w^T from three GEMMs on
// x rounded once (one bf16 copy for the three), q and k turned by the rotary embedding of their
// position t in 0 .. T-1, and each of the n_kv_head kv heads repeated for the n_head / n_kv_head
// query heads of its group (nn::RotaryPackQkv; NOTE [Grouped-query attention]). qkv is bf16 when
// the weights are (bf16 attention, NOTE [bf16 attention]), else fp32. x [B, T, C] fp32 (bf16 with
// bf16 weights); q_w [n_head D, C]; k_w and v_w [n_kv_head D, C]; the three of one dtype, fp32 or
// bf16, no biases; D even; tables (nn::MakeRotaryTables) of head width D with at least T positions,
// on x's device. Gradients (GroupedQueryAttention's backward): from dL/dqkv the rotary packing's
// backward gives dL/dq, dL/dk and dL/dv (each kv head's the sum over its group, q and k turned
// back; bf16 under bf16 weights, for the GEMMs that round them so), then each projection's input
// and weight gradient GEMMs in the order q, k, v, k's and v's input gradients added to the sum so
// far in their GEMM's epilogue (kResidual). InvalidArgument "RotaryQkv: ..." naming the
// argument.
absl::StatusOr<core::Tensor> RotaryQkv(core::Arg x, core::Arg q_w, core::Arg k_w, core::Arg v_w,
                                       const RotaryTables& tables, int64_t n_head,
                                       int64_t n_kv_head);

struct SwiGluOptions {
  // Store h bf16 when the weights are bf16, for down_proj's bf16 GEMM (SwiGluMlp does when
  // down_proj's weight is bf16: NOTE [GEMM epilogues]). False, or fp32 weights: fp32.
  bool h_for_gemm = true;
};

// h = silu(x gate_w^T) * (x up_w^T), SwiGLU's hidden activation (SwiGluMlp up to down_proj): the
// two GEMMs on x rounded once (one bf16 copy for both), their fp32 outputs into nn::SiluMulForward.
// h
// [..., I] is bf16 per options.h_for_gemm. x [..., C] fp32 (bf16 with bf16 weights); gate_w and
// up_w [I, C] of one dtype, fp32 or bf16, no biases. Gradients (SwiGluMlp's backward below
// down_proj): nn::SiluMulBackward gives dL/dgate and dL/dup (bf16 under bf16 weights), then gate's
// input and weight gradient GEMMs and up's, up's input gradient added to gate's in its GEMM's
// epilogue. InvalidArgument "SwiGlu: ..." naming the argument.
absl::StatusOr<core::Tensor> SwiGlu(core::Arg x, core::Arg gate_w, core::Arg up_w,
                                    const SwiGluOptions& options = {});

// The packing step of RotaryQkv for q, k and v made elsewhere (GroupedQueryAttention's forward when
// a projection is called with its hooks): qkv [B, T, 3 n_head D] in `dtype` (fp32, or bf16 for
// bf16 attention) from q [B, T, n_head D] and k, v [B, T, n_kv_head D], all fp32 on one device, q
// and k turned by the rotary embedding of their position and each kv head repeated for its group
// (nn::RotaryPackQkv, the bits of RotaryQkv's packing). Gradients: nn::RotaryPackQkvBackward's
// (each kv head's the sum over its group), fp32, or bf16 for a producer that takes it so (NOTE
// [Functional fusions] in fused.h). tables as RotaryQkv's. InvalidArgument
// "PackRotaryQkv: ..." naming the argument.
absl::StatusOr<core::Tensor> PackRotaryQkv(core::Arg q, core::Arg k, core::Arg v,
                                           const RotaryTables& tables, int64_t n_head,
                                           int64_t n_kv_head,
                                           core::DType dtype = core::DType::kFloat32);

// h = silu(gate) * up, SwiGLU's product for gate and up made elsewhere (SwiGluMlp's forward when a
// projection is called with its hooks), through nn::SiluMulForward and SiluMulBackward: the bits of
// SwiGlu's product. gate and up fp32 of one shape on one device; h in `dtype` (bf16 for a bf16 GEMM
// that takes it: NOTE [GEMM epilogues]). Gradients fp32, or bf16 for a producer that takes it so
// (NOTE [Functional fusions] in fused.h). InvalidArgument "SiluMul: ..." naming the argument.
absl::StatusOr<core::Tensor> SiluMul(core::Arg gate, core::Arg up,
                                     core::DType dtype = core::DType::kFloat32);

}  // namespace functional
}  // namespace nn

#endif  // NN_FUNCTIONAL_LLAMA_FUSED_H_
