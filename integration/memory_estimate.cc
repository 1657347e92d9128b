#include "integration/memory_estimate.h"

#include <algorithm>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "core/format_bytes.h"
#include "core/host_memory.h"
#include "core/status_macros.h"

namespace integration {
namespace {

// int64 arithmetic that remembers whether any step overflowed.
class Checked {
 public:
  int64_t Mul(int64_t a, int64_t b) {
    int64_t out = 0;
    if (__builtin_mul_overflow(a, b, &out)) overflow_ = true;
    return overflow_ ? 0 : out;
  }
  int64_t Add(int64_t a, int64_t b) {
    int64_t out = 0;
    if (__builtin_add_overflow(a, b, &out)) overflow_ = true;
    return overflow_ ? 0 : out;
  }
  bool overflow() const { return overflow_; }

 private:
  bool overflow_ = false;
};

absl::Status Bad(absl::string_view field, int64_t value, absl::string_view rule) {
  return absl::InvalidArgumentError(
      absl::StrCat("MemoryEstimateInput.", field, " = ", value, ": ", rule));
}

absl::Status Validate(const MemoryEstimateInput& in) {
  if (in.world_size < 1) return Bad("world_size", in.world_size, "must be >= 1");
  if (in.local_ranks < 1 || in.local_ranks > in.world_size) {
    return Bad("local_ranks", in.local_ranks,
               absl::StrCat("must be in [1, world_size = ", in.world_size, "]"));
  }
  if (in.strategy == fsdp::ShardingStrategy::kHybridShard &&
      (in.hybrid_shard_size < 1 || in.world_size % in.hybrid_shard_size != 0)) {
    return Bad(
        "hybrid_shard_size", in.hybrid_shard_size,
        absl::StrCat("HYBRID_SHARD needs a positive divisor of world_size = ", in.world_size));
  }
  if (in.param_dtype != core::DType::kFloat32 && in.param_dtype != core::DType::kBFloat16) {
    return absl::InvalidArgumentError(
        absl::StrCat("MemoryEstimateInput.param_dtype = ", core::DTypeName(in.param_dtype),
                     ": must be float32 or bfloat16"));
  }
  const ModelSizes& m = in.model;
  if (m.num_params < 0) return Bad("model.num_params", m.num_params, "must be >= 0");
  if (m.ignored_params < 0) return Bad("model.ignored_params", m.ignored_params, "must be >= 0");
  if (m.largest_unit_params < 0 || m.largest_unit_params > m.num_params) {
    return Bad("model.largest_unit_params", m.largest_unit_params,
               absl::StrCat("must be in [0, model.num_params = ", m.num_params, "]"));
  }
  if (m.root_unit_params < 0 || m.root_unit_params > m.num_params) {
    return Bad("model.root_unit_params", m.root_unit_params,
               absl::StrCat("must be in [0, model.num_params = ", m.num_params, "]"));
  }
  if (in.cpu_offload && !in.device.is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MemoryEstimateInput.cpu_offload on ", in.device.ToString(),
        ": offload keeps a CUDA model's state in host memory; it needs a CUDA device"));
  }
  if (in.limit_all_gathers < 0) {
    return Bad("limit_all_gathers", in.limit_all_gathers, "must be >= 0");
  }
  if (m.num_units < (m.num_params > 0 ? 1 : 0)) {
    return Bad("model.num_units", m.num_units, "must be >= 1 when there are parameters");
  }
  if (in.activations.has_value()) {
    const GptActivationShape& a = *in.activations;
    const std::pair<const char*, int64_t> dims[] = {
        {"batch_rows", a.batch_rows}, {"seq_len", a.seq_len}, {"n_embd", a.n_embd},
        {"n_layer", a.n_layer},       {"n_head", a.n_head},   {"vocab_size", a.vocab_size}};
    for (const auto& [name, value] : dims) {
      if (value < 0) return Bad(absl::StrCat("activations.", name), value, "must be >= 0");
    }
    std::vector<bool> seen(static_cast<size_t>(a.n_layer), false);
    for (int64_t i : a.checkpointed_blocks) {
      if (i < 0 || i >= a.n_layer || seen[static_cast<size_t>(i)]) {
        return Bad(
            "activations.checkpointed_blocks", i,
            absl::StrCat("must be distinct blocks in [0, activations.n_layer = ", a.n_layer, ")"));
      }
      seen[static_cast<size_t>(i)] = true;
    }
  }
  return absl::OkStatus();
}

