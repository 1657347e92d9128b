#include "nn/internal/attention_core.h"

#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/op_profile.h"
#include "core/status_macros.h"
#include "nn/internal/validate.h"
#include "nn/tensor_ops.h"

namespace nn {
namespace internal {
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

void CausalAttentionCore::Release() {
  qkv_ = core::Tensor();
  att_ = core::Tensor();
  y_ = core::Tensor();
  lse_ = core::Tensor();
}

absl::StatusOr<core::Tensor> CausalAttentionCore::Forward(const core::Module& m, core::Tensor qkv,
                                                          int64_t n_head, bool fused, bool y_bf16) {
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, H = n_head, hd = C / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const core::Device device = qkv.device();
  const std::string what = What(m);
  const bool bf16 = qkv.dtype() == core::DType::kBFloat16;
  n_head_ = n_head;
  if (bf16 && fused && FusedAttentionSupported(device, hd)) {  // NOTE [Fused attention]
    ASSIGN_OR_RETURN(
        core::Tensor y,
        NewActivation({B, T, C}, device, y_bf16 ? core::DType::kBFloat16 : core::DType::kFloat32));
    ASSIGN_OR_RETURN(core::Tensor lse, NewActivation({B, H, T}, device));
    RETURN_IF_ERROR(FusedAttentionForward(what, qkv, H, scale, y, lse));
    qkv_ = std::move(qkv);
    att_ = core::Tensor();
    y_ = y;
    lse_ = std::move(lse);
    return y;
  }
  ASSIGN_OR_RETURN(core::Tensor att, NewActivation({B, H, T, T}, device));
  core::Tensor probs = att;  // fp32: the softmax runs in place
  if (bf16) {
    ASSIGN_OR_RETURN(probs, NewActivation({B, H, T, T}, device, core::DType::kBFloat16));
  }
  ASSIGN_OR_RETURN(core::Tensor y, NewActivation({B, T, C}, device));
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
  qkv_ = std::move(qkv);
  att_ = std::move(probs);
  y_ = core::Tensor();
  lse_ = core::Tensor();
  return y;
}

absl::StatusOr<core::Tensor> CausalAttentionCore::Backward(const core::Module& m, core::Tensor gy,
                                                           bool gqkv_bf16) {
  if (!qkv_.defined()) {
    return absl::FailedPreconditionError(
        absl::StrCat(m.Describe(), ": attention backward without a preceding forward"));
  }
  if (lse_.defined()) return FusedBackward(m, std::move(gy), gqkv_bf16);
  const core::Device device = qkv_.device();
  const int64_t B = qkv_.size(0), T = qkv_.size(1), C = qkv_.size(2) / 3, H = n_head_, hd = C / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const std::string what = What(m);
  const bool bf16 = att_.dtype() == core::DType::kBFloat16;  // NOTE [bf16 attention]
  if (bf16) {
    ASSIGN_OR_RETURN(gy, RoundToBf16(m, gy, "the heads' gradient"));
  }
  ASSIGN_OR_RETURN(core::Tensor gqkv, NewActivation({B, T, 3 * C}, device));
  // dL/datt of one batch element's heads, reused across the batch, and with bf16 its
  // score gradient rounded (the operand of dq and dk).
  ASSIGN_OR_RETURN(core::Tensor gatt, NewActivation({H, T, T}, device));
  core::Tensor gscores = gatt;
  if (bf16) {
    ASSIGN_OR_RETURN(gscores, NewActivation({H, T, T}, device, core::DType::kBFloat16));
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
      da.b = Heads(qkv_, b, T, 3 * C, 2 * C, hd);
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
      dq.b = Heads(qkv_, b, T, 3 * C, C, hd);
      dq.c = Heads(gqkv, b, T, 3 * C, 0, hd);
      RETURN_IF_ERROR(MatMul(what, dq));
      GemmArgs dk = dq;
      dk.trans_a = true;
      dk.b = Heads(qkv_, b, T, 3 * C, 0, hd);
      dk.c = Heads(gqkv, b, T, 3 * C, C, hd);
      RETURN_IF_ERROR(MatMul(what, dk));
    }
  }
  Release();
  return gqkv;
}

absl::StatusOr<core::Tensor> CausalAttentionCore::FusedBackward(const core::Module& m,
                                                                core::Tensor gy, bool gqkv_bf16) {
  const core::Device device = qkv_.device();
  const int64_t B = qkv_.size(0), T = qkv_.size(1), C = qkv_.size(2) / 3, H = n_head_;
  const float scale = 1.0f / std::sqrt(static_cast<float>(C / H));
  ASSIGN_OR_RETURN(gy, RoundToBf16(m, gy, "the heads' gradient"));
  ASSIGN_OR_RETURN(core::Tensor gqkv,
                   NewActivation({B, T, 3 * C}, device,
                                 gqkv_bf16 ? core::DType::kBFloat16 : core::DType::kFloat32));
  ASSIGN_OR_RETURN(core::Tensor delta, NewActivation({B, H, T}, device));
  RETURN_IF_ERROR(FusedAttentionBackward(What(m), qkv_, y_, gy, lse_, delta, H, scale, gqkv));
  Release();
  return gqkv;
}

}  // namespace internal
}  // namespace nn
