#include "fsdp/options.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"

namespace fsdp {
namespace {

std::string PolicyName(const policy::WrapPolicyPtr& p) {
  return p == nullptr ? policy::Never()->Name() : p->Name();
}

// What the policy decides (WrapPolicy::Identity), not only what it is called.
std::string PolicyIdentity(const policy::WrapPolicyPtr& p) {
  return p == nullptr ? policy::Never()->Identity() : p->Identity();
}

std::string Bool(bool b) { return b ? "true" : "false"; }

// "" when `a` and `b` decide alike; else "<field>: <difference>".
std::string PolicyDifference(const char* field, const policy::WrapPolicyPtr& a,
                             const policy::WrapPolicyPtr& b) {
  if (PolicyIdentity(a) == PolicyIdentity(b)) return "";
  if (PolicyName(a) == PolicyName(b)) {
    return absl::StrCat(field, ": another policy named '", PolicyName(a),
                        "' (policies compare by what they decide, WrapPolicy::Identity(): ",
                        PolicyIdentity(a), " vs ", PolicyIdentity(b), ")");
  }
  return absl::StrCat(field, ": ", PolicyName(a), " vs ", PolicyName(b));
}

// OK, or InvalidArgument "FullyShardOptions.<field> (<name>): <why>".
absl::Status ValidatePolicy(const char* field, const policy::WrapPolicyPtr& p) {
  if (p == nullptr) return absl::OkStatus();
  absl::Status s = p->Validate();
  if (s.ok()) return s;
  return absl::InvalidArgumentError(
      absl::StrCat("FullyShardOptions.", field, " (", p->Name(), "): ", s.message()));
}

}  // namespace

std::string ShardingStrategyName(ShardingStrategy strategy) {
  switch (strategy) {
    case ShardingStrategy::kFullShard:
      return "FULL_SHARD";
    case ShardingStrategy::kShardGradOp:
      return "SHARD_GRAD_OP";
    case ShardingStrategy::kNoShard:
      return "NO_SHARD";
    case ShardingStrategy::kHybridShard:
      return "HYBRID_SHARD";
  }
  return "UNKNOWN";
}

absl::Status FullyShardOptions::Validate(int group_size) const {
  RETURN_IF_ERROR(ValidatePolicy("policy", policy));
  RETURN_IF_ERROR(ValidatePolicy("checkpoint_policy", checkpoint_policy));
  if (strategy == ShardingStrategy::kHybridShard) {
    if (hybrid_shard_size < 1 || group_size % hybrid_shard_size != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "FullyShardOptions.hybrid_shard_size is ", hybrid_shard_size,
          "; HYBRID_SHARD needs a positive shard group size that divides the group size ",
          group_size));
    }
  } else if (hybrid_shard_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FullyShardOptions.hybrid_shard_size is ", hybrid_shard_size,
        " but the "
        "strategy is ",
        ShardingStrategyName(strategy), "; it applies to HYBRID_SHARD only (leave it 0)"));
  }
  for (const auto& [dtype, name] :
       {std::pair<core::DType, const char*>{mixed_precision.param_dtype, "param_dtype"},
        {mixed_precision.reduce_dtype, "reduce_dtype"}}) {
    if (dtype != core::DType::kFloat32 && dtype != core::DType::kBFloat16) {
      return absl::InvalidArgumentError(absl::StrCat("FullyShardOptions.mixed_precision.", name,
                                                     " is ", core::DTypeName(dtype),
                                                     "; it must be float32 or bfloat16"));
    }
  }
  if (limit_all_gathers < 0) {
    return absl::InvalidArgumentError(absl::StrCat("FullyShardOptions.limit_all_gathers is ",
                                                   limit_all_gathers, "; it must be >= 0"));
  }
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FullyShardOptions.timeout is ", absl::FormatDuration(timeout), "; it must be positive"));
  }
  if (deterministic) {
    // NOTE [Deterministic reduction]: a tree over the ranks, in fp32.
    if (group_size < 1 || (group_size & (group_size - 1)) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "FullyShardOptions.deterministic needs a power-of-two group size (1, 2, 4, ...), got ",
          group_size));
    }
    if (mixed_precision.reduce_dtype != core::DType::kFloat32) {
      return absl::InvalidArgumentError(absl::StrCat(
          "FullyShardOptions.deterministic reduces in float32; mixed_precision.reduce_dtype is ",
          core::DTypeName(mixed_precision.reduce_dtype)));
    }
    if (cpu_offload) {
      return absl::InvalidArgumentError(
          "FullyShardOptions.deterministic runs on CPU parameters; cpu_offload needs CUDA ones");
    }
  }
  return absl::OkStatus();
}

