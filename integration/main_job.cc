// The main job (README: `make demo`): trains a GPT on the synthetic Markov language over
// N ranks with FSDP, tests it in the same run through the shared wrapper registry (and
// prints what the registry reused), saves a sharded checkpoint, releases the model,
// exports it as safetensors and tests the plain module, then prints a summary table,
// writes SVG charts, and ends with one JSON line of the figures.
//
//   bazel run //integration:main_job                          # 2 local CPU ranks
//   bazel run //integration:main_job -- --world_size=4 --strategy=SHARD_GRAD_OP
//   bazel run //integration:main_job -- --stages=test --resume_from=out/main_job/checkpoint
//
// Run without RANK in the environment, it starts --world_size copies of itself through
// the local launcher (comm/launcher.h) and, once they succeed, prints the summary rank 0
// left in --output_dir. Run by a launcher that sets RANK, WORLD_SIZE, MASTER_ADDR and
// MASTER_PORT (ours, torchrun-style cluster launchers, several machines), it is one
// rank of that job and rank 0 prints the summary itself.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "checkpoint/safetensors.h"
#include "comm/agreement.h"
#include "comm/failure.h"
#include "comm/init_from_env.h"
#include "comm/launcher.h"
#include "core/allocator.h"
#include "core/cuda_device.h"
#include "core/timeout.h"
#include "core/status_macros.h"
#include "fsdp/runtime.h"
#include "fsdp/unit.h"
#include "integration/charts/svg_chart.h"
#include "integration/device_setup.h"
#include "integration/gpt_module.h"
#include "integration/memory_estimate.h"
#include "integration/stage_options.h"
#include "integration/stage_runner.h"
#include "nlohmann/json.hpp"
#include "nn/ops.h"
#include "policy/plan.h"
#include "policy/wrap_policy.h"

ABSL_FLAG(int, world_size, 2, "ranks to start on this machine (ignored under a launcher)");
ABSL_FLAG(std::string, backend, "auto",
          "collective backend: gloo, nccl, shm or auto (nccl on --device=cuda, gloo on the "
          "CPU; shm: shared memory between CPU ranks on one host)");
ABSL_FLAG(std::string, device, "cpu",
          "where the model computes: cpu, or cuda (rank r uses cuda:LOCAL_RANK; needs a "
          "--config=cuda build and --backend=nccl or auto)");
ABSL_FLAG(std::string, stages, "fit,test",
          "comma-separated stages to run in order: fit, validate, test, predict");
ABSL_FLAG(std::string, resume_from, "",
          "checkpoint directory to load first (any world size); with fit in --stages the "
          "optimizer state and step are restored and training continues");
ABSL_FLAG(std::string, output_dir, "",
          "where the checkpoint, safetensors file, charts and summary go (default: out/main_job "
          "in the workspace under bazel run, else ./out/main_job)");
ABSL_FLAG(std::string, checkpoint_dir, "", "where fit saves its checkpoint (default <output_dir>/checkpoint)");
ABSL_FLAG(std::string, safetensors_path, "",
          "where the released model goes (default <output_dir>/model.safetensors)");
ABSL_FLAG(bool, release, true,
          "release the model at the end, export it as safetensors and test the plain module");
ABSL_FLAG(std::string, stage_config, "",
          "text-format StageConfig file (integration/stage.proto); its set fields override the flags");
ABSL_FLAG(std::string, strategy, "FULL_SHARD", "FULL_SHARD, SHARD_GRAD_OP, NO_SHARD or HYBRID_SHARD");
ABSL_FLAG(int, hybrid_shard_size, 0, "HYBRID_SHARD: ranks per shard group");
ABSL_FLAG(bool, forward_prefetch, false,
          "issue the next unit's all-gather when a unit's forward starts (FSDP's "
          "forward_prefetch; its backward_prefetch is always on)");
ABSL_FLAG(std::string, param_dtype, "float32", "mixed precision compute copy: float32 or bfloat16");
ABSL_FLAG(int64_t, steps, 300, "training steps");
ABSL_FLAG(int, batch_size, 16, "sequences per global training batch (a multiple of the world size)");
ABSL_FLAG(int, eval_batch_size, 16, "sequences per global evaluation batch");
ABSL_FLAG(int, eval_batches, 8, "batches of each validate / test / predict stage");
ABSL_FLAG(int, seq_len, 32, "tokens per sequence (at most --block_size)");
ABSL_FLAG(int64_t, vocab_size, 64, "vocabulary of the language and the model");
ABSL_FLAG(int64_t, block_size, 32, "model context length");
ABSL_FLAG(int64_t, n_embd, 64, "model width");
ABSL_FLAG(int64_t, n_layer, 2, "transformer blocks (one FSDP unit each)");
ABSL_FLAG(int64_t, n_head, 4, "attention heads");
ABSL_FLAG(int, order, 1, "Markov order of the language");
ABSL_FLAG(double, lr, 1e-2, "AdamW peak learning rate");
ABSL_FLAG(double, weight_decay, 0.0, "AdamW decoupled weight decay");
ABSL_FLAG(int64_t, warmup_steps, 20, "linear learning-rate warm-up steps");
ABSL_FLAG(uint64_t, seed, 0, "seed of the model initialisation and of the language");
ABSL_FLAG(int, intra_op_threads, 0,
          "threads each rank's GEMMs and OpenMP loops use (nn::SetIntraOpThreads); 0 = auto: "
          "OMP_NUM_THREADS when set, else max(1, hardware threads / ranks on this host)");
ABSL_FLAG(int64_t, log_every, 25, "progress line every this many steps");
ABSL_FLAG(double, timeout_s, 300,
          "deadline in seconds of every collective and of joining the job, in [0.001, 604800] "
          "(core/timeout.h: there is no \"no timeout\")");
ABSL_FLAG(std::string, testonly_fault, "",
          "test hook, <kill|stop|exit|error>@<rank>:<step>: at that training step (1-based, "
          "counted in this run) that rank SIGKILLs itself, SIGSTOPs itself, exits with code 3 "
          "without a word, or fails the step with an error");
