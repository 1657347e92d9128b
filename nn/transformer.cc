#include "nn/transformer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nn/functional/elementwise.h"
#include "nn/functional/fused.h"
#include "nn/functional/linear.h"
#include "nn/internal/validate.h"
#include "nn/ops.h"

namespace nn {

namespace F = ::nn::functional;

Mlp::Mlp(int64_t n_embd, uint64_t seed) {
  config_error_ = internal::PositiveOrMessage("n_embd", n_embd);
  const int64_t c = std::max<int64_t>(n_embd, 1);
  fc_ = RegisterModule("fc", std::make_shared<Linear>(c, 4 * c, true, DeriveSeed(seed, 0)));
  gelu_ = RegisterModule("gelu", std::make_shared<GELU>());
  proj_ = RegisterModule("proj", std::make_shared<Linear>(4 * c, c, true, DeriveSeed(seed, 1)));
}

namespace {

// NOTE [Block forwards]: whether `mlp`'s children run inline (and fc and proj have the biases its
// fused steps add).
bool ChildrenRunInline(const Mlp& mlp) {
  return internal::RunsInline(*mlp.fc()) && internal::RunsInline(*mlp.gelu()) &&
         internal::RunsInline(*mlp.proj()) && mlp.fc()->bias() != nullptr &&
         mlp.proj()->bias() != nullptr;
}

// [residual +] proj(gelu(fc(x))) on `mlp`'s parameters (residual undefined: none): fc's GEMM adds
// the bias and applies the GELU in its epilogue, storing h and the pre-activation bf16 for
// proj's bf16 GEMM (NOTE [GEMM epilogues]); proj's adds its bias and the residual.
absl::StatusOr<core::Tensor> MlpInline(const Mlp& mlp, const core::Tensor& x,
                                       const core::Tensor& residual) {
  ASSIGN_OR_RETURN(const std::vector<core::Tensor> fc,
                   F::LinearGelu(x, mlp.fc()->weight(), mlp.fc()->bias()));
  return F::GeluLinear(fc[0], fc[1], mlp.proj()->weight(), mlp.proj()->bias(), residual);
}

}  // namespace

absl::StatusOr<core::Tensors> Mlp::ForwardGraph(const core::Tensors& in) {
  if (!config_error_.empty()) return internal::ModuleError(*this, config_error_);
  RETURN_IF_ERROR(internal::CheckInputCount(*this, in, 1));
  RETURN_IF_ERROR(internal::CheckMaterialized(*this));
  if (ChildrenRunInline(*this)) {
    ASSIGN_OR_RETURN(core::Tensor y,
                     internal::InModule(*this, MlpInline(*this, in[0], core::Tensor())));
    return core::Tensors{std::move(y)};
  }
  ASSIGN_OR_RETURN(core::Tensor y, proj_->CallOne({gelu_->CallOne({fc_->CallOne({in[0]})})}));
  return core::Tensors{std::move(y)};
}

TransformerBlock::TransformerBlock(int64_t n_embd, int64_t n_head, uint64_t seed) {
  ln_1_ = RegisterModule("ln_1", std::make_shared<LayerNorm>(n_embd));
  attn_ = RegisterModule(
      "attn", std::make_shared<CausalSelfAttention>(n_embd, n_head, DeriveSeed(seed, 0)));
  ln_2_ = RegisterModule("ln_2", std::make_shared<LayerNorm>(n_embd));
  mlp_ = RegisterModule("mlp", std::make_shared<Mlp>(n_embd, DeriveSeed(seed, 1)));
}

absl::StatusOr<core::Tensors> TransformerBlock::ForwardGraph(const core::Tensors& in) {
  RETURN_IF_ERROR(internal::CheckInputCount(*this, in, 1));
  RETURN_IF_ERROR(internal::CheckMaterialized(*this));
  // NOTE [Block forwards]: a LayerNorm run inline adds the residual's gradient in its backward
  // pass and stores its output bf16 under bf16 weights when a GEMM run inline takes it.
  const bool attn_inline = internal::RunsInline(*attn_);
  const bool ln_2_inline = internal::RunsInline(*ln_2_);
  const bool mlp_inline = internal::RunsInline(*mlp_) && ChildrenRunInline(*mlp_);
  // h = x + attn(ln_1(x)).
  core::Tensor residual = in[0];
  core::Tensor n1;
  if (internal::RunsInline(*ln_1_)) {
    ASSIGN_OR_RETURN(
        const std::vector<core::Tensor> r,
        internal::InModule(*ln_1_, F::ResidualLayerNorm(residual, ln_1_->weight(), ln_1_->bias(),
                                                        {ln_1_->eps(), attn_inline})));
    residual = r[0];
    n1 = r[1];
  } else {
    ASSIGN_OR_RETURN(n1, ln_1_->CallOne({residual}));
  }
  core::Tensor h;
  core::Tensor n2;  // ln_2(h), when made with h
  if (attn_inline) {
    // qkv stored for attention's bf16 GEMMs; proj's GEMM adds the bias and the residual.
    const bool y_bf16 = attn_->proj()->weight()->data.dtype() == core::DType::kBFloat16;
    ASSIGN_OR_RETURN(
        h, internal::InModule(*attn_,
                              F::LinearResidual(attn_->Heads(n1, y_bf16), attn_->proj()->weight(),
                                                BiasArg(*attn_->proj()), residual)));
  } else {
    ASSIGN_OR_RETURN(const core::Tensor a, attn_->CallOne({n1}));
    if (ln_2_inline) {
      // The residual add and ln_2 in one pass.
      ASSIGN_OR_RETURN(
          const std::vector<core::Tensor> r,
          internal::InModule(*ln_2_, F::AddLayerNorm(residual, a, ln_2_->weight(), ln_2_->bias(),
                                                     {ln_2_->eps(), mlp_inline})));
      h = r[0];
      n2 = r[1];
    } else {
      ASSIGN_OR_RETURN(h, internal::InModule(*this, F::Add(residual, a)));
    }
  }
  // y = h + mlp(ln_2(h)).
  if (!n2.defined()) {
    if (ln_2_inline) {
      ASSIGN_OR_RETURN(
          const std::vector<core::Tensor> r,
          internal::InModule(*ln_2_, F::ResidualLayerNorm(h, ln_2_->weight(), ln_2_->bias(),
                                                          {ln_2_->eps(), mlp_inline})));
      h = r[0];
      n2 = r[1];
    } else {
      ASSIGN_OR_RETURN(n2, ln_2_->CallOne({h}));
    }
  }
  core::Tensor y;
  if (mlp_inline) {
    ASSIGN_OR_RETURN(y, internal::InModule(*mlp_, MlpInline(*mlp_, n2, h)));
  } else {
    ASSIGN_OR_RETURN(y, internal::InModule(*this, F::Add(h, mlp_->CallOne({n2}))));
  }
  return core::Tensors{std::move(y)};
}

}  // namespace nn
