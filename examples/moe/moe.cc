#include "examples/moe/moe.h"

#include <numeric>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/param_init.h"
#include "core/status_macros.h"
#include "nn/functional/functional.h"

namespace moe {
namespace {

namespace F = ::nn::functional;

// `values` as an int32 tensor of `shape` on `device`.
absl::StatusOr<core::Tensor> Ints(const std::vector<int32_t>& values, const core::Shape& shape,
                                  const core::Device& device) {
  ASSIGN_OR_RETURN(core::Tensor host, core::Tensor::FromInts(values, shape));
  if (device.is_cpu()) return host;
  return host.To(device, core::MemoryTag::kOther);
}

// One-hot rows [N, E] of `index` [N, 1] (a constant: no gradient).
absl::StatusOr<core::Tensor> OneHot(const core::Tensor& index, int64_t experts) {
  const int64_t n = index.size(0);
  const core::Device device = index.device();
  ASSIGN_OR_RETURN(core::Tensor ones, core::Tensor::Allocate({n, 1}, core::DType::kFloat32,
                                                             core::MemoryTag::kOther, device));
  RETURN_IF_ERROR(ones.TryFill(1.0f));
  ASSIGN_OR_RETURN(core::Tensor zeros, core::Tensor::Allocate({n, experts}, core::DType::kFloat32,
                                                              core::MemoryTag::kOther, device));
  RETURN_IF_ERROR(zeros.TryZero());
  return F::ScatterAdd(zeros, 1, index, ones);
}

}  // namespace

Expert::Expert(const MoeConfig& c, uint64_t seed) {
  w1_ =
      AllocateParameter("w1", {c.expert_hidden, c.width}, core::ParamInit::FanIn(seed, 0, c.width));
  b1_ = AllocateParameter("b1", {c.expert_hidden}, core::ParamInit::FanIn(seed + 1, 0, c.width));
  w2_ = AllocateParameter("w2", {c.width, c.expert_hidden},
                          core::ParamInit::FanIn(seed + 2, 0, c.expert_hidden));
  b2_ = AllocateParameter("b2", {c.width}, core::ParamInit::FanIn(seed + 3, 0, c.expert_hidden));
}

absl::StatusOr<core::Tensors> Expert::ForwardGraph(const core::Tensors& in) {
  ASSIGN_OR_RETURN(core::Tensor y, F::Linear(F::Gelu(F::Linear(in[0], w1_, b1_)), w2_, b2_));
  return core::Tensors{y};
}

MoeLayer::MoeLayer(const MoeConfig& c, uint64_t seed) : num_experts_(c.experts) {
  router_ =
      AllocateParameter("router", {c.experts, c.width}, core::ParamInit::FanIn(seed, 0, c.width));
  for (int64_t e = 0; e < c.experts; ++e) {
    experts_.push_back(RegisterModule(absl::StrCat("expert", e),
                                      std::make_shared<Expert>(c, seed + 10 * (e + 1))));
  }
}

absl::StatusOr<core::Tensors> MoeLayer::ForwardGraph(const core::Tensors& in) {
  const core::Tensor& x = in[0];
  const int64_t b = x.size(0), t = x.size(1), c = x.size(2), n = b * t, e = num_experts_;
  ASSIGN_OR_RETURN(core::Tensor tokens, F::Reshape(x, {n, c}));
  ASSIGN_OR_RETURN(core::Tensor probs, F::Softmax(F::Linear(tokens, router_)));  // [N, E]
  // The top 2: the first maximum, then the first maximum of the rest (the first one pushed
  // below every probability; the others keep their exact values).
  ASSIGN_OR_RETURN(std::vector<core::Tensor> first, F::Max(probs, -1, /*keepdim=*/true));
  ASSIGN_OR_RETURN(core::Tensor one1, OneHot(first[1], e));
  ASSIGN_OR_RETURN(std::vector<core::Tensor> second,
                   F::Max(F::Sub(probs, F::MulScalar(one1, 2.0f)), -1, /*keepdim=*/true));
  ASSIGN_OR_RETURN(core::Tensor one2, OneHot(second[1], e));
  absl::StatusOr<core::Tensor> sum = F::Add(first[0], second[0]);
  // gates [N, E]: w1 at e1, w2 at e2, 0 elsewhere.
  ASSIGN_OR_RETURN(core::Tensor gates, F::Add(F::Mul(one1, F::Div(first[0], sum)),
                                              F::Mul(one2, F::Div(second[0], sum))));
  // Each expert on its tokens, in token order, its outputs weighted and added back in place.
  const std::vector<float> e1 = first[1].ToVector(), e2 = second[1].ToVector();
  ASSIGN_OR_RETURN(core::Tensor out,
                   core::Tensor::Allocate({n, c}, core::DType::kFloat32,
                                          core::MemoryTag::kActivation, x.device()));
  RETURN_IF_ERROR(out.TryZero());
  absl::StatusOr<core::Tensor> y = out;
  for (int64_t k = 0; k < e; ++k) {
    std::vector<int32_t> chosen, rows;
    for (int64_t i = 0; i < n; ++i) {
      if (e1[i] == k || e2[i] == k) {
        chosen.push_back(static_cast<int32_t>(i));
        rows.insert(rows.end(), c, static_cast<int32_t>(i));
      }
    }
    if (chosen.empty()) continue;
    const int64_t m = static_cast<int64_t>(chosen.size());
    ASSIGN_OR_RETURN(core::Tensor index, Ints(chosen, {m}, x.device()));
    ASSIGN_OR_RETURN(core::Tensor scatter, Ints(rows, {m, c}, x.device()));
    absl::StatusOr<core::Tensor> expert_out =
        experts_[k]->CallOne({F::IndexSelect(tokens, 0, index)});
    absl::StatusOr<core::Tensor> weight = F::IndexSelect(F::Slice(gates, 1, k, k + 1), 0, index);
    y = F::ScatterAdd(y, 0, scatter, F::Mul(expert_out, weight));
  }
  ASSIGN_OR_RETURN(core::Tensor y_out, F::Reshape(y, {b, t, c}));
  // NOTE [Sequence-level balance loss]: f [B, E] (counts, no gradient) and P [B, E].
  ASSIGN_OR_RETURN(core::Tensor f,
                   F::MulScalar(F::Sum(F::Reshape(F::Add(one1, one2), {b, t, e}), {1}),
                                1.0f / static_cast<float>(2 * t)));
  ASSIGN_OR_RETURN(
      core::Tensor aux,
      F::MulScalar(F::Mean(F::Sum(F::Mul(f, F::Mean(F::Reshape(probs, {b, t, e}), {1})), {1})),
                   static_cast<float>(e)));
  return core::Tensors{y_out, aux};
}

MoeBlock::MoeBlock(const MoeConfig& c, uint64_t seed) {
  norm1_ = RegisterModule("norm1", std::make_shared<nn::LayerNorm>(c.width));
  attention_ = RegisterModule("attention",
                              std::make_shared<nn::CausalSelfAttention>(c.width, c.heads, seed));
  norm2_ = RegisterModule("norm2", std::make_shared<nn::LayerNorm>(c.width));
  moe_ = RegisterModule("moe", std::make_shared<MoeLayer>(c, seed + 1000));
}

absl::StatusOr<core::Tensors> MoeBlock::ForwardGraph(const core::Tensors& in) {
  ASSIGN_OR_RETURN(core::Tensor h, F::Add(in[0], attention_->CallOne({norm1_->CallOne({in[0]})})));
  absl::StatusOr<core::Tensor> normed = norm2_->CallOne({h});
  RETURN_IF_ERROR(normed.status());
  ASSIGN_OR_RETURN(core::Tensors moe, moe_->Call({*normed}));
  ASSIGN_OR_RETURN(core::Tensor y, F::Add(h, moe[0]));
  return core::Tensors{y, moe[1]};
}

MoeDecoder::MoeDecoder(const MoeConfig& c) : config_(c) {
  const uint64_t s = c.seed * 100'000;
  embed_ =
      AllocateParameter("embed", {c.vocab, c.width}, core::ParamInit::Normal(s, 0, 0.0f, 0.5f));
  positions_ = AllocateParameter("positions", {c.max_positions, c.width},
                                 core::ParamInit::Normal(s + 1, 0, 0.0f, 0.1f));
  for (int64_t i = 0; i < c.blocks; ++i) {
    blocks_.push_back(RegisterModule(absl::StrCat("block", i),
                                     std::make_shared<MoeBlock>(c, s + 10'000 * (i + 1))));
  }
  norm_ = RegisterModule("norm", std::make_shared<nn::LayerNorm>(c.width));
}

absl::StatusOr<core::Tensors> MoeDecoder::ForwardGraph(const core::Tensors& in) {
  if (in.size() != 1 || !in[0].defined() || in[0].dtype() != core::DType::kInt32 ||
      in[0].dim() != 2 || in[0].size(1) < 1 || in[0].size(1) > config_.max_positions) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoeDecoder: takes {ids}, int32 [B, T] with 1 <= T <= max_positions (",
                     config_.max_positions, "); got ", in.size(), " inputs",
                     in.empty() || !in[0].defined() ? std::string() : ", ids " + in[0].ToString()));
  }
  const int64_t t = in[0].size(1);
  std::vector<int32_t> positions(t);
  std::iota(positions.begin(), positions.end(), 0);
  ASSIGN_OR_RETURN(core::Tensor position_ids, core::Tensor::FromInts(positions, {t}));
  absl::StatusOr<core::Tensor> h =
      F::Add(F::Embedding(in[0], embed_), F::Embedding(position_ids, positions_));
  core::Tensor aux;  // the blocks' sum
  for (const std::shared_ptr<MoeBlock>& block : blocks_) {
    RETURN_IF_ERROR(h.status());
    ASSIGN_OR_RETURN(core::Tensors out, block->Call({*h}));
    h = out[0];
    if (aux.defined()) {
      ASSIGN_OR_RETURN(aux, F::Add(aux, out[1]));
    } else {
      aux = out[1];
    }
  }
  ASSIGN_OR_RETURN(core::Tensor logits, F::Linear(norm_->CallOne({h}), embed_));
  return core::Tensors{logits, aux};
}

}  // namespace moe