ABSL_FLAG(int, testonly_failure_print_delay_ms, 0,
          "test hook: a rank whose own error is the root cause waits this long after "
          "recording it (FSDP_ERROR_FILE) before printing it and exiting");

namespace {

constexpr char kLaunchedByParent[] = "FSDP_MAIN_JOB_PARENT";
constexpr char kSummaryFile[] = "summary.json";

std::string DefaultOutputDir() {
  const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  return workspace != nullptr ? absl::StrCat(workspace, "/out/main_job") : "out/main_job";
}

// Relative paths in flags are relative to the directory `bazel run` was started in (the
// workspace), not to the binary's runfiles directory.
std::string Resolve(const std::string& path) {
  const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  if (path.empty() || path[0] == '/' || workspace == nullptr) return path;
  return absl::StrCat(workspace, "/", path);
}

std::string OutputDir() {
  const std::string flag = absl::GetFlag(FLAGS_output_dir);
  return flag.empty() ? DefaultOutputDir() : Resolve(flag);
}

absl::Status MakeDirs(const std::string& path) {
  std::error_code error;
  std::filesystem::create_directories(path, error);
  if (error) {
    return absl::PermissionDeniedError(
        absl::StrCat("--output_dir: cannot create '", path, "': ", error.message()));
  }
  return absl::OkStatus();
}

nlohmann::json MemoryJson(const integration::RankMemory& m) {
  nlohmann::json j;
  for (int t = 0; t < core::kNumMemoryTags; ++t) {
    j[core::MemoryTagName(static_cast<core::MemoryTag>(t))] = m.peak_by_tag[t];
  }
  j["total"] = m.peak_total;
  return j;
}

// Peaks over several stages, rank by rank.
void MaxInto(const std::vector<integration::RankMemory>& stage,
             std::vector<integration::RankMemory>* run) {
  if (run->size() < stage.size()) run->resize(stage.size());
  for (size_t r = 0; r < stage.size(); ++r) {
    for (int t = 0; t < core::kNumMemoryTags; ++t) {
      (*run)[r].peak_by_tag[t] = std::max((*run)[r].peak_by_tag[t], stage[r].peak_by_tag[t]);
    }
    (*run)[r].peak_total = std::max((*run)[r].peak_total, stage[r].peak_total);
  }
}

std::string WrapLine(const integration::WrapReport& w) {
  if (w.skipped) return "not wrapped";
  if (w.reused) {
    return absl::StrFormat("reused the existing wrap: units reused %d of %d, parameter bytes "
                           "copied on re-wrap %d",
                           w.units_reused, w.units, w.param_bytes_copied);
  }
  return absl::StrFormat("wrapped fresh: %d units (%d kept from earlier wraps), %s of "
                         "parameters copied into shards",
                         w.units, w.units_reused, core::FormatBytes(w.param_bytes_copied));
}

// The summary table, from the summary JSON (so the launching parent prints the same one).
std::string SummaryTable(const nlohmann::json& s) {
  std::ostringstream out;
  auto row = [&](const std::string& name, const std::string& value) {
    out << absl::StrFormat("  %-34s %s\n", name, value);
  };
  auto number = [&](const char* key, const char* format) -> std::string {
    if (!s.contains(key) || s[key].is_null()) return "-";
    return absl::StrFormat(format, s[key].get<double>());
  };
  out << "\nsummary\n";
  row("world size / backend / strategy",
      absl::StrCat(s["world_size"].get<int>(), " / ", s["backend"].get<std::string>(), " / ",
                   s["strategy"].get<std::string>()));
  if (s.contains("intra_op_threads")) {
    row("intra-op threads per rank / GEMM",
        absl::StrCat(s["intra_op_threads"].get<int>(), " / ", s["gemm_library"].get<std::string>()));
  }
  row("model parameters", absl::StrCat(s["model_parameters"].get<int64_t>()));
  row("stages", s["stages"].get<std::string>());
  row("global steps", absl::StrCat(s["global_step"].get<int64_t>()));
  row("final train loss", number("final_train_loss", "%.4f"));
  row("test loss (wrapped)", number("test_loss", "%.4f"));
  row("test loss (released plain module)", number("released_test_loss", "%.4f"));
  row("entropy floor", number("entropy_floor", "%.4f"));
  row("test loss over floor", number("test_loss_over_floor", "%.4f"));
  row("units reused by the test stage", absl::StrCat(s["units_reused"].get<int>()));
  row("param bytes copied on re-wrap", absl::StrCat(s["param_bytes_copied_on_rewrap"].get<int64_t>()));
  row("fresh wraps (registry)", absl::StrCat(s["fresh_wraps"].get<int64_t>()));
  row("tokens/s (fit, all ranks)", number("tokens_per_second", "%.0f"));
  if (s.contains("tokens_per_second_after_warmup")) {
    row(absl::StrCat("tokens/s after ",
                     s.contains("warmup_steps_excluded") ? s["warmup_steps_excluded"].get<int64_t>() : 0,
                     " warm-up steps"),
        number("tokens_per_second_after_warmup", "%.0f"));
  }
  if (s.contains("device")) row("device", s["device"].get<std::string>());
  if (s.contains("mfu") && !s["mfu"].is_null()) {
    row("MFU (bf16 dense peak)", absl::StrFormat("%.1f%%", 100 * s["mfu"].get<double>()));
  }
  if (s.contains("peak_device_memory_bytes") && s["peak_device_memory_bytes"].is_array()) {
    const auto& dev = s["peak_device_memory_bytes"];
    for (size_t r = 0; r < dev.size(); ++r) {
      row(absl::StrCat("peak device memory rank ", r), core::FormatBytes(dev[r].get<int64_t>()));
    }
  }
  const auto& peaks = s["peak_bytes_per_rank"];
  for (size_t r = 0; r < peaks.size(); ++r) {
    std::string line;
    for (auto it = peaks[r].begin(); it != peaks[r].end(); ++it) {
      if (it.key() == "total") continue;
      if (it.value().get<int64_t>() == 0) continue;
      absl::StrAppend(&line, it.key(), "=", core::FormatBytes(it.value().get<int64_t>()), " ");
    }
    absl::StrAppend(&line, "total=", core::FormatBytes(peaks[r]["total"].get<int64_t>()));
    row(absl::StrCat("peak memory rank ", r), line);
  }
  row("checkpoint", s["checkpoint_dir"].is_null() ? "-" : s["checkpoint_dir"].get<std::string>());
  row("safetensors", s["safetensors_path"].is_null() ? "-" : s["safetensors_path"].get<std::string>());
  for (const char* chart : {"loss_chart", "memory_chart"}) {
    if (s.contains(chart) && !s[chart].is_null()) row(chart, s[chart].get<std::string>());
  }
  return out.str();
}

// The summary without the per-step losses (those stay in summary.json).
nlohmann::json LastLine(nlohmann::json summary) {
  summary.erase("fit_losses");
  return summary;
}

absl::Status WriteCharts(const std::string& dir, const std::vector<std::pair<double, double>>& losses,
                         double floor, const std::vector<integration::RankMemory>& memory,
                         nlohmann::json* summary) {
  const nlohmann::json& test = (*summary)["test_loss"];
  using integration::charts::BarGroup;
  using integration::charts::Series;
  if (!losses.empty()) {
    integration::charts::LineChartOptions options;
    options.title = "Training loss (global batch mean)";
    options.x_label = "global step";
    options.y_label = "cross-entropy (nats/token)";
    options.lines.push_back({absl::StrFormat("entropy floor %.3f", floor), floor});
    if (test.is_number()) {
      options.lines.push_back({absl::StrFormat("test loss %.3f", test.get<double>()), test.get<double>()});
    }
    ASSIGN_OR_RETURN(std::string svg,
                     integration::charts::LineChart({Series{"train loss", losses}}, options));
    const std::string path = dir + "/loss.svg";
    RETURN_IF_ERROR(integration::charts::WriteTextFile(path, svg));
    (*summary)["loss_chart"] = path;
  }
  std::vector<BarGroup> groups;
  for (size_t r = 0; r < memory.size(); ++r) {
    BarGroup g;
    g.label = absl::StrCat("rank ", r);
    for (int t = 0; t < core::kNumMemoryTags; ++t) {
      g.bars.push_back({core::MemoryTagName(static_cast<core::MemoryTag>(t)),
                        static_cast<double>(memory[r].peak_by_tag[t])});
    }
    groups.push_back(std::move(g));
  }
  integration::charts::BarChartOptions options;
  options.title = "Peak memory per rank by tag (whole run)";
  options.y_label = "bytes";
  options.bytes = true;
  ASSIGN_OR_RETURN(std::string svg, integration::charts::GroupedBarChart(groups, options));
  const std::string path = dir + "/memory.svg";
  RETURN_IF_ERROR(integration::charts::WriteTextFile(path, svg));
  (*summary)["memory_chart"] = path;
  return absl::OkStatus();
}

// The --testonly_fault hook: a TrainModule that passes everything to the real one and
// misbehaves at one training step on one rank, for the fault-injection tests.
class FaultInjector : public integration::TrainModule {
 public:
  static absl::StatusOr<std::unique_ptr<FaultInjector>> Parse(const std::string& spec, int rank,
                                                              integration::TrainModule* inner) {
    std::vector<std::string> parts = absl::StrSplit(spec, absl::ByAnyChar("@:"));
    int fault_rank = 0;
    int64_t step = 0;
    if (parts.size() != 3 ||
        (parts[0] != "kill" && parts[0] != "stop" && parts[0] != "exit" && parts[0] != "error") ||
        !absl::SimpleAtoi(parts[1], &fault_rank) || !absl::SimpleAtoi(parts[2], &step) || step < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--testonly_fault=", spec, ": expected <kill|stop|exit|error>@<rank>:<step>, step >= 1"));
    }
    return std::unique_ptr<FaultInjector>(
        new FaultInjector(inner, parts[0], fault_rank == rank ? step : -1));
  }

