#include "trainer/internal/job_options.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <system_error>
#include <thread>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "checkpoint/hf_gpt2.h"
#include "checkpoint/hf_llama.h"
#include "checkpoint/hf_model.h"
#include "comm/init_from_env.h"
#include "core/dtype.h"
#include "core/status_macros.h"
#include "core/timeout.h"
#include "integration/device_setup.h"
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
          "optimizer state and step are restored and training continues. 'latest': the "
          "newest complete checkpoint under --checkpoint_dir (damaged ones skipped, with a "
          "warning); none there starts fresh");
ABSL_FLAG(bool, resume_allow_data_change, false,
          "with --resume_from and fit: resume even when the training data differ from the "
          "checkpoint's (token files, their content, --seed, the language, --seq_len), and print "
          "what differs; without it such a resume is refused naming each differing field");
ABSL_FLAG(std::string, hf_dir, "",
          "Hugging Face checkpoint directory to start from (config.json, model.safetensors or "
          "its index; GPT-2 or Llama): config.json's model_type and sizes make the model in "
          "place of --model and the size flags (one set to other than its default must agree "
          "with config.json), built deferred, and each rank loads its weights into its shards "
          "before the first stage; with --resume_from the weights are the checkpoint's");
ABSL_FLAG(std::string, export_hf_dir, "",
          "after the release, rank 0 also exports the model here in the Hugging Face layout "
          "(config.json and model.safetensors, which transformers and --hf_dir read); needs "
          "--release");
ABSL_FLAG(std::string, output_dir, "",
          "where the checkpoint, safetensors file, charts and summary go (default: out/main_job "
          "in the workspace under bazel run, else ./out/main_job)");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "where fit saves its checkpoint (default <output_dir>/checkpoint)");
ABSL_FLAG(int64_t, checkpoint_every_steps, 0,
          "save a checkpoint under --checkpoint_dir (step-<N>) every this many global steps "
          "during fit (0: only at its end, to --checkpoint_dir itself)");
ABSL_FLAG(double, checkpoint_every_minutes, 0,
          "save a checkpoint under --checkpoint_dir at the first progress line after this many "
          "minutes since the last (0: off)");
ABSL_FLAG(int, keep_checkpoints, 0,
          "with periodic checkpoints, keep only the newest this many (0: all)");
ABSL_FLAG(bool, async_checkpoints, false,
          "write periodic checkpoints on a background thread while training goes on (the step "
          "pays for a snapshot of the shards only)");
ABSL_FLAG(std::string, safetensors_path, "",
          "where the released model goes (default <output_dir>/model.safetensors)");
ABSL_FLAG(bool, release, true,
          "release the model at the end, export it as safetensors and test the plain module");
ABSL_FLAG(
    std::string, stage_config, "",
    "text-format StageConfig file (integration/stage.proto); its set fields override the flags");
ABSL_FLAG(std::string, strategy, "FULL_SHARD",
          "FULL_SHARD, SHARD_GRAD_OP, NO_SHARD or HYBRID_SHARD");
ABSL_FLAG(int, hybrid_shard_size, 0, "HYBRID_SHARD: ranks per shard group");
ABSL_FLAG(bool, profile_ops, false,
          "record the ops of the last fit step: a table per op category and summary.json's "
          "op_profile, with each category's device time on CUDA beside the roofline estimate "
          "on an H200 (core/op_profile.h, core/roofline.h)");
ABSL_FLAG(std::optional<int64_t>, throughput_warmup_steps, std::nullopt,
          "fit steps left out of tokens_per_second_after_warmup and device_timed (e.g. to "
          "leave out as many as a PyTorch run does), in [0, --steps - 2]: the figures time "
          "each later step from its start to the next step's start, so the last step is never "
          "timed (default min(5, --steps / 10)); not the learning-rate warm-up, --warmup_steps");
ABSL_FLAG(std::string, forward_prefetch, "auto",
          "issue the next unit's all-gather when a unit's forward starts (FSDP's "
          "forward_prefetch; its backward_prefetch is always on): true, false, or auto (on "
          "with --device=cuda, where the all-gather overlaps the unit's kernels; off on the "
          "CPU, whose ranks compute with every core)");
ABSL_FLAG(bool, deterministic, false,
          "N ranks give the bits of 1 rank (and a resume at another world size those of the "
          "uninterrupted run): the global batch in --deterministic_micro_batches fixed "
          "micro-batches, gradients summed in one binary tree; gloo or shm, power-of-two "
          "world sizes; --intra_op_threads defaults to 1");
ABSL_FLAG(int, deterministic_micro_batches, 8,
          "--deterministic: micro-batches per global batch (a power of two that the world size "
          "divides and that divides --batch_size)");
ABSL_FLAG(bool, cpu_offload, false,
          "keep the shards, gradient shards and AdamW state in pinned host memory and step on "
          "the CPU (FSDP2's CPUOffloadPolicy); --device=cuda only");
