// Single-process GPT training on the synthetic Markov language, with no FSDP and no
// process group: the reference run that distributed training is compared against (its
// learning test, gpt_training_test, bounds the loss the main job's default model reaches).
// The main job itself runs integration::StageRunner over GptTrainModule (gpt_module.h).
//
//   integration::GptTrainingOptions options;   // small GPT, 300 AdamW steps
//   options.steps = 400;
//   ASSIGN_OR_RETURN(integration::GptTrainingResult result,
//                    integration::TrainGpt(options, [](const integration::TrainingProgress& p) {
//                      LOG(INFO) << integration::FormatProgress(p);
//                    }));
//   // result.eval_loss is close to result.entropy_floor when the model has learnt.
//
// Batch i of training is MarkovLanguage::Batch(i, ...); evaluation uses batches from
// index kEvalBatchOffset on, which training never reaches, so the evaluation loss is
// measured on sequences the model has not seen.
#ifndef INTEGRATION_GPT_TRAINING_H_
#define INTEGRATION_GPT_TRAINING_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/allocator.h"
#include "data/markov_language.h"
#include "integration/gpt_module.h"
#include "nn/gpt.h"
#include "optim/adamw.h"

namespace integration {

// First batch index used for evaluation.
inline constexpr int64_t kEvalBatchOffset = int64_t{1} << 40;

struct GptTrainingOptions {
  nn::GptConfig model;                  // defaults: V 64, context 32, width 64, 2 layers, 4 heads
  data::MarkovLanguageOptions language; // vocab_size is taken from model.vocab_size
  int64_t steps = 300;                  // > 0
  int batch_size = 16;                  // sequences per step, > 0
  int seq_len = 32;                     // tokens per sequence, 0 < seq_len <= model.block_size
  optim::AdamWOptions adamw = DefaultAdamW();
  int64_t warmup_steps = 20;            // linear learning-rate warm-up, >= 0
  int64_t log_every = 25;               // progress every this many steps; 0 never
  int eval_batches = 8;                 // batches of batch_size for the evaluation loss, > 0

  static optim::AdamWOptions DefaultAdamW() { return GptModuleOptions::DefaultAdamW(); }
};

// What the progress callback receives every log_every steps and after the last step.
struct TrainingProgress {
  int64_t step = 0;           // 1-based number of the step just taken
  int64_t steps = 0;          // total steps
  float loss = 0.0f;          // this step's training loss
  double tokens_per_second = 0.0;  // since the previous report
  core::MemoryStats memory;   // the CPU allocator's counters (peaks since training began)
};

// "step  100/300  loss 2.3141  tokens/s 41234  peak param=... grad=... ...".
std::string FormatProgress(const TrainingProgress& progress);

struct GptTrainingResult {
  std::vector<float> losses;   // training loss of every step
  float final_train_loss = 0;  // mean training loss of the last min(10, steps) steps
  double eval_loss = 0;        // mean loss over eval_batches unseen batches
  double entropy_floor = 0;    // MarkovLanguage::LossFloor(seq_len)
  double log_vocab = 0;        // loss of a model that has learnt nothing
  double tokens_per_second = 0;
  core::MemoryStats memory;    // peaks over the whole run
  std::shared_ptr<nn::Gpt> model;  // the trained model
};

// Trains a fresh Gpt with AdamW. InvalidArgument naming the option for bad options;
// the first error of any layer or the optimizer otherwise.
absl::StatusOr<GptTrainingResult> TrainGpt(
    const GptTrainingOptions& options,
    const std::function<void(const TrainingProgress&)>& on_progress = nullptr);

// Mean cross-entropy of `model` over `num_batches` batches of the language from
// `first_index` on. No gradients are computed.
absl::StatusOr<double> EvaluateGpt(nn::Gpt& model, const data::MarkovLanguage& language,
                                   int64_t first_index, int num_batches, int batch_size,
                                   int seq_len);

}  // namespace integration

#endif  // INTEGRATION_GPT_TRAINING_H_
