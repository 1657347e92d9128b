#include "examples/hf_gpt2_stages.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "checkpoint/hf_gpt2.h"
#include "core/status_macros.h"
#include "integration/gpt_module.h"
#include "integration/stage_runner.h"
#include "policy/wrap_policy.h"

namespace examples {

absl::StatusOr<HfGpt2StagesResult> RunHfGpt2Stages(
    const std::shared_ptr<comm::ProcessGroup>& group, const HfGpt2StagesOptions& options) {
  ASSIGN_OR_RETURN(nn::GptConfig config, checkpoint::ReadHfGpt2Config(options.hf_dir));
  integration::GptModuleOptions model;
  model.model = config;
  model.seq_len = std::min<int64_t>(options.seq_len, config.block_size);
  model.data_path = options.data;
  model.eval_data_path = options.eval_data;
  model.adamw.lr = options.lr;
  model.warmup_steps = 0;
  model.deferred_init = true;  // no parameter memory until the wrap makes the shards
  ASSIGN_OR_RETURN(std::unique_ptr<integration::GptTrainModule> module,
                   integration::GptTrainModule::Create(model));

  integration::StageOptions stages;
  stages.wrap.policy = policy::ModuleTypes({"TransformerBlock"});
  stages.fit_steps = options.steps;
  stages.train_batch_size = options.batch_size;
  stages.eval_batch_size = options.batch_size;
  stages.eval_batches = 4;
  stages.log_every = 0;
  ASSIGN_OR_RETURN(std::unique_ptr<integration::StageRunner> runner,
                   integration::StageRunner::Create(group, stages));
  // Wrap first, so the checkpoint goes straight into this rank's shards; the stages below
  // reuse this wrap.
  RETURN_IF_ERROR(runner->Wrap(*module).status());
  RETURN_IF_ERROR(checkpoint::LoadHfGpt2(options.hf_dir, *module->gpt(), &runner->registry()));

  HfGpt2StagesResult result;
  ASSIGN_OR_RETURN(integration::EvalResult before, runner->Test(*module));
  result.test_loss_before = before.loss;
  ASSIGN_OR_RETURN(integration::FitResult fit, runner->Fit(*module));
  result.first_train_loss = fit.losses.empty() ? 0 : fit.losses.front();
  result.final_train_loss = fit.final_loss;
  ASSIGN_OR_RETURN(integration::EvalResult after, runner->Test(*module));
  result.test_loss_after = after.loss;
  RETURN_IF_ERROR(runner->Release(*module));  // the plain trained model, on every rank
  if (group->rank() == 0 && !options.out_dir.empty()) {
    RETURN_IF_ERROR(checkpoint::ExportHfGpt2(*module->gpt(), options.out_dir));
  }
  return result;
}

}  // namespace examples
