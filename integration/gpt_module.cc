#include "integration/gpt_module.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "data/sampler.h"
#include "integration/device_setup.h"
#include "nn/losses.h"

namespace integration {

int64_t LanguageVocabFor(int64_t model_vocab, int order) {
  // V^k <= 2^20 and V^(k+1) <= 2^24 (data/markov_language.h), without overflow.
  auto fits = [order](int64_t v) {
    if (order < 1 || v < 1) return true;  // Create reports the bad option itself
    double contexts = 1;
    for (int i = 0; i < order; ++i) contexts *= static_cast<double>(v);
    return contexts <= double{1 << 20} && contexts * static_cast<double>(v) <= double{1 << 24};
  };
  if (fits(model_vocab)) return model_vocab;
  return std::min<int64_t>(model_vocab, kCappedLanguageVocab);
}

absl::StatusOr<std::unique_ptr<GptTrainModule>> GptTrainModule::Create(
    const GptModuleOptions& options) {
  if (options.seq_len <= 0 || options.seq_len > options.model.block_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("GptModuleOptions.seq_len = ", options.seq_len, ": must be in [1, ",
                     "GptConfig.block_size = ", options.model.block_size, "]"));
  }
  if (options.warmup_steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GptModuleOptions.warmup_steps = ", options.warmup_steps, ": must be >= 0"));
  }
  data::MarkovLanguageOptions language_options = options.language;
  language_options.vocab_size =
      static_cast<int>(LanguageVocabFor(options.model.vocab_size, language_options.order));
  ASSIGN_OR_RETURN(data::MarkovLanguage language, data::MarkovLanguage::Create(language_options));
  absl::StatusOr<std::shared_ptr<nn::Gpt>> created;
  if (options.deferred_init) {
    core::DeferredInitScope deferred;
    created = nn::Gpt::Create(options.model);
  } else {
    created = nn::Gpt::Create(options.model);
  }
  ASSIGN_OR_RETURN(std::shared_ptr<nn::Gpt> gpt, std::move(created));
  if (!options.device.is_cpu()) RETURN_IF_ERROR(MoveModuleToDevice(*gpt, options.device));
  // Check the AdamW options now rather than at the first Fit.
  RETURN_IF_ERROR(optim::AdamW::Create(std::vector<core::ParameterPtr>{}, options.adamw).status());
  std::unique_ptr<GptTrainModule> module(
      new GptTrainModule(options, std::move(language), std::move(gpt)));
  if (!options.data_path.empty() || !options.eval_data_path.empty()) {
    const auto open = [](const std::string& path,
                         const char* option) -> absl::StatusOr<data::TokenFile> {
      absl::StatusOr<data::TokenFile> f = data::TokenFile::Open(path);
      if (!f.ok()) {
        return absl::Status(f.status().code(),
                            absl::StrCat("GptModuleOptions.", option, ": ", f.status().message()));
      }
      return f;
    };
    if (options.data_path.empty()) {
      return absl::InvalidArgumentError(
          "GptModuleOptions.eval_data_path is set but data_path is not; set both or neither");
    }
    ASSIGN_OR_RETURN(module->train_tokens_, open(options.data_path, "data_path"));
    if (options.eval_data_path.empty()) {
      module->eval_tokens_ = module->train_tokens_;  // shares the mapped files
    } else {
      ASSIGN_OR_RETURN(module->eval_tokens_, open(options.eval_data_path, "eval_data_path"));
    }
  }
  return module;
}

double GptTrainModule::EntropyFloor() const {
  if (uses_token_files()) return std::numeric_limits<double>::quiet_NaN();
  return language_.LossFloor(options_.seq_len);
}

GptTrainModule::GptTrainModule(GptModuleOptions options, data::MarkovLanguage language,
                               std::shared_ptr<nn::Gpt> gpt)
    : options_(std::move(options)), language_(std::move(language)), gpt_(std::move(gpt)) {}

int64_t GptTrainModule::BatchIndex(const StepContext& ctx) {
  switch (ctx.stage) {
    case Stage::kFit:
      return ctx.step;
    case Stage::kValidate:
      return kValidateBatchOffset + ctx.step;
    case Stage::kTest:
    case Stage::kPredict:
      return kTestBatchOffset + ctx.step;
  }
  return ctx.step;
}

