// The main job (README: `make demo`): trains a small GPT on the synthetic Markov language
// with AdamW on the CPU, prints progress, and ends with the evaluation loss beside the
// language's entropy floor, then one JSON line with the figures.
//
//   bazel run //integration:main_job -- --steps=300 --n_layer=2
#include <cmath>
#include <cstdio>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "core/allocator.h"
#include "integration/gpt_training.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(int64_t, steps, 300, "training steps");
ABSL_FLAG(int, batch_size, 16, "sequences per step");
ABSL_FLAG(int, seq_len, 32, "tokens per sequence (at most --block_size)");
ABSL_FLAG(int64_t, vocab_size, 64, "vocabulary of the language and the model");
ABSL_FLAG(int64_t, block_size, 32, "model context length");
ABSL_FLAG(int64_t, n_embd, 64, "model width");
ABSL_FLAG(int64_t, n_layer, 2, "transformer blocks");
ABSL_FLAG(int64_t, n_head, 4, "attention heads");
ABSL_FLAG(int, order, 1, "Markov order of the language (next token depends on this many)");
ABSL_FLAG(double, lr, 1e-2, "AdamW peak learning rate");
ABSL_FLAG(double, weight_decay, 0.0, "AdamW decoupled weight decay");
ABSL_FLAG(uint64_t, seed, 0, "seed of the model initialisation and of the language");
ABSL_FLAG(int64_t, log_every, 25, "progress line every this many steps");
ABSL_FLAG(int, eval_batches, 8, "unseen batches for the evaluation loss");

namespace {

nlohmann::json MemoryJson(const core::MemoryStats& s) {
  nlohmann::json j;
  for (int t = 0; t < core::kNumMemoryTags; ++t) {
    j[core::MemoryTagName(static_cast<core::MemoryTag>(t))] = s.peak_by_tag[t];
  }
  j["total"] = s.peak_total;
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Trains a small GPT on a synthetic language (see README.md).");
  absl::ParseCommandLine(argc, argv);

  integration::GptTrainingOptions options;
  options.steps = absl::GetFlag(FLAGS_steps);
  options.batch_size = absl::GetFlag(FLAGS_batch_size);
  options.seq_len = absl::GetFlag(FLAGS_seq_len);
  options.model.vocab_size = absl::GetFlag(FLAGS_vocab_size);
  options.model.block_size = absl::GetFlag(FLAGS_block_size);
  options.model.n_embd = absl::GetFlag(FLAGS_n_embd);
  options.model.n_layer = absl::GetFlag(FLAGS_n_layer);
  options.model.n_head = absl::GetFlag(FLAGS_n_head);
  options.model.seed = absl::GetFlag(FLAGS_seed);
  options.language.order = absl::GetFlag(FLAGS_order);
  options.language.seed = absl::GetFlag(FLAGS_seed) + 1;
  options.adamw.lr = absl::GetFlag(FLAGS_lr);
  options.adamw.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  options.log_every = absl::GetFlag(FLAGS_log_every);
  options.eval_batches = absl::GetFlag(FLAGS_eval_batches);

  std::printf("main job: GPT (vocab %lld, context %lld, width %lld, %lld layers, %lld heads) on a "
              "Markov language of order %d, %lld AdamW steps of %d x %d tokens, 1 process (CPU)\n",
              static_cast<long long>(options.model.vocab_size),
              static_cast<long long>(options.model.block_size),
              static_cast<long long>(options.model.n_embd),
              static_cast<long long>(options.model.n_layer),
              static_cast<long long>(options.model.n_head), options.language.order,
              static_cast<long long>(options.steps), options.batch_size, options.seq_len);
  std::fflush(stdout);

  absl::StatusOr<integration::GptTrainingResult> result =
      integration::TrainGpt(options, [](const integration::TrainingProgress& p) {
        std::printf("%s\n", integration::FormatProgress(p).c_str());
        std::fflush(stdout);
      });
  if (!result.ok()) {
    std::fprintf(stderr, "main job failed: %s\n", result.status().ToString().c_str());
    return 1;
  }
  const double gap = result->eval_loss / result->entropy_floor - 1.0;
  std::printf("\nfinal train loss %.4f | eval loss %.4f | entropy floor %.4f (%+.1f%%) | "
              "log V %.4f | %.0f tokens/s\n",
              result->final_train_loss, result->eval_loss, result->entropy_floor, 100 * gap,
              result->log_vocab, result->tokens_per_second);
  std::printf("peak memory by tag: %s\n", result->memory.PeakSummary().c_str());

  nlohmann::json summary;
  summary["world_size"] = 1;
  summary["steps"] = options.steps;
  summary["final_train_loss"] = result->final_train_loss;
  summary["eval_loss"] = result->eval_loss;
  summary["entropy_floor"] = result->entropy_floor;
  summary["log_vocab"] = result->log_vocab;
  summary["eval_loss_over_floor"] = result->eval_loss / result->entropy_floor;
  summary["tokens_per_second"] = result->tokens_per_second;
  summary["peak_bytes"] = MemoryJson(result->memory);
  std::cout << summary.dump() << std::endl;
  return 0;
}
