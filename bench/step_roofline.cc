// step_roofline: the roofline estimate, on an H200, of one training step of a GPT (or a
// Llama) as this library runs it on a GPU, from the op list the same step records here
// (NOTE [Op accounting] in core/op_profile.h), without a GPU.
//
//   bazel run -c opt //bench:step_roofline                       # GPT-2 124M, batch 16, bf16
//   bazel run -c opt //bench:step_roofline -- --param_dtype=float32 --n_layer=2
//   bazel run -c opt //bench:step_roofline -- --model=llama      # GPT-2 small's widths,
//                                                                # 4 kv heads, SwiGLU 2048
//
// It trains the model on one rank (FullyShard over a one-rank gloo group, the main job's
// policy: each TransformerBlock or LlamaDecoderLayer a unit) through StageRunner::Fit, one
// step to wrap and warm
// up, then records one step at 1 and at 2 sequences, extrapolates the op list to --batch
// sequences (core::ExtrapolateBatch) and estimates each op on core::H200Rates(). Prints a
// table per op category and, last, one JSON line: each category's ops, launches, FLOPs,
// bytes and estimated time, the step's estimated time, tokens/s and MFU (model FLOPs
// 6 N + 12 L T C per token, as nanoGPT and tools/gpu_bundle/run.sh count them), and the
// rates the estimate used.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "comm/gloo_process_group.h"
#include "comm/hash_store.h"
#include "core/dtype.h"
#include "core/op_profile.h"
#include "core/roofline.h"
#include "core/status_macros.h"
#include "integration/device_setup.h"
#include "integration/gpt_module.h"
#include "integration/llama_module.h"
#include "integration/op_profile_report.h"
#include "integration/stage_runner.h"
#include "nlohmann/json.hpp"
#include "policy/wrap_policy.h"

ABSL_FLAG(std::string, model, "gpt", "gpt or llama (nn::Gpt or nn::Llama, untied)");
ABSL_FLAG(int64_t, vocab_size, 50304, "vocabulary");
ABSL_FLAG(int, seq_len, 1024, "tokens per sequence (the model's block size)");
ABSL_FLAG(int64_t, n_embd, 768, "embedding width");
ABSL_FLAG(int64_t, n_layer, 12, "transformer blocks");
ABSL_FLAG(int64_t, n_head, 12, "attention heads");
ABSL_FLAG(int64_t, n_kv_head, 4, "Llama: key-value heads");
ABSL_FLAG(int64_t, intermediate_size, 2048, "Llama: the SwiGLU MLP's width");
ABSL_FLAG(int64_t, batch, 16, "sequences per step in the estimate");
ABSL_FLAG(std::string, param_dtype, "bfloat16", "float32 or bfloat16 (FSDP mixed precision)");

