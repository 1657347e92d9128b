// The main job (README: `make demo`): trains a GPT (or, with --model=llama, a Llama) on
// the synthetic Markov language over N ranks with FSDP, tests it in the same run through
// the shared wrapper registry (and prints what the registry reused), saves a sharded
// checkpoint, releases the model, exports it as safetensors and tests the plain module,
// then prints a summary table, writes SVG charts, and ends with one JSON line of the
// figures.
//
//   bazel run //trainer:main_job                              # 2 local CPU ranks
//   bazel run //trainer:main_job -- --world_size=4 --strategy=SHARD_GRAD_OP
//   bazel run //trainer:main_job -- --model=llama --n_kv_head=2
//   bazel run //trainer:main_job -- --stages=test --resume_from=out/main_job/checkpoint
//   bazel run //trainer:main_job -- --hf_dir=/models/gpt2 --export_hf_dir=/out/tuned
//
// Run without RANK in the environment, it starts --world_size copies of itself through
// the local launcher (comm/launcher.h) and, once they succeed, prints the summary rank 0
// left in --output_dir. Run by a launcher that sets RANK, WORLD_SIZE, MASTER_ADDR and
// MASTER_PORT (ours, torchrun-style cluster launchers, several machines), it is one
// rank of that job and rank 0 prints the summary itself.
//
// The pieces live in trainer/internal/: the flags and their checks (job_options.h),
// a rank's setup (job_setup.h), the stages (stage_loop.h) and the summary (job_summary.h).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "comm/agreement.h"
#include "comm/failure.h"
#include "comm/init_from_env.h"
#include "comm/launcher.h"
#include "core/status_macros.h"
#include "core/timeout.h"
#include "integration/device_setup.h"
#include "integration/stage_runner.h"
#include "nlohmann/json.hpp"
#include "nn/ops.h"
#include "trainer/internal/job_options.h"
#include "trainer/internal/job_setup.h"
#include "trainer/internal/job_summary.h"
#include "trainer/internal/job_train_modules.h"
#include "trainer/internal/run_log.h"
#include "trainer/internal/stage_loop.h"

#ifdef FSDP_WITH_CUDA
#include "nn/cuda/gemm.h"
#endif

namespace {

using integration::internal::JobOptions;

constexpr char kLaunchedByParent[] = "FSDP_MAIN_JOB_PARENT";

double UnixSeconds() { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); }

bool g_failure_reported = false;

// Records this rank's failure in its error file (comm/failure.h), then prints it, while
// the process group is still alive: a peer that fails because of this rank finds the
// root cause on disk even if this process is stopped right after.
void ReportFailure(const JobOptions& job, const absl::Status& status, int rank) {
  if (g_failure_reported) return;
  g_failure_reported = true;
  comm::RecordFailure(status, rank).IgnoreError();
  const int delay_ms = job.testonly_failure_print_delay_ms;
  if (delay_ms > 0 && !comm::IsSecondary(status)) absl::SleepFor(absl::Milliseconds(delay_ms));
  std::fprintf(stderr, "main job (rank %d) failed: %s: %s\n", rank,
               absl::StatusCodeToString(status.code()).c_str(),
               std::string(status.message()).c_str());
  std::fflush(stderr);
}

integration::internal::JobFacts FactsOf(const JobOptions& job,
                                        const integration::internal::JobSetup& setup,
                                        const comm::Distributed& dist) {
  integration::internal::JobFacts facts;
  facts.world_size = dist.group->size();
  facts.intra_op_threads = setup.intra_op_threads;
  facts.gemm_library = nn::GemmLibrary();
  facts.backend = dist.group->backend_name();
  facts.cuda = dist.device.is_cuda();
  facts.language_vocab_size =
      setup.module->uses_token_files() ? 0 : setup.module->language().vocab_size();
  facts.strategy = fsdp::ShardingStrategyName(setup.options.wrap.strategy);
  facts.stages = job.stages;
  facts.model = job.model_kind;
  facts.hf_dir = job.hf_dir;
  facts.model_parameters = setup.module->model()->NumParameterElements();
  facts.entropy_floor = setup.module->EntropyFloor();
  facts.memory_estimate = setup.estimate;
  return facts;
}