  std::shared_ptr<core::Module> model() override { return inner_->model(); }
  absl::StatusOr<integration::StepOutput> TrainingStep(const integration::StepContext& ctx) override {
    if (++steps_ == fault_step_) {
      if (action_ == "kill") ::raise(SIGKILL);
      if (action_ == "stop") ::raise(SIGSTOP);
      if (action_ == "exit") ::_exit(3);
      return absl::InternalError(absl::StrCat("--testonly_fault: injected error at step ", steps_));
    }
    return inner_->TrainingStep(ctx);
  }
  absl::StatusOr<integration::StepOutput> EvaluationStep(const integration::StepContext& ctx) override {
    return inner_->EvaluationStep(ctx);
  }
  absl::StatusOr<core::Tensor> PredictStep(const integration::StepContext& ctx) override {
    return inner_->PredictStep(ctx);
  }
  absl::StatusOr<std::unique_ptr<optim::Optimizer>> ConfigureOptimizer(
      std::vector<core::NamedParameter> params) override {
    return inner_->ConfigureOptimizer(std::move(params));
  }
  std::optional<double> LearningRate(int64_t step) override { return inner_->LearningRate(step); }

 private:
  FaultInjector(integration::TrainModule* inner, std::string action, int64_t fault_step)
      : inner_(inner), action_(std::move(action)), fault_step_(fault_step) {}
  integration::TrainModule* inner_;
  std::string action_;
  int64_t fault_step_;  // -1: not on this rank
  int64_t steps_ = 0;
};

// Times the training steps (integration::ThroughputMeter) of the module it forwards to.
class TimedTrainModule : public integration::TrainModule {
 public:
  TimedTrainModule(integration::TrainModule* inner, integration::ThroughputMeter* meter)
      : inner_(inner), meter_(meter) {}
  std::shared_ptr<core::Module> model() override { return inner_->model(); }
  absl::StatusOr<integration::StepOutput> TrainingStep(const integration::StepContext& ctx) override {
    meter_->StepStarted(absl::Now());
    return inner_->TrainingStep(ctx);
  }
  absl::StatusOr<integration::StepOutput> EvaluationStep(const integration::StepContext& ctx) override {
    return inner_->EvaluationStep(ctx);
  }
  absl::StatusOr<core::Tensor> PredictStep(const integration::StepContext& ctx) override {
    return inner_->PredictStep(ctx);
  }
  absl::StatusOr<std::unique_ptr<optim::Optimizer>> ConfigureOptimizer(
      std::vector<core::NamedParameter> params) override {
    return inner_->ConfigureOptimizer(std::move(params));
  }
  std::optional<double> LearningRate(int64_t step) override { return inner_->LearningRate(step); }