absl::StatusOr<data::TokenBatch> GptTrainModule::LocalBatch(int64_t index,
                                                            const StepContext& ctx) const {
  data::TokenBatch global;
  if (uses_token_files()) {
    const data::TokenFile& tokens = ctx.stage == Stage::kFit ? *train_tokens_ : *eval_tokens_;
    ASSIGN_OR_RETURN(global, tokens.Batch(index, ctx.batch_size, options_.seq_len,
                                          options_.model.vocab_size, options_.data_seed));
  } else {
    ASSIGN_OR_RETURN(global, language_.Batch(index, ctx.batch_size, options_.seq_len));
  }
  if (ctx.micro_batches > 1) {  // this step's micro-batch: a contiguous block of rows
    ASSIGN_OR_RETURN(data::RankSampler micro,
                     data::RankSampler::Create(ctx.micro_batch, ctx.micro_batches));
    ASSIGN_OR_RETURN(global, micro.Local(global));
  }
  ASSIGN_OR_RETURN(data::RankSampler sampler, data::RankSampler::Create(ctx.rank, ctx.world_size));
  // Stays on the host on every device: the token embedding and the loss check their ids
  // on the host and copy them to the device themselves, once each (an uploaded batch
  // would be copied back to be checked: two more host syncs a step).
  return sampler.Local(global);
}

absl::StatusOr<StepOutput> GptTrainModule::TrainingStep(const StepContext& ctx) {
  ASSIGN_OR_RETURN(data::TokenBatch batch, LocalBatch(BatchIndex(ctx), ctx));
  ASSIGN_OR_RETURN(core::Tensor logits, gpt_->Forward(batch.inputs));
  // The logits' gradient in the dtype the head's GEMMs use (bf16 under mixed precision),
  // and the logits freed before the backward: at most one [B, T, V] tensor in each.
  ASSIGN_OR_RETURN(nn::LossResult loss,
                   nn::CrossEntropyLoss(logits, batch.targets, gpt_->logits_grad_dtype()));
  logits = core::Tensor();
  RETURN_IF_ERROR(gpt_->Backward(loss.grad).status());
  return StepOutput{loss.loss, batch.targets.numel()};
}

absl::StatusOr<StepOutput> GptTrainModule::EvaluationStep(const StepContext& ctx) {
  ASSIGN_OR_RETURN(data::TokenBatch batch, LocalBatch(BatchIndex(ctx), ctx));
  ASSIGN_OR_RETURN(core::Tensor logits, gpt_->Forward(batch.inputs));
  ASSIGN_OR_RETURN(nn::LossResult loss, nn::CrossEntropyLoss(logits, batch.targets));
  return StepOutput{loss.loss, batch.targets.numel()};
}

absl::StatusOr<core::Tensor> GptTrainModule::PredictStep(const StepContext& ctx) {
  ASSIGN_OR_RETURN(data::TokenBatch batch, LocalBatch(BatchIndex(ctx), ctx));
  ASSIGN_OR_RETURN(core::Tensor logits, gpt_->Forward(batch.inputs));
  if (!logits.device().is_cpu()) {
    ASSIGN_OR_RETURN(logits, OnDevice(logits, core::Device::Cpu()));
  }
  const int64_t vocab = logits.size(-1);
  const int64_t positions = logits.numel() / vocab;
  ASSIGN_OR_RETURN(core::Tensor ids, core::Tensor::Allocate(batch.inputs.shape(),
                                                            core::DType::kInt32));
  const float* l = logits.data<float>();
  int32_t* out = ids.data<int32_t>();
  for (int64_t p = 0; p < positions; ++p) {
    const float* row = l + p * vocab;
    out[p] = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
  }
  return ids;
}

absl::StatusOr<std::unique_ptr<optim::Optimizer>> GptTrainModule::ConfigureOptimizer(
    std::vector<core::NamedParameter> params) {
  ASSIGN_OR_RETURN(std::unique_ptr<optim::AdamW> adamw,
                   optim::AdamW::Create(std::move(params), options_.adamw));
  return std::unique_ptr<optim::Optimizer>(std::move(adamw));
}

std::optional<double> GptTrainModule::LearningRate(int64_t step) {
  const double warmup =
      options_.warmup_steps > 0
          ? std::min(1.0, static_cast<double>(step + 1) / options_.warmup_steps)
          : 1.0;
  return options_.adamw.lr * warmup;
}

}  // namespace integration