// The job on one rank, once it has joined the group.
absl::Status RunJob(const JobOptions& flags, comm::Distributed& dist, absl::Duration timeout) {
  const int rank = dist.group->rank();
  auto say = [rank](const std::string& line) {
    if (rank == 0) {
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    }
  };
  // Setting up can fail on some ranks only (a configuration file one host cannot read):
  // every rank learns the outcome before the first collective, and all fail alike.
  absl::StatusOr<integration::internal::JobSetup> setup =
      integration::internal::SetUpRank(flags, dist, timeout);
  RETURN_IF_ERROR(comm::AgreeOnStatus(dist.group.get(), setup.status(), "main job setup", timeout));
  const JobOptions& job = setup->job;  // the flags with their Hugging Face directories settled
  ASSIGN_OR_RETURN(std::unique_ptr<integration::StageRunner> runner,
                   integration::StageRunner::Create(dist.group, setup->options));
  integration::ThroughputMeter meter(setup->options.fit_steps, job.throughput_warmup_steps,
                                     dist.device);
  integration::internal::TimedTrainModule trained(setup->trained(), &meter);
  for (const std::string& line : integration::internal::DescribeJob(job, *setup, dist)) say(line);

  nlohmann::json summary = integration::internal::NewSummary(FactsOf(job, *setup, dist));
  integration::internal::StageLoop loop(job, *setup, runner.get(), &trained, &summary, say);
  // NOTE [Hugging Face start]: with --resume_from as well, the checkpoint's weights.
  bool resumed = false;
  if (!job.resume_from.empty()) {
    ASSIGN_OR_RETURN(resumed, loop.Resume());
  }
  if (!resumed && !job.hf_dir.empty()) RETURN_IF_ERROR(loop.LoadHf());
  // NOTE [Run log]: rank 0 logs every fit step and what restarts cost; a failure to write it
  // is reported once and does not stop the training.
  std::optional<integration::internal::RunLog> run_log;
  bool run_log_warned = false;
  auto log_status = [&](const absl::Status& s) {
    if (s.ok() || run_log_warned) return;
    run_log_warned = true;
    say(absl::StrCat("warning: ", s.message(), "; the run log stops here"));
    run_log.reset();
  };
  if (rank == 0 && std::find(setup->stages.begin(), setup->stages.end(),
                             integration::Stage::kFit) != setup->stages.end()) {
    const int restart = integration::internal::RestartCount();
    absl::StatusOr<integration::internal::RunLog> opened = integration::internal::RunLog::Open(
        absl::StrCat(job.output_dir, "/", integration::internal::kRunLogFile), restart,
        /*fresh=*/restart == 0 && !resumed);
    log_status(opened.status());
    if (opened.ok()) {
      run_log.emplace(*std::move(opened));
      log_status(run_log->Started(runner->GlobalStep(trained), dist.group->size(), UnixSeconds()));
    }
  }
  runner->set_progress_callback([&](const integration::Progress& p) {
    if (run_log.has_value()) log_status(run_log->Reported(p, UnixSeconds()));
    say(integration::FormatProgress(p) + (run_log.has_value() ? run_log->ProgressSuffix() : ""));
  });
  for (integration::Stage stage : setup->stages) RETURN_IF_ERROR(loop.Run(stage));
  RETURN_IF_ERROR(loop.AddRunFigures(meter, dist.group.get(), dist.device, timeout));
  if (job.release) RETURN_IF_ERROR(loop.Release());

  if (rank == 0) {
#ifdef FSDP_WITH_CUDA
    // NOTE [GEMM tuning] (nn/cuda/gemm.h): what tuning chose for each GEMM problem.
    if (dist.device.is_cuda()) summary["gemm_tuning"] = nn::cuda::GemmTuningReport();
#endif
    if (run_log.has_value()) {
      const integration::internal::RestartFigures& f = run_log->figures();
      summary["run_log"] = run_log->path();
      summary["restarts"] = f.restarts;
      summary["steps_recomputed"] = f.steps_recomputed;
      summary["seconds_lost"] = f.seconds_lost;
      summary["recomputed_per_restart"] = f.recomputed_per_restart;
    }
    RETURN_IF_ERROR(integration::internal::WriteSummary(job.output_dir, loop.totals(),
                                                        setup->module->EntropyFloor(), &summary));
    if (std::getenv(kLaunchedByParent) == nullptr) integration::internal::PrintSummary(summary);
  }
  return absl::OkStatus();
}

