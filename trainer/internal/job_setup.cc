#include "trainer/internal/job_setup.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/safetensors.h"
#include "comm/launcher.h"
#include "core/format_bytes.h"
#include "core/param_init.h"
#include "core/status_macros.h"
#include "fsdp/options.h"
#include "integration/device_setup.h"
#include "integration/gpt_module.h"
#include "integration/llama_module.h"
#include "integration/memory_estimate.h"
#include "nn/gpt.h"
#include "nn/llama.h"
#include "nn/ops.h"
#include "policy/plan.h"
#include "policy/plan_report.h"
#include "policy/wrap_policy.h"

namespace integration {
namespace internal {

absl::StatusOr<std::unique_ptr<DecoderTrainModule>> CreateJobModule(const JobOptions& job,
                                                                    core::Device device) {
  ASSIGN_OR_RETURN(const ModelKind kind, ParseModelKind(job.model_kind));
  if (kind == ModelKind::kLlama) {
    LlamaModuleOptions options = LlamaOptionsFor(job);
    options.device = device;
    absl::StatusOr<std::unique_ptr<LlamaTrainModule>> module = LlamaTrainModule::Create(options);
    if (!module.ok()) return WithLlamaFlagNames(module.status());
    return std::unique_ptr<DecoderTrainModule>(*std::move(module));
  }
  GptModuleOptions options = GptOptionsFor(job);
  options.device = device;
  ASSIGN_OR_RETURN(std::unique_ptr<GptTrainModule> module, GptTrainModule::Create(options));
  return std::unique_ptr<DecoderTrainModule>(std::move(module));
}

absl::StatusOr<policy::WrapPlan> PlanJob(const core::Module& model, const StageOptions& options,
                                         int world) {
  const std::shared_ptr<const policy::WrapPolicy> wrap_policy =
      options.wrap.policy != nullptr ? options.wrap.policy : policy::Never();
  policy::PlanOptions plan_options;
  plan_options.ignored_paths = options.wrap.ignored_paths;
  plan_options.checkpoint_policy = options.wrap.checkpoint_policy.get();
  return policy::Plan(model, *wrap_policy, fsdp::ShardGroupSize(options.wrap, world), plan_options);
}

absl::StatusOr<MemoryEstimate> EstimateJobMemory(const core::Module& model,
                                                 const DecoderTrainOptions& train,
                                                 const StageOptions& options, int world,
                                                 int local_ranks, core::Device device) {
  ASSIGN_OR_RETURN(policy::WrapPlan plan, PlanJob(model, options, world));
  MemoryEstimateInput need;
  need.model = ModelSizesFromPlan(plan);
  need.world_size = world;
  need.local_ranks = local_ranks;
  need.strategy = options.wrap.strategy;
  need.hybrid_shard_size = options.wrap.hybrid_shard_size;
  need.limit_all_gathers = options.wrap.limit_all_gathers;
  need.param_dtype = options.wrap.mixed_precision.param_dtype;
  need.device = device;
  // Activations of the largest batch one pass holds: a training micro-batch or an
  // evaluation batch. The formula is the GPT's (NOTE [Memory estimate]): another model's
  // activations are left out rather than estimated wrongly.
  if (const auto* gpt = dynamic_cast<const nn::Gpt*>(&model); gpt != nullptr) {
    need.activations = GptActivations(
        gpt->config(),
        std::max(options.train_batch_size / options.grad_accumulation, options.eval_batch_size) /
            world,
        train.seq_len);
    need.activations->checkpointed_blocks = GptCheckpointedBlocks(plan);
  }
  need.deferred_init = train.deferred_init;
  need.cpu_offload = options.wrap.cpu_offload;
  need.no_sync_accumulation =
      options.grad_accumulation > 1 && options.accumulation == StageOptions::Accumulation::kNoSync;
  return EstimateMemory(need);
}

namespace {

// Refuses a run this host's memory (or the rank's GPU's) cannot hold, naming the shortfall;
// keeps the estimate in setup->estimate.
absl::Status CheckFitsInMemory(JobSetup* setup_out, int world, core::Device device) {
  const JobSetup& setup = *setup_out;
  ASSIGN_OR_RETURN(MemoryEstimate estimate,
                   EstimateJobMemory(*setup.module->model(), setup.module->train_options(),
                                     setup.options, world, LocalRanks(world), device));
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

absl::StatusOr<std::string> MemoryPlanReport(const JobOptions& flags, absl::Duration timeout) {
  ASSIGN_OR_RETURN(const JobOptions job, ResolveHfDirs(flags));
  const int world = job.world_size;
  if (world < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--world_size=", world, " must be >= 1"));
  }
  RETURN_IF_ERROR(CheckModelFlags(job));
  ASSIGN_OR_RETURN(StageOptions options, StageOptionsFor(job, timeout));
  ASSIGN_OR_RETURN(const DecoderSpec spec, ModelSpecFor(job));
  // Shapes only: the model is built deferred, whatever its size (NOTE [Deferred
  // initialisation] in core/param_init.h).
  std::shared_ptr<core::Module> model;
  {
    core::DeferredInitScope deferred;
    ASSIGN_OR_RETURN(model, spec.build());
  }
  const core::Device device = job.device == "cuda" ? core::Device::Cuda(0) : core::Device::Cpu();
  ASSIGN_OR_RETURN(policy::WrapPlan plan, PlanJob(*model, options, world));
  std::string out = policy::FormatPlanTable(plan);
  absl::StrAppend(&out,
                  "\nPer-rank memory estimate (NOTE [Memory estimate] in "
                  "integration/memory_estimate.h), ",
                  world, " ranks, ", LocalRanks(world), " on this host, ", device.ToString(),
                  ":\n");
  absl::StrAppend(
      &out, absl::StrFormat("  %-44s %12s %12s %12s %12s %12s %12s %12s\n", "mode", "per rank",
                            "init", "state", "gathered", "activations", "comm", "host"));
  struct Variant {
    std::string name;
    bool checkpoint_every_block;
    bool deferred;
    bool offload = false;
  };
  const bool asked_checkpoint = options.wrap.checkpoint_policy != nullptr;
  std::vector<Variant> variants = {
      {"as asked", asked_checkpoint, job.train.deferred_init, options.wrap.cpu_offload},
      {"no checkpointing, full init", false, false},
      {"every block checkpointed, full init", true, false},
      {"no checkpointing, deferred init", false, true},
      {"every block checkpointed, deferred init", true, true}};
  if (device.is_cuda()) {
    // NOTE [CPU offload]: the device keeps what it computes with; the host column says
    // what the state costs there.
    variants.push_back({"every block checkpointed, deferred, offload", true, true, true});
  }
  bool activations_estimated = true;
  for (const Variant& v : variants) {
    StageOptions o = options;
    DecoderTrainOptions m = job.train;
    if (v.name != "as asked") {
      o.wrap.checkpoint_policy =
          v.checkpoint_every_block ? policy::ModuleTypes({spec.block_type}) : nullptr;
      m.deferred_init = v.deferred;
      o.wrap.cpu_offload = v.offload;
    }
    ASSIGN_OR_RETURN(MemoryEstimate e,
                     EstimateJobMemory(*model, m, o, world, LocalRanks(world), device));
    activations_estimated = e.activations_estimated;
    absl::StrAppend(
        &out,
        absl::StrFormat(
            "  %-44s %12s %12s %12s %12s %12s %12s %12s\n", v.name,
            core::FormatBytes(e.per_rank_bytes), core::FormatBytes(e.init_bytes),
            core::FormatBytes(e.model_state_bytes), core::FormatBytes(e.gathered_bytes),
            e.activations_estimated ? core::FormatBytes(e.activation_bytes) : std::string("-"),
            core::FormatBytes(e.comm_bytes), core::FormatBytes(e.per_host_bytes)));
  }
  if (!activations_estimated) absl::StrAppend(&out, "  ", kActivationsNotEstimated, "\n");
  return out;
}

TrainModule* JobSetup::trained() const {
  return fault != nullptr ? static_cast<TrainModule*>(fault.get()) : module.get();
}

int RestartCount() {
  const char* text = std::getenv(comm::kRestartCountEnv);
  int count = 0;
  return text != nullptr && absl::SimpleAtoi(text, &count) && count > 0 ? count : 0;
}

absl::StatusOr<JobSetup> SetUpRank(const JobOptions& flags, const comm::Distributed& dist,
                                   absl::Duration timeout) {
  const int rank = dist.group->rank();
  const int world = dist.group->size();
  JobSetup setup;
  if (rank == 0) RETURN_IF_ERROR(MakeOutputDir(flags));
  ASSIGN_OR_RETURN(setup.job, ResolveHfDirs(flags));
  const JobOptions& job = setup.job;
  ASSIGN_OR_RETURN(setup.intra_op_threads, IntraOpThreads(job, world));
  RETURN_IF_ERROR(nn::SetIntraOpThreads(setup.intra_op_threads));
  ASSIGN_OR_RETURN(setup.module, CreateJobModule(job, dist.device));
  // The test hook's faults name the start they fire at (0 unless a fault says otherwise: a
  // restarted job, NOTE [Restarts] in comm/launcher.h, runs clean).
  if (!job.testonly_fault.empty()) {
    ASSIGN_OR_RETURN(setup.fault, FaultInjector::Parse(job.testonly_fault, rank, setup.module.get(),
                                                       RestartCount()));
  }
  setup.full_shapes = checkpoint::ParameterShapes(*setup.module->model());
  ASSIGN_OR_RETURN(setup.stages, ParseStages(job.stages));
  ASSIGN_OR_RETURN(setup.options, StageOptionsFor(job, timeout));
  if (setup.fault != nullptr) setup.options.testonly_write_error = setup.fault->WriteErrorHook();
  RETURN_IF_ERROR(CheckFitsInMemory(&setup, world, dist.device));
  return setup;
}

std::vector<std::string> DescribeJob(const JobOptions& job, const JobSetup& setup,
                                     const comm::Distributed& dist) {
  std::vector<std::string> lines;
  const DecoderTrainOptions& mo = setup.module->train_options();
  const int64_t vocab_size = setup.module->spec().vocab_size;
  const std::string data =
      setup.module->uses_token_files()
          ? absl::StrCat("token files ", mo.data_path,
                         mo.eval_data_path.empty()
                             ? ""
                             : absl::StrCat(" (evaluation ", mo.eval_data_path, ")"))
          : absl::StrFormat("a Markov language of order %d", mo.language.order);
  std::string model;
  if (ParseModelKind(job.model_kind).value_or(ModelKind::kGpt) == ModelKind::kLlama) {
    const nn::LlamaConfig& c = job.llama;
    model = absl::StrFormat(
        "Llama (vocab %d, context %d, width %d, %d layers, %d heads, %d key/value heads, SwiGLU "
        "width %d, rope theta %g, %s head, %d parameters)",
        c.vocab_size, c.max_position_embeddings, c.hidden_size, c.num_hidden_layers,
        c.num_attention_heads, c.num_key_value_heads, c.intermediate_size, c.rope_theta,
        c.tie_word_embeddings ? "tied" : "untied", setup.module->model()->NumParameterElements());
  } else {
    const nn::GptConfig& c = job.gpt;
    model = absl::StrFormat(
        "GPT (vocab %d, context %d, width %d, %d layers, %d heads, %d "
        "parameters)",
        c.vocab_size, c.block_size, c.n_embd, c.n_layer, c.n_head,
        setup.module->model()->NumParameterElements());
  }
  lines.push_back(absl::StrFormat(
      "main job: %s on %s; %d ranks (%s, %s), %s, stages %s; %d intra-op threads per rank, "
      "GEMM %s",
      model, data, dist.group->size(), dist.group->backend_name(), dist.device.ToString(),
      fsdp::ShardingStrategyName(setup.options.wrap.strategy), job.stages, setup.intra_op_threads,
      nn::GemmLibrary()));
  if (!setup.module->uses_token_files() && setup.module->language().vocab_size() != vocab_size) {
    lines.push_back(
        absl::StrFormat("main job: the Markov language uses token ids 0..%d of the model's %d "
                        "(its transition table is dense; NOTE [Language vocabulary] in "
                        "integration/decoder_module.h)",
                        setup.module->language().vocab_size() - 1, vocab_size));
  }
  if (!setup.estimate.activations_estimated) {
    lines.push_back(absl::StrCat("main job: ", kActivationsNotEstimated));
  }
  // NOTE [Restarts] in comm/launcher.h: a restart that left out lost ranks.
  const char* initial = std::getenv(comm::kInitialWorldSizeEnv);
  int initial_world = 0;
  if (initial != nullptr && absl::SimpleAtoi(initial, &initial_world) &&
      initial_world > dist.group->size()) {
    lines.push_back(absl::StrFormat(
        "main job: continuing at %d of %d ranks (ranks were lost for good; --batch_size %d kept)",
        dist.group->size(), initial_world, job.batch_size));
  }
  if (!job.hf_dir.empty()) {  // NOTE [Hugging Face start] in job_options.h
    lines.push_back(absl::StrCat("main job: the model's config is ", job.hf_dir, "/config.json's (",
                                 job.hf_dir_name, "); its weights ",
                                 job.resume_from.empty()
                                     ? "load into each rank's shards after the wrap"
                                     : "are --resume_from's"));
  }
  return lines;
}

}  // namespace internal
}  // namespace integration