int ShardGroupSize(const MemoryEstimateInput& in) {
  switch (in.strategy) {
    case fsdp::ShardingStrategy::kNoShard:
      return 1;
    case fsdp::ShardingStrategy::kHybridShard:
      return in.hybrid_shard_size;
    default:
      return in.world_size;
  }
}

// The quantities of NOTE [Memory estimate] that several of its terms use.
struct Terms {
  int64_t g = 0;             // G, the shard group size
  int64_t compute = 0;       // c, bytes per element of the compute dtype
  int64_t shard = 0;         // S, the shard elements
  int64_t largest_unit = 0;  // Lu, the largest unit's elements, padded
  int64_t root = 0;          // R, the root unit's elements, padded
  int64_t others = 0;        // U - 1, the units besides the root
  int64_t in_flight = 0;     // A, the other units gathered at once
};

// The Terms of `input`; `c` notes any overflow, as in every function below.
Terms TermsOf(const MemoryEstimateInput& input, Checked& c) {
  const ModelSizes& m = input.model;
  Terms t;
  t.g = ShardGroupSize(input);
  t.compute = core::DTypeSize(input.param_dtype);
  t.shard = c.Add((m.num_params + t.g - 1) / t.g, m.num_units);
  t.largest_unit = m.largest_unit_params > 0 ? c.Add(m.largest_unit_params, t.g - 1) : 0;
  // NOTE [Memory estimate]: the root unit stays gathered through the whole pass (its
  // forward and backward enclose the others'), besides the computing unit and up to
  // limit_all_gathers prefetched ones.
  t.root = m.root_unit_params > 0 ? c.Add(m.root_unit_params, t.g - 1) : 0;
  t.others = std::max<int64_t>(m.num_units - 1, 0);
  t.in_flight = std::min<int64_t>(t.others, 1 + std::max(input.limit_all_gathers, 0));
  return t;
}

// The gathered term: compute copies of the gathered parameters and the unsharded fp32
// gradients held at once.
int64_t GatheredBytes(const MemoryEstimateInput& input, const Terms& t, Checked& c) {
  const ModelSizes& m = input.model;
  // The unsharded fp32 gradient held at once: one unit's, or every unit's under no_sync.
  const int64_t full_grad =
      input.no_sync_accumulation ? c.Mul(4, m.num_params) : c.Mul(4, t.largest_unit);
  // NOTE [Memory estimate]: the root unit's full gradient lives through the backward,
  // besides the computing unit's and the one reduction in flight.
  const int64_t grads_in_flight = std::min<int64_t>(t.others, 2);
  const int64_t unit_grads = input.no_sync_accumulation
                                 ? full_grad
                                 : c.Mul(4, c.Add(t.root, c.Mul(grads_in_flight, t.largest_unit)));
  switch (input.strategy) {
    case fsdp::ShardingStrategy::kFullShard:
    case fsdp::ShardingStrategy::kHybridShard:
      return c.Add(c.Mul(t.compute, c.Add(t.root, c.Mul(t.in_flight, t.largest_unit))), unit_grads);
    case fsdp::ShardingStrategy::kShardGradOp:
      return c.Add(c.Mul(t.compute, m.num_params), unit_grads);
    case fsdp::ShardingStrategy::kNoShard:
      return t.compute == 4 ? 0 : c.Mul(t.compute, m.num_params);
  }
  return 0;
}

// The activations term of a GPT of shape `a`.
int64_t ActivationBytes(const GptActivationShape& a, Checked& c) {
  // NOTE [Memory estimate]: each block's share; a checkpointed one keeps its input and
  // is recomputed in the backward.
  const int64_t per_layer = c.Add(c.Add(c.Mul(16, a.n_embd), c.Mul(a.n_head, a.seq_len)), 4);
  std::vector<bool> checkpointed(static_cast<size_t>(a.n_layer), false);
  for (int64_t i : a.checkpointed_blocks) checkpointed[static_cast<size_t>(i)] = true;
  int64_t held = 0, recompute = 0;
  for (int64_t i = 0; i < a.n_layer; ++i) {
    if (checkpointed[static_cast<size_t>(i)]) {
      // Its input stays held while it is recomputed.
      recompute = std::max(recompute, c.Add(c.Add(held, a.n_embd), per_layer));
      held = c.Add(held, a.n_embd);
    } else {
      held = c.Add(held, per_layer);
    }
  }
  // The head at the loss (the logits and their gradient) and in the backward (the
  // gradient only: the training step frees the logits), NOTE [Memory estimate].
  const int64_t at_loss = c.Add(c.Add(held, c.Mul(2, a.n_embd)), c.Mul(2, a.vocab_size));
  const int64_t in_backward =
      c.Add(c.Add(std::max(held, recompute), c.Mul(5, a.n_embd)), a.vocab_size);
  const int64_t per_token = c.Add(std::max(at_loss, in_backward), 4);
  return c.Mul(4, c.Mul(c.Mul(a.batch_rows, a.seq_len), per_token));
}

