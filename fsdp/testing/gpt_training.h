// Test-only: the Gpt training runs the fsdp tests compare: a single-process unwrapped
// reference and the same training on one rank of a thread-rank group under FullyShard.
// The runs take any language model (a ModelFactory: llama_parity_test trains an
// nn::Llama) on the setup's data, steps and optimizer.
//
//   fsdp::testing::GptTrainingSetup setup = fsdp::testing::TinySetup();
//   ASSIGN_OR_RETURN(fsdp::testing::TrainingRun reference, fsdp::testing::TrainUnwrapped(setup));
//   absl::Status s = comm::testing::RunThreadRanks(4, [&](comm::testing::RankContext& ctx) {
//     ASSIGN_OR_RETURN(auto run, fsdp::testing::TrainFullyShardedRank(ctx, setup, options));
//     return fsdp::testing::CompareRuns(reference, run, 1e-5, 1e-6);
//   });
//
// Both runs see the same global batches (data::MarkovLanguage batch `step`); a rank
// trains on its data::RankSampler rows with the loss averaged over them, so the
// averaged reduce-scatter gives the gradient of the global-batch mean loss. Both go
// through one training loop, test-only and apart from integration::StageRunner::Fit on
// purpose (NOTE [Parity training loop] in the .cc).
#ifndef FSDP_TESTING_GPT_TRAINING_H_
#define FSDP_TESTING_GPT_TRAINING_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/testing/thread_ranks.h"
#include "core/module.h"
#include "data/markov_language.h"
#include "fsdp/handle.h"
#include "fsdp/options.h"
#include "fsdp/registry.h"
#include "nn/gpt.h"
#include "optim/adamw.h"

