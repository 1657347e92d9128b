// DecoderTrainModule: the TrainModule of a decoder-only language model (Forward(int32
// tokens [B, T]) -> logits [B, T, V], Backward(the logits' gradient)) learning the
// synthetic Markov language (data/markov_language.h), or token files, with AdamW and a
// linear learning-rate warm-up. One piece of code for every such model: the model comes
// from a DecoderSpec, which GptTrainModule (integration/gpt_module.h) and
// LlamaTrainModule (integration/llama_module.h) fill in for nn::Gpt and nn::Llama.
//
//   ASSIGN_OR_RETURN(auto module, integration::GptTrainModule::Create(gpt_options));
//   // or, for any decoder:
//   ASSIGN_OR_RETURN(auto module, integration::DecoderTrainModule::Create(
//                                     train_options, integration::LlamaTrainModule::Spec(config)));
//   ASSIGN_OR_RETURN(auto fit, runner->Fit(*module));
//   ASSIGN_OR_RETURN(auto test, runner->Test(*module));
//   // test.loss approaches module->EntropyFloor() as the model learns
//
// Training step s uses language batch s (so training resumed at step s sees what
// uninterrupted training would); validation uses batches from kValidateBatchOffset on and
// testing from kTestBatchOffset on, which training never reaches. Every rank builds the
// whole global batch (cheap: sampling) and runs its data::RankSampler rows, kept on the
// host (int32 tokens): the embedding and the loss check them there and copy them to the
// model's device. With token files (DecoderTrainOptions::data_path) training step s reads
// data::TokenFile::Batch(s): the training file's windows in epochs, each in an order of
// (data_seed, epoch) (NOTE [Token windows] in data/token_file.h). Validate and test each
// evaluate the whole evaluation file (eval_data_path, default data_path), every window
// exactly once, in order: batch b is windows [b B, (b + 1) B), the last batch padded (NOTE
// [Whole-set evaluation] in integration/train_module.h), so both report the exact mean loss
// over all the file's target tokens; they read the same windows (one held-out file: give
// validate and test their own numbers by running one of them). Predict batch b reads the
// same windows as evaluation batch b.
#ifndef INTEGRATION_DECODER_MODULE_H_
#define INTEGRATION_DECODER_MODULE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/module.h"
#include "data/markov_language.h"
#include "data/token_file.h"
#include "integration/train_module.h"
#include "optim/adamw.h"

namespace integration {

inline constexpr int64_t kValidateBatchOffset = int64_t{1} << 40;
inline constexpr int64_t kTestBatchOffset = int64_t{1} << 41;

// NOTE [Language vocabulary]: the Markov language's transition table is dense, V^(k+1)
// probabilities (data/markov_language.h caps it at 2^24), so a model vocabulary like
// GPT-2's 50304 cannot be the language's. When the model's vocabulary is too large for
// the table at the language's order, the language uses the first kCappedLanguageVocab
// token ids only (the model still predicts over its full vocabulary and learns to give
// the rest no mass); the loss floor is that language's. The main job prints it.
inline constexpr int kCappedLanguageVocab = 128;

// The language vocabulary for a model vocabulary and a Markov order (see NOTE
// [Language vocabulary]): model_vocab when the table allows it, else
// min(model_vocab, kCappedLanguageVocab).
int64_t LanguageVocabFor(int64_t model_vocab, int order);

// What the options of every decoder module share: the data, the optimizer, and where and
// how the model is built. GptModuleOptions and LlamaModuleOptions add the model's config.
struct DecoderTrainOptions {
  data::MarkovLanguageOptions language;  // vocab_size is taken from the model's (NOTE
                                         // [Language vocabulary])
  int seq_len = 32;                      // 0 < seq_len <= the model's longest sequence
  optim::AdamWOptions adamw = DefaultAdamW();
  int64_t warmup_steps = 20;  // linear warm-up over the first global steps, >= 0
  // Where the model computes: it is built on the CPU (the same deterministic init
  // everywhere) and moved there, keeping its Parameter objects.
  core::Device device = core::Device::Cpu();
  // Build the model deferred (NOTE [Deferred initialisation] in core/param_init.h): no
  // parameter memory until a stage wraps it, which fills only each rank's shards, with
  // the same values (on a CUDA device: filled on the host, copied there).
  bool deferred_init = false;
  // Token files (data/token_file.h) to read instead of the Markov language: data_path for
  // fit, eval_data_path (default data_path) for validate, test and predict; training
  // windows ordered by data_seed. Every token must be below the model's vocabulary, and
  // each file must hold at least seq_len + 1 tokens (one window).
  std::string data_path;
  std::string eval_data_path;
  uint64_t data_seed = 0;

