#include "nn/transformer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nn/internal/validate.h"
#include "nn/ops.h"
#include "nn/tensor_ops.h"

namespace nn {
namespace {

// a + b into a fresh activation on their device (a residual connection of `m`).
absl::StatusOr<core::Tensor> Add(const core::Module& m, const core::Tensor& a,
                                 const core::Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != core::DType::kFloat32 ||
      b.dtype() != core::DType::kFloat32) {
    return internal::ModuleError(
        m, absl::StrCat("residual operands differ: ", a.ToString(), " and ", b.ToString()));
  }
  RETURN_IF_ERROR(internal::CheckDevice(m, b, "residual operand", a.device(), "the other"));
  ASSIGN_OR_RETURN(core::Tensor out, internal::NewActivation(a.shape(), a.device()));
  RETURN_IF_ERROR(AddTensors(internal::What(m), a, b, out));
  return out;
}

}  // namespace

Mlp::Mlp(int64_t n_embd, uint64_t seed) {
  config_error_ = internal::PositiveOrMessage("n_embd", n_embd);
  const int64_t c = std::max<int64_t>(n_embd, 1);
  fc_ = RegisterModule("fc", std::make_shared<Linear>(c, 4 * c, true, DeriveSeed(seed, 0)));
  gelu_ = RegisterModule("gelu", std::make_shared<GELU>());
  proj_ = RegisterModule("proj", std::make_shared<Linear>(4 * c, c, true, DeriveSeed(seed, 1)));
}

absl::StatusOr<core::Tensor> Mlp::ForwardImpl(const core::Tensor& x) {
  if (!config_error_.empty()) return internal::ModuleError(*this, config_error_);
  ASSIGN_OR_RETURN(core::Tensor h, fc_->Forward(x));
  ASSIGN_OR_RETURN(h, gelu_->Forward(h));
  return proj_->Forward(h);
}

absl::StatusOr<core::Tensor> Mlp::BackwardImpl(const core::Tensor& grad_output) {
  ASSIGN_OR_RETURN(core::Tensor g, proj_->Backward(grad_output));
  ASSIGN_OR_RETURN(g, gelu_->Backward(g));
  return fc_->Backward(g);
}

TransformerBlock::TransformerBlock(int64_t n_embd, int64_t n_head, uint64_t seed) {
  ln_1_ = RegisterModule("ln_1", std::make_shared<LayerNorm>(n_embd));
  attn_ = RegisterModule(
      "attn", std::make_shared<CausalSelfAttention>(n_embd, n_head, DeriveSeed(seed, 0)));
  ln_2_ = RegisterModule("ln_2", std::make_shared<LayerNorm>(n_embd));
  mlp_ = RegisterModule("mlp", std::make_shared<Mlp>(n_embd, DeriveSeed(seed, 1)));
}

absl::StatusOr<core::Tensor> TransformerBlock::ForwardImpl(const core::Tensor& x) {
  ASSIGN_OR_RETURN(core::Tensor a, ln_1_->Forward(x));
  ASSIGN_OR_RETURN(a, attn_->Forward(a));
  ASSIGN_OR_RETURN(core::Tensor h, Add(*this, x, a));
  ASSIGN_OR_RETURN(core::Tensor m, ln_2_->Forward(h));
  ASSIGN_OR_RETURN(m, mlp_->Forward(m));
  ASSIGN_OR_RETURN(core::Tensor y, Add(*this, h, m));
  input_shape_ = x.shape();
  return y;
}

absl::StatusOr<core::Tensor> TransformerBlock::BackwardImpl(const core::Tensor& grad_output) {
  RETURN_IF_ERROR(
      internal::CheckGradOutput(*this, !input_shape_.empty(), input_shape_, grad_output));
  // y = h + mlp(ln_2(h)): dL/dh = g + ln_2'(mlp'(g)).
  ASSIGN_OR_RETURN(core::Tensor gm, mlp_->Backward(grad_output));
  ASSIGN_OR_RETURN(gm, ln_2_->Backward(gm));
  ASSIGN_OR_RETURN(core::Tensor gh, Add(*this, grad_output, gm));
  // h = x + attn(ln_1(x)): dL/dx = gh + ln_1'(attn'(gh)).
  ASSIGN_OR_RETURN(core::Tensor ga, attn_->Backward(gh));
  ASSIGN_OR_RETURN(ga, ln_1_->Backward(ga));
  input_shape_.clear();
  return Add(*this, gh, ga);
}

}  // namespace nn
