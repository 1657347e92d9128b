#include "integration/decoder_module.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/param_init.h"
#include "core/status_macros.h"
#include "data/sampler.h"
#include "integration/device_setup.h"
#include "nn/functional/loss.h"

namespace integration {

namespace F = ::nn::functional;

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

absl::StatusOr<std::unique_ptr<DecoderTrainModule>> DecoderTrainModule::Create(
    const DecoderTrainOptions& options, DecoderSpec spec) {
  std::unique_ptr<DecoderTrainModule> module(new DecoderTrainModule());
  RETURN_IF_ERROR(module->Init(options, std::move(spec)));
  return module;
}

absl::Status DecoderTrainModule::Init(const DecoderTrainOptions& options, DecoderSpec spec) {
  const std::string name = spec.options_name;  // a copy: `spec` moves into spec_ below
  if (options.seq_len <= 0 || options.seq_len > spec.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(name, ".seq_len = ", options.seq_len,
                                                   ": must be in [1, ", spec.max_seq_len_name,
                                                   " = ", spec.max_seq_len, "]"));
  }
  if (options.warmup_steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ".warmup_steps = ", options.warmup_steps, ": must be >= 0"));
  }
  data::MarkovLanguageOptions language_options = options.language;
  language_options.vocab_size =
      static_cast<int>(LanguageVocabFor(spec.vocab_size, language_options.order));
  ASSIGN_OR_RETURN(data::MarkovLanguage language, data::MarkovLanguage::Create(language_options));
  absl::StatusOr<std::shared_ptr<core::Module>> created;
  if (options.deferred_init) {
    core::DeferredInitScope deferred;
    created = spec.build();
  } else {
    created = spec.build();
  }
  ASSIGN_OR_RETURN(std::shared_ptr<core::Module> model, std::move(created));
  if (!options.device.is_cpu()) RETURN_IF_ERROR(MoveModuleToDevice(*model, options.device));
  // Check the AdamW options now rather than at the first Fit.
  RETURN_IF_ERROR(optim::AdamW::Create(std::vector<core::ParameterPtr>{}, options.adamw).status());
  train_options_ = options;
  spec_ = std::move(spec);
  language_.emplace(std::move(language));
  model_ = std::move(model);
  if (!options.data_path.empty() || !options.eval_data_path.empty()) {
    const auto open = [&name](const std::string& path,
                              const char* option) -> absl::StatusOr<data::TokenFile> {
      absl::StatusOr<data::TokenFile> f = data::TokenFile::Open(path);
      if (!f.ok()) {
        return core::Annotate(f.status(), absl::StrCat(name, ".", option));
      }
      return f;
    };
    if (options.data_path.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ".eval_data_path is set but data_path is not; set both or neither"));
    }
    ASSIGN_OR_RETURN(train_tokens_, open(options.data_path, "data_path"));
    if (options.eval_data_path.empty()) {
      eval_tokens_ = train_tokens_;  // shares the mapped files
    } else {
      ASSIGN_OR_RETURN(eval_tokens_, open(options.eval_data_path, "eval_data_path"));
    }
    // NOTE [Token windows]: each file must hold a window of seq_len + 1 tokens.
    for (const auto& [tokens, option] :
         {std::pair{&*train_tokens_, "data_path"}, std::pair{&*eval_tokens_, "eval_data_path"}}) {
      if (tokens->NumWindows(options.seq_len) < 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            name, ".", option, ": ", tokens->num_tokens(),
            " tokens, fewer than seq_len + 1 = ", options.seq_len + 1, " (one window)"));
      }
    }
  }
  return absl::OkStatus();
}

double DecoderTrainModule::EntropyFloor() const {
  if (uses_token_files()) return std::numeric_limits<double>::quiet_NaN();
  return language_->LossFloor(train_options_.seq_len);
}

