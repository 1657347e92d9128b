#include "integration/internal/job_setup.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/safetensors.h"
#include "core/format_bytes.h"
#include "core/status_macros.h"
#include "fsdp/options.h"
#include "integration/device_setup.h"
#include "integration/memory_estimate.h"
#include "nn/ops.h"
#include "policy/plan.h"
#include "policy/wrap_policy.h"

namespace integration {
namespace internal {
namespace {

// Refuses a run this host's memory (or the rank's GPU's) cannot hold, naming the shortfall;
// keeps the estimate in setup->estimate.
absl::Status CheckFitsInMemory(JobSetup* setup_out, int world, core::Device device) {
  const JobSetup& setup = *setup_out;
  const StageOptions& options = setup.options;
  MemoryEstimateInput need;
  const std::shared_ptr<const policy::WrapPolicy> wrap_policy =
      options.wrap.policy != nullptr ? options.wrap.policy : policy::Never();
  policy::PlanOptions plan_options;
  plan_options.checkpoint_policy = options.wrap.checkpoint_policy.get();
  ASSIGN_OR_RETURN(policy::WrapPlan plan,
                   policy::Plan(*setup.module->model(), *wrap_policy, world, plan_options));
  need.model = ModelSizesFromPlan(plan);
  need.world_size = world;
  need.local_ranks = LocalRanks(world);
  need.strategy = options.wrap.strategy;
  need.hybrid_shard_size = options.wrap.hybrid_shard_size;
  need.limit_all_gathers = options.wrap.limit_all_gathers;
  need.param_dtype = options.wrap.mixed_precision.param_dtype;
  need.device = device;
  // Activations of the largest batch one pass holds: a training micro-batch or an
  // evaluation batch.
  need.activations = GptActivations(
      setup.model_options.model,
      std::max(options.train_batch_size / options.grad_accumulation, options.eval_batch_size) /
          world,
      setup.model_options.seq_len);
  need.activations->checkpointed_blocks = GptCheckpointedBlocks(plan);
  need.deferred_init = setup.model_options.deferred_init;
  need.no_sync_accumulation = options.grad_accumulation > 1 &&
                              options.accumulation == StageOptions::Accumulation::kNoSync;
  ASSIGN_OR_RETURN(MemoryEstimate estimate, EstimateMemory(need));
  setup_out->estimate = estimate;
  RETURN_IF_ERROR(CheckFitsInHostMemory(estimate));
  if (device.is_cuda()) {
    ASSIGN_OR_RETURN(DeviceMemoryInfo info, ReadDeviceMemoryInfo(device));
    RETURN_IF_ERROR(CheckFitsInDeviceMemory(
        estimate, info.free_bytes,
        absl::StrCat("free on ", device.ToString(), " ", core::FormatBytes(info.free_bytes), " of ",
                     core::FormatBytes(info.total_bytes))));
  }
  return absl::OkStatus();
}

}  // namespace

TrainModule* JobSetup::trained() const {
  return fault != nullptr ? static_cast<TrainModule*>(fault.get()) : module.get();
}

absl::StatusOr<JobSetup> SetUpRank(const JobOptions& job, const comm::Distributed& dist,
                                   absl::Duration timeout) {
  const int rank = dist.group->rank();
  const int world = dist.group->size();
  JobSetup setup;
  if (rank == 0) RETURN_IF_ERROR(MakeOutputDir(job));
  ASSIGN_OR_RETURN(setup.intra_op_threads, IntraOpThreads(job, world));
  RETURN_IF_ERROR(nn::SetIntraOpThreads(setup.intra_op_threads));
  setup.model_options = job.model;
  setup.model_options.device = dist.device;
  ASSIGN_OR_RETURN(setup.module, GptTrainModule::Create(setup.model_options));
  if (!job.testonly_fault.empty()) {
    ASSIGN_OR_RETURN(setup.fault, FaultInjector::Parse(job.testonly_fault, rank, setup.module.get()));
  }
  setup.full_shapes = checkpoint::ParameterShapes(*setup.module->model());
  ASSIGN_OR_RETURN(setup.stages, ParseStages(job.stages));
  ASSIGN_OR_RETURN(setup.options, StageOptionsFor(job, timeout));
  RETURN_IF_ERROR(CheckFitsInMemory(&setup, world, dist.device));
  return setup;
}

std::vector<std::string> DescribeJob(const JobOptions& job, const JobSetup& setup,
                                     const comm::Distributed& dist) {
  const nn::GptConfig& model = setup.model_options.model;
  std::vector<std::string> lines;
  const GptModuleOptions& mo = setup.model_options;
  const std::string data =
      setup.module->uses_token_files()
          ? absl::StrCat("token files ", mo.data_path,
                         mo.eval_data_path.empty() ? "" : absl::StrCat(" (evaluation ", mo.eval_data_path, ")"))
          : absl::StrFormat("a Markov language of order %d", mo.language.order);
  lines.push_back(absl::StrFormat(
      "main job: GPT (vocab %d, context %d, width %d, %d layers, %d heads, %d parameters) on "
      "%s; %d ranks (%s, %s), %s, stages %s; %d intra-op threads per rank, GEMM %s",
      model.vocab_size, model.block_size, model.n_embd, model.n_layer, model.n_head,
      setup.module->model()->NumParameterElements(), data, dist.group->size(),
      dist.group->backend_name(), dist.device.ToString(),
      fsdp::ShardingStrategyName(setup.options.wrap.strategy), job.stages,
      setup.intra_op_threads, nn::GemmLibrary()));
  if (!setup.module->uses_token_files() &&
      setup.module->language().vocab_size() != model.vocab_size) {
    lines.push_back(absl::StrFormat(
        "main job: the Markov language uses token ids 0..%d of the model's %d "
        "(its transition table is dense; NOTE [Language vocabulary] in "
        "integration/gpt_module.h)",
        setup.module->language().vocab_size() - 1, model.vocab_size));
  }
  return lines;
}

}  // namespace internal
}  // namespace integration