  static optim::AdamWOptions DefaultAdamW() {
    optim::AdamWOptions o;
    o.lr = 1e-2;
    o.weight_decay = 0.0;
    return o;
  }
};

// A decoder-only language model as DecoderTrainModule drives it: what the module checks
// its options against, how to build the model, and what the job's wrap policy and FLOPs
// estimate need to know of it.
struct DecoderSpec {
  // The name of the module's options and of the config's longest-sequence field, for
  // errors: "GptModuleOptions" and "GptConfig.block_size".
  std::string options_name;
  std::string max_seq_len_name;
  int64_t vocab_size = 0;   // V
  int64_t max_seq_len = 0;  // the longest sequence Forward takes
  // core::Module::TypeName of the repeated block ("TransformerBlock"): one FSDP unit each
  // in the main job, and what its activation checkpointing applies to.
  std::string block_type;
  int64_t num_layers = 0;  // L and C of the model-FLOPs estimate 6 N + 12 L T C
  int64_t hidden_size = 0;
  // Builds the model (under a core::DeferredInitScope when DecoderTrainOptions::
  // deferred_init); its config's InvalidArgument naming the field.
  std::function<absl::StatusOr<std::shared_ptr<core::Module>>()> build;
};

// Sets spec->build for a model type with
// `static absl::StatusOr<std::shared_ptr<Model>> Create(const Config&)` (nn::Gpt, nn::Llama).
template <typename Model, typename Config>
void SetDecoderModel(const Config& config, DecoderSpec* spec) {
  spec->build = [config]() -> absl::StatusOr<std::shared_ptr<core::Module>> {
    absl::StatusOr<std::shared_ptr<Model>> model = Model::Create(config);
    if (!model.ok()) return model.status();
    return std::shared_ptr<core::Module>(*std::move(model));
  };
}

class DecoderTrainModule : public TrainModule {
 public:
  // InvalidArgument naming the option ("<spec.options_name>.seq_len", the config's field,
  // MarkovLanguageOptions...) for bad options.
  static absl::StatusOr<std::unique_ptr<DecoderTrainModule>> Create(
      const DecoderTrainOptions& options, DecoderSpec spec);

  std::shared_ptr<core::Module> model() override { return model_; }
  // Cross-entropy of the rank's rows of language batch ctx.step; count = its tokens (in
  // evaluation its real target tokens: padding rows count 0, NOTE [Whole-set evaluation]).
  absl::StatusOr<StepOutput> TrainingStep(const StepContext& ctx) override;
  absl::StatusOr<StepOutput> EvaluationStep(const StepContext& ctx) override;
  // Micro-batches as StepContext says.
  bool SupportsMicroBatches() const override { return true; }
  // The most likely next token at every position of the rank's rows (int32 [rows, T]).
  absl::StatusOr<core::Tensor> PredictStep(const StepContext& ctx) override;
  // AdamW with DecoderTrainOptions::adamw.
  absl::StatusOr<std::unique_ptr<optim::Optimizer>> ConfigureOptimizer(
      std::vector<core::NamedParameter> params) override;
  // adamw.lr * min(1, (step + 1) / warmup_steps).
  std::optional<double> LearningRate(int64_t step) override;
  // StepOutput::count is the number of target tokens.
  std::string CountUnit() const override { return "tokens"; }
  // NOTE [Data identity] of the training batches. Both sources: "data.kind"
  // ("token_files" or "markov_language") and "data.seq_len". Token files: "data.files"
  // (data::TokenFile::Files() paths as given, comma-separated), "data.sizes" (each file's
  // tokens), "data.fingerprint" (TokenFile::Fingerprint(), "0x" and 16 hex digits),
  // "data.seed" (data_seed) and "data.sampling" ("epochs": NOTE [Token windows]; a
  // checkpoint of windows drawn at random has none). The Markov language:
  // "data.language_seed", "data.order", "data.vocab" (the language's, NOTE [Language
  // vocabulary]), "data.likely_tokens" and "data.peakedness". The evaluation files
  // (eval_data_path) are not in it: they change no training batch, only validate, test and
  // predict read them.
  std::map<std::string, std::string> DataIdentity() const override;
  // NOTE [Data position]: token files only (the language's batch is the step's):
  // "data.epoch" and "data.window", sample global_step * batch_size's epoch and its place
  // in it (NOTE [Token windows]).
  std::map<std::string, std::string> DataPosition(int64_t global_step,
                                                  int batch_size) const override;
  // NOTE [Whole-set evaluation]: token files' validate and test, ceil(W / batch_size) for
  // the evaluation file's W windows; nullopt for the language (StageOptions::eval_batches
  // batches sampled from it) and for predict.
  std::optional<int64_t> EvaluationBatches(Stage stage, int batch_size) const override;

  const DecoderSpec& spec() const { return spec_; }
  const DecoderTrainOptions& train_options() const { return train_options_; }
  const data::MarkovLanguage& language() const { return *language_; }
  // Whether the batches come from token files (DecoderTrainOptions::data_path).
  bool uses_token_files() const { return train_tokens_.has_value(); }
  // MarkovLanguage::LossFloor(seq_len): the best test loss any model can reach; NaN
  // (unknown) on token files.
  double EntropyFloor() const;

 protected:
  DecoderTrainModule() = default;
  // Create's work, for the Create of a subclass: checks `options`, builds the language,
  // the model (spec.build) and the token files.
  absl::Status Init(const DecoderTrainOptions& options, DecoderSpec spec);

 private:
  // This rank's rows of batch `index` (of the language, or of the stage's token file).
  absl::StatusOr<data::TokenBatch> LocalBatch(int64_t index, const StepContext& ctx) const;
  // The batch index a stage's step reads.
  static int64_t BatchIndex(const StepContext& ctx);

  DecoderTrainOptions train_options_;
  DecoderSpec spec_;
  std::optional<data::MarkovLanguage> language_;  // set by Init
  std::shared_ptr<core::Module> model_;
  std::optional<data::TokenFile> train_tokens_;
  std::optional<data::TokenFile> eval_tokens_;
};

}  // namespace integration

#endif  // INTEGRATION_DECODER_MODULE_H_
