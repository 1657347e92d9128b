#include "examples/hf_stages.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "checkpoint/hf_gpt2.h"
#include "checkpoint/hf_llama.h"
#include "checkpoint/hf_model.h"
#include "core/status_macros.h"
#include "integration/gpt_module.h"
#include "integration/llama_module.h"
#include "integration/stage_runner.h"
#include "policy/wrap_policy.h"

namespace examples {
namespace {

// The training options both families share.
void SetTraining(const HfStagesOptions& options, int64_t max_seq_len,
                 integration::DecoderTrainOptions* out) {
  out->seq_len = static_cast<int>(std::min<int64_t>(options.seq_len, max_seq_len));
  out->data_path = options.data;
  out->eval_data_path = options.eval_data;
  out->adamw.lr = options.lr;
  out->warmup_steps = 0;
  out->deferred_init = true;  // no parameter memory until the wrap makes the shards
}

// The stages, whatever the family: wrap, load into the shards, test, fit, test, release,
// export on rank 0.
absl::StatusOr<HfStagesResult> RunStages(const std::shared_ptr<comm::ProcessGroup>& group,
                                         const HfStagesOptions& options,
                                         integration::TrainModule& module,
                                         const std::string& block_type) {
  integration::StageOptions stages;
  stages.wrap.policy = policy::ModuleTypes({block_type});
  stages.fit_steps = options.steps;
  stages.train_batch_size = options.batch_size;
  stages.eval_batch_size = options.batch_size;
  stages.eval_batches = 4;
  stages.log_every = 0;
  ASSIGN_OR_RETURN(std::unique_ptr<integration::StageRunner> runner,
                   integration::StageRunner::Create(group, stages));
  // Wrap first, so the checkpoint goes straight into this rank's shards; the stages below
  // reuse this wrap.
  RETURN_IF_ERROR(runner->Wrap(module).status());
  RETURN_IF_ERROR(checkpoint::LoadHfModel(options.hf_dir, *module.model(), &runner->registry()));

  HfStagesResult result;
  ASSIGN_OR_RETURN(integration::EvalResult before, runner->Test(module));
  result.test_loss_before = before.loss;
  ASSIGN_OR_RETURN(integration::FitResult fit, runner->Fit(module));
  result.first_train_loss = fit.losses.empty() ? 0 : fit.losses.front();
  result.final_train_loss = fit.final_loss;
  ASSIGN_OR_RETURN(integration::EvalResult after, runner->Test(module));
  result.test_loss_after = after.loss;
  RETURN_IF_ERROR(runner->Release(module));  // the plain trained model, on every rank
  if (group->rank() == 0 && !options.out_dir.empty()) {
    RETURN_IF_ERROR(checkpoint::ExportHfModel(*module.model(), options.out_dir));
  }
  return result;
}

}  // namespace

absl::StatusOr<HfStagesResult> RunHfStages(const std::shared_ptr<comm::ProcessGroup>& group,
                                           const HfStagesOptions& options) {
  ASSIGN_OR_RETURN(const checkpoint::HfModelType type, checkpoint::ReadHfModelType(options.hf_dir));
  absl::StatusOr<HfStagesResult> result;
  if (type == checkpoint::HfModelType::kGpt2) {
    integration::GptModuleOptions model;
    ASSIGN_OR_RETURN(model.model, checkpoint::ReadHfGpt2Config(options.hf_dir));
    SetTraining(options, model.model.block_size, &model);
    ASSIGN_OR_RETURN(std::unique_ptr<integration::GptTrainModule> module,
                     integration::GptTrainModule::Create(model));
    result = RunStages(group, options, *module, integration::GptTrainModule::kBlockType);
  } else {
    integration::LlamaModuleOptions model;
    ASSIGN_OR_RETURN(model.model, checkpoint::ReadHfLlamaConfig(options.hf_dir));
    SetTraining(options, model.model.max_position_embeddings, &model);
    ASSIGN_OR_RETURN(std::unique_ptr<integration::LlamaTrainModule> module,
                     integration::LlamaTrainModule::Create(model));
    result = RunStages(group, options, *module, integration::LlamaTrainModule::kBlockType);
  }
  if (result.ok()) result->model_type = checkpoint::HfModelTypeName(type);
  return result;
}

}  // namespace examples