// One rank of the job.
absl::Status RunRank(const JobOptions& job) {
  ASSIGN_OR_RETURN(const comm::LaunchEnv env, comm::ReadLaunchEnv());
  ASSIGN_OR_RETURN(const integration::DeviceChoice choice,
                   integration::ChooseDeviceAndBackend(job.device, job.backend, env.local_rank,
                                                       integration::DeviceAvailability::Probe()));
  comm::InitOptions init;
  init.backend = choice.backend;
  ASSIGN_OR_RETURN(const absl::Duration timeout,
                   core::TimeoutFromSeconds(job.timeout_s, "--timeout_s"));
  init.timeout = timeout;
  ASSIGN_OR_RETURN(comm::Distributed dist, comm::InitFromLaunchEnv(env, init));
  if (dist.device != choice.device) {
    return absl::InternalError(absl::StrCat("--device=", job.device, ": rank ", env.rank, " chose ",
                                            choice.device.ToString(), " but its group runs on ",
                                            dist.device.ToString()));
  }
  const absl::Status status = RunJob(job, dist, timeout);
  // Report while the process group is alive (see ReportFailure).
  if (!status.ok()) ReportFailure(job, status, dist.group->rank());
  return status;
}

// Starts --world_size ranks of this binary through the local launcher, then prints the
// summary rank 0 wrote.
int LaunchLocalRanks(const JobOptions& job, int argc, char** argv) {
  if (absl::Status s = integration::internal::MakeOutputDir(job); !s.ok()) {
    std::fprintf(stderr, "main job: %s\n", s.ToString().c_str());
    return 1;
  }
  const std::string summary_path =
      absl::StrCat(job.output_dir, "/", integration::internal::kSummaryFile);
  std::remove(summary_path.c_str());
  // Refuse what can be checked without the ranks before starting them.
  if (absl::Status s = integration::internal::CheckBeforeLaunch(job); !s.ok()) {
    std::fprintf(stderr, "main job: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  std::vector<std::string> args(argv + 1, argv + argc);
  // Every rank writes into the same output directory: make the default explicit so it
  // does not depend on each rank's working directory.
  args.push_back(absl::StrCat("--output_dir=", job.output_dir));
  ::setenv(kLaunchedByParent, "1", 1);
  std::printf("main job: starting %d local ranks (comm/launcher.h); output in %s\n", job.world_size,
              job.output_dir.c_str());
  std::fflush(stdout);
  comm::LaunchOptions launch;
  launch.max_restarts = job.max_restarts;  // NOTE [Restarts] in comm/launcher.h
  launch.min_nproc = job.min_world_size;
  absl::StatusOr<int> launched = comm::RunLocalRanks(job.world_size, args, launch);
  if (!launched.ok()) {
    std::fprintf(stderr, "main job: %s\n", launched.status().ToString().c_str());
    return 1;
  }
  const int rc = *launched;
  if (rc != 0) {
    std::fprintf(stderr, "main job: the ranks failed (exit status %d); see their output above\n",
                 rc);
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
  integration::internal::PrintSummary(summary);
  return 0;
}

// --help lists the job's flags, which trainer/internal/job_options.cc defines (absl's
// default lists only the flags of the file that holds main).
bool IsJobFlagFile(absl::string_view file) {
  return absl::StrContains(file, "trainer/internal/job_options.cc") ||
         absl::StrContains(file, "trainer/main_job.cc");
}

}  // namespace

int main(int argc, char** argv) {
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = IsJobFlagFile;
  usage.contains_helpshort_flags = IsJobFlagFile;
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage(
      "Trains, tests, checkpoints and releases a GPT or a Llama (--model, or a Hugging Face "
      "checkpoint: --hf_dir) with FSDP over local ranks (README.md).");
  absl::ParseCommandLine(argc, argv);
  const JobOptions job = integration::internal::JobOptionsFromFlags();
  if (job.memory_plan) {
    absl::StatusOr<absl::Duration> timeout = core::TimeoutFromSeconds(job.timeout_s, "--timeout_s");
    absl::StatusOr<std::string> report =
        timeout.ok() ? integration::internal::MemoryPlanReport(job, *timeout)
                     : absl::StatusOr<std::string>(timeout.status());
    if (!report.ok()) {
      std::fprintf(stderr, "main_job: --memory_plan: %s\n", report.status().ToString().c_str());
      return 1;
    }
    std::printf("%s", report->c_str());
    return 0;
  }
  if (!comm::IsLaunchedRank()) return LaunchLocalRanks(job, argc, argv);
  const absl::Status status = RunRank(job);
  if (!status.ok()) {
    const absl::StatusOr<comm::LaunchEnv> env = comm::ReadLaunchEnv();
    ReportFailure(job, status, env.ok() ? env->rank : -1);  // failed before joining the group
    return 1;
  }
  return 0;
}