int ShardGroupSize(const FullyShardOptions& options, int group_size) {
  switch (options.strategy) {
    case ShardingStrategy::kFullShard:
    case ShardingStrategy::kShardGradOp:
      return group_size;
    case ShardingStrategy::kNoShard:
      return 1;
    case ShardingStrategy::kHybridShard:
      return options.hybrid_shard_size;
  }
  return group_size;
}

std::string FirstDifferingOption(const FullyShardOptions& a, const FullyShardOptions& b) {
  if (std::string d = PolicyDifference("policy", a.policy, b.policy); !d.empty()) return d;
  if (std::string d =
          PolicyDifference("checkpoint_policy", a.checkpoint_policy, b.checkpoint_policy);
      !d.empty()) {
    return d;
  }
  if (a.strategy != b.strategy) {
    return absl::StrCat("strategy: ", ShardingStrategyName(a.strategy), " vs ",
                        ShardingStrategyName(b.strategy));
  }
  if (a.hybrid_shard_size != b.hybrid_shard_size) {
    return absl::StrCat("hybrid_shard_size: ", a.hybrid_shard_size, " vs ", b.hybrid_shard_size);
  }
  if (a.mixed_precision.param_dtype != b.mixed_precision.param_dtype) {
    return absl::StrCat(
        "mixed_precision.param_dtype: ", core::DTypeName(a.mixed_precision.param_dtype), " vs ",
        core::DTypeName(b.mixed_precision.param_dtype));
  }
  if (a.mixed_precision.reduce_dtype != b.mixed_precision.reduce_dtype) {
    return absl::StrCat(
        "mixed_precision.reduce_dtype: ", core::DTypeName(a.mixed_precision.reduce_dtype), " vs ",
        core::DTypeName(b.mixed_precision.reduce_dtype));
  }
  if (a.backward_prefetch != b.backward_prefetch) {
    return absl::StrCat("backward_prefetch: ", Bool(a.backward_prefetch), " vs ",
                        Bool(b.backward_prefetch));
  }
  if (a.forward_prefetch != b.forward_prefetch) {
    return absl::StrCat("forward_prefetch: ", Bool(a.forward_prefetch), " vs ",
                        Bool(b.forward_prefetch));
  }
  if (a.limit_all_gathers != b.limit_all_gathers) {
    return absl::StrCat("limit_all_gathers: ", a.limit_all_gathers, " vs ", b.limit_all_gathers);
  }
  if (a.ignored_paths != b.ignored_paths) {
    return absl::StrCat("ignored_paths: [", absl::StrJoin(a.ignored_paths, ", "), "] vs [",
                        absl::StrJoin(b.ignored_paths, ", "), "]");
  }
  if (a.sync_module_states != b.sync_module_states) {
    return absl::StrCat("sync_module_states: ", Bool(a.sync_module_states), " vs ",
                        Bool(b.sync_module_states));
  }
  if (a.deterministic != b.deterministic) {
    return absl::StrCat("deterministic: ", Bool(a.deterministic), " vs ", Bool(b.deterministic));
  }
  if (a.cpu_offload != b.cpu_offload) {
    return absl::StrCat("cpu_offload: ", Bool(a.cpu_offload), " vs ", Bool(b.cpu_offload));
  }
  if (a.timeout != b.timeout) {
    return absl::StrCat("timeout: ", absl::FormatDuration(a.timeout), " vs ",
                        absl::FormatDuration(b.timeout));
  }
  return "";
}

}  // namespace fsdp
