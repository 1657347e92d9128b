#include "examples/hf_stages.h"

#include <algorithm>
#include <fstream>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "checkpoint/hf_gpt2.h"
#include "checkpoint/hf_llama.h"
#include "core/status_macros.h"
#include "integration/gpt_module.h"
#include "integration/llama_module.h"
#include "integration/stage_runner.h"
#include "nlohmann/json.hpp"
#include "policy/wrap_policy.h"

namespace examples {
namespace {

// config.json's model_type ("" when absent); NotFound / InvalidArgument naming the file.
absl::StatusOr<std::string> ModelType(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open it"));
  const nlohmann::json config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  const auto it = config.find("model_type");
  return it != config.end() && it->is_string() ? it->get<std::string>() : std::string();
}

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
absl::StatusOr<HfStagesResult> RunStages(
    const std::shared_ptr<comm::ProcessGroup>& group, const HfStagesOptions& options,
    integration::TrainModule& module, const std::string& block_type,
    const std::function<absl::Status(fsdp::WrapperRegistry*)>& load,
    const std::function<absl::Status()>& export_model) {
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
  RETURN_IF_ERROR(load(&runner->registry()));

  HfStagesResult result;
  ASSIGN_OR_RETURN(integration::EvalResult before, runner->Test(module));
  result.test_loss_before = before.loss;
  ASSIGN_OR_RETURN(integration::FitResult fit, runner->Fit(module));
  result.first_train_loss = fit.losses.empty() ? 0 : fit.losses.front();
  result.final_train_loss = fit.final_loss;
  ASSIGN_OR_RETURN(integration::EvalResult after, runner->Test(module));
  result.test_loss_after = after.loss;
  RETURN_IF_ERROR(runner->Release(module));  // the plain trained model, on every rank
  if (group->rank() == 0 && !options.out_dir.empty()) RETURN_IF_ERROR(export_model());
  return result;
}

}  // namespace

absl::StatusOr<HfStagesResult> RunHfStages(const std::shared_ptr<comm::ProcessGroup>& group,
                                           const HfStagesOptions& options) {
  ASSIGN_OR_RETURN(const std::string model_type, ModelType(options.hf_dir));
  absl::StatusOr<HfStagesResult> result;
  if (model_type == "gpt2") {
    integration::GptModuleOptions model;
    ASSIGN_OR_RETURN(model.model, checkpoint::ReadHfGpt2Config(options.hf_dir));
    SetTraining(options, model.model.block_size, &model);
    ASSIGN_OR_RETURN(std::unique_ptr<integration::GptTrainModule> module,
                     integration::GptTrainModule::Create(model));
    nn::Gpt& gpt = *module->gpt();
    result = RunStages(
        group, options, *module, integration::GptTrainModule::kBlockType,
        [&](fsdp::WrapperRegistry* r) { return checkpoint::LoadHfGpt2(options.hf_dir, gpt, r); },
        [&] { return checkpoint::ExportHfGpt2(gpt, options.out_dir); });
  } else if (model_type == "llama") {
    integration::LlamaModuleOptions model;
    ASSIGN_OR_RETURN(model.model, checkpoint::ReadHfLlamaConfig(options.hf_dir));
    SetTraining(options, model.model.max_position_embeddings, &model);
    ASSIGN_OR_RETURN(std::unique_ptr<integration::LlamaTrainModule> module,
                     integration::LlamaTrainModule::Create(model));
    nn::Llama& llama = *module->llama();
    result = RunStages(
        group, options, *module, integration::LlamaTrainModule::kBlockType,
        [&](fsdp::WrapperRegistry* r) { return checkpoint::LoadHfLlama(options.hf_dir, llama, r); },
        [&] { return checkpoint::ExportHfLlama(llama, options.out_dir); });
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(options.hf_dir, "/config.json: model_type \"", model_type,
                     "\": this example trains gpt2 and llama"));
  }
  if (result.ok()) result->model_type = model_type;
  return result;
}

}  // namespace examples