ABSL_FLAG(std::string, param_dtype, "float32", "mixed precision compute copy: float32 or bfloat16");
ABSL_FLAG(int64_t, steps, 300,
          "training steps of this run's fit (counted from where it starts: a resume trains "
          "this many more; see --max_steps)");
ABSL_FLAG(int64_t, max_steps, 0,
          "when > 0, fit trains up to this global step instead of --steps steps (Lightning's "
          "max_steps): a resumed or restarted run ends where the uninterrupted one does "
          "(StageOptions::max_steps, NOTE [Training to a global step])");
ABSL_FLAG(int, batch_size, 16,
          "sequences per global training batch (a multiple of the world size)");
ABSL_FLAG(int, eval_batch_size, 16, "sequences per global evaluation batch");
ABSL_FLAG(int, grad_accumulation, 1,
          "micro-batches per optimizer step, each --batch_size / this many sequences");
ABSL_FLAG(std::string, accumulation, "reduce_each",
          "how micro-batch gradients meet: reduce_each (reduce-scatter each; shard memory) or "
          "no_sync (keep full gradients, reduce once)");
ABSL_FLAG(bool, memory_plan, false,
          "print the wrap plan and the per-rank memory estimate (as asked, and with and without "
          "activation checkpointing and deferred init) and exit without training; the model is "
          "built deferred, so any size can be planned");
ABSL_FLAG(bool, deferred_init, false,
          "build the model without parameter memory; the wrap fills only each rank's shards, "
          "with the values a full construction gives");
ABSL_FLAG(int, activation_checkpoint_every, 0,
          "activation checkpointing: every k-th block (TransformerBlock, or LlamaDecoderLayer "
          "for --model=llama; blocks 0, k, 2k, ...) drops its activations after the forward and "
          "recomputes them in the backward; 1: every block, 0: none");
ABSL_FLAG(int, eval_batches, 8,
          "batches of each validate / test / predict stage; with --data, validate and test "
          "evaluate every window of the evaluation file once instead, however many batches "
          "that takes");
ABSL_FLAG(int, seq_len, 32, "tokens per sequence (at most --block_size)");
ABSL_FLAG(std::string, model, "gpt",
          "the decoder to train: gpt (nn::Gpt, GPT-2 style) or llama (nn::Llama: RMSNorm, "
          "rotary positions, SwiGLU, grouped-query attention); both read --vocab_size, "
          "--block_size, --n_embd, --n_layer and --n_head, llama also --n_kv_head, "
          "--intermediate_size, --rope_theta, --rms_norm_eps and --tie_word_embeddings");
ABSL_FLAG(int64_t, vocab_size, 64, "vocabulary of the language and the model");
ABSL_FLAG(int64_t, block_size, 32, "model context length (--model=llama: max_position_embeddings)");
ABSL_FLAG(int64_t, n_embd, 64, "model width (--model=llama: hidden_size)");
ABSL_FLAG(int64_t, n_layer, 2,
          "transformer blocks (one FSDP unit each; --model=llama: LlamaDecoderLayers)");
ABSL_FLAG(int64_t, n_head, 4, "attention heads");
ABSL_FLAG(std::optional<int64_t>, n_kv_head, std::nullopt,
          "--model=llama: key/value heads of the grouped-query attention (a divisor of "
          "--n_head; default --n_head: multi-head attention)");
ABSL_FLAG(std::optional<int64_t>, intermediate_size, std::nullopt,
          "--model=llama: width of the SwiGLU MLP (default 8/3 --n_embd rounded up to a multiple "
          "of 8: 176 for 64)");
ABSL_FLAG(double, rope_theta, 10000.0, "--model=llama: base of the rotary position embedding");
ABSL_FLAG(double, rms_norm_eps, 1e-6, "--model=llama: epsilon of the RMSNorms");
ABSL_FLAG(bool, tie_word_embeddings, false, "--model=llama: lm_head shares embed_tokens' weight");
ABSL_FLAG(int, order, 1, "Markov order of the language");
ABSL_FLAG(std::string, data, "",
          "token file or directory of .bin shards to train on instead of the Markov language "
          "(llm.c or nanoGPT layout; tools/text_to_tokens.py makes one from a text), read in "
          "epochs of fixed windows, each epoch in an order of --seed");
ABSL_FLAG(std::string, eval_data, "",
          "token file or directory for validate, test and predict (default: --data); "
          "validate and test evaluate each of its windows once");
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
          "test hook, comma-separated <kill|stop|exit|error|lose|diskfull>@<rank>:<step>"
          "[:<restart>]: at that training step (1-based, counted in this run, or g<N>: global "
          "step N) that rank SIGKILLs itself, SIGSTOPs itself, exits with code 3 without a word, "
          "fails the step with an error, marks its slot lost for good and SIGKILLs itself, or "
          "fails to write the periodic checkpoint of that step (disk full); at the start with "
          "that --max_restarts restart count (default 0: the first start only)");