// The comm term: the collectives' staging and, under offload, the copies to the device.
int64_t CommBytes(const MemoryEstimateInput& input, const Terms& t, Checked& c) {
  const int64_t largest_shard = (t.largest_unit + t.g - 1) / t.g;
  int64_t bytes = 0;
  // The collectives' staging (fsdp/unit.cc, tag comm): the shard each all-gather in
  // flight sends and the shard the reduction in flight receives.
  if (t.g > 1 && input.strategy != fsdp::ShardingStrategy::kNoShard) {
    bytes = c.Mul(c.Mul(4, largest_shard), c.Add(std::max<int64_t>(t.in_flight, 1), 1));
  }
  if (input.cpu_offload) {
    // The float32 copy of each shard on its way to the device.
    bytes = c.Add(bytes, c.Mul(c.Mul(4, largest_shard), std::max<int64_t>(t.in_flight, 1)));
  }
  return bytes;
}

// Sets where the per-rank bytes live: per_device_bytes and per_host_bytes.
void SetDeviceAndHostBytes(const MemoryEstimateInput& input, const Terms& t, Checked& c,
                           MemoryEstimate& e) {
  const ModelSizes& m = input.model;
  if (input.device.is_cuda()) {
    // NOTE [Memory estimate on a device]: the model is built on the host and moved to
    // the device whole before sharding, so the device holds max(init, training) and the
    // host only each rank's CPU-built model (4 P + 4 I).
    e.per_device_bytes = e.per_rank_bytes;
    // A deferred model is never built on the host: Flatten fills one unit's shard there
    // at a time and copies it over.
    const int64_t built = input.deferred_init ? c.Mul(4, (t.largest_unit + t.g - 1) / t.g)
                                              : c.Mul(4, c.Add(m.num_params, m.ignored_params));
    e.per_host_bytes = c.Mul(std::max(built, e.offloaded_bytes), input.local_ranks);
  } else {
    e.per_host_bytes = c.Mul(e.per_rank_bytes, input.local_ranks);
  }
}

}  // namespace

ModelSizes ModelSizesFromPlan(const policy::WrapPlan& plan) {
  ModelSizes sizes;
  sizes.num_params = plan.totals().numel();
  sizes.ignored_params = plan.totals().ignored_numel();
  sizes.num_units = plan.units_size();
  for (const policy::WrapUnit& unit : plan.units()) {
    sizes.largest_unit_params = std::max(sizes.largest_unit_params, unit.numel());
    if (unit.path().empty()) sizes.root_unit_params = unit.numel();
  }
  return sizes;
}

ModelSizes ModelSizesOfModule(const core::Module& model) {
  ModelSizes sizes;
  sizes.num_params = model.NumParameterElements();
  sizes.largest_unit_params = sizes.num_params;
  sizes.root_unit_params = sizes.num_params;
  sizes.num_units = 1;
  return sizes;
}

std::vector<int64_t> GptCheckpointedBlocks(const policy::WrapPlan& plan) {
  std::vector<int64_t> out;
  for (const policy::CheckpointedModule& m : plan.checkpointed()) {
    int64_t i = 0;
    absl::string_view path = m.path();
    if (absl::ConsumePrefix(&path, "blocks.") && absl::SimpleAtoi(path, &i) && i >= 0) {
      out.push_back(i);
    }
  }
  return out;
}

GptActivationShape GptActivations(const nn::GptConfig& config, int64_t batch_rows,
                                  int64_t seq_len) {
  GptActivationShape shape;
  shape.batch_rows = batch_rows;
  shape.seq_len = seq_len;
  shape.n_embd = config.n_embd;
  shape.n_layer = config.n_layer;
  shape.n_head = config.n_head;
  shape.vocab_size = config.vocab_size;
  return shape;
}

