#include "examples/seq2seq/seq2seq.h"

#include <numeric>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/param_init.h"
#include "core/status_macros.h"
#include "nn/functional/functional.h"

namespace seq2seq {
namespace {

namespace F = ::nn::functional;

// [B, T, heads * D] -> [B, heads, T, D].
absl::StatusOr<core::Tensor> SplitHeads(core::Arg x, int64_t heads) {
  RETURN_IF_ERROR(x.status());
  const core::Shape& s = x.tensor().shape();
  return F::Permute(F::Reshape(x, {s[0], s[1], heads, s[2] / heads}), {0, 2, 1, 3});
}

// 0, 1, ..., n - 1 as int32 on the CPU.
absl::StatusOr<core::Tensor> Positions(int64_t n) {
  std::vector<int32_t> ids(n);
  std::iota(ids.begin(), ids.end(), 0);
  return core::Tensor::FromInts(ids, {n});
}

absl::Status CheckIds(const core::Tensor& ids, const std::string& name, int64_t max_len) {
  if (!ids.defined() || ids.dtype() != core::DType::kInt32 || ids.dim() != 2 || ids.size(1) < 1 ||
      ids.size(1) > max_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("Seq2Seq: ", name, " must be int32 [B, L] with 1 <= L <= max_positions (",
                     max_len, "), got ", ids.defined() ? ids.ToString() : "undefined"));
  }
  return absl::OkStatus();
}

}  // namespace

Attention::Attention(const Seq2SeqConfig& c, bool causal, uint64_t seed)
    : heads_(c.heads), causal_(causal) {
  const int64_t w = c.width;
  wq_ = AllocateParameter("wq", {w, w}, core::ParamInit::FanIn(seed, 0, w));
  bq_ = AllocateParameter("bq", {w}, core::ParamInit::FanIn(seed + 1, 0, w));
  wk_ = AllocateParameter("wk", {w, w}, core::ParamInit::FanIn(seed + 2, 0, w));
  wv_ = AllocateParameter("wv", {w, w}, core::ParamInit::FanIn(seed + 4, 0, w));
  bv_ = AllocateParameter("bv", {w}, core::ParamInit::FanIn(seed + 5, 0, w));
  wo_ = AllocateParameter("wo", {w, w}, core::ParamInit::FanIn(seed + 6, 0, w));
  bo_ = AllocateParameter("bo", {w}, core::ParamInit::FanIn(seed + 7, 0, w));
}

absl::StatusOr<core::Tensors> Attention::ForwardGraph(const core::Tensors& in) {
  if (in.empty() || in.size() > 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Attention: takes {x}, {x, mask} or {x, memory, mask}, got ", in.size(), " inputs"));
  }
  const core::Tensor& x = in[0];
  const core::Tensor& memory = in.size() == 3 ? in[1] : in[0];
  F::AttentionOptions options;
  options.causal = causal_;
  if (in.size() > 1) options.mask = in.back();
  absl::StatusOr<core::Tensor> q = SplitHeads(F::Linear(x, wq_, bq_), heads_);
  absl::StatusOr<core::Tensor> k = SplitHeads(F::Linear(memory, wk_), heads_);
  absl::StatusOr<core::Tensor> v = SplitHeads(F::Linear(memory, wv_, bv_), heads_);
  // [B, H, T, D] -> [B, T, H, D] -> [B, T, C].
  absl::StatusOr<core::Tensor> heads =
      F::Permute(F::ScaledDotProductAttention(q, k, v, options), {0, 2, 1, 3});
  RETURN_IF_ERROR(heads.status());
  const core::Shape& s = heads->shape();
  ASSIGN_OR_RETURN(core::Tensor y,
                   F::Linear(F::Reshape(*heads, {s[0], s[1], s[2] * s[3]}), wo_, bo_));
  return core::Tensors{y};
}

