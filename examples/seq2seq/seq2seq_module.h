// The TrainModule of the encoder-decoder on the reverse task: what a trainer author writes
// to train their own model through integration::StageRunner (wrapping, stages, checkpoints
// and release are the runner's).
//
//   ASSIGN_OR_RETURN(auto module, seq2seq::Seq2SeqModule::Create({}));
//   integration::StageOptions options;
//   options.wrap.policy = seq2seq::LayerPolicy();   // a unit per encoder and decoder layer
//   ASSIGN_OR_RETURN(auto runner, integration::StageRunner::Create(group, options));
//   ASSIGN_OR_RETURN(integration::FitResult fit, runner->Fit(*module));
//
// A step makes exactly its rows of the global batch (integration::StepRows), takes the
// cross-entropy over the real target tokens (padding is ignore_index) and scales it by
// integration::ShareOfMean (NOTE [Mean over real tokens] in integration/train_module.h): the
// gradient is that of the mean over the global batch's real tokens at every world size, and
// the reported loss is that mean. Validation and test batches are held out (batch indices from
// 1,000,000 and 2,000,000).
#ifndef EXAMPLES_SEQ2SEQ_SEQ2SEQ_MODULE_H_
#define EXAMPLES_SEQ2SEQ_SEQ2SEQ_MODULE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/module.h"
#include "examples/seq2seq/reverse_task.h"
#include "examples/seq2seq/seq2seq.h"
#include "integration/train_module.h"
#include "optim/make_optimizer.h"
#include "optim/optimizer.h"
#include "policy/wrap_policy.h"

namespace seq2seq {

struct Seq2SeqModuleOptions {
  Seq2SeqConfig model;
  ReverseTaskOptions task;
  // AdamW with its defaults unless changed (optim/make_optimizer.h).
  optim::OptimizerOptions optimizer;
};

class Seq2SeqModule : public integration::TrainModule {
 public:
  // InvalidArgument naming the option when the task does not fit the model (task.vocab !=
  // model.vocab, max_symbols + 1 > max_positions) or either is invalid.
  static absl::StatusOr<std::unique_ptr<Seq2SeqModule>> Create(const Seq2SeqModuleOptions& options);

  std::shared_ptr<core::Module> model() override { return model_; }
  absl::StatusOr<integration::StepOutput> TrainingStep(
      const integration::StepContext& ctx) override;
  bool SupportsMicroBatches() const override { return true; }
  absl::StatusOr<integration::StepOutput> EvaluationStep(
      const integration::StepContext& ctx) override;
  absl::StatusOr<std::unique_ptr<optim::Optimizer>> ConfigureOptimizer(
      std::vector<core::NamedParameter> params) override;
  std::string CountUnit() const override { return "tokens"; }

 private:
  Seq2SeqModule(const Seq2SeqModuleOptions& options, ReverseTask task)
      : options_(options),
        model_(std::make_shared<Seq2Seq>(options.model)),
        task_(std::move(task)) {}

  Seq2SeqModuleOptions options_;
  std::shared_ptr<Seq2Seq> model_;
  ReverseTask task_;
};

// The model's answers to `batch`'s sources, greedily: target position j is the argmax of the
// logits at j given the answer's first j tokens (kBos first). Row r's answer is the symbols
// before the first kEos (all max_symbols + 1 positions when none). Runs under
// core::NoGradScope; the model must hold its full weights (unwrapped or released).
absl::StatusOr<std::vector<std::vector<int32_t>>> GreedyAnswers(Seq2Seq& model,
                                                                const ReverseBatch& batch);

// How many rows of `batch` GreedyAnswers reverses exactly.
absl::StatusOr<int64_t> ExactlyReversed(Seq2Seq& model, const ReverseBatch& batch);

// One FSDP unit per EncoderLayer and DecoderLayer (the root keeps the shared embedding).
policy::WrapPolicyPtr LayerPolicy();

}  // namespace seq2seq

#endif  // EXAMPLES_SEQ2SEQ_SEQ2SEQ_MODULE_H_
