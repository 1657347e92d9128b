// activation_checkpointing: what checkpointing every TransformerBlock (NOTE [Activation
// checkpointing] in core/module.h) saves and costs on a GPT trained under FSDP, measured
// from the allocator's activation counter, beside the figures it should come to.
//
//   bazel run -c opt //bench:activation_checkpointing
//   bazel run -c opt //bench:activation_checkpointing -- --n_layer=12 --steps=5
//   bash bench/activation_checkpointing.sh     # the same plus PyTorch's torch.utils.checkpoint
//
// One rank (FullyShard over a one-rank gloo group, each TransformerBlock a unit), fp32,
// AdamW. Two models with the same weights and batches, one with
// FullyShardOptions::checkpoint_policy = every TransformerBlock; steps alternate between
// them so that machine noise hits both alike. Per model, for the last step: the bytes
// under the activation tag held at the end of the forward and the peak during the step
// (each above what was held before it), and the median step time. Measured alone: the
// bytes one block's forward keeps for its backward (A, a fresh block on the same input
// shape) and one block's input (I = 4 B T C). Then
//   plain peak        = R + L A           (R: what is not the blocks', derived from it)
//   checkpointed peak <= R + L I + A      (every block's input, one block recomputed)
// and the JSON line prints the measured checkpointed peak against that bound
// (`peak_over_bound`, target <= 1.05), the held bytes against L I, the step-time ratio
// (target <= 1.4), and for each model the main job's memory estimate of its activation
// peak (integration/memory_estimate.h) over the measured one (target: within 5%).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "comm/gloo_process_group.h"
#include "comm/hash_store.h"
#include "core/allocator.h"
#include "core/module.h"
#include "core/random.h"
#include "core/status_macros.h"
#include "data/markov_language.h"
#include "fsdp/fully_shard.h"
#include "integration/memory_estimate.h"
#include "nlohmann/json.hpp"
#include "nn/gpt.h"
#include "nn/losses.h"
#include "nn/transformer.h"
#include "optim/adamw.h"
#include "policy/wrap_policy.h"

ABSL_FLAG(int64_t, vocab_size, 512, "GPT vocabulary");
ABSL_FLAG(int, seq_len, 128, "tokens per sequence (the model's block size)");
ABSL_FLAG(int64_t, n_embd, 256, "embedding width");
ABSL_FLAG(int64_t, n_layer, 6, "transformer blocks");
ABSL_FLAG(int64_t, n_head, 8, "attention heads");
ABSL_FLAG(int, batch, 8, "sequences per step");
ABSL_FLAG(int, steps, 6, "timed steps per model (after one warm-up step each)");

