// step_roofline: the roofline estimate, on an H200 (or an H100), of one training step of a
// GPT (or a Llama) as this library runs it on a GPU, from the op list the same step records
// here (NOTE [Op accounting] in core/op_profile.h), without a GPU.
//
//   bazel run -c opt //bench:step_roofline                       # GPT-2 124M, batch 16, bf16
//   bazel run -c opt //bench:step_roofline -- --param_dtype=float32 --n_layer=2
//   bazel run -c opt //bench:step_roofline -- --model=llama      # GPT-2 small's widths,
//                                                                # 4 kv heads, SwiGLU 2048
//   bazel run -c opt //bench:step_roofline -- --device=H100 --dump_ops=/tmp/ops.json
//
// It trains the model on one rank (FullyShard over a one-rank gloo group, the main job's
// policy: each TransformerBlock or LlamaDecoderLayer a unit) through StageRunner::Fit, one
// step to wrap and warm
// up, then records one step at 1 and at 2 sequences, extrapolates the op list to --batch
// sequences (core::ExtrapolateBatch) and estimates each op on the --device's rates
// (core::RatesForDevice). Prints the tables of the estimate on the calibrated set (NOTE
// [Rate sets] in core/roofline.h) per op category, op kind and GEMM shape, then the
// datasheet, attained and calibrated estimates side by side per category with the step's
// time, tokens/s and MFU (model FLOPs 6 N + 12 L T C per token, as nanoGPT and
// tools/gpu_bundle/run.sh count them), and, last, one JSON line: the calibrated estimate
// (each category's ops, launches, FLOPs, bytes and time, the step's, the rates) and
// "rate_sets", the three side by side. --dump_ops writes the op list (OpRecordsJson).
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
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
ABSL_FLAG(std::string, device, "H200",
          "the GPU to estimate on, by name: H200 or H100 (SXM; core::RatesForDevice)");
ABSL_FLAG(std::string, dump_ops, "",
          "if set, write the step's op list there as JSON (integration::OpRecordsJson)");
ABSL_FLAG(std::string, ops, "",
          "if set, estimate this op list (OpRecordsJson, or an object with \"records\": "
          "bench/testdata/run9_ops.json) instead of recording a step; the model flags "
          "describe its model");

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

// `path` as the user meant it: under `bazel run` a relative path is taken from the
// directory bazel was run in (BUILD_WORKING_DIRECTORY), not from the runfiles.
std::string UsersPath(const std::string& path) {
  const char* dir = std::getenv("BUILD_WORKING_DIRECTORY");
  if (path.empty() || path[0] == '/' || dir == nullptr || *dir == '\0') return path;
  return absl::StrCat(dir, "/", path);
}

// The op list --ops names, and the parameters of the model the flags describe.
absl::StatusOr<std::vector<core::OpRecord>> LoadStep(const std::string& path, int64_t* parameters) {
  std::string block_type;
  ASSIGN_OR_RETURN(std::unique_ptr<integration::DecoderTrainModule> module,
                   CreateModule(&block_type));
  *parameters = module->model()->NumParameterElements();
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  const nlohmann::json data = nlohmann::json::parse(text.str(), nullptr, false);
  if (!file || data.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrFormat("--ops=%s: not a readable JSON file", path));
  }
  absl::StatusOr<std::vector<core::OpRecord>> records = integration::OpRecordsFromJson(
      data.is_object() && data.contains("records") ? data["records"] : data);
  if (!records.ok()) return core::Annotate(records.status(), absl::StrCat("--ops=", path));
  return records;
}

nlohmann::json Run() {
  nlohmann::json out;
  int64_t parameters = 0;
  const int64_t batch = absl::GetFlag(FLAGS_batch);
  absl::StatusOr<std::vector<core::OpRecord>> step;
  if (!absl::GetFlag(FLAGS_ops).empty()) {
    step = LoadStep(UsersPath(absl::GetFlag(FLAGS_ops)), &parameters);
  } else {
    absl::StatusOr<std::vector<core::OpRecord>> one = RecordStep(1, &parameters);
    absl::StatusOr<std::vector<core::OpRecord>> two =
        one.ok() ? RecordStep(2, &parameters) : one.status();
    step = two.ok() ? core::ExtrapolateBatch(*one, *two, batch) : two.status();
  }
  if (!step.ok()) {
    out["error"] = step.status().ToString();
    return out;
  }
  const int64_t T = absl::GetFlag(FLAGS_seq_len);
  const double tokens = static_cast<double>(batch) * T;
  const double flops_per_token = integration::GptFlopsPerToken(
      parameters, absl::GetFlag(FLAGS_n_layer), T, absl::GetFlag(FLAGS_n_embd));
  const std::string device = absl::GetFlag(FLAGS_device);
  std::vector<integration::RateSetColumn> sets;
  for (int i = 0; i < core::kNumRateSets; ++i) {
    const core::RateSet set = static_cast<core::RateSet>(i);
    std::optional<core::DeviceRates> rates = core::RatesForDevice(device, set);
    if (!rates.has_value()) {
      out["error"] = absl::StrFormat(
          "--device=%s: core/roofline.h has rates for H200 and H100 (SXM) only", device);
      return out;
    }
    sets.push_back({core::RateSetName(set), *rates});
  }
  if (const std::string path = absl::GetFlag(FLAGS_dump_ops); !path.empty()) {
    std::ofstream file(UsersPath(path));
    file << integration::OpRecordsJson(*step).dump(1) << "\n";
    if (!file) {
      out["error"] = absl::StrFormat("--dump_ops=%s: cannot write it", path);
      return out;
    }
  }
  const double model_flops = flops_per_token * tokens;
  const integration::OpProfileReport report =
      integration::ReportOpProfile(*step, sets.back().rates, model_flops, tokens);
  for (const std::string& line : report.lines) std::printf("%s\n", line.c_str());
  const integration::OpProfileReport compared =
      integration::CompareRateSets(*step, sets, model_flops, tokens);
  std::printf("\n");
  for (const std::string& line : compared.lines) std::printf("%s\n", line.c_str());
  out = report.json;
  out["rate_sets"] = compared.json["sets"];
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
