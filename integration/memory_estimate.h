// Per-rank memory estimate of an FSDP training run, checked against the memory this
// host has, so that a model that cannot fit fails up front with a message naming the
// estimate, the available memory and the shortfall, instead of being OOM-killed
// without a word.
//
//   integration::MemoryEstimateInput input;
//   input.model = integration::ModelSizesFromPlan(plan);   // or ModelSizesOfModule(*model)
//   input.world_size = group->size();
//   input.local_ranks = ranks_on_this_host;
//   input.strategy = options.wrap.strategy;
//   input.hybrid_shard_size = options.wrap.hybrid_shard_size;
//   input.param_dtype = options.wrap.mixed_precision.param_dtype;
//   input.activations = integration::GptActivations(gpt_config, rows_per_rank, seq_len);
//   ASSIGN_OR_RETURN(integration::MemoryEstimate estimate, integration::EstimateMemory(input));
//   RETURN_IF_ERROR(integration::CheckFitsInHostMemory(estimate));
//
// NOTE [Memory estimate]: bytes per rank, with G the shard group size (FULL_SHARD and
// SHARD_GRAD_OP: world size; HYBRID_SHARD: hybrid_shard_size; NO_SHARD: 1), P the
// managed parameter elements in U units, S = ceil(P / G) + U the shard elements (each
// unit padded to a multiple of G adds at most one element per rank), Lu = the largest
// unit's elements + G - 1 (padded), c = bytes per element of the compute dtype (4
// fp32, 2 bf16) and I the ignored (unmanaged, replicated) elements:
//   model state   16 S + 16 I        fp32 shard 4 S + gradient shard 4 S + AdamW 8 S, as
//                                    ZeRO-3's 16 Psi / N (policy/plan.proto NOTE [Plan
//                                    memory accounting]); ignored parameters in full.
//   gathered      with R the root unit's elements (the wrapped module's own unit, padded)
//                 and A = min(U - 1, 1 + limit_all_gathers) the other units gathered at
//                 once (the computing one and those prefetched ahead of it):
//                 FULL/HYBRID_SHARD: c (R + A Lu) + 4 (R + min(U - 1, 2) Lu) — the root
//                 unit stays gathered through the pass, since its forward and backward
//                 enclose the others'; the unsharded fp32 gradients of the root, of the
//                 computing unit and of the reduction in flight;
//                 SHARD_GRAD_OP: c P + the same gradients (parameters stay gathered from
//                 forward to backward); NO_SHARD: c P when c != 4 (the compute copy),
//                 else 0. Gradient accumulation with no_sync (StageOptions::accumulation,
//                 NOTE [Gradient accumulation]) keeps every unit's unsharded fp32 gradient
//                 until the last micro-batch: 4 P instead (NO_SHARD: no change).
//   comm          4 ceil(Lu / G) (max(A, 1) + 1) when G > 1 (not NO_SHARD): the shard
//                 each all-gather in flight sends and the one the reduction receives.
//   activations   GPT (nn/gpt.h, fp32 on the CPU, every layer's cache kept for
//                 backward), in floats per token: each block keeps P = 16 C + H T + 4 (its
//                 LayerNorm, Linear and GELU caches, the attention probabilities and the
//                 LayerNorms' row statistics, a mean and an rstd each), a checkpointed block
//                 only its input, C (NOTE
//                 [Activation checkpointing] in core/module.h). The peak is the larger of
//                 the loss (every block's share, the logits and their gradient, 2 V, and
//                 ln_f's and lm_head's caches, 2 C) and the backward (the logits freed,
//                 as the training step does in integration/gpt_module.cc: their gradient
//                 V and about 5 C of caches and gradients on their way back, with every
//                 block's share held, or, recomputing a checkpointed block j, the shares
//                 of the blocks before j, j's input and its full P):
//                   4 B T (max(S + 2 C + 2 V, max(S, max_j R_j) + 5 C + V) + 4),
//                   S = sum_i share_i,  R_j = sum_{i<j} share_i + C + P,
//                 the 4 for ln_f's row statistics and the loss's and the kernels' small
//                 buffers (64-byte aligned).
//                 B is the rows of this rank's batch (of one micro-batch with gradient
//                 accumulation), T the sequence length. memory_estimate_test checks it
//                 against the measured peak on the CPU: at or above it and within 5%, with
//                 none, some and every block checkpointed. On a CUDA device under bf16 the
//                 formula is an upper bound: bf16 activations and the fused attention
//                 (its output and row statistics, no T x T probabilities) keep less. The formula is
//                 the GPT's caches; for another model (the main job's --model=llama: RMSNorm,
//                 rotary, GQA, SwiGLU caches) the activations are not estimated, and the estimate
//                 says so (MemoryEstimate::activations_estimated) rather than print a wrong figure:
//                 it is then a lower bound.
//   init          4 P + 4 I + 4 Lu   every rank builds the full fp32 model before
//                                    sharding it, plus one unit's flat buffer; 0 for a
//                                    deferred model (NOTE [Deferred initialisation] in
//                                    core/param_init.h), whose wrap allocates shards only.
//   per rank      max(init, model state + gathered + activations + comm);
//   per host      per rank x local_ranks (the ranks sharing this host's memory).
// CPU offload (FullyShardOptions::cpu_offload, NOTE [CPU offload] in fsdp/options.h; a
// CUDA device only) moves the managed model state to the host: the device's model state
// is 16 I, its comm term adds the float32 copy of each shard in flight to the device,
// 4 ceil(Lu / G) max(A, 1) (also when G = 1), and the host holds per rank
//   offloaded     16 S + 4 S         the state, and the pinned buffer each unit's reduced
//                                    gradient chunk comes back into.
// On a CUDA device the per-rank figure is the device's (bf16 compute copies are not
// widened there: c = 2) and the host holds only each rank's CPU-built model, 4 P + 4 I
// (deferred: the one shard Flatten fills on the host at a time, 4 ceil(Lu / G)).
// It is an estimate: allocator rounding, the backends' own buffers (gloo's ring pieces,
// NCCL's) and the runtime are not in it, so CheckFitsInMemory passing is necessary, not
// sufficient. The main job's summary prints it over the fit's measured peak.
#ifndef INTEGRATION_MEMORY_ESTIMATE_H_
#define INTEGRATION_MEMORY_ESTIMATE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/module.h"
#include "fsdp/options.h"
#include "nn/gpt.h"
#include "policy/plan.pb.h"

