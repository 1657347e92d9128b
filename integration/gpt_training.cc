#include "integration/gpt_training.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status_macros.h"
#include "nn/losses.h"

namespace integration {
namespace {

absl::Status Validate(const GptTrainingOptions& o) {
  auto bad = [](const std::string& option, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("GptTrainingOptions.", option, " ", why));
  };
  if (o.steps <= 0) return bad("steps", absl::StrCat("must be > 0, got ", o.steps));
  if (o.batch_size <= 0) return bad("batch_size", absl::StrCat("must be > 0, got ", o.batch_size));
  if (o.seq_len <= 0 || o.seq_len > o.model.block_size) {
    return bad("seq_len", absl::StrCat("must be in [1, model.block_size = ", o.model.block_size,
                                       "], got ", o.seq_len));
  }
  if (o.warmup_steps < 0) return bad("warmup_steps", "must be >= 0");
  if (o.log_every < 0) return bad("log_every", "must be >= 0");
  if (o.eval_batches <= 0) return bad("eval_batches", "must be > 0");
  return absl::OkStatus();
}

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

std::string FormatProgress(const TrainingProgress& p) {
  return absl::StrFormat("step %5d/%d  loss %.4f  tokens/s %8.0f  peak %s", p.step, p.steps,
                         p.loss, p.tokens_per_second, p.memory.PeakSummary());
}

absl::StatusOr<double> EvaluateGpt(nn::Gpt& model, const data::MarkovLanguage& language,
                                   int64_t first_index, int num_batches, int batch_size,
                                   int seq_len) {
  double total = 0;
  for (int i = 0; i < num_batches; ++i) {
    ASSIGN_OR_RETURN(data::TokenBatch batch, language.Batch(first_index + i, batch_size, seq_len));
    ASSIGN_OR_RETURN(core::Tensor logits, model.Forward(batch.inputs));
    ASSIGN_OR_RETURN(nn::LossResult loss, nn::CrossEntropyLoss(logits, batch.targets));
    total += loss.loss;
  }
  return total / num_batches;
}

absl::StatusOr<GptTrainingResult> TrainGpt(
    const GptTrainingOptions& options,
    const std::function<void(const TrainingProgress&)>& on_progress) {
  RETURN_IF_ERROR(Validate(options));
  // The same module the StageRunner trains, stepped here in one process with no FSDP.
  GptModuleOptions module_options;
  module_options.model = options.model;
  module_options.language = options.language;
  module_options.seq_len = options.seq_len;
  module_options.adamw = options.adamw;
  module_options.warmup_steps = options.warmup_steps;
  ASSIGN_OR_RETURN(std::unique_ptr<GptTrainModule> module, GptTrainModule::Create(module_options));
  const data::MarkovLanguage& language = module->language();

  std::shared_ptr<core::Allocator> cpu = core::Allocator::Current(core::Device::Cpu());
  cpu->ResetPeaks();

  GptTrainingResult result;
  result.model = module->gpt();
  nn::Gpt& model = *result.model;
  ASSIGN_OR_RETURN(std::unique_ptr<optim::Optimizer> adamw,
                   module->ConfigureOptimizer(model.NamedParameters()));

  const int64_t tokens_per_step = int64_t{options.batch_size} * options.seq_len;
  auto start = std::chrono::steady_clock::now();
  auto last_report = start;
  int64_t last_report_step = 0;
  for (int64_t step = 0; step < options.steps; ++step) {
    adamw->set_lr(*module->LearningRate(step));
    adamw->ZeroGrad();
    StepContext ctx;
    ctx.stage = Stage::kFit;
    ctx.step = step;
    ctx.batch_size = options.batch_size;
    ASSIGN_OR_RETURN(StepOutput out, module->TrainingStep(ctx));
    RETURN_IF_ERROR(adamw->Step());
    const float loss = static_cast<float>(out.loss);
    if (!std::isfinite(loss)) {
      return absl::InternalError(absl::StrCat("training diverged: loss is ", loss,
                                              " at step ", step + 1, " (lower --lr)"));
    }
    result.losses.push_back(loss);

    const int64_t done = step + 1;
    if (on_progress && ((options.log_every > 0 && done % options.log_every == 0) ||
                        done == options.steps)) {
      auto now = std::chrono::steady_clock::now();
      TrainingProgress p;
      p.step = done;
      p.steps = options.steps;
      p.loss = loss;
      p.tokens_per_second = (done - last_report_step) * tokens_per_step /
                            std::max(1e-9, Seconds(last_report, now));
      p.memory = cpu->Stats();
      on_progress(p);
      last_report = now;
      last_report_step = done;
    }
  }
  const double train_seconds = Seconds(start, std::chrono::steady_clock::now());
  result.tokens_per_second = options.steps * tokens_per_step / std::max(1e-9, train_seconds);

  const int64_t tail = std::min<int64_t>(10, options.steps);
  double sum = 0;
  for (int64_t i = options.steps - tail; i < options.steps; ++i) sum += result.losses[i];
  result.final_train_loss = static_cast<float>(sum / tail);
  ASSIGN_OR_RETURN(result.eval_loss,
                   EvaluateGpt(model, language, kEvalBatchOffset, options.eval_batches,
                               options.batch_size, options.seq_len));
  result.entropy_floor = language.LossFloor(options.seq_len);
  result.log_vocab = std::log(static_cast<double>(options.model.vocab_size));
  result.memory = cpu->Stats();
  return result;
}

}  // namespace integration
