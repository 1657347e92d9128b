// Gpt: a GPT-2 style decoder-only language model (nanoGPT's GPT without dropout),
// with lm_head tied to the token embedding.
//
//   nn::GptConfig config;                       // vocab 64, context 32, width 64, 2 layers
//   config.n_layer = 4;
//   ASSIGN_OR_RETURN(std::shared_ptr<nn::Gpt> gpt, nn::Gpt::Create(config));
//   namespace F = nn::functional;
//   ASSIGN_OR_RETURN(core::Tensor logits, gpt->CallOne({tokens}));  // int32 [B, T] -> [B, T, V]
//   ASSIGN_OR_RETURN(core::Tensor loss, F::CrossEntropy(logits, targets));
//   RETURN_IF_ERROR(core::Backward(loss));                          // fills every grad
//
// A graph module (NOTE [Graph modules] in core/module.h) written as a forward only: the
// embeddings added by F::BiasAdd, the blocks (nn/transformer.h, NOTE [Block forwards]), ln_f
// and the tied head. Forward(tokens) and Backward(logits' gradient) work as well.
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
  // The dtype the head's backward takes the logits' gradient in, for nn::CrossEntropyLoss's
  // grad_dtype: bf16 after a forward whose head ran inline with bf16 weights (its GEMMs
  // round the gradient to bf16 anyway: the same bits, half the bytes), else fp32. A bf16
  // gradient given to an fp32 head is widened.
  core::DType logits_grad_dtype() const { return logits_grad_dtype_; }

 protected:
  // {tokens}: int32 [B, T] (on the CPU or the parameters' device; the logits are on the
  // parameters' device) with T <= block_size and ids in [0, vocab_size) (otherwise
  // InvalidArgument naming this module, or "wte" for a bad id) -> {logits} [B, T, V], fp32,
  // or bf16 under bf16 weights. The tied weight receives the head's and wte's gradients.
  // NOTE [bf16 logits]: with bf16 weights (FSDP mixed precision) the head's GEMM stores the
  // logits bf16, each its fp32 sum rounded once, as a bf16 Linear gives them in PyTorch's
  // mixed precision; the losses widen them exactly and keep their statistics in double. At
  // GPT-2's size that halves the largest activation (16384 x 50304 logits: 1.6 GB instead of
  // 3.3) and the bytes the head's GEMM writes and the loss reads. A head with hooks of its own
  // (called, not run inline: NOTE [Block forwards] in nn/transformer.h) keeps fp32 logits.
  absl::StatusOr<core::Tensors> ForwardGraph(const core::Tensors& in) override;

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
  core::DType logits_grad_dtype_ = core::DType::kFloat32;  // of the last forward
};

}  // namespace nn

#endif  // NN_GPT_H_