namespace integration {

// The model's parameter counts, in elements.
struct ModelSizes {
  // Managed parameters (tied counted once), all units together.
  int64_t num_params = 0;
  // Elements of the largest FSDP unit; <= num_params.
  int64_t largest_unit_params = 0;
  // Elements of the root unit (the wrapped module's own); <= num_params.
  int64_t root_unit_params = 0;
  // FSDP units (>= 1 when num_params > 0).
  int64_t num_units = 1;
  // Ignored parameters: unmanaged, held in full (with gradients and AdamW state) by
  // every rank.
  int64_t ignored_params = 0;
};

// Sizes from a wrap plan (policy/plan.h): its units and totals.
ModelSizes ModelSizesFromPlan(const policy::WrapPlan& plan);

// Sizes of `model` wrapped as one unit (no policy).
ModelSizes ModelSizesOfModule(const core::Module& model);

// The shape of a GPT's activations on one rank.
struct GptActivationShape {
  int64_t batch_rows = 0;  // B: rows of this rank's batch
  int64_t seq_len = 0;     // T
  int64_t n_embd = 0;      // C
  int64_t n_layer = 0;     // L
  int64_t n_head = 0;      // H
  int64_t vocab_size = 0;  // V
  // Indices (in [0, n_layer), each once) of the blocks whose activations are
  // checkpointed (FullyShardOptions::checkpoint_policy; GptCheckpointedBlocks reads them
  // from a plan).
  std::vector<int64_t> checkpointed_blocks;
};

// The indices of the blocks ("blocks.<i>", as nn::Gpt names them) among `plan`'s
// checkpointed modules.
std::vector<int64_t> GptCheckpointedBlocks(const policy::WrapPlan& plan);

// The activation shape of `config` for `batch_rows` rows of `seq_len` tokens.
GptActivationShape GptActivations(const nn::GptConfig& config, int64_t batch_rows, int64_t seq_len);

struct MemoryEstimateInput {
  ModelSizes model;
  int world_size = 1;
  // Ranks whose memory comes from this host (1 ..= world_size).
  int local_ranks = 1;
  fsdp::ShardingStrategy strategy = fsdp::ShardingStrategy::kFullShard;
  // HYBRID_SHARD only: ranks per shard group (divides world_size).
  int hybrid_shard_size = 0;
  // The compute dtype of gathered parameters (FullyShardOptions.mixed_precision).
  core::DType param_dtype = core::DType::kFloat32;
  // FullyShardOptions.limit_all_gathers: units gathered ahead of the computing one.
  int limit_all_gathers = 2;
  // Unset: activations are not estimated (0).
  std::optional<GptActivationShape> activations;
  // Gradient accumulation keeps every unit's full gradient (StageOptions::Accumulation
  // kNoSync with grad_accumulation > 1).
  bool no_sync_accumulation = false;
  // The model is built deferred (GptModuleOptions::deferred_init): no full model before
  // the wrap, whose shards are part of the model state (init 0).
  bool deferred_init = false;
  // FullyShardOptions::cpu_offload (a CUDA device only; InvalidArgument on the CPU).
  bool cpu_offload = false;
  // Where the ranks compute (NOTE [Memory estimate on a device] in memory_estimate.cc):
  // on a CUDA device the per-rank figure is device memory, and the host holds only each
  // rank's CPU-built model.
  core::Device device = core::Device::Cpu();
};

// What the job says where the activations were not estimated (NOTE [Memory estimate]).
inline constexpr char kActivationsNotEstimated[] =
    "the memory estimate leaves out the activations (NOTE [Memory estimate]'s formula is the "
    "GPT's and does not cover this model): it is a lower bound";

// Bytes, per NOTE [Memory estimate].
struct MemoryEstimate {
  int64_t model_state_bytes = 0;
  int64_t gathered_bytes = 0;
  // 0 and activations_estimated false when MemoryEstimateInput::activations was unset.
  int64_t activation_bytes = 0;
  bool activations_estimated = false;
  int64_t comm_bytes = 0;
  int64_t init_bytes = 0;
  // Host bytes per rank under cpu_offload (0 without).
  int64_t offloaded_bytes = 0;
  int64_t per_rank_bytes = 0;
  int local_ranks = 1;
  // Host bytes: per_rank_bytes x local_ranks on the CPU; on a CUDA device the CPU-built
  // models, 4 (P + I) x local_ranks (deferred: one shard each), or under cpu_offload the
  // larger of those and offloaded_bytes x local_ranks.
  int64_t per_host_bytes = 0;
  core::Device device = core::Device::Cpu();
  // On a CUDA device: per_rank_bytes, held in each rank's device memory; 0 on the CPU.
  int64_t per_device_bytes = 0;

