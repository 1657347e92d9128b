// The main job's command line (trainer/main_job.cc) as a typed struct: the flags are
// defined here, read once into JobOptions, and turned into the options of the layers the
// job drives (GptModuleOptions or LlamaModuleOptions, StageOptions) by the functions
// below. Every error names the flag.
//
//   absl::ParseCommandLine(argc, argv);
//   const integration::internal::JobOptions job = integration::internal::JobOptionsFromFlags();
//   RETURN_IF_ERROR(integration::internal::CheckBeforeLaunch(job));   // the parent's checks
//   ASSIGN_OR_RETURN(std::vector<integration::Stage> stages,
//                    integration::internal::ParseStages(job.stages));
//   // On each rank: the job with its Hugging Face directories settled.
//   ASSIGN_OR_RETURN(integration::internal::JobOptions resolved,
//                    integration::internal::ResolveHfDirs(job));
//
// NOTE [Hugging Face start]: with an hf_dir (--hf_dir, or StageConfig.hf_dir of
// --stage_config, which replaces it as the file's set fields replace flags), config.json's
// model_type picks the model (gpt2: --model=gpt, llama: --model=llama) and its sizes make
// the model's config, in place of --model and the size flags. A model flag left at its
// default takes config.json's value; one set to another value must agree with config.json
// or the job is refused naming both. The model is built deferred (--deferred_init), each
// rank wraps it before any stage and loads config.json's weights straight into its shards
// (checkpoint::LoadHfModel), so no rank holds the whole model. With --resume_from as well,
// the hf_dir gives the model's config only: the weights (and with fit the optimizer state)
// are the checkpoint's, and the hf_dir's weights are not read. An export_hf_dir
// (--export_hf_dir or StageConfig.export_hf_dir) is written by rank 0 after the release
// (checkpoint::ExportHfModel: config.json and model.safetensors, which transformers and
// --hf_dir read), whether or not the run started from an hf_dir. Without --stage_config the
// parent makes these checks before it starts the ranks; a --stage_config is read on the
// ranks only, so with one they make them.
#ifndef TRAINER_INTERNAL_JOB_OPTIONS_H_
#define TRAINER_INTERNAL_JOB_OPTIONS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "integration/decoder_module.h"
#include "integration/gpt_module.h"
#include "integration/llama_module.h"
#include "integration/stage_options.h"
#include "integration/train_module.h"