namespace fsdp {
namespace testing {

struct GptTrainingSetup {
  nn::GptConfig gpt;
  data::MarkovLanguageOptions language;
  // Rows of every global batch; a multiple of every world size tested (12: N = 1..4).
  int global_batch = 12;
  int seq_len = 8;
  int steps = 20;
  optim::AdamWOptions adamw;
  // Parameters (NamedParameters() names) MakeGpt marks requires_grad = false.
  std::vector<std::string> frozen;
  // The model is a graph module (NOTE [Graph modules] in core/module.h): each step runs
  // ForwardBackwardGraph instead of ForwardBackward.
  bool graph_model = false;
};

// A Gpt of 2 blocks, width 16, 2 heads, vocabulary 16, context 8 (about 7k parameters),
// AdamW lr 1e-2, eps 1e-5 (NOTE [AdamW eps in parity runs] in the .cc): small enough for 16
// four-rank runs in seconds, large enough that every unit holds parameters on every rank.
GptTrainingSetup TinySetup();

struct TrainingRun {
  // Loss of the global batch at each step (on a rank: the mean of the ranks' local
  // losses, all-reduced).
  std::vector<double> losses;
  // Final full parameters by NamedParameters() name.
  std::vector<std::pair<std::string, std::vector<float>>> params;
};

// The language, the model and the batch of a step, shared by both runs.
absl::StatusOr<data::MarkovLanguage> MakeLanguage(const GptTrainingSetup& setup);
// InvalidArgument naming a `frozen` entry that is not a parameter.
absl::StatusOr<std::shared_ptr<nn::Gpt>> MakeGpt(const GptTrainingSetup& setup);
// A strategy at a world size, the parameter of the tests that run every strategy.
struct StrategyCase {
  ShardingStrategy strategy;
  int world_size;
  int hybrid_shard_size;  // HYBRID_SHARD only, else 0
};

// "FULLSHARD_N2", "HYBRIDSHARD_N4_H2": a gtest parameter name.
std::string StrategyCaseName(const StrategyCase& c);

// FULL_SHARD at N = 1, 2 and 4, SHARD_GRAD_OP and NO_SHARD at N = 2, HYBRID_SHARD 2 x 2 at N = 4:
// every strategy and world size once, for the parity tests that do not run every case.
std::vector<StrategyCase> SomeStrategyCases();

// The policy the parity tests use: one unit per `block_type` module (the GPT's
// TransformerBlock by default), plus the root.
FullyShardOptions PerBlockOptions(ShardingStrategy strategy, int hybrid_shard_size = 0,
                                  const std::string& block_type = "TransformerBlock");

// Builds the model a run trains: a language model (int32 tokens [B, T] -> logits [B, T, V])
// with the same values on every call.
using ModelFactory = std::function<absl::StatusOr<std::shared_ptr<core::Module>>()>;

// One forward/backward on `batch` (grads accumulate; no optimizer step); returns the
// loss, the mean over the batch's tokens.
absl::StatusOr<double> ForwardBackward(core::Module& model, const data::TokenBatch& batch);
// The same for a graph module: logits = model.CallOne({inputs}), the loss
// nn::functional::CrossEntropy, then core::Backward.
absl::StatusOr<double> ForwardBackwardGraph(core::Module& model, const data::TokenBatch& batch);

// Single process, no FSDP: MakeGpt(setup), or the model `make` builds (setup.gpt and
// setup.frozen unused then), trained on the setup's batches with its AdamW.
absl::StatusOr<TrainingRun> TrainUnwrapped(const GptTrainingSetup& setup);
absl::StatusOr<TrainingRun> TrainUnwrapped(const GptTrainingSetup& setup, const ModelFactory& make);

// On one rank: builds the same Gpt (or the model `make` builds), FullyShards it with
// `options` (a fresh registry), trains with AdamW on the rank's slices, then Releases it to
// read the full parameters.
absl::StatusOr<TrainingRun> TrainFullyShardedRank(comm::testing::RankContext& ctx,
                                                  const GptTrainingSetup& setup,
                                                  const FullyShardOptions& options);
absl::StatusOr<TrainingRun> TrainFullyShardedRank(comm::testing::RankContext& ctx,
                                                  const GptTrainingSetup& setup,
                                                  const FullyShardOptions& options,
                                                  const ModelFactory& make);

// The same for a model the caller made (plain, as MakeGpt(setup) returns it) through a
// registry the caller keeps: FullyShards `model` with `options` via `registry`, trains,
// Releases. Fails with FullyShard's error if the wrap fails.
absl::StatusOr<TrainingRun> TrainFullyShardedModel(comm::testing::RankContext& ctx,
                                                   const GptTrainingSetup& setup,
                                                   const FullyShardOptions& options,
                                                   const std::shared_ptr<core::Module>& model,
                                                   WrapperRegistry* registry);

// NOTE [FULL_SHARD memory bound] (fsdp/comm_memory_test.cc): the peak param + grad + optim
// bytes per rank of a GPT wrapped one unit a block plus the root under FULL_SHARD with fp32
// AdamW, over `world` ranks with `limit_all_gathers` prefetched units, from the units'
// padded sizes (`handle`: all blocks the same size, the root last).
struct MemoryBound {
  int64_t sharded = 0;    // shards, gradient shards and AdamW's two states
  int64_t transient = 0;  // unsharded parameters and full gradients in flight
  int64_t total() const { return sharded + transient; }
};
MemoryBound FullShardMemoryBound(const FullyShardHandle& handle, int limit_all_gathers, int world);

// The mean of every rank's micro-batch losses, gathered and added in rank order (micro-batch
// order when each rank holds an aligned range): the step loss of the deterministic runs.
absl::StatusOr<double> MicroBatchMeanLoss(comm::testing::RankContext& ctx,
                                          const std::vector<float>& losses);

// The values of a module's parameters by name (full-shape data read as floats).
std::vector<std::pair<std::string, std::vector<float>>> ParameterValues(const core::Module& m);

// OK when `actual` matches `expected` elementwise within |a - e| <= atol + rtol |e|
// (losses and parameters, same names in the same order); otherwise Internal naming the
// first mismatch (step, or parameter and index) with both values. When OK and
// `worst_ratio` is set, stores the largest |a - e| / (atol + rtol |e|) (how much of the
// tolerance the run used).
absl::Status CompareRuns(const TrainingRun& expected, const TrainingRun& actual, double rtol,
                         double atol, double* worst_ratio = nullptr);

// OK when the wrap plan of options.policy over `model` at `world_size` makes each module of
// `paths` ("blocks.0.attn") the root of a unit; NotFound naming the first that is not, or the
// planner's error.
absl::Status CheckUnits(const core::Module& model, const FullyShardOptions& options, int world_size,
                        const std::vector<std::string>& paths);

}  // namespace testing
}  // namespace fsdp

#endif  // FSDP_TESTING_GPT_TRAINING_H_