Mlp::Mlp(const Seq2SeqConfig& c, uint64_t seed) {
  w1_ = AllocateParameter("w1", {c.hidden, c.width}, core::ParamInit::FanIn(seed, 0, c.width));
  b1_ = AllocateParameter("b1", {c.hidden}, core::ParamInit::FanIn(seed + 1, 0, c.width));
  w2_ = AllocateParameter("w2", {c.width, c.hidden}, core::ParamInit::FanIn(seed + 2, 0, c.hidden));
  b2_ = AllocateParameter("b2", {c.width}, core::ParamInit::FanIn(seed + 3, 0, c.hidden));
}

absl::StatusOr<core::Tensors> Mlp::ForwardGraph(const core::Tensors& in) {
  ASSIGN_OR_RETURN(core::Tensor y, F::Linear(F::Gelu(F::Linear(in[0], w1_, b1_)), w2_, b2_));
  return core::Tensors{y};
}

absl::StatusOr<core::Tensor> Layer::Residual(const core::Tensor& x, core::Arg branch,
                                             int site) const {
  const DropoutStep& d = *dropout_;
  if (config_.dropout > 0 && d.training && branch.ok()) {
    // Row r of this forward is global row first_row + r: offset by the rows before it.
    const int64_t row_numel = x.numel() / x.size(0);
    branch = F::Dropout(branch, config_.dropout, seed_ * 16 + site, d.step, /*training=*/true,
                        d.first_row * row_numel);
  }
  return F::Add(x, branch);
}

Norm::Norm(const Seq2SeqConfig& c, uint64_t seed) : eps_(c.layer_norm_eps) {
  weight_ = AllocateParameter("weight", {c.width}, core::ParamInit::Normal(seed, 0, 1.0f, 0.1f));
  bias_ = AllocateParameter("bias", {c.width}, core::ParamInit::Normal(seed + 1, 0, 0.0f, 0.1f));
}

absl::StatusOr<core::Tensors> Norm::ForwardGraph(const core::Tensors& in) {
  ASSIGN_OR_RETURN(core::Tensor y, F::LayerNorm(in[0], weight_, bias_, eps_));
  return core::Tensors{y};
}

EncoderLayer::EncoderLayer(const Seq2SeqConfig& c, std::shared_ptr<const DropoutStep> dropout,
                           uint64_t seed)
    : Layer(c, std::move(dropout), seed) {
  norm1_ = RegisterModule("norm1", std::make_shared<Norm>(c, seed));
  norm2_ = RegisterModule("norm2", std::make_shared<Norm>(c, seed + 2));
  attention_ = RegisterModule("attention", std::make_shared<Attention>(c, false, seed + 10));
  mlp_ = RegisterModule("mlp", std::make_shared<Mlp>(c, seed + 20));
}

absl::StatusOr<core::Tensors> EncoderLayer::ForwardGraph(const core::Tensors& in) {
  const core::Tensor& mask = in[1];
  ASSIGN_OR_RETURN(core::Tensor x,
                   Residual(in[0], attention_->CallOne({norm1_->CallOne({in[0]}), mask}), 0));
  ASSIGN_OR_RETURN(core::Tensor y, Residual(x, mlp_->CallOne({norm2_->CallOne({x})}), 1));
  return core::Tensors{y};
}

DecoderLayer::DecoderLayer(const Seq2SeqConfig& c, std::shared_ptr<const DropoutStep> dropout,
                           uint64_t seed)
    : Layer(c, std::move(dropout), seed) {
  norm1_ = RegisterModule("norm1", std::make_shared<Norm>(c, seed));
  norm2_ = RegisterModule("norm2", std::make_shared<Norm>(c, seed + 2));
  norm3_ = RegisterModule("norm3", std::make_shared<Norm>(c, seed + 4));
  self_attention_ =
      RegisterModule("self_attention", std::make_shared<Attention>(c, true, seed + 10));
  cross_attention_ =
      RegisterModule("cross_attention", std::make_shared<Attention>(c, false, seed + 20));
  mlp_ = RegisterModule("mlp", std::make_shared<Mlp>(c, seed + 30));
}

