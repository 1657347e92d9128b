// An encoder-decoder transformer (T5- and BART-shaped) written as graph modules: only the
// forwards, composed of nn/functional ops; the autograd graph differentiates them and FSDP
// shards them like any other module.
//
//   seq2seq::Seq2SeqConfig config;   // vocab 16, width 32, 2 + 2 layers, 4 heads
//   auto model = std::make_shared<seq2seq::Seq2Seq>(config);
//   // src [B, S] int32, src_mask [B, 1, 1, S] int32 (1: a real token, 0: padding),
//   // tgt [B, T] int32 (the decoder's inputs) -> logits [B, T, vocab]:
//   absl::StatusOr<core::Tensor> logits = model->CallOne({src, src_mask, tgt});
//
// The model: one token embedding `embed` [vocab, width] shared by the encoder, the decoder
// and the output head (logits = h embed^T), learned positions per side. Encoder layers
// (pre-norm): x += Dropout(SelfAttention(LN(x), src_mask)); x += Dropout(MLP(LN(x))).
// Decoder layers: y += Dropout(CausalSelfAttention(LN(y))); y += Dropout(CrossAttention(LN(y),
// memory, src_mask)); y += Dropout(MLP(LN(y))); MLP(x) = W2 GELU(W1 x + b1) + b2 (GELU's tanh
// form). A padding mask keeps the padded source positions out of every attention over the
// source, so a real token's output does not depend on how much padding its row has.
//
// Dropout draws its mask from (config.seed + site, step, element index + offset) (NOTE [Dropout
// offset] in nn/functional/dropout.h); the step and the offset come from SetDropoutStep, which a
// TrainModule calls before each training forward with the global index of its first row, so the
// masks are the same at every world size.
#ifndef EXAMPLES_SEQ2SEQ_SEQ2SEQ_H_
#define EXAMPLES_SEQ2SEQ_SEQ2SEQ_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/module.h"
#include "core/parameter.h"
#include "core/tensor.h"

namespace seq2seq {

struct Seq2SeqConfig {
  int64_t vocab = 16;
  int64_t width = 32;
  int64_t heads = 4;  // dividing width
  int64_t hidden = 64;
  int64_t encoder_layers = 2;
  int64_t decoder_layers = 2;
  int64_t max_positions = 16;  // the longest source or target
  float layer_norm_eps = 1e-5f;
  double dropout = 0.0;  // in [0, 1)
  uint64_t seed = 1;
};

// What dropout draws from during a training forward; off (training false) otherwise.
struct DropoutStep {
  bool training = false;
  uint64_t step = 0;
  // The global index of the first row this forward runs (integration::StepRows).
  int64_t first_row = 0;
};

// Multi-head attention: {x [B, T, C]} (self), {x, mask [B, 1, 1, T]} (self, masked) or {x,
// memory [B, S, C], mask [B, 1, 1, S]} (cross) -> [B, T, C]. Causal when made so.
class Attention : public core::Module {
 public:
  Attention(const Seq2SeqConfig& config, bool causal, uint64_t seed);
  std::string TypeName() const override { return "Attention"; }

 protected:
  absl::StatusOr<core::Tensors> ForwardGraph(const core::Tensors& inputs) override;

 private:
  int64_t heads_;
  bool causal_;
  // No key bias: it adds q.b to every score of a row, which the softmax cancels, so its
  // gradient is 0 up to rounding, and an optimizer that normalises its steps (AdamW) would
  // move it by that rounding noise alone.
  core::ParameterPtr wq_, bq_, wk_, wv_, bv_, wo_, bo_;
};

// W2 GELU(W1 x + b1) + b2.
class Mlp : public core::Module {
 public:
  Mlp(const Seq2SeqConfig& config, uint64_t seed);
  std::string TypeName() const override { return "Mlp"; }

 protected:
  absl::StatusOr<core::Tensors> ForwardGraph(const core::Tensors& inputs) override;

 private:
  core::ParameterPtr w1_, b1_, w2_, b2_;
};

// LayerNorm over the last dim: weight 1 + N(0, 0.1), bias N(0, 0.1).
class Norm : public core::Module {
 public:
  Norm(const Seq2SeqConfig& config, uint64_t seed);
  std::string TypeName() const override { return "Norm"; }

 protected:
  absl::StatusOr<core::Tensors> ForwardGraph(const core::Tensors& inputs) override;

 private:
  float eps_;
  core::ParameterPtr weight_, bias_;
};

// What a layer shares: its config, the dropout step and the residual add.
class Layer : public core::Module {
 protected:
  Layer(const Seq2SeqConfig& config, std::shared_ptr<const DropoutStep> dropout, uint64_t seed)
      : config_(config), dropout_(std::move(dropout)), seed_(seed) {}
  // x + Dropout(branch), with dropout site `site` of this layer.
  absl::StatusOr<core::Tensor> Residual(const core::Tensor& x, core::Arg branch, int site) const;

  Seq2SeqConfig config_;
  std::shared_ptr<const DropoutStep> dropout_;
  uint64_t seed_;
};

// {x [B, S, C], src_mask} -> [B, S, C].
class EncoderLayer : public Layer {
 public:
  EncoderLayer(const Seq2SeqConfig& config, std::shared_ptr<const DropoutStep> dropout,
               uint64_t seed);
  std::string TypeName() const override { return "EncoderLayer"; }

 protected:
  absl::StatusOr<core::Tensors> ForwardGraph(const core::Tensors& inputs) override;

 private:
  std::shared_ptr<Norm> norm1_, norm2_;
  std::shared_ptr<Attention> attention_;
  std::shared_ptr<Mlp> mlp_;
};

// {y [B, T, C], memory [B, S, C], src_mask} -> [B, T, C].
class DecoderLayer : public Layer {
 public:
  DecoderLayer(const Seq2SeqConfig& config, std::shared_ptr<const DropoutStep> dropout,
               uint64_t seed);
  std::string TypeName() const override { return "DecoderLayer"; }

 protected:
  absl::StatusOr<core::Tensors> ForwardGraph(const core::Tensors& inputs) override;

 private:
  std::shared_ptr<Norm> norm1_, norm2_, norm3_;
  std::shared_ptr<Attention> self_attention_, cross_attention_;
  std::shared_ptr<Mlp> mlp_;
};

class Seq2Seq : public core::Module {
 public:
  explicit Seq2Seq(const Seq2SeqConfig& config);
  std::string TypeName() const override { return "Seq2Seq"; }
  const Seq2SeqConfig& config() const { return config_; }

  // What the next forwards' dropout draws from (the config's rate; nothing when it is 0).
  void SetDropoutStep(const DropoutStep& step) { *dropout_ = step; }

 protected:
  // {src [B, S], src_mask [B, 1, 1, S], tgt [B, T]} -> {logits [B, T, vocab]}: ids int32 in
  // [0, vocab), S and T at most max_positions. InvalidArgument naming the input otherwise.
  absl::StatusOr<core::Tensors> ForwardGraph(const core::Tensors& inputs) override;

 private:
  Seq2SeqConfig config_;
  std::shared_ptr<DropoutStep> dropout_;
  core::ParameterPtr embed_, encoder_positions_, decoder_positions_;
  std::shared_ptr<Norm> encoder_norm_, decoder_norm_;
  std::vector<std::shared_ptr<EncoderLayer>> encoder_;
  std::vector<std::shared_ptr<DecoderLayer>> decoder_;
};

}  // namespace seq2seq

#endif  // EXAMPLES_SEQ2SEQ_SEQ2SEQ_H_
