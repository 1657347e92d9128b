#include "nn/attention.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/op_profile.h"
#include "core/status_macros.h"
#include "nn/internal/validate.h"
#include "nn/ops.h"
#include "nn/tensor_ops.h"

namespace nn {

CausalSelfAttention::CausalSelfAttention(int64_t n_embd, int64_t n_head, uint64_t seed)
    : n_embd_(n_embd), n_head_(n_head) {
  config_error_ = internal::FirstError({internal::PositiveOrMessage("n_embd", n_embd),
                                        internal::PositiveOrMessage("n_head", n_head)});
  if (config_error_.empty() && n_embd % n_head != 0) {
    config_error_ =
        absl::StrCat("n_embd (", n_embd, ") must be divisible by n_head (", n_head, ")");
  }
  const int64_t c = std::max<int64_t>(n_embd, 1);
  qkv_ = RegisterModule("qkv", std::make_shared<Linear>(c, 3 * c, true, DeriveSeed(seed, 0)));
  proj_ = RegisterModule("proj", std::make_shared<Linear>(c, c, true, DeriveSeed(seed, 1)));
}

namespace {

// Head h of batch element b inside a [B, T, width] buffer, starting at column `col`:
// a batch (over heads) of [T, hd] matrices with row stride `width`, head stride hd.
MatrixRef Heads(const core::Tensor& t, int64_t b, int64_t T, int64_t width, int64_t col,
                int64_t hd) {
  MatrixRef r;
  r.tensor = t;
  r.offset = b * T * width + col;
  r.ld = width;
  r.batch_stride = hd;
  return r;
}

// The [T, T] matrices of `heads` consecutive heads starting at head `first`.
MatrixRef Squares(const core::Tensor& t, int64_t first, int64_t T) {
  MatrixRef r;
  r.tensor = t;
  r.offset = first * T * T;
  r.ld = T;
  r.batch_stride = T * T;
  return r;
}

}  // namespace

absl::StatusOr<core::Tensor> CausalSelfAttention::ForwardImpl(const core::Tensor& x) {
  if (!config_error_.empty()) return internal::ModuleError(*this, config_error_);
  RETURN_IF_ERROR(internal::CheckTensor(*this, x, core::DType::kFloat32, "input"));
  if (x.dim() != 3 || x.size(2) != n_embd_) {
    return internal::ModuleError(*this, absl::StrCat("input must be [B, T, ", n_embd_, "], got ",
                                                     core::ShapeToString(x.shape())));
  }
  const int64_t B = x.size(0), T = x.size(1), C = n_embd_, H = n_head_, hd = C / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const core::Device device = x.device();
  const std::string what = internal::What(*this);
  ASSIGN_OR_RETURN(core::Tensor qkv, qkv_->Forward(x));
  // NOTE [bf16 attention] (attention.h): with a bf16 qkv weight, q, k, v and the
  // probabilities are bf16 GEMM operands, the scores fp32.
  const bool bf16 = qkv_->weight()->data.dtype() == core::DType::kBFloat16;
  if (bf16) {
    ASSIGN_OR_RETURN(qkv, internal::RoundToBf16(*this, qkv, "q, k and v"));
  }
  if (bf16 && fused_ && FusedAttentionSupported(device, hd)) {  // NOTE [Fused attention]
    ASSIGN_OR_RETURN(core::Tensor y, internal::NewActivation({B, T, C}, device));
    ASSIGN_OR_RETURN(core::Tensor lse, internal::NewActivation({B, H, T}, device));
    RETURN_IF_ERROR(FusedAttentionForward(what, qkv, H, scale, y, lse));
    ASSIGN_OR_RETURN(core::Tensor out, proj_->Forward(y));
    qkv_out_ = std::move(qkv);
    att_ = core::Tensor();
    y_ = std::move(y);
    lse_ = std::move(lse);
    return out;
  }
  ASSIGN_OR_RETURN(core::Tensor att, internal::NewActivation({B, H, T, T}, device));
  core::Tensor probs = att;  // fp32: the softmax runs in place
  if (bf16) {
    ASSIGN_OR_RETURN(probs, internal::NewActivation({B, H, T, T}, device, core::DType::kBFloat16));
  }
  ASSIGN_OR_RETURN(core::Tensor y, internal::NewActivation({B, T, C}, device));
  {
    // NOTE [Op accounting]: the score and value GEMMs count as attention.
    core::ScopedOpCategory role(core::OpCategory::kAttention);
    for (int64_t b = 0; b < B; ++b) {
      // Scores of every head, q k^T * scale; entries above the diagonal are masked below.
      GemmArgs scores;
      scores.trans_b = true;
      scores.batch = H;
      scores.m = T;
      scores.n = T;
      scores.k = hd;
      scores.alpha = scale;
      scores.a = Heads(qkv, b, T, 3 * C, 0, hd);
      scores.b = Heads(qkv, b, T, 3 * C, C, hd);
      scores.c = Squares(att, b * H, T);
      RETURN_IF_ERROR(MatMul(what, scores));
    }
    RETURN_IF_ERROR(CausalSoftmaxForward(what, att, T, bf16 ? probs : core::Tensor()));
    for (int64_t b = 0; b < B; ++b) {
      // y_h = att v, written into columns [h*hd, (h+1)*hd) of y.
      GemmArgs av;
      av.batch = H;
      av.m = T;
      av.n = hd;
      av.k = T;
      av.a = Squares(probs, b * H, T);
      av.b = Heads(qkv, b, T, 3 * C, 2 * C, hd);
      av.c = Heads(y, b, T, C, 0, hd);
      RETURN_IF_ERROR(MatMul(what, av));
    }
  }
  ASSIGN_OR_RETURN(core::Tensor out, proj_->Forward(y));
  qkv_out_ = std::move(qkv);
  att_ = std::move(probs);
  y_ = core::Tensor();
  lse_ = core::Tensor();
  return out;
}

absl::StatusOr<core::Tensor> CausalSelfAttention::BackwardImpl(const core::Tensor& grad_output) {
  const bool have_cache = qkv_out_.defined();
  RETURN_IF_ERROR(internal::CheckGradOutput(
      *this, have_cache,
      have_cache ? core::Shape{qkv_out_.size(0), qkv_out_.size(1), n_embd_} : core::Shape{},
      grad_output));
  const core::Device device = qkv_out_.device();
  RETURN_IF_ERROR(internal::CheckDevice(*this, grad_output, "grad_output", device, "the input"));
  const int64_t B = qkv_out_.size(0), T = qkv_out_.size(1), C = n_embd_, H = n_head_, hd = C / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const std::string what = internal::What(*this);
  ASSIGN_OR_RETURN(core::Tensor gy, proj_->Backward(grad_output));
  if (lse_.defined()) return FusedBackward(std::move(gy));
  const bool bf16 = att_.dtype() == core::DType::kBFloat16;  // NOTE [bf16 attention]
  if (bf16) {
    ASSIGN_OR_RETURN(gy, internal::RoundToBf16(*this, gy, "the heads' gradient"));
  }
  ASSIGN_OR_RETURN(core::Tensor gqkv, internal::NewActivation({B, T, 3 * C}, device));
  // dL/datt of one batch element's heads, reused across the batch, and with bf16 its
  // score gradient rounded (the operand of dq and dk).
  ASSIGN_OR_RETURN(core::Tensor gatt, internal::NewActivation({H, T, T}, device));
  core::Tensor gscores = gatt;
  if (bf16) {
    ASSIGN_OR_RETURN(gscores, internal::NewActivation({H, T, T}, device, core::DType::kBFloat16));
  }
  {
    core::ScopedOpCategory role(core::OpCategory::kAttention);
    for (int64_t b = 0; b < B; ++b) {
      // dL/dv = att^T gy_h.
      GemmArgs dv;
      dv.trans_a = true;
      dv.batch = H;
      dv.m = T;
      dv.n = hd;
      dv.k = T;
      dv.a = Squares(att_, b * H, T);
      dv.b = Heads(gy, b, T, C, 0, hd);
      dv.c = Heads(gqkv, b, T, 3 * C, 2 * C, hd);
      RETURN_IF_ERROR(MatMul(what, dv));
      // dL/datt = gy_h v^T.
      GemmArgs da;
      da.trans_b = true;
      da.batch = H;
      da.m = T;
      da.n = T;
      da.k = hd;
      da.a = Heads(gy, b, T, C, 0, hd);
      da.b = Heads(qkv_out_, b, T, 3 * C, 2 * C, hd);
      da.c = Squares(gatt, 0, T);
      RETURN_IF_ERROR(MatMul(what, da));
      // Softmax backward per row, times the score scale: ds = scale * p (da - <da, p>).
      // Masked entries have p == 0 and so get no gradient.
      ASSIGN_OR_RETURN(core::Tensor p, att_.View(b * H * T * T, {H * T * T}));
      RETURN_IF_ERROR(
          CausalSoftmaxBackward(what, p, gatt, T, scale, bf16 ? gscores : core::Tensor()));
      // dL/dq = ds k, dL/dk = ds^T q.
      GemmArgs dq;
      dq.batch = H;
      dq.m = T;
      dq.n = hd;
      dq.k = T;
      dq.a = Squares(gscores, 0, T);
      dq.b = Heads(qkv_out_, b, T, 3 * C, C, hd);
      dq.c = Heads(gqkv, b, T, 3 * C, 0, hd);
      RETURN_IF_ERROR(MatMul(what, dq));
      GemmArgs dk = dq;
      dk.trans_a = true;
      dk.b = Heads(qkv_out_, b, T, 3 * C, 0, hd);
      dk.c = Heads(gqkv, b, T, 3 * C, C, hd);
      RETURN_IF_ERROR(MatMul(what, dk));
    }
  }
  qkv_out_ = core::Tensor();
  att_ = core::Tensor();
  return qkv_->Backward(gqkv);
}

absl::StatusOr<core::Tensor> CausalSelfAttention::FusedBackward(core::Tensor gy) {
  const core::Device device = qkv_out_.device();
  const int64_t B = qkv_out_.size(0), T = qkv_out_.size(1), C = n_embd_, H = n_head_;
  const float scale = 1.0f / std::sqrt(static_cast<float>(C / H));
  ASSIGN_OR_RETURN(gy, internal::RoundToBf16(*this, gy, "the heads' gradient"));
  ASSIGN_OR_RETURN(core::Tensor gqkv, internal::NewActivation({B, T, 3 * C}, device));
  ASSIGN_OR_RETURN(core::Tensor delta, internal::NewActivation({B, H, T}, device));
  RETURN_IF_ERROR(FusedAttentionBackward(internal::What(*this), qkv_out_, y_, gy, lse_, delta, H,
                                         scale, gqkv));
  qkv_out_ = core::Tensor();
  y_ = core::Tensor();
  lse_ = core::Tensor();
  return qkv_->Backward(gqkv);
}

}  // namespace nn
