// What one rank of the main job (trainer/main_job.cc) sets up before its first
// collective: the model's module (GPT or Llama, --model) on the rank's device, the --testonly_fault
// hook, the stages and their options, the intra-op threads, and the check that this host can hold
// the run.
//
//   absl::StatusOr<integration::internal::JobSetup> setup =
//       integration::internal::SetUpRank(job, dist, timeout);
//   // Setting up can fail on some ranks only: agree before the first collective.
//   RETURN_IF_ERROR(comm::AgreeOnStatus(dist.group.get(), setup.status(), "main job setup",
//   timeout));
#ifndef TRAINER_INTERNAL_JOB_SETUP_H_
#define TRAINER_INTERNAL_JOB_SETUP_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/init_from_env.h"
#include "core/tensor.h"
#include "integration/decoder_module.h"
#include "integration/memory_estimate.h"
#include "integration/stage_options.h"
#include "integration/train_module.h"
#include "trainer/internal/job_options.h"
#include "trainer/internal/job_train_modules.h"

namespace integration {
namespace internal {

struct JobSetup {
  // The job as this rank runs it: the flags with their Hugging Face directories settled
  // (ResolveHfDirs; NOTE [Hugging Face start] in job_options.h).
  JobOptions job;
  // A GptTrainModule or LlamaTrainModule (CreateJobModule) on the rank's device.
  std::unique_ptr<DecoderTrainModule> module;
  std::unique_ptr<FaultInjector> fault;  // null without --testonly_fault
  // The model's full parameter shapes, for the safetensors export after release.
  std::map<std::string, core::Shape> full_shapes;
  std::vector<Stage> stages;
  StageOptions options;
  int intra_op_threads = 0;
  // The per-rank memory estimate the job was checked against (NOTE [Memory estimate]).
  MemoryEstimate estimate;

  // What the stages train: the fault injector around the module, or the module.
  TrainModule* trained() const;
};

// The launcher's restart count of this start (FSDP_RESTART_COUNT, NOTE [Restarts] in
// comm/launcher.h): 0 at the first start and when no launcher set it.
int RestartCount();

// Sets this rank up (rank 0 also creates job.output_dir) and sets its intra-op threads.
// The first error of: the output directory, ResolveHfDirs, the thread count, the module's
// options, --testonly_fault, --stages, StageOptionsFor, and a run that this host's memory
// (or the rank's GPU's) cannot hold, named with its shortfall, rather than be OOM-killed
// without a word.
absl::StatusOr<JobSetup> SetUpRank(const JobOptions& job, const comm::Distributed& dist,
                                   absl::Duration timeout);

// The TrainModule of --model on `device`: a GptTrainModule (errors naming
// GptModuleOptions and GptConfig, as ever) or a LlamaTrainModule (errors naming the flags:
// WithLlamaFlagNames).
absl::StatusOr<std::unique_ptr<DecoderTrainModule>> CreateJobModule(const JobOptions& job,
                                                                    core::Device device);

// The wrap plan of `model` under `options` for `world` ranks, with the checkpoint policy's
// modules (policy::Plan over the shard group size).
absl::StatusOr<policy::WrapPlan> PlanJob(const core::Module& model, const StageOptions& options,
                                         int world);

// NOTE [Memory estimate] (integration/memory_estimate.h) of a job training `model` (its
// shapes; it may be deferred) with these options on `world` ranks, `local_ranks` of them on
// this host: the figure the job checks before it starts. Its activation term is the GPT's
// formula, so it is estimated for an nn::Gpt only; for any other model (the Llama) the
// estimate leaves activations out and says so (MemoryEstimate::activations_estimated).
absl::StatusOr<MemoryEstimate> EstimateJobMemory(const core::Module& model,
                                                 const DecoderTrainOptions& train,
                                                 const StageOptions& options, int world,
                                                 int local_ranks, core::Device device);

// --memory_plan: the wrap plan of the job's model (--model, or --hf_dir's: ResolveHfDirs)
// and its per-rank memory estimate as asked and with and without activation checkpointing
// of every block and deferred initialisation, without starting any rank (the model is
// built deferred: any size).
absl::StatusOr<std::string> MemoryPlanReport(const JobOptions& job, absl::Duration timeout);

// The lines rank 0 prints before the first stage: the model, the language and the job.
std::vector<std::string> DescribeJob(const JobOptions& job, const JobSetup& setup,
                                     const comm::Distributed& dist);

}  // namespace internal
}  // namespace integration

#endif  // TRAINER_INTERNAL_JOB_SETUP_H_