std::map<std::string, std::string> DecoderTrainModule::DataIdentity() const {
  std::map<std::string, std::string> id;
  id["data.seq_len"] = absl::StrCat(train_options_.seq_len);
  if (uses_token_files()) {
    std::vector<std::string> paths, sizes;
    for (const auto& [path, tokens] : train_tokens_->Files()) {
      paths.push_back(path);
      sizes.push_back(absl::StrCat(tokens));
    }
    id["data.kind"] = "token_files";
    id["data.files"] = absl::StrJoin(paths, ",");
    id["data.sizes"] = absl::StrJoin(sizes, ",");
    id["data.fingerprint"] = absl::StrFormat("0x%016x", train_tokens_->Fingerprint());
    id["data.seed"] = absl::StrCat(train_options_.data_seed);
    id["data.sampling"] = "epochs";  // NOTE [Token windows]
    return id;
  }
  const data::MarkovLanguageOptions& language = language_->options();
  id["data.kind"] = "markov_language";
  id["data.language_seed"] = absl::StrCat(language.seed);
  id["data.order"] = absl::StrCat(language.order);
  id["data.vocab"] = absl::StrCat(language.vocab_size);
  id["data.likely_tokens"] = absl::StrCat(language.likely_tokens);
  id["data.peakedness"] = absl::StrFormat("%.17g", language.peakedness);
  return id;
}

std::map<std::string, std::string> DecoderTrainModule::DataPosition(int64_t global_step,
                                                                    int batch_size) const {
  if (!uses_token_files()) return {};  // language batch s is the step's: nothing more
  // NOTE [Token windows]: the next sample, global_step * batch_size, in epochs of W windows.
  const int64_t windows = train_tokens_->NumWindows(train_options_.seq_len);
  const int64_t sample = global_step * batch_size;
  return {{"data.epoch", absl::StrCat(sample / windows)},
          {"data.window", absl::StrCat(sample % windows)}};
}

std::optional<int64_t> DecoderTrainModule::EvaluationBatches(Stage stage, int batch_size) const {
  if (!uses_token_files() || (stage != Stage::kValidate && stage != Stage::kTest) ||
      batch_size < 1) {
    return std::nullopt;
  }
  const int64_t windows = eval_tokens_->NumWindows(train_options_.seq_len);
  return (windows + batch_size - 1) / batch_size;
}