 private:
  integration::TrainModule* inner_;
  integration::ThroughputMeter* meter_;
};

// Every rank's peak bytes on its CUDA device (core's CUDA allocator counters), in rank
// order; an empty list on the CPU.
absl::StatusOr<std::vector<int64_t>> GatherDevicePeaks(comm::ProcessGroup* group,
                                                       core::Device device,
                                                       absl::Duration timeout) {
  std::vector<int64_t> peaks;
  if (!device.is_cuda()) return peaks;
  const int64_t mine = core::Allocator::Current(device)->Stats().peak_total;
  ASSIGN_OR_RETURN(std::vector<std::string> all,
                   comm::AllGatherBytes(group, absl::StrCat(mine), timeout));
  for (const std::string& text : all) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(text, &v)) {
      return absl::InternalError(absl::StrCat("peak device memory: a rank sent '", text, "'"));
    }
    peaks.push_back(v);
  }
  return peaks;
}

// Ranks of this job on this host: LOCAL_WORLD_SIZE when a launcher sets it.
int LocalRanks(int world) {
  int n = 0;
  const char* env = std::getenv("LOCAL_WORLD_SIZE");
  if (env != nullptr && absl::SimpleAtoi(env, &n) && n >= 1 && n <= world) return n;
  return world;
}

// The intra-op thread count of each rank: --intra_op_threads, or when it is 0, the
// environment's OMP_NUM_THREADS (a launcher's or the user's choice), else the hardware
// threads shared by the ranks on this host.
absl::StatusOr<int> IntraOpThreadsFor(int world) {
  const int flag = absl::GetFlag(FLAGS_intra_op_threads);
  if (flag < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--intra_op_threads=", flag, ": must be >= 1, or 0 for auto"));
  }
  if (flag > 0) return flag;
  int n = 0;
  const char* env = std::getenv("OMP_NUM_THREADS");
  if (env != nullptr && absl::SimpleAtoi(env, &n) && n >= 1) return n;
  const int hardware = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, hardware / LocalRanks(world));
}

bool g_failure_reported = false;

// Records this rank's failure in its error file (comm/failure.h), then prints it, while
// the process group is still alive: a peer that fails because of this rank finds the
// root cause on disk even if this process is stopped right after.
void ReportFailure(const absl::Status& status, int rank) {
  if (g_failure_reported) return;
  g_failure_reported = true;
  comm::RecordFailure(status, rank).IgnoreError();
  const int delay_ms = absl::GetFlag(FLAGS_testonly_failure_print_delay_ms);
  if (delay_ms > 0 && !comm::IsSecondary(status)) absl::SleepFor(absl::Milliseconds(delay_ms));
  std::fprintf(stderr, "main job (rank %d) failed: %s: %s\n", rank,
               absl::StatusCodeToString(status.code()).c_str(), std::string(status.message()).c_str());
  std::fflush(stderr);
}

absl::StatusOr<std::vector<integration::Stage>> ParseStages(const std::string& text) {
  std::vector<integration::Stage> stages;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    bool found = false;
    for (integration::Stage s : {integration::Stage::kFit, integration::Stage::kValidate,
                                 integration::Stage::kTest, integration::Stage::kPredict}) {
      if (integration::StageName(s) == part) {
        stages.push_back(s);
        found = true;
      }
    }
    if (!found) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--stages: unknown stage '", part, "'; use fit, validate, test, predict"));
    }
  }
  return stages;
}

absl::Status RunJob(comm::Distributed& dist, absl::Duration timeout);

// One rank of the job.
absl::Status RunRank() {
  ASSIGN_OR_RETURN(const comm::LaunchEnv env, comm::ReadLaunchEnv());
  ASSIGN_OR_RETURN(const integration::DeviceChoice choice,
                   integration::ChooseDeviceAndBackend(
                       absl::GetFlag(FLAGS_device), absl::GetFlag(FLAGS_backend), env.local_rank,
                       integration::DeviceAvailability::Probe()));
  comm::InitOptions init;
  init.backend = choice.backend;
  ASSIGN_OR_RETURN(const absl::Duration timeout,
                   core::TimeoutFromSeconds(absl::GetFlag(FLAGS_timeout_s), "--timeout_s"));
  init.timeout = timeout;
  ASSIGN_OR_RETURN(comm::Distributed dist, comm::InitFromLaunchEnv(env, init));
  if (dist.device != choice.device) {
    return absl::InternalError(absl::StrCat("--device=", absl::GetFlag(FLAGS_device), ": rank ",
                                            env.rank, " chose ", choice.device.ToString(),
                                            " but its group runs on ", dist.device.ToString()));
  }
  const absl::Status status = RunJob(dist, timeout);
  // Report while the process group is alive (see ReportFailure).
  if (!status.ok()) ReportFailure(status, dist.group->rank());
  return status;
}