  // "per rank 1.20GiB = max(init 400.00MiB, model state 800.00MiB + gathered
  // 100.00MiB + activations 328.00MiB + comm 1.00MiB); x 4 ranks on this host = 4.80GiB"
  // ("activations not estimated" in place of their figure when they were not).
  std::string Describe() const;
};

// The estimate of `input`. InvalidArgument naming the field ("MemoryEstimateInput.
// world_size", "...activations.seq_len", ...) for a negative or inconsistent size;
// ResourceExhausted when the figure overflows int64 (it cannot fit anywhere).
absl::StatusOr<MemoryEstimate> EstimateMemory(const MemoryEstimateInput& input);

// OK when estimate.per_host_bytes <= available_bytes; otherwise ResourceExhausted
// naming the estimate (Describe()), the available memory (from `available_source`,
// e.g. "MemAvailable 21.00GiB of MemTotal 23.50GiB") and the shortfall.
absl::Status CheckFitsInMemory(const MemoryEstimate& estimate, int64_t available_bytes,
                               absl::string_view available_source);

// On a CUDA device: OK when estimate.per_device_bytes <= available_bytes (free device
// memory, described by `available_source`), otherwise ResourceExhausted naming the
// device, the estimate and the shortfall. OK on the CPU (nothing to check).
absl::Status CheckFitsInDeviceMemory(const MemoryEstimate& estimate, int64_t available_bytes,
                                     absl::string_view available_source);

// CheckFitsInMemory against this host now: core::ReadHostMemoryInfo's Available()
// (/proc/meminfo MemAvailable, or less under a cgroup memory limit). The error of
// reading /proc/meminfo when that fails.
absl::Status CheckFitsInHostMemory(const MemoryEstimate& estimate);

}  // namespace integration

#endif  // INTEGRATION_MEMORY_ESTIMATE_H_