namespace integration {
namespace internal {

// The flags, with the paths resolved (NOTE [Paths under bazel run] in the .cc).
// --resume_from=latest: the newest complete checkpoint under the checkpoint directory
// (StageRunner::ResumeLatest).
inline constexpr char kResumeLatest[] = "latest";

struct JobOptions {
  int world_size = 0;       // --world_size: local ranks to start (not under a launcher)
  std::string backend;      // --backend
  std::string device;       // --device
  std::string stages;       // --stages as given (ParseStages reads it)
  std::string resume_from;  // --resume_from; "" for none, kResumeLatest, or a directory
  // --resume_allow_data_change: a resume may read other data than the checkpoint's
  // (LoadCheckpointOptions::allow_data_change, NOTE [Data identity]).
  bool resume_allow_data_change = false;
  // NOTE [Hugging Face start]: --hf_dir and --export_hf_dir, or the StageConfig fields
  // that replace them (ResolveHfDirs); "" for none. Errors name the flag or the field
  // that set each (`hf_dir_name`, `export_hf_dir_name`).
  std::string hf_dir;
  std::string export_hf_dir;
  std::string hf_dir_name = "--hf_dir";
  std::string export_hf_dir_name = "--export_hf_dir";
  // The model flags (--model and the size flags, by name: "model", "n_embd", ...) set to
  // other than their defaults: with an hf_dir each must agree with config.json.
  std::vector<std::string> model_flags_set;
  std::string output_dir;        // --output_dir, or out/main_job
  std::string checkpoint_dir;    // --checkpoint_dir, or <output_dir>/checkpoint
  std::string safetensors_path;  // --safetensors_path, or <output_dir>/model.safetensors
  bool release = true;           // --release
  std::string stage_config;      // --stage_config; "" for none
  // The wrap and the stages (StageOptionsFor).
  std::string strategy;
  int hybrid_shard_size = 0;
  std::string forward_prefetch = "auto";  // true, false, auto (on for CUDA)
  bool cpu_offload = false;
  bool deterministic = false;
  int deterministic_micro_batches = 8;
  bool profile_ops = false;  // --profile_ops: StageOptions::profile_step = the last fit step
  // --throughput_warmup_steps: the fit steps the throughput figures leave out
  // (integration::ThroughputMeter); nullopt: its default, min(5, steps / 10).
  std::optional<int64_t> throughput_warmup_steps;
  std::string param_dtype;
  int64_t steps = 0;
  int64_t max_steps = 0;  // --max_steps (NOTE [Training to a global step])
  int batch_size = 0;
  int grad_accumulation = 1;            // --grad_accumulation: micro-batches per step
  std::string accumulation;             // --accumulation: reduce_each or no_sync
  int activation_checkpoint_every = 0;  // --activation_checkpoint_every: 0 none, k every k-th block
  bool memory_plan = false;             // --memory_plan: print the plan and estimate, exit
  int eval_batch_size = 0;
  int eval_batches = 0;
  int64_t log_every = 0;
  // NOTE [Periodic checkpoints] (stage_options.h).
  int64_t checkpoint_every_steps = 0;   // --checkpoint_every_steps
  double checkpoint_every_minutes = 0;  // --checkpoint_every_minutes
  int keep_checkpoints = 0;             // --keep_checkpoints
  bool async_checkpoints = false;       // --async_checkpoints
  int max_restarts = 0;                 // --max_restarts (comm/launcher.h NOTE [Restarts])
  int min_world_size = 0;               // --min_world_size: 0 = --world_size (never fewer)
  // The model: --model (ParseModelKind), what both models' modules take (the language or
  // token files, --seq_len, AdamW, the warm-up, deferred init; `train.device` is the CPU:
  // each rank sets its own), and each model's config from the dimension flags.
  std::string model_kind;  // --model: gpt or llama
  DecoderTrainOptions train;
  nn::GptConfig gpt;         // --model=gpt
  nn::LlamaConfig llama;     // --model=llama
  int intra_op_threads = 0;  // --intra_op_threads; 0 = auto (IntraOpThreads)
  double timeout_s = 0;      // --timeout_s (core::TimeoutFromSeconds checks it)
  std::string testonly_fault;
  int testonly_failure_print_delay_ms = 0;
};

// Which decoder the job trains (--model).
enum class ModelKind { kGpt, kLlama };

// "gpt" -> kGpt, "llama" -> kLlama; InvalidArgument naming --model otherwise.
absl::StatusOr<ModelKind> ParseModelKind(const std::string& text);

// --intermediate_size's default for a width C: the SwiGLU width 8 C / 3 rounded up to a
// multiple of 8, that is 8 ceil(C / 3) (176 for C = 64; 0 for C <= 0, which
// LlamaConfig::Validate names as --n_embd first).
int64_t DefaultIntermediateSize(int64_t hidden_size);

// The module options of --model=gpt and --model=llama: job.train with the model's config.
GptModuleOptions GptOptionsFor(const JobOptions& job);
LlamaModuleOptions LlamaOptionsFor(const JobOptions& job);

// The job's model as DecoderTrainModule builds it (GptTrainModule::Spec or
// LlamaTrainModule::Spec of its config); ParseModelKind's error.
absl::StatusOr<DecoderSpec> ModelSpecFor(const JobOptions& job);

// `status` with the LlamaConfig and LlamaModuleOptions fields that flags set named as
// those flags: "LlamaConfig.num_key_value_heads (3) must divide
// LlamaConfig.num_attention_heads (4)" -> "--n_kv_head (3) must divide --n_head (4)".
absl::Status WithLlamaFlagNames(const absl::Status& status);

// The model flags' checks that need no rank: --model, and for --model=llama the config
// (LlamaConfig::Validate) and --seq_len <= --block_size, each naming the flag. With an
// hf_dir (ResolveHfDirs read the config from config.json): --seq_len within config.json's
// context.
absl::Status CheckModelFlags(const JobOptions& job);

// NOTE [Hugging Face start]: `job` with StageConfig.hf_dir and StageConfig.export_hf_dir of
// job.stage_config in place of the flags where set, and with an hf_dir, model_kind, the
// model's config (the seed stays --seed's) and deferred init from it. InvalidArgument
// naming the flag or field for an export directory without --release or that is the
// hf_dir, and for a set model flag that disagrees with config.json (naming the flag, the
// file and the field); ReadStageConfigFile's errors; config.json's readers' errors
// (checkpoint::ReadHfModelType, ReadHfGpt2Config, ReadHfLlamaConfig) after the flag or
// field.
absl::StatusOr<JobOptions> ResolveHfDirs(const JobOptions& job);

// The flags as parsed by absl::ParseCommandLine. Never fails: the checks come later, where
// their errors are reported (CheckBeforeLaunch, ParseStages, StageOptionsFor, ...).
JobOptions JobOptionsFromFlags();

// Creates job.output_dir and its parents; PermissionDenied naming --output_dir.
absl::Status MakeOutputDir(const JobOptions& job);

// The checks the launching parent makes before it starts any rank (world size, stages,
// --resume_allow_data_change only with --resume_from, --throughput_warmup_steps,
// without --stage_config the Hugging Face directories (ResolveHfDirs), the model flags,
// strategy, intra-op threads, timeout, device and backend), so a refusal comes once: the
// first failure, with the message the parent prints after "main job: ".
absl::Status CheckBeforeLaunch(const JobOptions& job);

// --throughput_warmup_steps, when given, in [0, --steps - 2] (at least one step timed:
// integration::ThroughputMeter times a step up to the next one's start); InvalidArgument
// naming the flag otherwise. CheckBeforeLaunch and StageOptionsFor call it.
absl::Status CheckThroughputWarmup(const JobOptions& job);

// "fit,test" -> {kFit, kTest}; InvalidArgument naming --stages for an unknown stage.
absl::StatusOr<std::vector<Stage>> ParseStages(const std::string& text);

// Ranks of this job on this host: the local world size of the launch environment
// (LOCAL_WORLD_SIZE, or Open MPI's or Slurm's: NOTE [Launch environment] in
// comm/init_from_env.h) when it is complete and valid, else `world`.
int LocalRanks(int world);

// The intra-op thread count of each rank: --intra_op_threads, or when it is 0, the
// environment's OMP_NUM_THREADS (a launcher's or the user's choice), else the hardware
// threads shared by the ranks on this host. InvalidArgument when the flag is negative.
absl::StatusOr<int> IntraOpThreads(const JobOptions& job, int world);

// The stages' options: one FSDP unit per block of the model (TransformerBlock, or
// LlamaDecoderLayer for --model=llama; --activation_checkpoint_every counts them),
// --strategy and the other wrap flags, the batch and step flags, `checkpoint_dir`, then the
// fields --stage_config sets (read here, so this can fail on some ranks only).
// InvalidArgument naming the flag, or ReadStageOptionsFile's error.
absl::StatusOr<StageOptions> StageOptionsFor(const JobOptions& job, absl::Duration timeout);

}  // namespace internal
}  // namespace integration

#endif  // TRAINER_INTERNAL_JOB_OPTIONS_H_