// The job on one rank, once it has joined the group.
absl::Status RunJob(comm::Distributed& dist, absl::Duration timeout) {
  const int rank = dist.group->rank();
  const int world = dist.group->size();
  auto say = [&](const std::string& line) {
    if (rank == 0) {
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    }
  };

  integration::GptModuleOptions model_options;
  std::unique_ptr<integration::GptTrainModule> module;
  std::map<std::string, core::Shape> full_shapes;
  const std::string output_dir = OutputDir();
  std::string checkpoint_dir, safetensors_path;
  std::vector<integration::Stage> stages;
  integration::StageOptions options;
  std::unique_ptr<FaultInjector> fault;
  int intra_op_threads = 0;
  // Setting up can fail on some ranks only (a configuration file one host cannot read):
  // every rank learns the outcome before the first collective, and all fail alike.
  const absl::Status setup = [&]() -> absl::Status {
    if (rank == 0) RETURN_IF_ERROR(MakeDirs(output_dir));
    ASSIGN_OR_RETURN(intra_op_threads, IntraOpThreadsFor(world));
    RETURN_IF_ERROR(nn::SetIntraOpThreads(intra_op_threads));
    model_options.model.vocab_size = absl::GetFlag(FLAGS_vocab_size);
    model_options.model.block_size = absl::GetFlag(FLAGS_block_size);
    model_options.model.n_embd = absl::GetFlag(FLAGS_n_embd);
    model_options.model.n_layer = absl::GetFlag(FLAGS_n_layer);
    model_options.model.n_head = absl::GetFlag(FLAGS_n_head);
    model_options.model.seed = absl::GetFlag(FLAGS_seed);
    model_options.language.order = absl::GetFlag(FLAGS_order);
    model_options.language.seed = absl::GetFlag(FLAGS_seed) + 1;
    model_options.seq_len = absl::GetFlag(FLAGS_seq_len);
    model_options.adamw.lr = absl::GetFlag(FLAGS_lr);
    model_options.adamw.weight_decay = absl::GetFlag(FLAGS_weight_decay);
    model_options.warmup_steps = absl::GetFlag(FLAGS_warmup_steps);
    model_options.device = dist.device;
    ASSIGN_OR_RETURN(module, integration::GptTrainModule::Create(model_options));
    if (!absl::GetFlag(FLAGS_testonly_fault).empty()) {
      ASSIGN_OR_RETURN(fault, FaultInjector::Parse(absl::GetFlag(FLAGS_testonly_fault), rank,
                                                   module.get()));
    }
    full_shapes = checkpoint::ParameterShapes(*module->model());
    checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir).empty()
                         ? output_dir + "/checkpoint"
                         : Resolve(absl::GetFlag(FLAGS_checkpoint_dir));
    safetensors_path = absl::GetFlag(FLAGS_safetensors_path).empty()
                           ? output_dir + "/model.safetensors"
                           : Resolve(absl::GetFlag(FLAGS_safetensors_path));
    ASSIGN_OR_RETURN(stages, ParseStages(absl::GetFlag(FLAGS_stages)));
    options.wrap.policy = policy::ModuleTypes({"TransformerBlock"});
    absl::StatusOr<fsdp::ShardingStrategy> strategy =
        integration::ParseShardingStrategy(absl::GetFlag(FLAGS_strategy));
    if (!strategy.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--strategy: ", strategy.status().message()));
    }
    options.wrap.strategy = *strategy;
    options.wrap.hybrid_shard_size = absl::GetFlag(FLAGS_hybrid_shard_size);
    options.wrap.forward_prefetch = absl::GetFlag(FLAGS_forward_prefetch);
    ASSIGN_OR_RETURN(options.wrap.mixed_precision.param_dtype,
                     core::ParseDType(absl::GetFlag(FLAGS_param_dtype)));
    options.wrap.timeout = timeout;
    options.fit_steps = absl::GetFlag(FLAGS_steps);
    options.train_batch_size = absl::GetFlag(FLAGS_batch_size);
    options.eval_batch_size = absl::GetFlag(FLAGS_eval_batch_size);
    options.eval_batches = absl::GetFlag(FLAGS_eval_batches);
    options.log_every = absl::GetFlag(FLAGS_log_every);
    options.checkpoint_dir = checkpoint_dir;
    if (!absl::GetFlag(FLAGS_stage_config).empty()) {
      ASSIGN_OR_RETURN(options, integration::ReadStageOptionsFile(
                                    Resolve(absl::GetFlag(FLAGS_stage_config)), options));
    }
    // Refuse a run this host's memory cannot hold before training starts, naming the
    // shortfall, rather than be OOM-killed without a word.
    integration::MemoryEstimateInput need;
    const std::shared_ptr<const policy::WrapPolicy> wrap_policy =
        options.wrap.policy != nullptr ? options.wrap.policy : policy::Never();
    ASSIGN_OR_RETURN(policy::WrapPlan plan, policy::Plan(*module->model(), *wrap_policy, world));
    need.model = integration::ModelSizesFromPlan(plan);
    need.world_size = world;
    need.local_ranks = LocalRanks(world);
    need.strategy = options.wrap.strategy;
    need.hybrid_shard_size = options.wrap.hybrid_shard_size;
    need.param_dtype = options.wrap.mixed_precision.param_dtype;
    need.device = dist.device;
    need.activations = integration::GptActivations(
        model_options.model, std::max(options.train_batch_size, options.eval_batch_size) / world,
        model_options.seq_len);
    ASSIGN_OR_RETURN(integration::MemoryEstimate estimate, integration::EstimateMemory(need));
    RETURN_IF_ERROR(integration::CheckFitsInHostMemory(estimate));
    if (dist.device.is_cuda()) {
      ASSIGN_OR_RETURN(integration::DeviceMemoryInfo info,
                       integration::ReadDeviceMemoryInfo(dist.device));
      RETURN_IF_ERROR(integration::CheckFitsInDeviceMemory(
          estimate, info.free_bytes,
          absl::StrCat("free on ", dist.device.ToString(), " ",
                       core::FormatBytes(info.free_bytes), " of ",
                       core::FormatBytes(info.total_bytes))));
    }
    return absl::OkStatus();
  }();
  RETURN_IF_ERROR(comm::AgreeOnStatus(dist.group.get(), setup, "main job setup", timeout));
  const bool fits = std::find(stages.begin(), stages.end(), integration::Stage::kFit) != stages.end();
  ASSIGN_OR_RETURN(std::unique_ptr<integration::StageRunner> runner,
                   integration::StageRunner::Create(dist.group, options));
  integration::ThroughputMeter meter(options.fit_steps);
  TimedTrainModule timed(
      fault != nullptr ? static_cast<integration::TrainModule*>(fault.get()) : module.get(),
      &meter);
  integration::TrainModule& trained = timed;
  runner->set_progress_callback([&](const integration::Progress& p) {
    say(integration::FormatProgress(p));
  });

  say(absl::StrFormat(
      "main job: GPT (vocab %d, context %d, width %d, %d layers, %d heads, %d parameters) on a "
      "Markov language of order %d; %d ranks (%s, %s), %s, stages %s; %d intra-op threads per "
      "rank, GEMM %s",
      model_options.model.vocab_size, model_options.model.block_size, model_options.model.n_embd,
      model_options.model.n_layer, model_options.model.n_head,
      module->model()->NumParameterElements(), model_options.language.order, world,
      dist.group->backend_name(), dist.device.ToString(),
      fsdp::ShardingStrategyName(options.wrap.strategy), absl::GetFlag(FLAGS_stages),
      intra_op_threads, nn::GemmLibrary()));
  if (module->language().vocab_size() != model_options.model.vocab_size) {
    say(absl::StrFormat("main job: the Markov language uses token ids 0..%d of the model's %d "
                        "(its transition table is dense; NOTE [Language vocabulary] in "
                        "integration/gpt_module.h)",
                        module->language().vocab_size() - 1, model_options.model.vocab_size));
  }

  nlohmann::json summary;
  summary["world_size"] = world;
  summary["intra_op_threads"] = intra_op_threads;
  summary["gemm_library"] = nn::GemmLibrary();
  summary["backend"] = dist.group->backend_name();
  summary["device"] = dist.device.is_cuda() ? "cuda" : "cpu";
  summary["language_vocab_size"] = module->language().vocab_size();
  summary["strategy"] = fsdp::ShardingStrategyName(options.wrap.strategy);
  summary["stages"] = absl::GetFlag(FLAGS_stages);
  summary["model_parameters"] = module->model()->NumParameterElements();
  summary["entropy_floor"] = module->EntropyFloor();
  summary["final_train_loss"] = nullptr;
  summary["test_loss"] = nullptr;
  summary["validate_loss"] = nullptr;
  summary["released_test_loss"] = nullptr;
  summary["checkpoint_dir"] = nullptr;
  summary["safetensors_path"] = nullptr;
  summary["resumed_from"] = nullptr;
  summary["units_reused"] = 0;
  summary["param_bytes_copied_on_rewrap"] = 0;
  std::vector<integration::RankMemory> run_memory;
  std::vector<std::pair<double, double>> loss_points;
  nlohmann::json fit_losses = nlohmann::json::array();
  int64_t bytes_copied_on_rewrap = 0;
  double tokens_per_second = 0;

  if (!absl::GetFlag(FLAGS_resume_from).empty()) {
    const std::string from = Resolve(absl::GetFlag(FLAGS_resume_from));
    ASSIGN_OR_RETURN(integration::LoadedCheckpoint loaded,
                     runner->LoadCheckpoint(trained, from, /*optimizer=*/fits));
    say(absl::StrFormat("loaded checkpoint %s (saved at step %d by %d ranks%s); this rank read %s",
                        from, loaded.step, loaded.saved_world_size,
                        fits ? ", with optimizer state" : "", core::FormatBytes(loaded.bytes_read)));
    summary["resumed_from"] = from;
    summary["resumed_step"] = loaded.step;
  }

  for (integration::Stage stage : stages) {
    switch (stage) {
      case integration::Stage::kFit: {
        say(absl::StrFormat("fit: %d steps of %d x %d tokens from global step %d",
                            options.fit_steps, options.train_batch_size, model_options.seq_len,
                            runner->GlobalStep(trained)));
        runner->registry().runtime().ResetCommTiming();
        ASSIGN_OR_RETURN(integration::FitResult fit, runner->Fit(trained));
        say(absl::StrCat("fit: ", WrapLine(fit.report.wrap)));
        {
          // NOTE [Comm overlap] in fsdp/unit.h: this rank's collectives during the fit.
          const fsdp::CommTiming c = runner->registry().runtime().comm_timing();
          nlohmann::json overlap;
          overlap["all_gathers"] = c.all_gathers;
          overlap["all_gather_seconds"] = absl::ToDoubleSeconds(c.all_gather_run);
          overlap["all_gather_wait_seconds"] = absl::ToDoubleSeconds(c.all_gather_wait);
          overlap["all_gather_hidden"] = fsdp::CommTiming::Hidden(c.all_gather_run, c.all_gather_wait);
          overlap["reductions"] = c.reductions;
          overlap["reduce_seconds"] = absl::ToDoubleSeconds(c.reduce_run);
          overlap["reduce_wait_seconds"] = absl::ToDoubleSeconds(c.reduce_wait);
          overlap["reduce_hidden"] = fsdp::CommTiming::Hidden(c.reduce_run, c.reduce_wait);
          overlap["what"] =
              "rank 0's all-gathers and reduce-scatters during the fit: seconds they ran "
              "(gloo; not measured on NCCL), seconds the rank blocked waiting for them, and "
              "hidden = 1 - wait / run, the part that overlapped compute";
          summary["comm_overlap"] = overlap;
          // The units' sizes, for memory bounds computed from them (bench/cpu).
          nlohmann::json units = nlohmann::json::array();
          if (std::shared_ptr<core::Module> model = trained.model()) {
            for (const std::shared_ptr<fsdp::Unit>& u : runner->registry().UnitsIn(*model)) {
              units.push_back({{"label", u->label()},
                               {"numel", u->flat().numel()},
                               {"padded_numel", u->flat().padded_numel()}});
            }
          }
          summary["fsdp_units"] = units;
          summary["limit_all_gathers"] = options.wrap.limit_all_gathers;
          if (c.all_gathers + c.reductions > 0) {
            say(absl::StrFormat(
                "fit: comm overlap: %d all-gathers ran %.3f s, waited %.3f s (%.0f%% hidden); "
                "%d reduce-scatters ran %.3f s, waited %.3f s (%.0f%% hidden)",
                c.all_gathers, absl::ToDoubleSeconds(c.all_gather_run),
                absl::ToDoubleSeconds(c.all_gather_wait),
                100 * fsdp::CommTiming::Hidden(c.all_gather_run, c.all_gather_wait), c.reductions,
                absl::ToDoubleSeconds(c.reduce_run), absl::ToDoubleSeconds(c.reduce_wait),
                100 * fsdp::CommTiming::Hidden(c.reduce_run, c.reduce_wait)));
          }
        }
        if (fit.report.wrap.reused) bytes_copied_on_rewrap += fit.report.wrap.param_bytes_copied;
        for (size_t i = 0; i < fit.losses.size(); ++i) {
          loss_points.push_back({static_cast<double>(fit.first_step + i + 1), fit.losses[i]});
          fit_losses.push_back(fit.losses[i]);
        }
        summary["final_train_loss"] = fit.final_loss;
        tokens_per_second = fit.items_per_second;
        MaxInto(fit.report.memory, &run_memory);
        if (!fit.checkpoint_dir.empty()) {
          say(absl::StrCat("fit: saved checkpoint ", fit.checkpoint_dir, " (model and optimizer, step ",
                           fit.global_step, ")"));
          summary["checkpoint_dir"] = fit.checkpoint_dir;
        }
        break;
      }
      case integration::Stage::kValidate:
      case integration::Stage::kTest: {
        ASSIGN_OR_RETURN(integration::EvalResult eval, stage == integration::Stage::kTest
                                                           ? runner->Test(trained)
                                                           : runner->Validate(trained));
        say(absl::StrFormat("%s: loss %.4f over %d tokens; %s", integration::StageName(stage),
                            eval.loss, eval.count, WrapLine(eval.report.wrap)));
        if (eval.report.wrap.reused) bytes_copied_on_rewrap += eval.report.wrap.param_bytes_copied;
        summary[integration::StageName(stage) + "_loss"] = eval.loss;
        if (stage == integration::Stage::kTest) {
          summary["units_reused"] = eval.report.wrap.units_reused;
          summary["test_wrap_reused"] = eval.report.wrap.reused;
        }
        MaxInto(eval.report.memory, &run_memory);
        break;
      }
      case integration::Stage::kPredict: {
        ASSIGN_OR_RETURN(integration::PredictResult predicted, runner->Predict(trained));
        std::string first;
        if (!predicted.outputs.empty()) {
          const core::Tensor& ids = predicted.outputs[0];
          for (int64_t t = 0; t < std::min<int64_t>(ids.size(-1), 16); ++t) {
            absl::StrAppend(&first, t > 0 ? " " : "", ids.data<int32_t>()[t]);
          }
        }
        say(absl::StrCat("predict: ", predicted.outputs.size(), " batches; rank 0's first row: ",
                         first, " ...; ", WrapLine(predicted.report.wrap)));
        if (predicted.report.wrap.reused) {
          bytes_copied_on_rewrap += predicted.report.wrap.param_bytes_copied;
        }
        MaxInto(predicted.report.memory, &run_memory);
        break;
      }
    }
  }
  summary["param_bytes_copied_on_rewrap"] = bytes_copied_on_rewrap;
  summary["fresh_wraps"] = runner->registry().counters().wraps;
  summary["global_step"] = runner->GlobalStep(trained);
  summary["tokens_per_second"] = tokens_per_second;
  // Throughput after the warm-up and MFU (NOTE in integration/device_setup.h).
  const int64_t tokens_per_step =
      static_cast<int64_t>(options.train_batch_size) * model_options.seq_len;
  const std::optional<double> steady = meter.TokensPerSecond(tokens_per_step);
  summary["warmup_steps_excluded"] = meter.warmup_steps();
  summary["tokens_per_second_after_warmup"] = steady.has_value() ? nlohmann::json(*steady) : nlohmann::json();
  summary["mfu"] = nullptr;
  summary["peak_device_memory_bytes"] = nullptr;
  {
    nlohmann::json mfu;
    // The unsharded count (while wrapped, parameters are local slices).
    const int64_t n_params = summary["model_parameters"].get<int64_t>();
    const double flops_per_token =
        integration::GptFlopsPerToken(n_params, model_options.model.n_layer, model_options.seq_len,
                                      model_options.model.n_embd);
    mfu["formula"] = "(6 N + 12 L T C) x tokens_per_second_after_warmup / (world_size x peak_flops)";
    mfu["N"] = n_params;
    mfu["L"] = model_options.model.n_layer;
    mfu["T"] = model_options.seq_len;
    mfu["C"] = model_options.model.n_embd;
    mfu["flops_per_token"] = flops_per_token;
    mfu["peak_flops_per_device"] = nullptr;
    if (dist.device.is_cuda()) {
      absl::StatusOr<std::string> name = core::CudaDeviceName(dist.device.index);
      mfu["device_name"] = name.ok() ? *name : std::string(name.status().message());
      const std::optional<double> peak =
          name.ok() ? integration::PeakBf16FlopsFromName(*name) : std::nullopt;
      if (peak.has_value()) {
        mfu["peak_flops_per_device"] = *peak;
        if (steady.has_value()) {
          summary["mfu"] = flops_per_token * *steady / (static_cast<double>(world) * *peak);
        }
      }
    }
    summary["mfu_inputs"] = mfu;
    if (rank == 0 && dist.device.is_cuda()) {
      say(absl::StrFormat("throughput: %s tokens/s after %d warm-up steps; model FLOPs per token "
                          "6 N + 12 L T C = 6 x %d + 12 x %d x %d x %d = %.4g; MFU %s",
                          steady.has_value() ? absl::StrFormat("%.0f", *steady) : "-",
                          meter.warmup_steps(), n_params, model_options.model.n_layer,
                          model_options.seq_len, model_options.model.n_embd, flops_per_token,
                          summary["mfu"].is_null()
                              ? "- (unknown device peak or no steady-state steps)"
                              : absl::StrFormat("%.1f%%", 100 * summary["mfu"].get<double>())));
    }
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> device_peaks,
                   GatherDevicePeaks(dist.group.get(), dist.device, timeout));
  if (!device_peaks.empty()) summary["peak_device_memory_bytes"] = device_peaks;

  if (absl::GetFlag(FLAGS_release)) {
    RETURN_IF_ERROR(runner->Release(trained));
    if (rank == 0) {
      RETURN_IF_ERROR(checkpoint::ExportSafetensors(
          safetensors_path, *module->model(),
          {{"format", "pt"}, {"global_step", absl::StrCat(runner->GlobalStep(trained))}},
          full_shapes));
    }
    summary["safetensors_path"] = safetensors_path;
    integration::EvalOptions plain;
    plain.wrap = false;
    ASSIGN_OR_RETURN(integration::EvalResult released, runner->Test(trained, plain));
    say(absl::StrFormat("released: plain module (no units, no process group needed), wrote %s; "
                        "test loss %.4f",
                        safetensors_path, released.loss));
    summary["released_test_loss"] = released.loss;
    MaxInto(released.report.memory, &run_memory);
  }

  if (rank == 0) {
    if (!summary["test_loss"].is_null()) {
      summary["test_loss_over_floor"] =
          summary["test_loss"].get<double>() / module->EntropyFloor();
    }
    nlohmann::json peaks = nlohmann::json::array();
    for (const integration::RankMemory& m : run_memory) peaks.push_back(MemoryJson(m));
    summary["peak_bytes_per_rank"] = peaks;
    RETURN_IF_ERROR(WriteCharts(output_dir, loss_points, module->EntropyFloor(), run_memory,
                                &summary));
    summary["fit_losses"] = fit_losses;
    RETURN_IF_ERROR(integration::charts::WriteTextFile(
        absl::StrCat(output_dir, "/", kSummaryFile), summary.dump(2) + "\n"));
    if (std::getenv(kLaunchedByParent) == nullptr) {
      std::printf("%s", SummaryTable(summary).c_str());
      std::cout << LastLine(summary).dump() << std::endl;
    }
  }
  return absl::OkStatus();
}

