// Gpt: a GPT-2 style decoder-only language model (nanoGPT's GPT without dropout),
// with lm_head tied to the token embedding.
//
//   nn::GptConfig config;                       // vocab 64, context 32, width 64, 2 layers
//   config.n_layer = 4;
//   ASSIGN_OR_RETURN(std::shared_ptr<nn::Gpt> gpt, nn::Gpt::Create(config));
//   ASSIGN_OR_RETURN(core::Tensor logits, gpt->Forward(tokens));    // int32 [B, T] -> [B, T, V]
//   ASSIGN_OR_RETURN(nn::LossResult loss, nn::CrossEntropyLoss(logits, targets));
//   RETURN_IF_ERROR(gpt->Backward(loss.grad).status());           // fills every grad
//
// Children, in this order: "wte" Embedding(V, C), "wpe" Embedding(block_size, C),
// "blocks" Sequential of n_layer TransformerBlocks, "ln_f" LayerNorm(C), "lm_head"
// Linear::Tied(wte weight, no bias). NamedParameters() is therefore "wte.weight",
// "wpe.weight", "blocks.0.ln_1.weight", "blocks.0.ln_1.bias", "blocks.0.attn.qkv.weight",
// ..., "ln_f.weight", "ln_f.bias"; the tied lm_head.weight is not listed again.
//
// Initialisation (GPT-2 / nanoGPT): every Linear and Embedding weight N(0, 0.02), every
// attention and MLP "proj" weight N(0, 0.02 / sqrt(2 * n_layer)), biases 0, LayerNorm
// weight 1 and bias 0. wte, wpe and block l draw from seeds DeriveSeed(config.seed, 0),
// DeriveSeed(config.seed, 1) and DeriveSeed(config.seed, 2 + l), and each Linear from its
// own seed below those, so the weights depend only on the config.
#ifndef NN_GPT_H_
#define NN_GPT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/module.h"
#include "core/tensor.h"
#include "nn/embedding.h"
#include "nn/layer_norm.h"
#include "nn/linear.h"
#include "nn/sequential.h"

namespace nn {

struct GptConfig {
  int64_t vocab_size = 64;
  int64_t block_size = 32;  // longest sequence (number of positions)
  int64_t n_embd = 64;
  int64_t n_layer = 2;
  int64_t n_head = 4;
  uint64_t seed = 0;
};

class Gpt : public core::Module {
 public:
  // A freshly initialised model. InvalidArgument naming the option (e.g.
  // "GptConfig.n_head") unless every size is positive and n_embd % n_head == 0;
  // ResourceExhausted naming the sizes and the largest tensor (e.g. "wte.weight") when
  // the parameters' bytes overflow int64 or exceed what the current CPU allocator may
  // still hold (core::Allocator::limit()), or naming the module and parameter when an
  // allocation fails. Never aborts on sizes.
  static absl::StatusOr<std::shared_ptr<Gpt>> Create(const GptConfig& config);

  std::string TypeName() const override { return "Gpt"; }

  const GptConfig& config() const { return config_; }
  const std::shared_ptr<Embedding>& wte() const { return wte_; }
  const std::shared_ptr<Embedding>& wpe() const { return wpe_; }
  // The TransformerBlocks, as children "0" .. "n_layer-1".
  const std::shared_ptr<Sequential>& blocks() const { return blocks_; }
  const std::shared_ptr<LayerNorm>& ln_f() const { return ln_f_; }
  // Shares its weight Parameter with wte().
  const std::shared_ptr<Linear>& lm_head() const { return lm_head_; }
  // The dtype Backward wants the logits' gradient in (lm_head's GradOutputDType): bf16
  // after a Forward with bf16 weights, for nn::CrossEntropyLoss's grad_dtype. Backward
  // takes fp32 too.
  core::DType logits_grad_dtype() const { return lm_head_->GradOutputDType(); }

 protected:
  // tokens: int32 [B, T] (on the CPU or the parameters' device; the logits are on the
  // parameters' device) with T <= block_size and ids in [0, vocab_size) (otherwise
  // InvalidArgument naming this module, or "wte" for a bad id) -> logits [B, T, V], fp32,
  // or bf16 under bf16 weights.
  // NOTE [bf16 logits]: with bf16 weights (FSDP mixed precision) the head's GEMM stores the
  // logits bf16, each its fp32 sum rounded once, as a bf16 Linear gives them in PyTorch's
  // mixed precision; nn::CrossEntropyLoss widens them exactly and keeps its statistics in
  // double. At GPT-2's size that halves the largest activation (16384 x 50304 logits: 1.6
  // GB instead of 3.3) and the bytes the head's GEMM writes and the loss reads. A head with
  // hooks of its own (not nn::internal::Fusable) keeps fp32 logits.
  absl::StatusOr<core::Tensor> ForwardImpl(const core::Tensor& tokens) override;
  // grad_output: [B, T, V] (fp32, or bf16 per logits_grad_dtype). Adds every parameter's gradient (the tied weight receives
  // both lm_head's and wte's contributions) and returns an undefined Tensor.
  absl::StatusOr<core::Tensor> BackwardImpl(const core::Tensor& grad_output) override;
  void ReleaseActivations() override { token_shape_.clear(); }

 private:
  // OK when the parameters of `config` fit the current CPU allocator (see Create).
  static absl::Status CheckParametersFit(const GptConfig& config);
  explicit Gpt(const GptConfig& config);
  void InitializeWeights();

  GptConfig config_;
  std::shared_ptr<Embedding> wte_;
  std::shared_ptr<Embedding> wpe_;
  std::shared_ptr<Sequential> blocks_;
  std::shared_ptr<LayerNorm> ln_f_;
  std::shared_ptr<Linear> lm_head_;
  core::Shape token_shape_;  // [B, T] of the cached Forward; empty when none
};

}  // namespace nn

#endif  // NN_GPT_H_
