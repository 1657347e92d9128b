// The GPT-2 block's fused steps as differentiable ops, each a custom function with its own
// backward, which nn::TransformerBlock's forward runs on its children's parameters (NOTE [Block
// forwards] in nn/transformer.h).
//
//   namespace F = nn::functional;
//   // x [B, T, C]; ln_1_w, qkv_w, ... the block's ParameterPtrs.
//   ASSIGN_OR_RETURN(std::vector<core::Tensor> n1, F::ResidualLayerNorm(x, ln_1_w, ln_1_b));
//   absl::StatusOr<core::Tensor> y =
//       F::CausalSelfAttentionCore(F::LinearForGemm(n1[1], qkv_w, qkv_b), n_head);
//   ASSIGN_OR_RETURN(core::Tensor h, F::LinearResidual(y, attn_proj_w, attn_proj_b, n1[0]));
//   ASSIGN_OR_RETURN(std::vector<core::Tensor> n2, F::ResidualLayerNorm(h, ln_2_w, ln_2_b));
//   ASSIGN_OR_RETURN(std::vector<core::Tensor> fc, F::LinearGelu(n2[1], fc_w, fc_b));
//   absl::StatusOr<core::Tensor> out = F::GeluLinear(fc[0], fc[1], proj_w, proj_b, n2[0]);
//
// NOTE [Functional fusions]: each op issues the dispatch calls (nn/tensor_ops.h) of one fused
// step of the layers (the norms' one-pass residual forms, LayerNorm::ForwardAdd and BackwardAdd,
// are the reference fused_test checks against; the Linear steps are nn::Linear's GEMMs with the
// bias, GELU or residual in their epilogues, NOTE [GEMM epilogues]), in its order, so a block of
// them gives the bits of the hand-written block they replaced (the demo's losses and
// bench:step_roofline's op list are unchanged). Weights and biases that are parameter leaves get
// their gradients added into Parameter::grad by the backward's own GEMMs and passes (beta 1, made
// fp32 zeros first where undefined), as the layers do; any other gets its gradient returned. Under
// bf16 weights the ops keep the layers' bf16 storage: a LayerNorm output, qkv, GELU's h and
// pre-activation are stored bf16 where a bf16 GEMM takes them (NOTE [GEMM epilogues]), and every
// GEMM operand is rounded once (NOTE [bf16 GEMMs] in nn/linear.h). Where one step hands a bf16
// gradient to the next, the producer passes it bf16 and the receiver takes it as it is
// (core::FunctionOptions::bf16_grad_outputs; NOTE [Autograd]). Under bf16 weights that is (a)
// GELU's pre-activation gradient, which GeluLinear's GEMM stores bf16 (its epilogue reads the bf16
// pre) for LinearGelu; (c) the heads' gradient, which LinearResidual's (or F::Linear's) input
// gradient GEMM stores bf16 when its input's producer takes it so (CausalSelfAttentionCore with
// bf16 q, k, v); (d) with the fused attention kernel, dL/dqkv, written bf16 when qkv's producer
// takes it so (LinearForGemm). A Linear step stores dL/dx bf16 wherever its input's producer takes
// it. A receiver takes bf16 only for an output whose gradient its bf16 GEMMs round anyway; one
// that gets fp32 instead (a second consumer: the engine sums in fp32; a producer that is not
// fused) rounds it itself. (b) LinearResidual needs the residual stream's gradient fp32 for the
// residual and bf16 for its GEMMs: ResidualLayerNorm's backward, which computes it, also writes
// the bf16 copy in its pass (NOTE [bf16 gradient copies] in core/autograd.h), as
// LayerNorm::BackwardAdd's sum16 does. On CUDA the bf16 block is checked within a bf16 rounding
// of the CPU (cuda_fused_test); fp32 weights issue the same calls.
#ifndef NN_FUNCTIONAL_FUSED_H_
#define NN_FUNCTIONAL_FUSED_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/autograd.h"
#include "core/tensor.h"

