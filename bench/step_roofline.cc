// step_roofline: the roofline estimate, on an H200, of one training step of a GPT as this
// library runs it on a GPU, from the op list the same step records here (NOTE [Op
// accounting] in core/op_profile.h), without a GPU.
//
//   bazel run -c opt //bench:step_roofline                       # GPT-2 124M, batch 16, bf16
//   bazel run -c opt //bench:step_roofline -- --param_dtype=float32 --n_layer=2
//
// It trains the model on one rank (FullyShard over a one-rank gloo group, the main job's
// policy: each TransformerBlock a unit) through StageRunner::Fit, one step to wrap and warm
// up, then records one step at 1 and at 2 sequences, extrapolates the op list to --batch
// sequences (core::ExtrapolateBatch) and estimates each op on core::H200Rates(). Prints a
// table per op category and, last, one JSON line: each category's ops, launches, FLOPs,
// bytes and estimated time, the step's estimated time, tokens/s and MFU (model FLOPs
// 6 N + 12 L T C per token, as nanoGPT and tools/gpu_bundle/run.sh count them), and the
// rates the estimate used.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
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
#include "integration/gpt_module.h"
#include "integration/stage_runner.h"
#include "nlohmann/json.hpp"
#include "policy/wrap_policy.h"

ABSL_FLAG(int64_t, vocab_size, 50304, "GPT vocabulary");
ABSL_FLAG(int, seq_len, 1024, "tokens per sequence (the model's block size)");
ABSL_FLAG(int64_t, n_embd, 768, "embedding width");
ABSL_FLAG(int64_t, n_layer, 12, "transformer blocks");
ABSL_FLAG(int64_t, n_head, 12, "attention heads");
ABSL_FLAG(int64_t, batch, 16, "sequences per step in the estimate");
ABSL_FLAG(std::string, param_dtype, "bfloat16", "float32 or bfloat16 (FSDP mixed precision)");