absl::StatusOr<core::Tensors> DecoderLayer::ForwardGraph(const core::Tensors& in) {
  const core::Tensor& memory = in[1];
  const core::Tensor& mask = in[2];
  ASSIGN_OR_RETURN(core::Tensor y,
                   Residual(in[0], self_attention_->CallOne({norm1_->CallOne({in[0]})}), 0));
  ASSIGN_OR_RETURN(y,
                   Residual(y, cross_attention_->CallOne({norm2_->CallOne({y}), memory, mask}), 1));
  ASSIGN_OR_RETURN(y, Residual(y, mlp_->CallOne({norm3_->CallOne({y})}), 2));
  return core::Tensors{y};
}

Seq2Seq::Seq2Seq(const Seq2SeqConfig& c) : config_(c), dropout_(std::make_shared<DropoutStep>()) {
  const uint64_t s = c.seed * 100'000;
  embed_ =
      AllocateParameter("embed", {c.vocab, c.width}, core::ParamInit::Normal(s, 0, 0.0f, 0.5f));
  encoder_positions_ = AllocateParameter("encoder_positions", {c.max_positions, c.width},
                                         core::ParamInit::Normal(s + 1, 0, 0.0f, 0.1f));
  decoder_positions_ = AllocateParameter("decoder_positions", {c.max_positions, c.width},
                                         core::ParamInit::Normal(s + 2, 0, 0.0f, 0.1f));
  for (int64_t i = 0; i < c.encoder_layers; ++i) {
    encoder_.push_back(
        RegisterModule(absl::StrCat("encoder", i),
                       std::make_shared<EncoderLayer>(c, dropout_, s + 100 * (i + 1))));
  }
  for (int64_t i = 0; i < c.decoder_layers; ++i) {
    decoder_.push_back(
        RegisterModule(absl::StrCat("decoder", i),
                       std::make_shared<DecoderLayer>(c, dropout_, s + 10'000 + 100 * (i + 1))));
  }
  encoder_norm_ = RegisterModule("encoder_norm", std::make_shared<Norm>(c, s + 3));
  decoder_norm_ = RegisterModule("decoder_norm", std::make_shared<Norm>(c, s + 5));
}

absl::StatusOr<core::Tensors> Seq2Seq::ForwardGraph(const core::Tensors& in) {
  if (in.size() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("Seq2Seq: takes {src, src_mask, tgt}, got ", in.size(), " inputs"));
  }
  const core::Tensor &src = in[0], &tgt = in[2];
  RETURN_IF_ERROR(CheckIds(src, "src", config_.max_positions));
  RETURN_IF_ERROR(CheckIds(tgt, "tgt", config_.max_positions));
  // The ids may stay on the host (the embedding copies them); the attention wants its mask on
  // the activations' device.
  const core::Device device = embed_->data.device();
  core::Tensor src_mask = in[1];
  if (src_mask.defined() && src_mask.device() != device) {
    ASSIGN_OR_RETURN(src_mask, src_mask.To(device, core::MemoryTag::kOther));
  }
  // Token and position embeddings; positions [L, C] broadcast over the batch.
  absl::StatusOr<core::Tensor> x =
      F::Add(F::Embedding(src, embed_), F::Embedding(Positions(src.size(1)), encoder_positions_));
  for (const std::shared_ptr<EncoderLayer>& layer : encoder_) x = layer->CallOne({x, src_mask});
  absl::StatusOr<core::Tensor> memory = encoder_norm_->CallOne({x});
  absl::StatusOr<core::Tensor> y =
      F::Add(F::Embedding(tgt, embed_), F::Embedding(Positions(tgt.size(1)), decoder_positions_));
  for (const std::shared_ptr<DecoderLayer>& layer : decoder_) {
    y = layer->CallOne({y, memory, src_mask});
  }
  // The head shares the embedding: logits = LN(y) embed^T.
  ASSIGN_OR_RETURN(core::Tensor logits, F::Linear(decoder_norm_->CallOne({y}), embed_));
  return core::Tensors{logits};
}

}  // namespace seq2seq