ABSL_FLAG(int, max_restarts, 0,
          "when a rank fails, stop every rank, report the root cause and start the whole job "
          "again, up to this many times (comm/launcher.h NOTE [Restarts]); with "
          "--resume_from=latest each restart resumes from the newest checkpoint");
ABSL_FLAG(int, min_world_size, 0,
          "the fewest ranks a --max_restarts restart may continue with, in [0, --world_size]: a "
          "restart leaves out the ranks marked lost for good in $FSDP_LOST_RANKS_FILE and "
          "renumbers the rest (comm/launcher.h NOTE [Restarts]); 0 = --world_size: never fewer. "
          "Without --max_restarts it has no effect. The global batch (--batch_size rows) is "
          "kept, so --batch_size (and --eval_batch_size) must be multiples of the smaller world "
          "size too: the ranks of such a restart refuse otherwise (StageOptions::Validate). "
          "Ignored under a launcher");
ABSL_FLAG(int, testonly_failure_print_delay_ms, 0,
          "test hook: a rank whose own error is the root cause waits this long after "
          "recording it (FSDP_ERROR_FILE) before printing it and exiting");

namespace integration {
namespace internal {
namespace {

// NOTE [Paths under bazel run]: relative paths in flags are relative to the directory
// `bazel run` was started in (the workspace), not to the binary's runfiles directory;
// the default output directory is out/main_job there (else ./out/main_job).
std::string Resolve(const std::string& path) {
  const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  if (path.empty() || path[0] == '/' || workspace == nullptr) return path;
  return absl::StrCat(workspace, "/", path);
}

std::string DefaultOutputDir() {
  const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  return workspace != nullptr ? absl::StrCat(workspace, "/out/main_job") : "out/main_job";
}

// `flag` resolved, or `fallback` when the flag is empty.
std::string PathOr(const std::string& flag, const std::string& fallback) {
  return flag.empty() ? fallback : Resolve(flag);
}

DecoderTrainOptions TrainOptionsFromFlags() {
  DecoderTrainOptions o;
  o.language.order = absl::GetFlag(FLAGS_order);
  o.language.seed = absl::GetFlag(FLAGS_seed) + 1;
  o.seq_len = absl::GetFlag(FLAGS_seq_len);
  o.data_path = PathOr(absl::GetFlag(FLAGS_data), "");
  o.eval_data_path = PathOr(absl::GetFlag(FLAGS_eval_data), "");
  o.data_seed = absl::GetFlag(FLAGS_seed) + 2;
  o.adamw.lr = absl::GetFlag(FLAGS_lr);
  o.adamw.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  o.warmup_steps = absl::GetFlag(FLAGS_warmup_steps);
  o.deferred_init = absl::GetFlag(FLAGS_deferred_init);
  return o;
}

nn::GptConfig GptConfigFromFlags() {
  nn::GptConfig c;
  c.vocab_size = absl::GetFlag(FLAGS_vocab_size);
  c.block_size = absl::GetFlag(FLAGS_block_size);
  c.n_embd = absl::GetFlag(FLAGS_n_embd);
  c.n_layer = absl::GetFlag(FLAGS_n_layer);
  c.n_head = absl::GetFlag(FLAGS_n_head);
  c.seed = absl::GetFlag(FLAGS_seed);
  return c;
}

nn::LlamaConfig LlamaConfigFromFlags() {
  nn::LlamaConfig c;
  c.vocab_size = absl::GetFlag(FLAGS_vocab_size);
  c.hidden_size = absl::GetFlag(FLAGS_n_embd);
  c.intermediate_size =
      absl::GetFlag(FLAGS_intermediate_size).value_or(DefaultIntermediateSize(c.hidden_size));
  c.num_hidden_layers = absl::GetFlag(FLAGS_n_layer);
  c.num_attention_heads = absl::GetFlag(FLAGS_n_head);
  c.num_key_value_heads = absl::GetFlag(FLAGS_n_kv_head).value_or(c.num_attention_heads);
  c.max_position_embeddings = absl::GetFlag(FLAGS_block_size);
  c.rms_norm_eps = static_cast<float>(absl::GetFlag(FLAGS_rms_norm_eps));
  c.rope_theta = absl::GetFlag(FLAGS_rope_theta);
  c.tie_word_embeddings = absl::GetFlag(FLAGS_tie_word_embeddings);
  c.seed = absl::GetFlag(FLAGS_seed);
  return c;
}

// NOTE [Hugging Face start]: the model flags whose value is not their default.
std::vector<std::string> ModelFlagsSet() {
  std::vector<std::string> set;
  for (const absl::CommandLineFlag* flag :
       {&absl::GetFlagReflectionHandle(FLAGS_model),
        &absl::GetFlagReflectionHandle(FLAGS_vocab_size),
        &absl::GetFlagReflectionHandle(FLAGS_block_size),
        &absl::GetFlagReflectionHandle(FLAGS_n_embd), &absl::GetFlagReflectionHandle(FLAGS_n_layer),
        &absl::GetFlagReflectionHandle(FLAGS_n_head),
        &absl::GetFlagReflectionHandle(FLAGS_n_kv_head),
        &absl::GetFlagReflectionHandle(FLAGS_intermediate_size),
        &absl::GetFlagReflectionHandle(FLAGS_rope_theta),
        &absl::GetFlagReflectionHandle(FLAGS_rms_norm_eps),
        &absl::GetFlagReflectionHandle(FLAGS_tie_word_embeddings)}) {
    if (flag->CurrentValue() != flag->DefaultValue()) set.push_back(std::string(flag->Name()));
  }
  return set;
}

// One model flag beside config.json's field for the same quantity, as text.
struct FlagAndField {
  const char* flag;
  std::string flag_value;
  const char* field;
  std::string field_value;
  bool same = false;
};

std::string Text(int64_t v) { return absl::StrCat(v); }
std::string Text(float v) { return absl::StrCat(v); }
std::string Text(double v) { return absl::StrCat(v); }
std::string Text(bool v) { return v ? "true" : "false"; }

template <typename T>
FlagAndField Compare(const char* flag, const T& flag_value, const char* field,
                     const T& field_value) {
  return {flag, Text(flag_value), field, Text(field_value), flag_value == field_value};
}

// NOTE [Hugging Face start]: the model flags that `flags` set (model_flags_set) against
// config.json's model (`hf`, of model_type `type`); InvalidArgument naming the
// first that disagrees, and config.json's field. The Llama's own flags mean nothing to a
// GPT-2 (as with --model=gpt) and are not compared.
absl::Status CheckModelFlagsAgree(const JobOptions& flags, const JobOptions& hf,
                                  checkpoint::HfModelType type) {
  std::vector<FlagAndField> pairs = {{"model", flags.model_kind, "model_type",
                                      checkpoint::HfModelTypeName(type),
                                      flags.model_kind == hf.model_kind}};
  if (type == checkpoint::HfModelType::kGpt2) {
    const nn::GptConfig &f = flags.gpt, &c = hf.gpt;
    pairs.push_back(Compare("vocab_size", f.vocab_size, "vocab_size", c.vocab_size));
    pairs.push_back(Compare("block_size", f.block_size, "n_positions", c.block_size));
    pairs.push_back(Compare("n_embd", f.n_embd, "n_embd", c.n_embd));
    pairs.push_back(Compare("n_layer", f.n_layer, "n_layer", c.n_layer));
    pairs.push_back(Compare("n_head", f.n_head, "n_head", c.n_head));
  } else {
    const nn::LlamaConfig &f = flags.llama, &c = hf.llama;
    pairs.push_back(Compare("vocab_size", f.vocab_size, "vocab_size", c.vocab_size));
    pairs.push_back(Compare("block_size", f.max_position_embeddings, "max_position_embeddings",
                            c.max_position_embeddings));
    pairs.push_back(Compare("n_embd", f.hidden_size, "hidden_size", c.hidden_size));
    pairs.push_back(
        Compare("n_layer", f.num_hidden_layers, "num_hidden_layers", c.num_hidden_layers));
    pairs.push_back(
        Compare("n_head", f.num_attention_heads, "num_attention_heads", c.num_attention_heads));
    pairs.push_back(
        Compare("n_kv_head", f.num_key_value_heads, "num_key_value_heads", c.num_key_value_heads));
    pairs.push_back(Compare("intermediate_size", f.intermediate_size, "intermediate_size",
                            c.intermediate_size));
    pairs.push_back(Compare("rope_theta", f.rope_theta, "rope_theta", c.rope_theta));
    pairs.push_back(Compare("rms_norm_eps", f.rms_norm_eps, "rms_norm_eps", c.rms_norm_eps));
    pairs.push_back(Compare("tie_word_embeddings", f.tie_word_embeddings, "tie_word_embeddings",
                            c.tie_word_embeddings));
  }
  for (const FlagAndField& p : pairs) {
    const bool set = std::find(flags.model_flags_set.begin(), flags.model_flags_set.end(),
                               p.flag) != flags.model_flags_set.end();
    if (!set || p.same) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "--", p.flag, "=", p.flag_value, " disagrees with ", hf.hf_dir, "/config.json: ", p.field,
        " is ", p.field_value, " (", hf.hf_dir_name,
        ": the model's family and sizes are config.json's; leave the flag out or make it "
        "agree)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelKind> ParseModelKind(const std::string& text) {
  if (text == "gpt") return ModelKind::kGpt;
  if (text == "llama") return ModelKind::kLlama;
  return absl::InvalidArgumentError(
      absl::StrCat("--model=", text, ": unknown model; use gpt or llama"));
}

int64_t DefaultIntermediateSize(int64_t hidden_size) {
  if (hidden_size <= 0) return 0;
  return 8 * ((hidden_size + 2) / 3);
}

GptModuleOptions GptOptionsFor(const JobOptions& job) {
  GptModuleOptions o;
  static_cast<DecoderTrainOptions&>(o) = job.train;
  o.model = job.gpt;
  return o;
}

LlamaModuleOptions LlamaOptionsFor(const JobOptions& job) {
  LlamaModuleOptions o;
  static_cast<DecoderTrainOptions&>(o) = job.train;
  o.model = job.llama;
  return o;
}

absl::StatusOr<DecoderSpec> ModelSpecFor(const JobOptions& job) {
  ASSIGN_OR_RETURN(ModelKind kind, ParseModelKind(job.model_kind));
  switch (kind) {
    case ModelKind::kGpt:
      return GptTrainModule::Spec(job.gpt);
    case ModelKind::kLlama:
      return LlamaTrainModule::Spec(job.llama);
  }
  return absl::InternalError("unreachable ModelKind");
}

absl::Status WithLlamaFlagNames(const absl::Status& status) {
  if (status.ok()) return status;
  // No name below is a prefix of another, so the order does not matter.
  const std::string message = absl::StrReplaceAll(
      status.message(), {{"LlamaConfig.vocab_size", "--vocab_size"},
                         {"LlamaConfig.hidden_size", "--n_embd"},
                         {"LlamaConfig.intermediate_size", "--intermediate_size"},
                         {"LlamaConfig.num_hidden_layers", "--n_layer"},
                         {"LlamaConfig.num_attention_heads", "--n_head"},
                         {"LlamaConfig.num_key_value_heads", "--n_kv_head"},
                         {"LlamaConfig.max_position_embeddings", "--block_size"},
                         {"LlamaConfig.rms_norm_eps", "--rms_norm_eps"},
                         {"LlamaConfig.rope_theta", "--rope_theta"},
                         {"LlamaModuleOptions.seq_len", "--seq_len"},
                         {"LlamaModuleOptions.warmup_steps", "--warmup_steps"},
                         {"LlamaModuleOptions.data_path", "--data"},
                         {"LlamaModuleOptions.eval_data_path", "--eval_data"}});
  return absl::Status(status.code(), message);
}

absl::Status CheckModelFlags(const JobOptions& job) {
  ASSIGN_OR_RETURN(ModelKind kind, ParseModelKind(job.model_kind));
  if (!job.hf_dir.empty()) {  // the config is config.json's, checked as it was read
    const bool llama = kind == ModelKind::kLlama;
    const int64_t context = llama ? job.llama.max_position_embeddings : job.gpt.block_size;
    if (job.train.seq_len <= 0 || job.train.seq_len > context) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--seq_len = ", job.train.seq_len, ": must be in [1, ", context, "], ", job.hf_dir,
          "/config.json's ", llama ? "max_position_embeddings" : "n_positions", " (",
          job.hf_dir_name, ")"));
    }
    return absl::OkStatus();
  }
  if (kind != ModelKind::kLlama) return absl::OkStatus();
  RETURN_IF_ERROR(WithLlamaFlagNames(job.llama.Validate()));
  if (job.train.seq_len <= 0 || job.train.seq_len > job.llama.max_position_embeddings) {
    return absl::InvalidArgumentError(
        absl::StrCat("--seq_len = ", job.train.seq_len,
                     ": must be in [1, --block_size = ", job.llama.max_position_embeddings, "]"));
  }
  return absl::OkStatus();
}

absl::StatusOr<JobOptions> ResolveHfDirs(const JobOptions& flags) {
  JobOptions job = flags;
  if (!job.stage_config.empty()) {
    ASSIGN_OR_RETURN(const StageConfig config, ReadStageConfigFile(job.stage_config));
    if (config.has_hf_dir()) {
      job.hf_dir = config.hf_dir();
      job.hf_dir_name = "StageConfig.hf_dir";
    }
    if (config.has_export_hf_dir()) {
      job.export_hf_dir = config.export_hf_dir();
      job.export_hf_dir_name = "StageConfig.export_hf_dir";
    }
  }
  if (!job.export_hf_dir.empty()) {
    if (!job.release) {
      return absl::InvalidArgumentError(
          absl::StrCat(job.export_hf_dir_name, "=", job.export_hf_dir,
                       " needs --release: the export is of the released model"));
    }
    std::error_code e1, e2;
    const std::filesystem::path out = std::filesystem::weakly_canonical(job.export_hf_dir, e1);
    const std::filesystem::path in = std::filesystem::weakly_canonical(job.hf_dir, e2);
    if (!job.hf_dir.empty() && !e1 && !e2 && out == in) {
      return absl::InvalidArgumentError(
          absl::StrCat(job.export_hf_dir_name, "=", job.export_hf_dir, " is ", job.hf_dir_name,
                       ": the export would overwrite the checkpoint the run starts from"));
    }
  }
  if (job.hf_dir.empty()) return job;
  // Errors of config.json's readers name the file; say which flag or field named it.
  absl::StatusOr<checkpoint::HfModelType> type = checkpoint::ReadHfModelType(job.hf_dir);
  if (!type.ok()) return core::Annotate(type.status(), job.hf_dir_name);
  if (*type == checkpoint::HfModelType::kGpt2) {
    absl::StatusOr<nn::GptConfig> config = checkpoint::ReadHfGpt2Config(job.hf_dir);
    if (!config.ok()) return core::Annotate(config.status(), job.hf_dir_name);
    job.model_kind = "gpt";
    job.gpt = *config;
    job.gpt.seed = flags.gpt.seed;
  } else {
    absl::StatusOr<nn::LlamaConfig> config = checkpoint::ReadHfLlamaConfig(job.hf_dir);
    if (!config.ok()) return core::Annotate(config.status(), job.hf_dir_name);
    job.model_kind = "llama";
    job.llama = *config;
    job.llama.seed = flags.llama.seed;
  }
  RETURN_IF_ERROR(CheckModelFlagsAgree(flags, job, *type));
  job.train.deferred_init = true;  // the wrap makes the shards, the load fills them
  return job;
}

JobOptions JobOptionsFromFlags() {
  JobOptions job;
  job.world_size = absl::GetFlag(FLAGS_world_size);
  job.backend = absl::GetFlag(FLAGS_backend);
  job.device = absl::GetFlag(FLAGS_device);
  job.stages = absl::GetFlag(FLAGS_stages);
  const std::string resume_from = absl::GetFlag(FLAGS_resume_from);
  job.resume_from = resume_from == kResumeLatest ? resume_from : Resolve(resume_from);
  job.resume_allow_data_change = absl::GetFlag(FLAGS_resume_allow_data_change);
  job.hf_dir = Resolve(absl::GetFlag(FLAGS_hf_dir));
  job.export_hf_dir = Resolve(absl::GetFlag(FLAGS_export_hf_dir));
  job.output_dir = PathOr(absl::GetFlag(FLAGS_output_dir), DefaultOutputDir());
  job.checkpoint_dir = PathOr(absl::GetFlag(FLAGS_checkpoint_dir), job.output_dir + "/checkpoint");
  job.safetensors_path =
      PathOr(absl::GetFlag(FLAGS_safetensors_path), job.output_dir + "/model.safetensors");
  job.release = absl::GetFlag(FLAGS_release);
  job.stage_config = Resolve(absl::GetFlag(FLAGS_stage_config));
  job.strategy = absl::GetFlag(FLAGS_strategy);
  job.hybrid_shard_size = absl::GetFlag(FLAGS_hybrid_shard_size);
  job.forward_prefetch = absl::GetFlag(FLAGS_forward_prefetch);
  job.cpu_offload = absl::GetFlag(FLAGS_cpu_offload);
  job.deterministic = absl::GetFlag(FLAGS_deterministic);
  job.deterministic_micro_batches = absl::GetFlag(FLAGS_deterministic_micro_batches);
  job.profile_ops = absl::GetFlag(FLAGS_profile_ops);
  job.throughput_warmup_steps = absl::GetFlag(FLAGS_throughput_warmup_steps);
  job.param_dtype = absl::GetFlag(FLAGS_param_dtype);
  job.steps = absl::GetFlag(FLAGS_steps);
  job.max_steps = absl::GetFlag(FLAGS_max_steps);
  job.batch_size = absl::GetFlag(FLAGS_batch_size);
  job.grad_accumulation = absl::GetFlag(FLAGS_grad_accumulation);
  job.accumulation = absl::GetFlag(FLAGS_accumulation);
  job.activation_checkpoint_every = absl::GetFlag(FLAGS_activation_checkpoint_every);
  job.memory_plan = absl::GetFlag(FLAGS_memory_plan);
  job.eval_batch_size = absl::GetFlag(FLAGS_eval_batch_size);
  job.eval_batches = absl::GetFlag(FLAGS_eval_batches);
  job.log_every = absl::GetFlag(FLAGS_log_every);
  job.checkpoint_every_steps = absl::GetFlag(FLAGS_checkpoint_every_steps);
  job.checkpoint_every_minutes = absl::GetFlag(FLAGS_checkpoint_every_minutes);
  job.keep_checkpoints = absl::GetFlag(FLAGS_keep_checkpoints);
  job.async_checkpoints = absl::GetFlag(FLAGS_async_checkpoints);
  job.model_kind = absl::GetFlag(FLAGS_model);
  job.train = TrainOptionsFromFlags();
  job.gpt = GptConfigFromFlags();
  job.llama = LlamaConfigFromFlags();
  job.model_flags_set = ModelFlagsSet();
  job.intra_op_threads = absl::GetFlag(FLAGS_intra_op_threads);
  job.timeout_s = absl::GetFlag(FLAGS_timeout_s);
  job.testonly_fault = absl::GetFlag(FLAGS_testonly_fault);
  job.max_restarts = absl::GetFlag(FLAGS_max_restarts);
  job.min_world_size = absl::GetFlag(FLAGS_min_world_size);
  job.testonly_failure_print_delay_ms = absl::GetFlag(FLAGS_testonly_failure_print_delay_ms);
  return job;
}

absl::Status MakeOutputDir(const JobOptions& job) {
  std::error_code error;
  std::filesystem::create_directories(job.output_dir, error);
  if (error) {
    return absl::PermissionDeniedError(
        absl::StrCat("--output_dir: cannot create '", job.output_dir, "': ", error.message()));
  }
  return absl::OkStatus();
}

absl::Status CheckBeforeLaunch(const JobOptions& job) {
  // The messages are the lines the parent has always printed: a check's status in full.
  auto refuse = [](const absl::Status& s, const std::string& prefix = "") {
    return absl::Status(s.code(), absl::StrCat(prefix, s.ToString()));
  };
  if (job.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--world_size=", job.world_size, " must be >= 1"));
  }
  if (absl::Status s = ParseStages(job.stages).status(); !s.ok()) return refuse(s);
  if (job.max_restarts < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_restarts=", job.max_restarts, " must be >= 0"));
  }
  if (job.max_steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_steps=", job.max_steps, " must be >= 0 (0: train --steps steps)"));
  }
  RETURN_IF_ERROR(CheckThroughputWarmup(job));
  // NOTE [Training to a global step]: a restart that resumes and then trains --steps more
  // would end past the run that never failed.
  const std::vector<Stage> stages = ParseStages(job.stages).value_or(std::vector<Stage>());
  if (job.max_restarts > 0 && job.resume_from == kResumeLatest && job.max_steps == 0 &&
      std::find(stages.begin(), stages.end(), Stage::kFit) != stages.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_restarts=", job.max_restarts,
        " with --resume_from=latest needs --max_steps (the "
        "global step to train to): --steps counts the steps of each start, so every restart "
        "would train --steps more than the run that never failed"));
  }
  if (job.min_world_size < 0 || job.min_world_size > job.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("--min_world_size=", job.min_world_size,
                                                   " must be in [0, --world_size=", job.world_size,
                                                   "] (0: never fewer ranks than --world_size)"));
  }
  if (job.resume_allow_data_change && job.resume_from.empty()) {
    return absl::InvalidArgumentError(
        "--resume_allow_data_change needs --resume_from: it lets a resume read other data");
  }
  // NOTE [Hugging Face start]: a --stage_config may replace the flags' directories and is
  // the ranks' to read; with one, a model from --hf_dir is theirs to check too.
  if (job.stage_config.empty()) {
    absl::StatusOr<JobOptions> resolved = ResolveHfDirs(job);
    if (!resolved.ok()) return refuse(resolved.status());
    if (absl::Status s = CheckModelFlags(*resolved); !s.ok()) return refuse(s);
  } else if (job.hf_dir.empty()) {
    if (absl::Status s = CheckModelFlags(job); !s.ok()) return refuse(s);
  }
  if (absl::Status s = ParseShardingStrategy(job.strategy).status(); !s.ok()) {
    return refuse(s, "--strategy: ");
  }
  if (job.intra_op_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--intra_op_threads=", job.intra_op_threads, " must be >= 1, or 0 for auto"));
  }
  if (absl::Status s = core::TimeoutFromSeconds(job.timeout_s, "--timeout_s").status(); !s.ok()) {
    return refuse(s);
  }
  if (job.deterministic && job.device != "cpu") {
    return absl::InvalidArgumentError(
        "--deterministic runs on --device=cpu (the gloo and shm backends reduce in its tree)");
  }
  if (job.cpu_offload && job.device == "cpu") {
    return absl::InvalidArgumentError(
        "--cpu_offload needs --device=cuda: it keeps a CUDA model's shards, gradients and "
        "optimizer state in host memory, and a CPU model has them there already");
  }
  // --device / --backend: what the parent can check (the build, the GPUs, one per local
  // rank).
  if (absl::Status s = ChooseDeviceAndBackend(job.device, job.backend, job.world_size - 1,
                                              DeviceAvailability::Probe())
                           .status();
      !s.ok()) {
    return refuse(s);
  }
  return absl::OkStatus();
}