namespace {

using Clock = std::chrono::steady_clock;

int64_t Activations(const core::Allocator& a) {
  return a.Stats().current(core::MemoryTag::kActivation);
}

struct Model {
  std::shared_ptr<nn::Gpt> gpt;
  std::shared_ptr<fsdp::FullyShardHandle> handle;
  std::unique_ptr<optim::AdamW> adamw;
  std::vector<double> step_s;
  int64_t held_after_forward = 0;  // bytes above the step's start, at the forward's end
  int64_t peak = 0;                // bytes above the step's start, during the step
};

absl::Status Step(Model& m, const data::TokenBatch& batch, core::Allocator& cpu) {
  const int64_t start = Activations(cpu);
  cpu.ResetPeaks();
  const Clock::time_point t0 = Clock::now();
  m.adamw->ZeroGrad();
  ASSIGN_OR_RETURN(core::Tensor logits, m.gpt->Forward(batch.inputs));
  m.held_after_forward = Activations(cpu) - start;
  ASSIGN_OR_RETURN(nn::LossResult loss, nn::CrossEntropyLoss(logits, batch.targets));
  logits = core::Tensor();
  RETURN_IF_ERROR(m.gpt->Backward(loss.grad).status());
  RETURN_IF_ERROR(m.adamw->Step());
  m.step_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  m.peak = cpu.Stats().peak(core::MemoryTag::kActivation) - start;
  return absl::OkStatus();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The GPT and the batch shape of the flags.
struct Setup {
  nn::GptConfig config;
  int batch_rows = 0;
  int seq_len = 0;
  int steps = 0;
};

absl::StatusOr<Setup> SetupFromFlags() {
  Setup s;
  s.config.vocab_size = absl::GetFlag(FLAGS_vocab_size);
  s.config.block_size = absl::GetFlag(FLAGS_seq_len);
  s.config.n_embd = absl::GetFlag(FLAGS_n_embd);
  s.config.n_layer = absl::GetFlag(FLAGS_n_layer);
  s.config.n_head = absl::GetFlag(FLAGS_n_head);
  s.batch_rows = absl::GetFlag(FLAGS_batch);
  s.seq_len = absl::GetFlag(FLAGS_seq_len);
  s.steps = absl::GetFlag(FLAGS_steps);
  if (s.batch_rows < 1 || s.steps < 1) {
    return absl::InvalidArgumentError("--batch and --steps must be >= 1");
  }
  return s;
}

// What one block's forward keeps for its backward (A), and one block's input (I).
struct BlockBytes {
  int64_t activations = 0;
  int64_t input = 0;
};

// A and I, from a fresh block run on the batch's shape; freed before it returns.
absl::StatusOr<BlockBytes> MeasureOneBlock(const Setup& setup, core::Allocator& cpu) {
  const nn::GptConfig& config = setup.config;
  auto block = std::make_shared<nn::TransformerBlock>(config.n_embd, config.n_head, 1);
  ASSIGN_OR_RETURN(core::Tensor x,
                   core::Tensor::Allocate({setup.batch_rows, setup.seq_len, config.n_embd},
                                          core::DType::kFloat32, core::MemoryTag::kActivation));
  core::Rng rng(7);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = rng.Normal(0.0f, 1.0f);
  const int64_t before_block = Activations(cpu);
  ASSIGN_OR_RETURN(core::Tensor y, block->Forward(x));
  BlockBytes bytes;
  bytes.activations = Activations(cpu) - before_block - y.nbytes();
  bytes.input = x.nbytes();
  return bytes;
}

// models[0] plain, models[1] with every TransformerBlock checkpointed; the same weights.
absl::Status BuildModels(const nn::GptConfig& config,
                         const std::shared_ptr<comm::GlooProcessGroup>& group,
                         fsdp::WrapperRegistry* registry, Model (&models)[2]) {
  for (int k = 0; k < 2; ++k) {
    ASSIGN_OR_RETURN(models[k].gpt, nn::Gpt::Create(config));
    fsdp::FullyShardOptions options;
    options.policy = policy::ModuleTypes({"TransformerBlock"});
    if (k == 1) options.checkpoint_policy = policy::ModuleTypes({"TransformerBlock"});
    ASSIGN_OR_RETURN(models[k].handle, fsdp::FullyShard(models[k].gpt, group, options, registry));
    ASSIGN_OR_RETURN(models[k].adamw, optim::AdamW::Create(models[k].gpt->NamedParameters()));
  }
  return absl::OkStatus();
}

// One warm-up step and `steps` timed ones, the two models alternating on the same batches.
absl::Status Train(const Setup& setup, core::Allocator& cpu, Model (&models)[2]) {
  data::MarkovLanguageOptions language_options;
  language_options.vocab_size = static_cast<int>(setup.config.vocab_size);
  ASSIGN_OR_RETURN(data::MarkovLanguage language, data::MarkovLanguage::Create(language_options));
  for (int s = 0; s <= setup.steps; ++s) {
    ASSIGN_OR_RETURN(data::TokenBatch batch, language.Batch(s, setup.batch_rows, setup.seq_len));
    for (Model& m : models) RETURN_IF_ERROR(Step(m, batch, cpu));
    if (s == 0) {
      for (Model& m : models) m.step_s.clear();  // the warm-up step makes AdamW's state
    }
    std::fprintf(stderr, "step %d/%d: %.3f s plain, %.3f s checkpointed\n", s, setup.steps,
                 models[0].step_s.empty() ? 0.0 : models[0].step_s.back(),
                 models[1].step_s.empty() ? 0.0 : models[1].step_s.back());
  }
  return absl::OkStatus();
}

// The same weights: the two models must agree to the bit (NOTE [Activation
// checkpointing]); a benchmark of a wrong result would be worthless.
absl::Status CheckBitwiseEqual(const Model& plain, const Model& ckpt) {
  const auto p0 = plain.gpt->NamedParameters();
  const auto p1 = ckpt.gpt->NamedParameters();
  for (size_t i = 0; i < p0.size(); ++i) {
    const core::Tensor& a = p0[i].second->data;
    const core::Tensor& b = p1[i].second->data;
    if (a.nbytes() != b.nbytes() ||
        std::memcmp(a.data<float>(), b.data<float>(), a.nbytes()) != 0) {
      return absl::InternalError(
          absl::StrCat("parameter ", p0[i].first, " differs between the two models"));
    }
  }
  return absl::OkStatus();
}

// The main job's memory estimate (NOTE [Memory estimate] in integration/memory_estimate.h)
// of a model's activation peak, with every block checkpointed or none.
absl::StatusOr<int64_t> EstimatedActivationPeak(const nn::Gpt& gpt, const Setup& setup,
                                                bool checkpointed) {
  integration::MemoryEstimateInput in;
  in.model = integration::ModelSizesOfModule(gpt);
  in.activations = integration::GptActivations(setup.config, setup.batch_rows, setup.seq_len);
  if (checkpointed) {
    for (int64_t i = 0; i < setup.config.n_layer; ++i) {
      in.activations->checkpointed_blocks.push_back(i);
    }
  }
  ASSIGN_OR_RETURN(integration::MemoryEstimate e, integration::EstimateMemory(in));
  return e.activation_bytes;
}

nlohmann::json ModelReport(const Model& m, int64_t estimate, double step_s_median) {
  return {{"held_after_forward_bytes", m.held_after_forward},
          {"peak_bytes", m.peak},
          {"estimated_peak_bytes", estimate},
          {"estimate_over_peak", static_cast<double>(estimate) / m.peak},
          {"step_s_median", step_s_median}};
}

// The JSON line: the measurements beside the bound of the file's header.
nlohmann::json Report(const Setup& setup, const BlockBytes& block, const Model& plain,
                      const Model& ckpt, const int64_t (&estimate)[2]) {
  const nn::GptConfig& config = setup.config;
  const int64_t L = config.n_layer;
  const int64_t rest = plain.peak - L * block.activations;
  const int64_t bound = rest + L * block.input + block.activations;
  const double plain_s = Median(plain.step_s);
  const double ckpt_s = Median(ckpt.step_s);
  nlohmann::json out;
  out["benchmark"] = "activation_checkpointing";
  out["config"] = {{"vocab_size", config.vocab_size},
                   {"seq_len", setup.seq_len},
                   {"n_embd", config.n_embd},
                   {"n_layer", L},
                   {"n_head", config.n_head},
                   {"batch", setup.batch_rows},
                   {"steps", setup.steps},
                   {"dtype", "float32"},
                   {"world_size", 1}};
  out["one_block_activation_bytes"] = block.activations;
  out["one_block_input_bytes"] = block.input;
  out["plain"] = ModelReport(plain, estimate[0], plain_s);
  out["checkpointed"] = ModelReport(ckpt, estimate[1], ckpt_s);
  out["estimate_over_peak_target"] = "within 5%: |ratio - 1| <= 0.05";
  out["theory"] = {
      {"rest_bytes", rest},
      {"rest_is", "plain peak - L x one block's activations"},
      {"checkpointed_peak_bound_bytes", bound},
      {"checkpointed_peak_bound_is", "rest + L x one block's input + one block's activations"},
      {"held_blocks_plain_bytes", L * block.activations},
      {"held_blocks_checkpointed_bytes", L * block.input}};
  out["peak_over_bound"] = bound > 0 ? static_cast<double>(ckpt.peak) / bound : 0.0;
  out["peak_over_bound_target"] = "<= 1.05";
  out["peak_ratio_checkpointed_over_plain"] =
      plain.peak > 0 ? static_cast<double>(ckpt.peak) / plain.peak : 0.0;
  out["step_time_ratio"] = plain_s > 0 ? ckpt_s / plain_s : 0.0;
  out["step_time_ratio_target"] = "<= 1.4";
  out["bitwise_equal_parameters"] = true;
  return out;
}

absl::StatusOr<nlohmann::json> Run() {
  ASSIGN_OR_RETURN(const Setup setup, SetupFromFlags());
  core::Allocator& cpu = *core::Allocator::Current(core::Device::Cpu());
  ASSIGN_OR_RETURN(const BlockBytes block, MeasureOneBlock(setup, cpu));

  auto store = std::make_shared<comm::HashStore>();
  ASSIGN_OR_RETURN(std::shared_ptr<comm::GlooProcessGroup> group,
                   comm::GlooProcessGroup::Create(store, 0, 1, comm::GlooOptions()));
  fsdp::WrapperRegistry registry;
  Model models[2];
  RETURN_IF_ERROR(BuildModels(setup.config, group, &registry, models));
  RETURN_IF_ERROR(Train(setup, cpu, models));
  RETURN_IF_ERROR(CheckBitwiseEqual(models[0], models[1]));
  int64_t estimate[2] = {0, 0};
  for (int k = 0; k < 2; ++k) {
    ASSIGN_OR_RETURN(estimate[k], EstimatedActivationPeak(*models[k].gpt, setup, k == 1));
  }
  return Report(setup, block, models[0], models[1], estimate);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  absl::StatusOr<nlohmann::json> out = Run();
  if (!out.ok()) {
    std::fprintf(stderr, "activation_checkpointing: %s\n", out.status().ToString().c_str());
    return 1;
  }
  std::printf("%s\n", out->dump().c_str());
  return 0;
}