namespace {

// The model --model names, with the flags' sizes.
absl::StatusOr<std::unique_ptr<integration::DecoderTrainModule>> CreateModule(
    std::string* block_type) {
  const std::string model = absl::GetFlag(FLAGS_model);
  const int seq_len = absl::GetFlag(FLAGS_seq_len);
  if (model == "gpt") {
    integration::GptModuleOptions options;
    options.model.vocab_size = absl::GetFlag(FLAGS_vocab_size);
    options.model.block_size = seq_len;
    options.model.n_embd = absl::GetFlag(FLAGS_n_embd);
    options.model.n_layer = absl::GetFlag(FLAGS_n_layer);
    options.model.n_head = absl::GetFlag(FLAGS_n_head);
    options.seq_len = seq_len;
    *block_type = integration::GptTrainModule::kBlockType;
    return integration::GptTrainModule::Create(options);
  }
  if (model == "llama") {
    integration::LlamaModuleOptions options;
    options.model.vocab_size = absl::GetFlag(FLAGS_vocab_size);
    options.model.max_position_embeddings = seq_len;
    options.model.hidden_size = absl::GetFlag(FLAGS_n_embd);
    options.model.num_hidden_layers = absl::GetFlag(FLAGS_n_layer);
    options.model.num_attention_heads = absl::GetFlag(FLAGS_n_head);
    options.model.num_key_value_heads = absl::GetFlag(FLAGS_n_kv_head);
    options.model.intermediate_size = absl::GetFlag(FLAGS_intermediate_size);
    options.seq_len = seq_len;
    *block_type = integration::LlamaTrainModule::kBlockType;
    return integration::LlamaTrainModule::Create(options);
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("--model must be gpt or llama, not \"%s\"", model));
}

// The op list of one training step at `rows` sequences, after a first step that wraps.
absl::StatusOr<std::vector<core::OpRecord>> RecordStep(int rows, int64_t* parameters) {
  std::string block_type;
  ASSIGN_OR_RETURN(std::unique_ptr<integration::DecoderTrainModule> module,
                   CreateModule(&block_type));
  *parameters = module->model()->NumParameterElements();

  auto store = std::make_shared<comm::HashStore>();
  ASSIGN_OR_RETURN(std::shared_ptr<comm::GlooProcessGroup> group,
                   comm::GlooProcessGroup::Create(store, 0, 1, comm::GlooOptions()));
  integration::StageOptions stage;
  stage.wrap.policy = policy::ModuleTypes({block_type});
  ASSIGN_OR_RETURN(stage.wrap.mixed_precision.param_dtype,
                   core::ParseDType(absl::GetFlag(FLAGS_param_dtype)));
  stage.train_batch_size = rows;
  // Step 0 wraps and builds the optimizer state; step 1 is recorded.
  stage.fit_steps = 2;
  stage.log_every = 0;
  stage.profile_step = 1;
  ASSIGN_OR_RETURN(std::unique_ptr<integration::StageRunner> runner,
                   integration::StageRunner::Create(group, stage));
  ASSIGN_OR_RETURN(integration::FitResult fit, runner->Fit(*module));
  return fit.profiled_ops;
}

nlohmann::json Run() {
  nlohmann::json out;
  int64_t parameters = 0;
  absl::StatusOr<std::vector<core::OpRecord>> one = RecordStep(1, &parameters);
  absl::StatusOr<std::vector<core::OpRecord>> two =
      one.ok() ? RecordStep(2, &parameters) : one.status();
  const int64_t batch = absl::GetFlag(FLAGS_batch);
  absl::StatusOr<std::vector<core::OpRecord>> step =
      two.ok() ? core::ExtrapolateBatch(*one, *two, batch) : two.status();
  if (!step.ok()) {
    out["error"] = step.status().ToString();
    return out;
  }
  const int64_t T = absl::GetFlag(FLAGS_seq_len);
  const double tokens = static_cast<double>(batch) * T;
  const double flops_per_token = integration::GptFlopsPerToken(
      parameters, absl::GetFlag(FLAGS_n_layer), T, absl::GetFlag(FLAGS_n_embd));
  const integration::OpProfileReport report =
      integration::ReportOpProfile(*step, core::H200Rates(), flops_per_token * tokens, tokens);
  for (const std::string& line : report.lines) std::printf("%s\n", line.c_str());
  out = report.json;
  out["model"] = {{"kind", absl::GetFlag(FLAGS_model)},
                  {"vocab_size", absl::GetFlag(FLAGS_vocab_size)},
                  {"seq_len", T},
                  {"n_embd", absl::GetFlag(FLAGS_n_embd)},
                  {"n_layer", absl::GetFlag(FLAGS_n_layer)},
                  {"n_head", absl::GetFlag(FLAGS_n_head)},
                  {"parameters", parameters}};
  if (absl::GetFlag(FLAGS_model) == "llama") {
    out["model"]["n_kv_head"] = absl::GetFlag(FLAGS_n_kv_head);
    out["model"]["intermediate_size"] = absl::GetFlag(FLAGS_intermediate_size);
  }
  out["batch"] = batch;
  out["param_dtype"] = absl::GetFlag(FLAGS_param_dtype);
  out["model_flops_per_token"] = flops_per_token;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const nlohmann::json out = Run();
  std::printf("%s\n", out.dump().c_str());
  return out.contains("error") ? 1 : 0;
}