absl::Status CheckThroughputWarmup(const JobOptions& job) {
  if (!job.throughput_warmup_steps.has_value()) return absl::OkStatus();
  const int64_t w = *job.throughput_warmup_steps;
  if (w >= 0 && w <= job.steps - 2) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "--throughput_warmup_steps=", w, " must be in [0, --steps - 2 = ", job.steps - 2,
      "]: the throughput figures time each step after the warm-up from its start to the next "
      "step's start, so at least two steps must follow the warm-up"));
}

absl::StatusOr<std::vector<Stage>> ParseStages(const std::string& text) {
  std::vector<Stage> stages;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    bool found = false;
    for (Stage s : {Stage::kFit, Stage::kValidate, Stage::kTest, Stage::kPredict}) {
      if (StageName(s) == part) {
        stages.push_back(s);
        found = true;
      }
    }
    if (!found) {
      return absl::InvalidArgumentError(
          absl::StrCat("--stages: unknown stage '", part, "'; use fit, validate, test, predict"));
    }
  }
  return stages;
}

int LocalRanks(int world) {
  const absl::StatusOr<comm::LaunchEnv> env = comm::ReadLaunchEnv();
  if (env.ok() && env->local_world_size >= 1 && env->local_world_size <= world) {
    return env->local_world_size;
  }
  return world;
}

