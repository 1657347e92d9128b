// GptTrainModule: the TrainModule of the main job and of the end-to-end tests: an
// nn::Gpt learning the synthetic Markov language (data/markov_language.h), or token files,
// with AdamW and a linear learning-rate warm-up.
//
//   integration::GptModuleOptions options;     // small GPT on a vocabulary of 64
//   ASSIGN_OR_RETURN(auto module, integration::GptTrainModule::Create(options));
//   ASSIGN_OR_RETURN(auto fit, runner->Fit(*module));
//   ASSIGN_OR_RETURN(auto test, runner->Test(*module));
//   // test.loss approaches module->EntropyFloor() as the model learns
//
// Training step s uses language batch s (so training resumed at step s sees what
// uninterrupted training would); validation uses batches from kValidateBatchOffset on and
// testing from kTestBatchOffset on, which training never reaches. Every rank builds the
// whole global batch (cheap: sampling) and runs its data::RankSampler rows, kept on the
// host (int32 tokens): the embedding and the loss check them there and copy them to the
// model's device. With token files (GptModuleOptions::data_path) the batches come from
// data::TokenFile, sampled the same way by index.
#ifndef INTEGRATION_GPT_MODULE_H_
#define INTEGRATION_GPT_MODULE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "core/device.h"
#include "data/markov_language.h"
#include "data/token_file.h"
#include "integration/train_module.h"
#include "nn/gpt.h"
#include "optim/adamw.h"

namespace integration {

inline constexpr int64_t kValidateBatchOffset = int64_t{1} << 40;
inline constexpr int64_t kTestBatchOffset = int64_t{1} << 41;

// NOTE [Language vocabulary]: the Markov language's transition table is dense, V^(k+1)
// probabilities (data/markov_language.h caps it at 2^24), so a model vocabulary like
// GPT-2's 50304 cannot be the language's. When model.vocab_size is too large for the
// table at the language's order, the language uses the first kCappedLanguageVocab token
// ids only (the model still predicts over its full vocabulary and learns to give the
// rest no mass); the loss floor is that language's. The main job prints it.
inline constexpr int kCappedLanguageVocab = 128;

// The language vocabulary for a model vocabulary and a Markov order (see NOTE
// [Language vocabulary]): model_vocab when the table allows it, else
// min(model_vocab, kCappedLanguageVocab).
int64_t LanguageVocabFor(int64_t model_vocab, int order);

struct GptModuleOptions {
  nn::GptConfig model;                   // vocab_size is also the language's (NOTE
                                         // [Language vocabulary])
  data::MarkovLanguageOptions language;  // vocab_size is taken from model.vocab_size
  int seq_len = 32;                      // 0 < seq_len <= model.block_size
  optim::AdamWOptions adamw = DefaultAdamW();
  int64_t warmup_steps = 20;             // linear warm-up over the first global steps, >= 0
  // Where the model computes: it is built on the CPU (the same deterministic init
  // everywhere) and moved there, keeping its Parameter objects.
  core::Device device = core::Device::Cpu();
  // Build the model deferred (NOTE [Deferred initialisation] in core/param_init.h): no
  // parameter memory until a stage wraps it, which fills only each rank's shards, with
  // the same values (on a CUDA device: filled on the host, copied there).
  bool deferred_init = false;
  // Token files (data/token_file.h) to read instead of the Markov language: data_path for
  // fit, eval_data_path (default data_path) for validate, test and predict; batches
  // sampled with data_seed. Every token must be below model.vocab_size.
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

class GptTrainModule : public TrainModule {
 public:
  // InvalidArgument naming the option ("GptModuleOptions.seq_len", "GptConfig.n_head",
  // MarkovLanguageOptions...) for bad options.
  static absl::StatusOr<std::unique_ptr<GptTrainModule>> Create(const GptModuleOptions& options);

  std::shared_ptr<core::Module> model() override { return gpt_; }
  // Cross-entropy of the rank's rows of language batch ctx.step; count = its tokens.
  absl::StatusOr<StepOutput> TrainingStep(const StepContext& ctx) override;
  absl::StatusOr<StepOutput> EvaluationStep(const StepContext& ctx) override;
  // Micro-batches as StepContext says.
  bool SupportsMicroBatches() const override { return true; }
  // The most likely next token at every position of the rank's rows (int32 [rows, T]).
  absl::StatusOr<core::Tensor> PredictStep(const StepContext& ctx) override;
  // AdamW with GptModuleOptions::adamw.
  absl::StatusOr<std::unique_ptr<optim::Optimizer>> ConfigureOptimizer(
      std::vector<core::NamedParameter> params) override;
  // adamw.lr * min(1, (step + 1) / warmup_steps).
  std::optional<double> LearningRate(int64_t step) override;
  // StepOutput::count is the number of target tokens.
  std::string CountUnit() const override { return "tokens"; }

  const std::shared_ptr<nn::Gpt>& gpt() const { return gpt_; }
  const data::MarkovLanguage& language() const { return language_; }
  // Whether the batches come from token files (GptModuleOptions::data_path).
  bool uses_token_files() const { return train_tokens_.has_value(); }
  const GptModuleOptions& options() const { return options_; }
  // MarkovLanguage::LossFloor(seq_len): the best test loss any model can reach; NaN
  // (unknown) on token files.
  double EntropyFloor() const;

 private:
  GptTrainModule(GptModuleOptions options, data::MarkovLanguage language,
                 std::shared_ptr<nn::Gpt> gpt);
  // This rank's rows of batch `index` (of the language, or of the stage's token file).
  absl::StatusOr<data::TokenBatch> LocalBatch(int64_t index, const StepContext& ctx) const;
  // The batch index a stage's step reads.
  static int64_t BatchIndex(const StepContext& ctx);

  GptModuleOptions options_;
  data::MarkovLanguage language_;
  std::shared_ptr<nn::Gpt> gpt_;
  std::optional<data::TokenFile> train_tokens_;
  std::optional<data::TokenFile> eval_tokens_;
};

}  // namespace integration

#endif  // INTEGRATION_GPT_MODULE_H_
