#include "nn/gpt.h"

#include <cmath>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/allocator.h"
#include "core/random.h"
#include "core/status_macros.h"
#include "nn/functional/embedding.h"
#include "nn/functional/fused.h"
#include "nn/functional/norm.h"
#include "nn/internal/decoder_head.h"
#include "nn/internal/validate.h"
#include "nn/ops.h"
#include "nn/transformer.h"

namespace nn {

namespace F = ::nn::functional;

namespace {

// a * b and a + b, or nullopt on int64 overflow (sizes come from user configs).
std::optional<int64_t> Mul(std::optional<int64_t> a, std::optional<int64_t> b) {
  int64_t out;
  if (!a || !b || __builtin_mul_overflow(*a, *b, &out)) return std::nullopt;
  return out;
}
std::optional<int64_t> Add(std::optional<int64_t> a, std::optional<int64_t> b) {
  int64_t out;
  if (!a || !b || __builtin_add_overflow(*a, *b, &out)) return std::nullopt;
  return out;
}

}  // namespace

absl::Status Gpt::CheckParametersFit(const GptConfig& config) {
  const int64_t C = config.n_embd;
  // Elements: wte V*C, wpe T*C, each block 12*C*C + 13*C (ln_1, qkv, proj, ln_2, fc,
  // proj), ln_f 2*C; fp32.
  const std::optional<int64_t> wte = Mul(config.vocab_size, C);
  const std::optional<int64_t> wpe = Mul(config.block_size, C);
  const std::optional<int64_t> block = Add(Mul(Mul(12, C), C), Mul(13, C));
  const std::optional<int64_t> bytes =
      Mul(Add(Add(Add(wte, wpe), Mul(config.n_layer, block)), Mul(2, C)), 4);
  const std::string what =
      absl::StrCat("GptConfig (vocab_size=", config.vocab_size, ", block_size=", config.block_size,
                   ", n_embd=", C, ", n_layer=", config.n_layer, ")");
  if (!bytes.has_value()) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, ": the parameters' size in bytes overflows int64 (wte.weight alone is [",
                     config.vocab_size, ", ", C, "])"));
  }
  std::shared_ptr<core::Allocator> allocator = core::Allocator::Current(core::Device::Cpu());
  const int64_t limit = allocator->limit();
  const int64_t in_use = allocator->Stats().current_total;
  if (limit > 0 && *bytes > limit - in_use) {
    // Name the largest tensor, which is where the size comes from.
    const bool wte_largest =
        wte.value_or(0) >= wpe.value_or(0) && wte.value_or(0) >= block.value_or(0);
    const std::string largest =
        wte_largest ? absl::StrCat("wte.weight [", config.vocab_size, ", ", C, "] alone is ",
                                   core::FormatBytes(Mul(wte, 4).value_or(0)))
                    : absl::StrCat("each of the ", config.n_layer, " blocks is ",
                                   core::FormatBytes(Mul(block, 4).value_or(0)));
    return absl::ResourceExhaustedError(
        absl::StrCat(what, ": the parameters need ", core::FormatBytes(*bytes), " (", *bytes,
                     " bytes; ", largest, "), more than the CPU allocator can hold: limit ",
                     core::FormatBytes(limit), " with ", core::FormatBytes(in_use), " in use"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Gpt>> Gpt::Create(const GptConfig& config) {
  const std::pair<const char*, int64_t> sizes[] = {{"vocab_size", config.vocab_size},
                                                   {"block_size", config.block_size},
                                                   {"n_embd", config.n_embd},
                                                   {"n_layer", config.n_layer},
                                                   {"n_head", config.n_head}};
  for (const auto& [name, value] : sizes) {
    if (value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("GptConfig.", name, " must be positive, got ", value));
    }
  }
  if (config.n_embd % config.n_head != 0) {
    return absl::InvalidArgumentError(absl::StrCat("GptConfig.n_embd (", config.n_embd,
                                                   ") must be divisible by GptConfig.n_head (",
                                                   config.n_head, ")"));
  }
  // A deferred model (NOTE [Deferred initialisation]) allocates no parameter memory.
  if (!core::DeferredInitScope::Active()) RETURN_IF_ERROR(CheckParametersFit(config));
  std::shared_ptr<Gpt> gpt(new Gpt(config));
  // A backstop for the check above: a parameter that still could not be allocated.
  RETURN_IF_ERROR(core::Annotate(gpt->ConstructionStatus(), "Gpt"));
  gpt->InitializeWeights();
  return gpt;
}

Gpt::Gpt(const GptConfig& config) : config_(config) {
  const int64_t C = config.n_embd;
  wte_ = RegisterModule(
      "wte", std::make_shared<Embedding>(config.vocab_size, C, DeriveSeed(config.seed, 0)));
  wpe_ = RegisterModule(
      "wpe", std::make_shared<Embedding>(config.block_size, C, DeriveSeed(config.seed, 1)));
  std::vector<std::shared_ptr<core::Module>> blocks;
  for (int64_t l = 0; l < config.n_layer; ++l) {
    blocks.push_back(std::make_shared<TransformerBlock>(
        C, config.n_head, DeriveSeed(config.seed, 2 + static_cast<uint64_t>(l))));
  }
  blocks_ = RegisterModule("blocks", Sequential::Make(std::move(blocks)));
  ln_f_ = RegisterModule("ln_f", std::make_shared<LayerNorm>(C));
  lm_head_ = RegisterModule("lm_head", Linear::Tied(wte_->weight(), /*bias=*/false));
}

void Gpt::InitializeWeights() {
  const float kStd = 0.02f;
  const float proj_std = kStd / std::sqrt(2.0f * static_cast<float>(config_.n_layer));
  for (const auto& [path, module] : NamedModules()) {
    if (module.get() == lm_head_.get()) continue;  // tied: initialised as wte
    // Recipes (NOTE [Deferred initialisation] in core/param_init.h): filled now, or when
    // a deferred model's shards are made. fp32 CPU or deferred: cannot fail.
    if (auto* emb = dynamic_cast<Embedding*>(module.get())) {
      (void)core::InitParameter(*emb->weight(),
                                core::ParamInit::Normal(emb->seed(), 0, 0.0f, kStd));
    } else if (auto* linear = dynamic_cast<Linear*>(module.get())) {
      const bool is_proj = absl::EndsWith(path, ".proj");
      (void)core::InitParameter(
          *linear->weight(),
          core::ParamInit::Normal(linear->seed(), 0, 0.0f, is_proj ? proj_std : kStd));
      if (linear->bias()) {
        (void)core::InitParameter(*linear->bias(), core::ParamInit::Constant(0.0f));
      }
    }
  }
}

absl::StatusOr<core::Tensors> Gpt::ForwardGraph(const core::Tensors& in) {
  RETURN_IF_ERROR(internal::CheckInputCount(*this, in, 1));
  // The modules this forward runs inline (the blocks check their own).
  for (const core::Module* m : std::initializer_list<const core::Module*>{
           wte_.get(), wpe_.get(), ln_f_.get(), lm_head_.get()}) {
    RETURN_IF_ERROR(internal::CheckMaterialized(*m));
  }
  const core::Tensor& tokens = in[0];
  RETURN_IF_ERROR(internal::CheckTensor(*this, tokens, core::DType::kInt32, "input tokens"));
  if (tokens.dim() != 2) {
    return internal::ModuleError(*this, absl::StrCat("input tokens must be [B, T], got ",
                                                     core::ShapeToString(tokens.shape())));
  }
  const int64_t T = tokens.size(1);
  if (T > config_.block_size) {
    return internal::ModuleError(
        *this,
        absl::StrCat("sequence length ", T, " of input ", core::ShapeToString(tokens.shape()),
                     " exceeds GptConfig.block_size ", config_.block_size));
  }
  // Positions are made on the host; the embedding copies them to its table's device.
  ASSIGN_OR_RETURN(core::Tensor positions,
                   core::Tensor::Allocate({T}, core::DType::kInt32, core::MemoryTag::kActivation));
  for (int64_t t = 0; t < T; ++t) positions.data<int32_t>()[t] = static_cast<int32_t>(t);
  // x[b] = tok[b] + pos: pos, flat, is a row vector over the [B, T * C] matrix tok.
  absl::StatusOr<core::Tensor> tok =
      internal::RunsInline(*wte_) ? internal::InModule(*wte_, F::Embedding(tokens, wte_->weight()))
                                  : wte_->CallOne({tokens});
  absl::StatusOr<core::Tensor> pos =
      internal::RunsInline(*wpe_)
          ? internal::InModule(*wpe_, F::Embedding(positions, wpe_->weight()))
          : wpe_->CallOne({positions});
  absl::StatusOr<core::Tensor> x = internal::InModule(*this, F::BiasAdd(tok, pos));
  x = blocks_->CallOne({x});
  // NOTE [bf16 logits] (nn/gpt.h): under bf16 weights ln_f stores its output bf16 for the
  // head's GEMM, which stores the logits bf16.
  const bool head_inline = internal::RunsInline(*lm_head_);
  absl::StatusOr<core::Tensor> normed =
      !internal::RunsInline(*ln_f_) ? ln_f_->CallOne({x})
      : head_inline ? F::LayerNormForGemm(x, ln_f_->weight(), ln_f_->bias(), ln_f_->eps())
                    : F::LayerNorm(x, ln_f_->weight(), ln_f_->bias(), ln_f_->eps());
  return internal::DecoderLogits(*this, *lm_head_, head_inline, std::move(normed),
                                 &logits_grad_dtype_);
}

}  // namespace nn