absl::StatusOr<int> IntraOpThreads(const JobOptions& job, int world) {
  if (job.intra_op_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--intra_op_threads=", job.intra_op_threads, ": must be >= 1, or 0 for auto"));
  }
  if (job.intra_op_threads > 0) return job.intra_op_threads;
  // NOTE [Deterministic training]: the same thread count at every world size.
  if (job.deterministic) return 1;
  int n = 0;
  const char* env = std::getenv("OMP_NUM_THREADS");
  if (env != nullptr && absl::SimpleAtoi(env, &n) && n >= 1) return n;
  const int hardware = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, hardware / LocalRanks(world));
}

absl::StatusOr<StageOptions> StageOptionsFor(const JobOptions& job, absl::Duration timeout) {
  StageOptions options;
  ASSIGN_OR_RETURN(const DecoderSpec model, ModelSpecFor(job));
  options.wrap.policy = policy::ModuleTypes({model.block_type});
  absl::StatusOr<fsdp::ShardingStrategy> strategy = ParseShardingStrategy(job.strategy);
  if (!strategy.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--strategy: ", strategy.status().message()));
  }
  options.wrap.strategy = *strategy;
  options.wrap.hybrid_shard_size = job.hybrid_shard_size;
  if (job.forward_prefetch == "auto") {
    options.wrap.forward_prefetch = job.device != "cpu";
  } else if (job.forward_prefetch == "true" || job.forward_prefetch == "false") {
    options.wrap.forward_prefetch = job.forward_prefetch == "true";
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--forward_prefetch=", job.forward_prefetch, ": use true, false or auto"));
  }
  options.wrap.cpu_offload = job.cpu_offload;
  if (job.deterministic) {  // NOTE [Deterministic training]
    options.wrap.deterministic = true;
    options.deterministic_micro_batches = job.deterministic_micro_batches;
  }
  ASSIGN_OR_RETURN(options.wrap.mixed_precision.param_dtype, core::ParseDType(job.param_dtype));
  options.wrap.timeout = timeout;
  options.fit_steps = job.steps;
  options.max_steps = job.max_steps;
  options.train_batch_size = job.batch_size;
  options.grad_accumulation = job.grad_accumulation;
  absl::StatusOr<StageOptions::Accumulation> accumulation = ParseAccumulation(job.accumulation);
  if (!accumulation.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--", accumulation.status().message()));
  }
  options.accumulation = *accumulation;
  if (job.activation_checkpoint_every < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--activation_checkpoint_every=", job.activation_checkpoint_every,
                     " must be >= 0 (0: no activation checkpointing)"));
  }
  if (job.activation_checkpoint_every > 0) {
    options.wrap.checkpoint_policy =
        policy::EveryKth({model.block_type}, job.activation_checkpoint_every);
  }
  options.eval_batch_size = job.eval_batch_size;
  options.eval_batches = job.eval_batches;
  options.log_every = job.log_every;
  options.profile_step = job.profile_ops ? job.steps - 1 : -1;
  RETURN_IF_ERROR(CheckThroughputWarmup(job));  // a rank under another launcher checks it here
  options.checkpoint_dir = job.checkpoint_dir;
  options.checkpoint_every_steps = job.checkpoint_every_steps;
  options.checkpoint_every_minutes = job.checkpoint_every_minutes;
  options.keep_checkpoints = job.keep_checkpoints;
  options.async_checkpoints = job.async_checkpoints;
  if (!job.stage_config.empty()) {
    ASSIGN_OR_RETURN(options, ReadStageOptionsFile(job.stage_config, options));
  }
  return options;
}

}  // namespace internal
}  // namespace integration
