#include "nn/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nn/internal/validate.h"
#include "nn/ops.h"

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

absl::StatusOr<core::Tensor> CausalSelfAttention::ForwardImpl(const core::Tensor& x) {
  if (!config_error_.empty()) return internal::ModuleError(*this, config_error_);
  RETURN_IF_ERROR(internal::CheckTensor(*this, x, core::DType::kFloat32, "input"));
  if (x.dim() != 3 || x.size(2) != n_embd_) {
    return internal::ModuleError(*this, absl::StrCat("input must be [B, T, ", n_embd_, "], got ",
                                                     core::ShapeToString(x.shape())));
  }
  const int64_t B = x.size(0), T = x.size(1), C = n_embd_, H = n_head_, hd = C / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  ASSIGN_OR_RETURN(core::Tensor qkv, qkv_->Forward(x));
  ASSIGN_OR_RETURN(core::Tensor att, internal::NewActivation({B, H, T, T}));
  ASSIGN_OR_RETURN(core::Tensor y, internal::NewActivation({B, T, C}));
  for (int64_t b = 0; b < B; ++b) {
    const float* base = qkv.data<float>() + b * T * 3 * C;
    for (int64_t h = 0; h < H; ++h) {
      const float* q = base + h * hd;
      const float* k = base + C + h * hd;
      const float* v = base + 2 * C + h * hd;
      float* p = att.data<float>() + (b * H + h) * T * T;
      // Scores for every (t, s); entries above the diagonal are overwritten below.
      Gemm(false, true, T, T, hd, scale, q, 3 * C, k, 3 * C, 0.0f, p, T);
      for (int64_t t = 0; t < T; ++t) {
        float* row = p + t * T;
        float max = row[0];
        for (int64_t s = 1; s <= t; ++s) max = std::max(max, row[s]);
        double sum = 0.0;
        for (int64_t s = 0; s <= t; ++s) {
          row[s] = std::exp(row[s] - max);
          sum += row[s];
        }
        const float inv = static_cast<float>(1.0 / sum);
        for (int64_t s = 0; s <= t; ++s) row[s] *= inv;
        for (int64_t s = t + 1; s < T; ++s) row[s] = 0.0f;
      }
      // y_h = att v, written into columns [h*hd, (h+1)*hd) of y.
      Gemm(false, false, T, hd, T, 1.0f, p, T, v, 3 * C, 0.0f, y.data<float>() + b * T * C + h * hd,
           C);
    }
  }
  ASSIGN_OR_RETURN(core::Tensor out, proj_->Forward(y));
  qkv_out_ = std::move(qkv);
  att_ = std::move(att);
  return out;
}

absl::StatusOr<core::Tensor> CausalSelfAttention::BackwardImpl(const core::Tensor& grad_output) {
  const bool have_cache = qkv_out_.defined();
  RETURN_IF_ERROR(internal::CheckGradOutput(
      *this, have_cache,
      have_cache ? core::Shape{qkv_out_.size(0), qkv_out_.size(1), n_embd_} : core::Shape{},
      grad_output));
  const int64_t B = qkv_out_.size(0), T = qkv_out_.size(1), C = n_embd_, H = n_head_, hd = C / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  ASSIGN_OR_RETURN(core::Tensor gy, proj_->Backward(grad_output));
  ASSIGN_OR_RETURN(core::Tensor gqkv, internal::NewActivation({B, T, 3 * C}));
  std::vector<float> gatt(static_cast<size_t>(T * T));
  for (int64_t b = 0; b < B; ++b) {
    const float* base = qkv_out_.data<float>() + b * T * 3 * C;
    float* gbase = gqkv.data<float>() + b * T * 3 * C;
    const float* gyb = gy.data<float>() + b * T * C;
    for (int64_t h = 0; h < H; ++h) {
      const float* q = base + h * hd;
      const float* k = base + C + h * hd;
      const float* v = base + 2 * C + h * hd;
      const float* p = att_.data<float>() + (b * H + h) * T * T;
      const float* gyh = gyb + h * hd;
      // dL/dv = att^T gy_h.
      Gemm(true, false, T, hd, T, 1.0f, p, T, gyh, C, 0.0f, gbase + 2 * C + h * hd, 3 * C);
      // dL/datt = gy_h v^T.
      Gemm(false, true, T, T, hd, 1.0f, gyh, C, v, 3 * C, 0.0f, gatt.data(), T);
      // Softmax backward per row, times the score scale: ds = scale * p (da - <da, p>).
      // Masked entries have p == 0 and so get no gradient.
      for (int64_t t = 0; t < T; ++t) {
        const float* pr = p + t * T;
        float* gr = gatt.data() + t * T;
        double dot = 0.0;
        for (int64_t s = 0; s <= t; ++s) dot += static_cast<double>(gr[s]) * pr[s];
        for (int64_t s = 0; s <= t; ++s) gr[s] = scale * pr[s] * (gr[s] - static_cast<float>(dot));
        for (int64_t s = t + 1; s < T; ++s) gr[s] = 0.0f;
      }
      // dL/dq = ds k, dL/dk = ds^T q.
      Gemm(false, false, T, hd, T, 1.0f, gatt.data(), T, k, 3 * C, 0.0f, gbase + h * hd, 3 * C);
      Gemm(true, false, T, hd, T, 1.0f, gatt.data(), T, q, 3 * C, 0.0f, gbase + C + h * hd, 3 * C);
    }
  }
  qkv_out_ = core::Tensor();
  att_ = core::Tensor();
  return qkv_->Backward(gqkv);
}

}  // namespace nn