namespace nn {
namespace functional {

// y = x w^T + b, as F::Linear (the same checks, gradients and bits), but y is stored bf16 when w is
// bf16, each element the fp32 value rounded once: the input of a bf16 GEMM or of bf16 attention
// (Linear::ForwardForGemm, attention's qkv). fp32 with an fp32 w. x is fp32, or bf16 with a bf16 w;
// b is optional. InvalidArgument "LinearForGemm: ..." naming the argument for a wrong shape, dtype
// or device.
absl::StatusOr<core::Tensor> LinearForGemm(core::Arg x, core::Arg w, core::Arg b = core::Tensor());

// {h, pre}: pre = x w^T + b and h = GELU(pre) (tanh form) from one GEMM with the bias and the GELU
// in its epilogue (kBiasGelu), both bf16 when w is bf16 (for GeluLinear's bf16 GEMM),
// else fp32. x [..., in] fp32 (bf16 with a bf16 w), w [out, in], b [out] (a bias is needed).
// Gradients: the gradient reaching pre (GeluLinear sends its own there) goes back through the GEMM
// as a Linear's backward: dx, dw and db. A gradient reaching h directly (any
// consumer other than GeluLinear) is multiplied by GELU'(pre) and added to pre's, after
// GeluLinear's (h is recorded by a node of its own, "LinearGelu.h", that runs only when such a
// gradient arrives). InvalidArgument "LinearGelu: ..." naming the argument.
absl::StatusOr<std::vector<core::Tensor>> LinearGelu(core::Arg x, core::Arg w, core::Arg b);

// y = [residual +] h w^T [+ b], fp32, where h = GELU(pre) as LinearGelu made them (the MLP's proj;
// the bias and the residual added in the GEMM's epilogue). h
// and pre: one shape [..., in] and dtype, fp32 or (with a bf16 w) bf16; residual, when given, fp32
// [..., out]. Gradients: pre gets dy w times GELU'(pre) from the GEMM's epilogue
// (kDGelu), h none (its gradient is in pre's, which is why h must be
// GELU(pre)); residual gets dy; w and b as proj's backward adds them. InvalidArgument
// "GeluLinear: ..." naming the argument for a wrong shape, dtype or device, or when h requires
// gradients and pre does not (h's gradient would be lost).
absl::StatusOr<core::Tensor> GeluLinear(core::Arg h, core::Arg pre, core::Arg w,
                                        core::Arg b = core::Tensor(),
                                        core::Arg residual = core::Tensor());

// y = x + b with b [...] the trailing dimensions of x [..., ...] (b.numel() elements as a row
// added to every row of x viewed as [x.numel() / b.numel(), b.numel()]), through nn::BiasAdd: the
// GPT's token embedding plus its position embedding. x fp32, b fp32 or bf16. Gradients: x gets dy,
// b the column sums of dy (nn::AccumulateColumnSums, the order the layers' bias gradients use),
// added into Parameter::grad when b is a parameter. InvalidArgument "BiasAdd: ..." naming the
// argument when b's shape is not x's trailing dimensions, or a dtype or device is wrong.
absl::StatusOr<core::Tensor> BiasAdd(core::Arg x, core::Arg b);

// y = residual + x w^T [+ b], fp32, the bias and the residual added in the GEMM's epilogue
// (kBiasResidual, or kResidual without a bias: attention's proj with the block's residual). x [...,
// in] fp32 (bf16 with a bf16 w), b optional, residual fp32 [..., out]. Gradients: x, w and b as
// Linear's backward, residual gets dy. InvalidArgument "LinearResidual: ..." naming the argument.
absl::StatusOr<core::Tensor> LinearResidual(core::Arg x, core::Arg w, core::Arg b,
                                            core::Arg residual);

struct FusedNormOptions {
  float eps = 1e-5f;
  // Store `normed` bf16 when the weight is bf16, for the bf16 GEMM that takes it
  // (LayerNorm::ForwardForGemm; NOTE [GEMM epilogues]). False, or an fp32 weight: fp32.
  bool normed_for_gemm = true;
};

// {x_out, normed} for a pre-LN residual stream: x_out is x itself (the same storage, a new handle:
// the residual branch adds to it) and normed = LayerNorm(x, w, b) as nn::LayerNorm (dtype per
// options.normed_for_gemm). x fp32 [..., C]; w and b [C], both fp32 or both bf16. The backward
// takes both gradients and gives x's as LN'(g_normed) + g_x_out in the LayerNorm's own pass
// (LayerNorm::BackwardAdd, as NOTE [Fused ops]'s LayerNormBackwardAdd): the residual's sum, the
// block's bits. w and b get the LayerNorm's gradients. A gradient missing for one output counts as
// zeros. InvalidArgument "ResidualLayerNorm: ..." naming the argument, or for an eps negative or
// not finite.
absl::StatusOr<std::vector<core::Tensor>> ResidualLayerNorm(core::Arg x, core::Arg w, core::Arg b,
                                                            const FusedNormOptions& options = {});

// {sum, normed}: sum = a + b and normed = LayerNorm(sum, w, bias) in one pass
// (LayerNorm::ForwardAdd, NOTE [Fused ops]'s AddLayerNormForward: the block's ln_2 after an
// attention whose output is not added in its GEMM). a and b fp32 of one shape on one device; w,
// bias and the options as ResidualLayerNorm. The backward gives a and b both LN'(g_normed) + g_sum
// from one pass, as ResidualLayerNorm's. InvalidArgument "AddLayerNorm: ..." naming the argument.
absl::StatusOr<std::vector<core::Tensor>> AddLayerNorm(core::Arg a, core::Arg b, core::Arg w,
                                                       core::Arg bias,
                                                       const FusedNormOptions& options = {});

struct AttentionCoreOptions {
  // Take the fused kernel where it applies (NOTE [Fused attention] in nn/attention.h: bf16 qkv and
  // a head width of 64 or 128); CausalSelfAttention::set_fused.
  bool fused = true;
  // The fused kernel stores y bf16, for a bf16 GEMM that takes it (attention's proj with a bf16
  // weight): the rounding that GEMM would do, and what the kernel's backward reads. The unfused
  // path's y is fp32 either way.
  bool y_bf16 = false;
};

// y [B, T, C]: per batch element and head h of n_head, softmax(q k^T / sqrt(C / n_head), causal) v,
// the heads side by side, with q, k, v packed in qkv [B, T, 3C] (nanoGPT's c_attn split; head h at
// columns h * hd of each): what CausalSelfAttention runs between its projections
// (nn::internal::CausalAttentionCore), with its own backward giving dL/dqkv (fp32; bf16 from the
// fused kernel where qkv's producer takes it so). With bf16 qkv y's gradient may arrive bf16
// (NOTE [Functional fusions]). qkv fp32, or
// bf16 for bf16 attention (NOTE [bf16 attention] in nn/attention.h; LinearForGemm stores it so
// under a bf16 weight). y is fp32 (bf16 per options.y_bf16). InvalidArgument
// "CausalSelfAttentionCore: ..." for qkv not [B, T, 3C] fp32 or bf16 with C divisible by a positive
// n_head.
absl::StatusOr<core::Tensor> CausalSelfAttentionCore(core::Arg qkv, int64_t n_head,
                                                     const AttentionCoreOptions& options = {});

}  // namespace functional
}  // namespace nn

#endif  // NN_FUNCTIONAL_FUSED_H_