// Starts --world_size ranks of this binary through the local launcher, then prints the
// summary rank 0 wrote.
int LaunchLocalRanks(int argc, char** argv) {
  const std::string output_dir = OutputDir();
  if (absl::Status s = MakeDirs(output_dir); !s.ok()) {
    std::fprintf(stderr, "main job: %s\n", s.ToString().c_str());
    return 1;
  }
  const std::string summary_path = absl::StrCat(output_dir, "/", kSummaryFile);
  std::remove(summary_path.c_str());
  comm::LaunchOptions launch;
  launch.nproc = absl::GetFlag(FLAGS_world_size);
  if (launch.nproc < 1) {
    std::fprintf(stderr, "main job: --world_size=%d must be >= 1\n", launch.nproc);
    return 1;
  }
  // Refuse what can be checked without the ranks before starting them.
  if (absl::Status s = ParseStages(absl::GetFlag(FLAGS_stages)).status(); !s.ok()) {
    std::fprintf(stderr, "main job: %s\n", s.ToString().c_str());
    return 1;
  }
  if (absl::Status s = integration::ParseShardingStrategy(absl::GetFlag(FLAGS_strategy)).status();
      !s.ok()) {
    std::fprintf(stderr, "main job: --strategy: %s\n", s.ToString().c_str());
    return 1;
  }
  if (absl::GetFlag(FLAGS_intra_op_threads) < 0) {
    std::fprintf(stderr, "main job: --intra_op_threads=%d must be >= 1, or 0 for auto\n",
                 absl::GetFlag(FLAGS_intra_op_threads));
    return 1;
  }
  if (absl::Status s = core::TimeoutFromSeconds(absl::GetFlag(FLAGS_timeout_s), "--timeout_s").status(); !s.ok()) {
    std::fprintf(stderr, "main job: %s\n", s.ToString().c_str());
    return 1;
  }
  // --device / --backend: the parent checks what it can (the build, the GPUs, one per
  // local rank) so a refusal comes once, before any rank starts.
  if (absl::StatusOr<integration::DeviceChoice> choice = integration::ChooseDeviceAndBackend(
          absl::GetFlag(FLAGS_device), absl::GetFlag(FLAGS_backend), launch.nproc - 1,
          integration::DeviceAvailability::Probe());
      !choice.ok()) {
    std::fprintf(stderr, "main job: %s\n", choice.status().ToString().c_str());
    return 1;
  }
  std::vector<std::string> args(argv + 1, argv + argc);
  // Every rank writes into the same output directory: make the default explicit so it
  // does not depend on each rank's working directory.
  args.push_back(absl::StrCat("--output_dir=", output_dir));
  ::setenv(kLaunchedByParent, "1", 1);
  std::printf("main job: starting %d local ranks (comm/launcher.h); output in %s\n", launch.nproc,
              output_dir.c_str());
  std::fflush(stdout);
  absl::StatusOr<int> launched = comm::RunLocalRanks(launch.nproc, args);
  if (!launched.ok()) {
    std::fprintf(stderr, "main job: %s\n", launched.status().ToString().c_str());
    return 1;
  }
  const int rc = *launched;
  if (rc != 0) {
    std::fprintf(stderr, "main job: the ranks failed (exit status %d); see their output above\n", rc);
    return rc;
  }
  std::ifstream in(summary_path);
  if (!in) {
    std::fprintf(stderr, "main job: rank 0 wrote no summary at %s\n", summary_path.c_str());
    return 1;
  }
  nlohmann::json summary;
  try {
    in >> summary;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "main job: cannot parse %s: %s\n", summary_path.c_str(), e.what());
    return 1;
  }
  std::printf("%s", SummaryTable(summary).c_str());
  std::cout << LastLine(summary).dump() << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Trains, tests, checkpoints and releases a GPT with FSDP over local ranks (README.md).");
  absl::ParseCommandLine(argc, argv);
  if (std::getenv("RANK") == nullptr) return LaunchLocalRanks(argc, argv);
  const absl::Status status = RunRank();
  if (!status.ok()) {
    int rank = -1;
    if (!absl::SimpleAtoi(std::getenv("RANK"), &rank)) rank = -1;
    ReportFailure(status, rank);  // when it failed before joining the group
    return 1;
  }
  return 0;
}