int64_t DecoderTrainModule::BatchIndex(const StepContext& ctx) {
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

absl::StatusOr<data::TokenBatch> DecoderTrainModule::LocalBatch(int64_t index,
                                                                const StepContext& ctx) const {
  data::TokenBatch global;
  if (uses_token_files() && ctx.stage == Stage::kFit) {
    ASSIGN_OR_RETURN(global, train_tokens_->Batch(index, ctx.batch_size, train_options_.seq_len,
                                                  spec_.vocab_size, train_options_.data_seed));
  } else if (uses_token_files()) {
    // NOTE [Whole-set evaluation]: the eval file's windows in order, batch b from window
    // b * batch_size, the rows past the last window padding.
    ASSIGN_OR_RETURN(data::WindowBatch windows,
                     eval_tokens_->Windows(ctx.step * ctx.batch_size, ctx.batch_size,
                                           train_options_.seq_len, spec_.vocab_size));
    global = std::move(windows.batch);
  } else {
    ASSIGN_OR_RETURN(global, language_->Batch(index, ctx.batch_size, train_options_.seq_len));
  }
  ASSIGN_OR_RETURN(auto rows, StepRows(ctx));
  // Stays on the host on every device: the token embedding and the loss check their ids
  // on the host and copy them to the device themselves, once each, each copy a host sync
  // (NOTE [Index uploads] in nn/tensor_ops.h; an uploaded batch would be copied back to be
  // checked: two more host syncs a step).
  return data::Rows(global, rows.first, rows.second);
}

absl::StatusOr<StepOutput> DecoderTrainModule::TrainingStep(const StepContext& ctx) {
  ASSIGN_OR_RETURN(data::TokenBatch batch, LocalBatch(BatchIndex(ctx), ctx));
  // The model and its loss on the autograd graph (NOTE [Graph modules] in core/module.h): the
  // loss keeps the logits' gradient in the dtype the head's GEMMs use (bf16 under mixed
  // precision, NOTE [Functional losses]) and the logits are freed before the backward, so at
  // most one [B, T, V] tensor lives in each. The loss's value stays on the device until the
  // runner reports it (NOTE [Deferred loss]).
  StepOutput out{0.0, batch.targets.numel()};
  F::CrossEntropyOptions loss_options;
  loss_options.read_loss = &out.read_loss;
  ASSIGN_OR_RETURN(const core::Tensor loss,
                   F::CrossEntropy(model_->CallOne({batch.inputs}), batch.targets, loss_options));
  RETURN_IF_ERROR(core::Backward(loss));
  return out;
}

absl::StatusOr<StepOutput> DecoderTrainModule::EvaluationStep(const StepContext& ctx) {
  ASSIGN_OR_RETURN(data::TokenBatch batch, LocalBatch(BatchIndex(ctx), ctx));
  std::function<absl::StatusOr<double>()> read_loss;
  F::CrossEntropyOptions loss_options;
  loss_options.read_loss = &read_loss;
  RETURN_IF_ERROR(
      F::CrossEntropy(model_->CallOne({batch.inputs}), batch.targets, loss_options).status());
  ASSIGN_OR_RETURN(const double loss, read_loss());
  // The targets the loss is over: padding rows' (data::kIgnoreTarget) are not.
  const int32_t* targets = batch.targets.data<int32_t>();
  const int64_t count = std::count_if(targets, targets + batch.targets.numel(),
                                      [](int32_t t) { return t != data::kIgnoreTarget; });
  return StepOutput{count > 0 ? loss : 0.0, count};
}

absl::StatusOr<core::Tensor> DecoderTrainModule::PredictStep(const StepContext& ctx) {
  ASSIGN_OR_RETURN(data::TokenBatch batch, LocalBatch(BatchIndex(ctx), ctx));
  ASSIGN_OR_RETURN(core::Tensor logits, model_->Forward(batch.inputs));
  if (!logits.device().is_cpu()) {
    ASSIGN_OR_RETURN(logits, OnDevice(logits, core::Device::Cpu()));
  }
  if (logits.dtype() != core::DType::kFloat32) {  // bf16 logits (NOTE [bf16 logits])
    ASSIGN_OR_RETURN(logits, logits.ToDType(core::DType::kFloat32, core::MemoryTag::kOther));
  }
  const int64_t vocab = logits.size(-1);
  const int64_t positions = logits.numel() / vocab;
  ASSIGN_OR_RETURN(core::Tensor ids,
                   core::Tensor::Allocate(batch.inputs.shape(), core::DType::kInt32));
  const float* l = logits.data<float>();
  int32_t* out = ids.data<int32_t>();
  for (int64_t p = 0; p < positions; ++p) {
    const float* row = l + p * vocab;
    out[p] = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
  }
  return ids;
}

absl::StatusOr<std::unique_ptr<optim::Optimizer>> DecoderTrainModule::ConfigureOptimizer(
    std::vector<core::NamedParameter> params) {
  ASSIGN_OR_RETURN(std::unique_ptr<optim::AdamW> adamw,
                   optim::AdamW::Create(std::move(params), train_options_.adamw));
  return std::unique_ptr<optim::Optimizer>(std::move(adamw));
}

std::optional<double> DecoderTrainModule::LearningRate(int64_t step) {
  const double warmup =
      train_options_.warmup_steps > 0
          ? std::min(1.0, static_cast<double>(step + 1) / train_options_.warmup_steps)
          : 1.0;
  return train_options_.adamw.lr * warmup;
}

}  // namespace integration
