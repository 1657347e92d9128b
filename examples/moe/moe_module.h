// The TrainModule of the mixture-of-experts decoder on token files (data::TokenFile: the .bin
// shards nanoGPT and llm.c write): next-token cross-entropy plus MoeConfig::aux_weight times
// the balance loss (NOTE [Sequence-level balance loss] in moe.h).
//
//   moe::MoeModuleOptions options;
//   options.train_tokens = "data/train";           // a .bin file or a directory of them
//   ASSIGN_OR_RETURN(auto module, moe::MoeModule::Create(options));
//   integration::StageOptions stages;
//   stages.wrap.policy = moe::BlockPolicy();       // a unit per MoeBlock
//   ASSIGN_OR_RETURN(auto runner, integration::StageRunner::Create(group, stages));
//   ASSIGN_OR_RETURN(integration::FitResult fit, runner->Fit(*module));
//
// A step reads its rows of global batch ctx.step (integration::StepRows: the same batch at
// every world size); validation and test read the eval tokens (the training tokens when none
// are given) from batch indices 1,000,000 and 2,000,000. The reported loss is the total the
// step differentiates.
#ifndef EXAMPLES_MOE_MOE_MODULE_H_
#define EXAMPLES_MOE_MOE_MODULE_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/module.h"
#include "data/token_file.h"
#include "examples/moe/moe.h"
#include "integration/train_module.h"
#include "optim/make_optimizer.h"
#include "optim/optimizer.h"
#include "policy/wrap_policy.h"

namespace moe {

struct MoeModuleOptions {
  MoeConfig model;
  std::string train_tokens;  // a token file or a directory of them
  std::string eval_tokens;   // empty: train_tokens
  int seq_len = 8;           // <= model.max_positions
  uint64_t data_seed = 0;
  // AdamW with its defaults unless changed (optim/make_optimizer.h).
  optim::OptimizerOptions optimizer;
};

class MoeModule : public integration::TrainModule {
 public:
  // InvalidArgument naming the option (model sizes, seq_len), or TokenFile::Open's error.
  static absl::StatusOr<std::unique_ptr<MoeModule>> Create(const MoeModuleOptions& options);

  std::shared_ptr<core::Module> model() override { return model_; }
  absl::StatusOr<integration::StepOutput> TrainingStep(
      const integration::StepContext& ctx) override;
  bool SupportsMicroBatches() const override { return true; }
  absl::StatusOr<integration::StepOutput> EvaluationStep(
      const integration::StepContext& ctx) override;
  absl::StatusOr<std::unique_ptr<optim::Optimizer>> ConfigureOptimizer(
      std::vector<core::NamedParameter> params) override;
  std::string CountUnit() const override { return "tokens"; }

  // The step's loss: cross-entropy + aux_weight * aux over this step's rows of `batch` (a
  // tensor of shape []); what TrainingStep differentiates.
  absl::StatusOr<core::Tensor> Loss(const data::TokenBatch& batch);

 private:
  MoeModule(const MoeModuleOptions& options, data::TokenFile train, data::TokenFile eval);
  absl::StatusOr<data::TokenBatch> StepBatch(const data::TokenFile& tokens, int64_t index,
                                             const integration::StepContext& ctx) const;

  MoeModuleOptions options_;
  std::shared_ptr<MoeDecoder> model_;
  data::TokenFile train_, eval_;
};

// The loss MoeModule's steps differentiate, on any ids (no token file): the mean
// cross-entropy of model's logits for `inputs` [B, T] against `targets` [B, T], plus
// model.config().aux_weight times its balance loss; a tensor of shape [].
absl::StatusOr<core::Tensor> MoeLoss(MoeDecoder& model, const core::Tensor& inputs,
                                     const core::Tensor& targets);

// One FSDP unit per MoeBlock (the root keeps the embedding the head shares).
policy::WrapPolicyPtr BlockPolicy();

}  // namespace moe

#endif  // EXAMPLES_MOE_MOE_MODULE_H_
