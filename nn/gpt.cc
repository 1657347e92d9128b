#include "nn/gpt.h"

#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/allocator.h"
#include "core/random.h"
#include "core/status_macros.h"
#include "nn/internal/validate.h"
#include "nn/ops.h"
#include "nn/tensor_ops.h"
#include "nn/transformer.h"

namespace nn {

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
  const std::string what = absl::StrCat(
      "GptConfig (vocab_size=", config.vocab_size, ", block_size=", config.block_size,
      ", n_embd=", C, ", n_layer=", config.n_layer, ")");
  if (!bytes.has_value()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, ": the parameters' size in bytes overflows int64 (wte.weight alone is [",
        config.vocab_size, ", ", C, "])"));
  }
  std::shared_ptr<core::Allocator> allocator = core::Allocator::Current(core::Device::Cpu());
  const int64_t limit = allocator->limit();
  const int64_t in_use = allocator->Stats().current_total;
  if (limit > 0 && *bytes > limit - in_use) {
    // Name the largest tensor, which is where the size comes from.
    const bool wte_largest = wte.value_or(0) >= wpe.value_or(0) && wte.value_or(0) >= block.value_or(0);
    const std::string largest =
        wte_largest ? absl::StrCat("wte.weight [", config.vocab_size, ", ", C, "] alone is ",
                                   core::FormatBytes(Mul(wte, 4).value_or(0)))
                    : absl::StrCat("each of the ", config.n_layer, " blocks is ",
                                   core::FormatBytes(Mul(block, 4).value_or(0)));
    return absl::ResourceExhaustedError(absl::StrCat(
        what, ": the parameters need ", core::FormatBytes(*bytes), " (", *bytes, " bytes; ",
        largest, "), more than the CPU allocator can hold: limit ", core::FormatBytes(limit),
        " with ", core::FormatBytes(in_use), " in use"));
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
  absl::Status allocated = gpt->ConstructionStatus();
  if (!allocated.ok()) {
    return absl::Status(allocated.code(), absl::StrCat("Gpt: ", allocated.message()));
  }
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

absl::StatusOr<core::Tensor> Gpt::ForwardImpl(const core::Tensor& tokens) {
  RETURN_IF_ERROR(internal::CheckTensor(*this, tokens, core::DType::kInt32, "input tokens"));
  if (tokens.dim() != 2) {
    return internal::ModuleError(*this, absl::StrCat("input tokens must be [B, T], got ",
                                                     core::ShapeToString(tokens.shape())));
  }
  const int64_t B = tokens.size(0), T = tokens.size(1), C = config_.n_embd;
  if (T > config_.block_size) {
    return internal::ModuleError(
        *this,
        absl::StrCat("sequence length ", T, " of input ", core::ShapeToString(tokens.shape()),
                     " exceeds GptConfig.block_size ", config_.block_size));
  }
  // Positions are made on the host; wpe copies them to its weight's device.
  ASSIGN_OR_RETURN(core::Tensor positions,
                   core::Tensor::Allocate({T}, core::DType::kInt32, core::MemoryTag::kActivation));
  for (int64_t t = 0; t < T; ++t) positions.data<int32_t>()[t] = static_cast<int32_t>(t);
  ASSIGN_OR_RETURN(core::Tensor tok, wte_->Forward(tokens));
  ASSIGN_OR_RETURN(core::Tensor pos, wpe_->Forward(positions));
  if (tok.shape() != core::Shape{B, T, C} || pos.shape() != core::Shape{T, C}) {
    return internal::ModuleError(
        *this, absl::StrCat("embeddings have shapes ", tok.ToString(), " and ", pos.ToString()));
  }
  RETURN_IF_ERROR(internal::CheckDevice(*this, pos, "wpe's output", tok.device(), "wte's output"));
  // x[b] = tok[b] + pos: pos, flat, is a row vector over the [B, T * C] matrix tok.
  ASSIGN_OR_RETURN(core::Tensor x, internal::NewActivation({B, T, C}, tok.device()));
  RETURN_IF_ERROR(BiasAdd(internal::What(*this), tok, pos, x));
  ASSIGN_OR_RETURN(x, blocks_->Forward(x));
  // NOTE [GEMM epilogues]: ln_f's output is the head's bf16 GEMM operand under bf16.
  if (internal::Fusable(*ln_f_) && internal::Fusable(*lm_head_)) {
    ASSIGN_OR_RETURN(x, ln_f_->ForwardForGemm(x));
  } else {
    ASSIGN_OR_RETURN(x, ln_f_->Forward(x));
  }
  // NOTE [bf16 logits] (nn/gpt.h): under bf16 weights the head stores its logits bf16.
  ASSIGN_OR_RETURN(core::Tensor logits, internal::Fusable(*lm_head_)
                                            ? lm_head_->ForwardForGemm(x)
                                            : lm_head_->Forward(x));
  token_shape_ = tokens.shape();
  return logits;
}

absl::StatusOr<core::Tensor> Gpt::BackwardImpl(const core::Tensor& grad_output) {
  const bool have_cache = !token_shape_.empty();
  RETURN_IF_ERROR(internal::CheckGradOutput(
      *this, have_cache,
      have_cache ? core::Shape{token_shape_[0], token_shape_[1], config_.vocab_size}
                 : core::Shape{},
      grad_output, logits_grad_dtype() == core::DType::kBFloat16));
  const int64_t B = token_shape_[0], T = token_shape_[1], C = config_.n_embd;
  ASSIGN_OR_RETURN(core::Tensor g, lm_head_->Backward(grad_output));
  ASSIGN_OR_RETURN(g, ln_f_->Backward(g));
  ASSIGN_OR_RETURN(g, blocks_->Backward(g));
  if (g.shape() != core::Shape{B, T, C}) {
    return internal::ModuleError(*this, absl::StrCat("blocks returned gradient ", g.ToString()));
  }
  // x = tok + pos broadcast over the batch: pos's gradient is g summed over b.
  ASSIGN_OR_RETURN(core::Tensor gpos, internal::NewActivation({T, C}, g.device()));
  RETURN_IF_ERROR(ZeroTensor(internal::What(*this), gpos));
  RETURN_IF_ERROR(AccumulateColumnSums(internal::What(*this), g, core::Tensor(), gpos));
  RETURN_IF_ERROR(wpe_->Backward(gpos).status());
  RETURN_IF_ERROR(wte_->Backward(g).status());
  token_shape_.clear();
  return core::Tensor();
}

}  // namespace nn