std::string MemoryEstimate::Describe() const {
  std::string out = absl::StrCat(
      "per rank ", core::FormatBytes(per_rank_bytes), " = max(init ", core::FormatBytes(init_bytes),
      ", model state ", core::FormatBytes(model_state_bytes), " + gathered ",
      core::FormatBytes(gathered_bytes), " + activations ",
      activations_estimated ? core::FormatBytes(activation_bytes) : "not estimated", " + comm ",
      core::FormatBytes(comm_bytes), ")");
  if (device.is_cuda() && offloaded_bytes > 0) {
    absl::StrAppend(&out, " on ", device.ToString(), "; offloaded to the host ",
                    core::FormatBytes(offloaded_bytes), " per rank, the host holding ",
                    core::FormatBytes(per_host_bytes), " for ", local_ranks,
                    local_ranks == 1 ? " rank" : " ranks");
  } else if (device.is_cuda()) {
    absl::StrAppend(&out, " on ", device.ToString(),
                    "; the host holds each rank's CPU-built "
                    "model, ",
                    core::FormatBytes(per_host_bytes), " for ", local_ranks,
                    local_ranks == 1 ? " rank" : " ranks");
  } else if (local_ranks > 1) {
    absl::StrAppend(&out, "; x ", local_ranks,
                    " ranks on this host = ", core::FormatBytes(per_host_bytes));
  }
  return out;
}

absl::StatusOr<MemoryEstimate> EstimateMemory(const MemoryEstimateInput& input) {
  RETURN_IF_ERROR(Validate(input));
  Checked c;
  const ModelSizes& m = input.model;
  const Terms t = TermsOf(input, c);

  MemoryEstimate e;
  // NOTE [Memory estimate]: offload moves the managed state (and a pinned staging shard
  // per unit) to the host.
  if (input.cpu_offload) {
    e.model_state_bytes = c.Mul(16, m.ignored_params);
    e.offloaded_bytes = c.Mul(20, t.shard);
  } else {
    e.model_state_bytes = c.Add(c.Mul(16, t.shard), c.Mul(16, m.ignored_params));
  }
  e.gathered_bytes = GatheredBytes(input, t, c);
  if (input.activations.has_value()) {
    e.activation_bytes = ActivationBytes(*input.activations, c);
    e.activations_estimated = true;
  }
  e.comm_bytes = CommBytes(input, t, c);
  e.init_bytes = input.deferred_init
                     ? 0
                     : c.Mul(4, c.Add(c.Add(m.num_params, m.ignored_params), t.largest_unit));
  const int64_t training =
      c.Add(c.Add(c.Add(e.model_state_bytes, e.gathered_bytes), e.activation_bytes), e.comm_bytes);
  e.per_rank_bytes = std::max(e.init_bytes, training);
  e.local_ranks = input.local_ranks;
  e.device = input.device;
  SetDeviceAndHostBytes(input, t, c, e);
  if (c.overflow()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the memory estimate overflows int64 (more than 8 EiB per host) for ",
                     m.num_params, " parameters on ", input.world_size, " ranks",
                     input.activations.has_value()
                         ? absl::StrCat(" with activations of ", input.activations->batch_rows,
                                        " x ", input.activations->seq_len, " tokens")
                         : std::string()));
  }
  return e;
}

absl::Status CheckFitsInMemory(const MemoryEstimate& estimate, int64_t available_bytes,
                               absl::string_view available_source) {
  if (estimate.per_host_bytes <= available_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "the run does not fit in this host's memory: it needs an estimated ",
      core::FormatBytes(estimate.per_host_bytes), " (", estimate.per_host_bytes, " bytes; ",
      estimate.Describe(), ") but ", core::FormatBytes(available_bytes), " (", available_bytes,
      " bytes) are available (", available_source, "); short by ",
      core::FormatBytes(estimate.per_host_bytes - available_bytes),
      ". Use more ranks or hosts, FULL_SHARD, bf16 mixed precision, or a smaller batch or "
      "model"));
}

absl::Status CheckFitsInDeviceMemory(const MemoryEstimate& estimate, int64_t available_bytes,
                                     absl::string_view available_source) {
  if (!estimate.device.is_cuda() || estimate.per_device_bytes <= available_bytes) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "the run does not fit in ", estimate.device.ToString(), "'s memory: it needs an estimated ",
      core::FormatBytes(estimate.per_device_bytes), " (", estimate.per_device_bytes, " bytes; ",
      estimate.Describe(), ") but ", core::FormatBytes(available_bytes), " (", available_bytes,
      " bytes) are free (", available_source, "); short by ",
      core::FormatBytes(estimate.per_device_bytes - available_bytes),
      ". Use more GPUs, FULL_SHARD, bf16 mixed precision, or a smaller batch or model"));
}

absl::Status CheckFitsInHostMemory(const MemoryEstimate& estimate) {
  absl::StatusOr<core::HostMemoryInfo> info = core::ReadHostMemoryInfo();
  if (!info.ok()) return info.status();
  return CheckFitsInMemory(estimate, info->Available(), info->Describe());
}

}  // namespace integration
