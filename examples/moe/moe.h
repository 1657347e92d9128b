// A decoder whose MLPs are mixtures of experts, written as graph modules: only the forwards,
// composed of nn/functional ops and the library's own modules (nn::CausalSelfAttention,
// nn::LayerNorm), differentiated by the autograd graph and sharded by FSDP like any module.
//
//   moe::MoeConfig config;                      // 4 experts, top 2, 2 blocks
//   auto model = std::make_shared<moe::MoeDecoder>(config);
//   // ids [B, T] int32 -> {logits [B, T, vocab], aux [] (the load-balancing loss)}:
//   absl::StatusOr<core::Tensors> out = model->Call({ids});
//
// Block: h = x + Attention(LN1(x)); y = h + Moe(LN2(h)). Moe, per token t of x [N, C] (the
// batch's tokens): router probabilities p_t = softmax(x_t Wr^T) over E experts; the top 2,
// e1 and e2 (the first maximum, then the first maximum of the others), weighted
// w_i = p_t[e_i] / (p_t[e1] + p_t[e2]); out_t = w_1 Expert_e1(x_t) + w_2 Expert_e2(x_t), each
// expert an MLP W2 GELU(W1 x + b1) + b2 run on the tokens routed to it only (gathered with
// IndexSelect, its outputs scattered back with ScatterAdd, expert by expert). An expert no
// token chose does not run (its parameters get no gradient from this batch).
//
// NOTE [Sequence-level balance loss]: aux = mean over sequences b of E sum_e f_be P_be, where
// f_be is the fraction of sequence b's top-2 choices that went to expert e (a count: no
// gradient) and P_be the mean router probability of e over b's tokens (the Switch
// Transformer's loss, taken per sequence as DeepSeek-V3's sequence-wise loss is). It is 1 when
// the choices and the probabilities are uniform and grows as they concentrate. Taken per
// sequence it is a mean over rows, so each rank's mean over its rows, averaged over ranks,
// is the global batch's: N ranks train as one (a loss over the whole batch's counts would not
// split over ranks). The model returns the sum over blocks; the trainer adds
// MoeConfig::aux_weight times it to the cross-entropy.
#ifndef EXAMPLES_MOE_MOE_H_
#define EXAMPLES_MOE_MOE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/module.h"
#include "core/parameter.h"
#include "core/tensor.h"
#include "nn/attention.h"
#include "nn/layer_norm.h"

namespace moe {

struct MoeConfig {
  int64_t vocab = 32;
  int64_t width = 32;
  int64_t heads = 4;  // dividing width
  int64_t expert_hidden = 48;
  int64_t experts = 4;  // >= 2
  int64_t blocks = 2;
  int64_t max_positions = 16;
  double aux_weight = 0.01;
  uint64_t seed = 1;
};

// W2 GELU(W1 x + b1) + b2: [n, C] -> [n, C].
class Expert : public core::Module {
 public:
  Expert(const MoeConfig& config, uint64_t seed);
  std::string TypeName() const override { return "Expert"; }

 protected:
  absl::StatusOr<core::Tensors> ForwardGraph(const core::Tensors& inputs) override;

 private:
  core::ParameterPtr w1_, b1_, w2_, b2_;
};

// {x [B, T, C]} -> {y [B, T, C], aux []}: the router, the top-2 experts, the balance loss.
class MoeLayer : public core::Module {
 public:
  MoeLayer(const MoeConfig& config, uint64_t seed);
  std::string TypeName() const override { return "MoeLayer"; }
  const std::vector<std::shared_ptr<Expert>>& experts() const { return experts_; }

 protected:
  absl::StatusOr<core::Tensors> ForwardGraph(const core::Tensors& inputs) override;

 private:
  int64_t num_experts_;
  core::ParameterPtr router_;
  std::vector<std::shared_ptr<Expert>> experts_;
};

// {x [B, T, C]} -> {y [B, T, C], aux []}.
class MoeBlock : public core::Module {
 public:
  MoeBlock(const MoeConfig& config, uint64_t seed);
  std::string TypeName() const override { return "MoeBlock"; }
  const std::shared_ptr<MoeLayer>& moe() const { return moe_; }

 protected:
  absl::StatusOr<core::Tensors> ForwardGraph(const core::Tensors& inputs) override;

 private:
  std::shared_ptr<nn::LayerNorm> norm1_, norm2_;
  std::shared_ptr<nn::CausalSelfAttention> attention_;
  std::shared_ptr<MoeLayer> moe_;
};

class MoeDecoder : public core::Module {
 public:
  explicit MoeDecoder(const MoeConfig& config);
  std::string TypeName() const override { return "MoeDecoder"; }
  const MoeConfig& config() const { return config_; }
  const std::vector<std::shared_ptr<MoeBlock>>& blocks() const { return blocks_; }

 protected:
  // {ids [B, T] int32 in [0, vocab), T <= max_positions} -> {logits [B, T, vocab], aux []}:
  // the head shares the token embedding. InvalidArgument naming the input otherwise.
  absl::StatusOr<core::Tensors> ForwardGraph(const core::Tensors& inputs) override;

 private:
  MoeConfig config_;
  core::ParameterPtr embed_, positions_;
  std::vector<std::shared_ptr<MoeBlock>> blocks_;
  std::shared_ptr<nn::LayerNorm> norm_;
};

}  // namespace moe

#endif  // EXAMPLES_MOE_MOE_H_