namespace {

// The op list of one training step at `rows` sequences, after a first step that wraps.
absl::StatusOr<std::vector<core::OpRecord>> RecordStep(int rows, int64_t* parameters) {
  integration::GptModuleOptions options;
  options.model.vocab_size = absl::GetFlag(FLAGS_vocab_size);
  options.model.block_size = absl::GetFlag(FLAGS_seq_len);
  options.model.n_embd = absl::GetFlag(FLAGS_n_embd);
  options.model.n_layer = absl::GetFlag(FLAGS_n_layer);
  options.model.n_head = absl::GetFlag(FLAGS_n_head);
  options.seq_len = absl::GetFlag(FLAGS_seq_len);
  ASSIGN_OR_RETURN(std::unique_ptr<integration::GptTrainModule> module,
                   integration::GptTrainModule::Create(options));
  *parameters = module->model()->NumParameterElements();

  auto store = std::make_shared<comm::HashStore>();
  ASSIGN_OR_RETURN(std::shared_ptr<comm::GlooProcessGroup> group,
                   comm::GlooProcessGroup::Create(store, 0, 1, comm::GlooOptions()));
  integration::StageOptions stage;
  stage.wrap.policy = policy::ModuleTypes({"TransformerBlock"});
  ASSIGN_OR_RETURN(stage.wrap.mixed_precision.param_dtype,
                   core::ParseDType(absl::GetFlag(FLAGS_param_dtype)));
  stage.train_batch_size = rows;
  stage.fit_steps = 1;
  stage.log_every = 0;
  ASSIGN_OR_RETURN(std::unique_ptr<integration::StageRunner> runner,
                   integration::StageRunner::Create(group, stage));
  RETURN_IF_ERROR(runner->Fit(*module).status());  // wraps, builds the optimizer state
  core::OpProfile profile;
  {
    core::ScopedOpProfile on(&profile);
    RETURN_IF_ERROR(runner->Fit(*module).status());
  }
  return profile.records();
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
  const core::DeviceRates rates = core::H200Rates();
  const core::RooflineEstimate e = core::EstimateRoofline(*step, rates);
  const std::vector<core::OpCategoryTotal> totals = core::OpProfile::TotalsOf(*step);

  const int64_t T = absl::GetFlag(FLAGS_seq_len);
  const double tokens = static_cast<double>(batch) * T;
  const double flops_per_token = 6.0 * parameters + 12.0 * absl::GetFlag(FLAGS_n_layer) * T *
                                                        absl::GetFlag(FLAGS_n_embd);
  const double step_s = e.total_ms * 1e-3;
  const double mfu = flops_per_token * tokens / step_s / (rates.peak_bf16_tflops * 1e12);

  std::printf("%-18s %6s %8s %12s %12s %10s %10s %10s\n", "category", "ops", "launches",
              "GFLOP", "GB", "est_ms", "compute_ms", "memory_ms");
  nlohmann::json categories = nlohmann::json::array();
  for (int i = 0; i < core::kNumOpCategories; ++i) {
    const core::OpCategoryTotal& t = totals[i];
    const core::RooflineCategory& c = e.categories[i];
    if (t.ops == 0) continue;
    std::printf("%-18s %6lld %8lld %12.1f %12.3f %10.3f %10.3f %10.3f\n",
                core::OpCategoryName(t.category), static_cast<long long>(t.ops),
                static_cast<long long>(t.launches), t.flops * 1e-9, t.bytes * 1e-9, c.ms,
                c.compute_ms, c.memory_ms);
    categories.push_back({{"category", core::OpCategoryName(t.category)},
                          {"ops", t.ops},
                          {"launches", t.launches},
                          {"flops", t.flops},
                          {"bytes", t.bytes},
                          {"estimated_ms", c.ms},
                          {"compute_ms", c.compute_ms},
                          {"memory_ms", c.memory_ms},
                          {"launch_ms", c.launch_ms}});
  }
  // The same per op kind (category and name), largest first: where the time goes.
  std::map<std::pair<std::string, std::string>, std::pair<int64_t, double>> kinds;
  for (const core::OpRecord& r : *step) {
    auto& k = kinds[{core::OpCategoryName(r.category), r.name}];
    ++k.first;
    k.second += core::EstimateOp(r, rates).ms;
  }
  std::vector<std::pair<double, std::pair<std::string, std::string>>> order;
  for (const auto& [key, v] : kinds) order.push_back({v.second, key});
  std::sort(order.rbegin(), order.rend());
  nlohmann::json ops = nlohmann::json::array();
  std::printf("\n%-18s %-30s %6s %10s\n", "category", "op", "count", "est_ms");
  for (const auto& [ms, key] : order) {
    std::printf("%-18s %-30s %6lld %10.3f\n", key.first.c_str(), key.second.c_str(),
                static_cast<long long>(kinds[key].first), ms);
    ops.push_back({{"category", key.first}, {"op", key.second}, {"count", kinds[key].first},
                   {"estimated_ms", ms}});
  }
  std::printf("step: %.2f ms estimated, %lld launches, %lld host syncs, %.0f tokens/s, MFU %.1f%%\n",
              e.total_ms, static_cast<long long>(e.launches),
              static_cast<long long>(e.host_syncs), tokens / step_s, 100.0 * mfu);

  out["model"] = {{"vocab_size", absl::GetFlag(FLAGS_vocab_size)},
                  {"seq_len", T},
                  {"n_embd", absl::GetFlag(FLAGS_n_embd)},
                  {"n_layer", absl::GetFlag(FLAGS_n_layer)},
                  {"n_head", absl::GetFlag(FLAGS_n_head)},
                  {"parameters", parameters}};
  out["batch"] = batch;
  out["param_dtype"] = absl::GetFlag(FLAGS_param_dtype);
  out["categories"] = categories;
  out["ops"] = ops;
  out["estimated_step_ms"] = e.total_ms;
  out["launches"] = e.launches;
  out["host_syncs"] = e.host_syncs;
  out["estimated_tokens_per_s"] = tokens / step_s;
  out["model_flops_per_token"] = flops_per_token;
  out["estimated_mfu"] = mfu;
  out["rates"] = {{"device", rates.name},
                  {"peak_bf16_tflops", rates.peak_bf16_tflops},
                  {"bf16_gemm_tflops", rates.bf16_gemm_tflops},
                  {"fp32_simt_tflops", rates.fp32_simt_tflops},
                  {"memory_gbps", rates.memory_gbps},
                  {"collective_gbps", rates.collective_gbps},
                  {"launch_us", rates.launch_us},
                  {"host_sync_us", rates.host_sync_us}};
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const nlohmann::json out = Run();
  std::printf("%s\n", out.dump().c_str());
  return out.contains("error") ? 1 : 0;
}
