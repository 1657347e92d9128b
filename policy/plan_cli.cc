#include "policy/plan_cli.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/status_macros.h"
#include "google/protobuf/text_format.h"
#include "nn/activations.h"
#include "nn/linear.h"
#include "nn/sequential.h"
#include "policy/config.h"
#include "policy/plan.h"
#include "policy/plan_report.h"

namespace policy {
namespace {

absl::StatusOr<ConfiguredPolicy> BuildCliPolicy(const PlanCliOptions& options,
                                                const PolicyRegistry& registry) {
  const bool named = !options.policy.empty();
  const bool file = !options.policy_config.empty();
  if (named == file) {
    return absl::InvalidArgumentError(named ? "--policy and --policy_config are exclusive; give one"
                                            : "give a policy: --policy=<name> (one of " +
                                                  absl::StrJoin(registry.Names(), ", ") +
                                                  ") or --policy_config=<file>");
  }
  if (options.min_num_params.has_value() && options.policy != "size_based") {
    return absl::InvalidArgumentError("--min_num_params applies only to --policy=size_based");
  }
  if (!options.module_types.empty() && options.policy != "module_types") {
    return absl::InvalidArgumentError("--module_types applies only to --policy=module_types");
  }
  if (file) {
    if (!options.policy_params.empty()) {
      return absl::InvalidArgumentError("--policy_params applies only with --policy");
    }
    ASSIGN_OR_RETURN(WrapPolicyConfig config, ReadWrapPolicyConfigFile(options.policy_config));
    absl::StatusOr<ConfiguredPolicy> built = BuildPolicy(config, registry);
    if (!built.ok()) {
      return core::Annotate(built.status(), options.policy_config);
    }
    return built;
  }
  PolicyParams params(absl::StrCat("--policy=", options.policy));
  if (options.min_num_params.has_value()) {
    params.Add("min_num_params", absl::StrCat(*options.min_num_params));
  }
  for (const std::string& type : options.module_types) params.Add("types", type);
  for (absl::string_view item : absl::StrSplit(options.policy_params, ';', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(item, absl::MaxSplits('=', 1));
    if (kv.first.empty() || item.find('=') == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("--policy_params: expected key=value, got '", item, "'"));
    }
    params.Add(std::string(kv.first), std::string(kv.second));
  }
  ConfiguredPolicy out;
  ASSIGN_OR_RETURN(out.policy, registry.Create(options.policy, params));
  return out;
}

}  // namespace

std::string DescribeCliModel(const PlanCliOptions& options) {
  if (options.model == "mlp")
    return absl::StrCat("MLP(", absl::StrJoin(options.mlp_sizes, "-"), ")");
  const nn::GptConfig& c = options.gpt;
  return absl::StrFormat("Gpt(vocab_size=%d, block_size=%d, n_embd=%d, n_layer=%d, n_head=%d)",
                         c.vocab_size, c.block_size, c.n_embd, c.n_layer, c.n_head);
}

absl::StatusOr<std::shared_ptr<core::Module>> BuildCliModel(const PlanCliOptions& options) {
  if (options.model == "gpt") {
    absl::StatusOr<std::shared_ptr<nn::Gpt>> gpt = nn::Gpt::Create(options.gpt);
    if (!gpt.ok()) {
      return core::Annotate(
          gpt.status(),
          "--model=gpt (sizes from --vocab_size, --block_size, --n_embd, --n_layer, --n_head)");
    }
    return std::shared_ptr<core::Module>(*std::move(gpt));
  }
  if (options.model == "mlp") {
    if (options.mlp_sizes.size() < 2) {
      return absl::InvalidArgumentError("--mlp_sizes needs at least two sizes, e.g. 784,256,10");
    }
    std::vector<std::shared_ptr<core::Module>> layers;
    for (size_t i = 0; i + 1 < options.mlp_sizes.size(); ++i) {
      if (options.mlp_sizes[i] <= 0 || options.mlp_sizes[i + 1] <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("--mlp_sizes: every size must be positive, got ",
                         absl::StrJoin(options.mlp_sizes, ",")));
      }
      if (i > 0) layers.push_back(std::make_shared<nn::ReLU>());
      layers.push_back(std::make_shared<nn::Linear>(options.mlp_sizes[i], options.mlp_sizes[i + 1],
                                                    /*bias=*/true, /*seed=*/i));
    }
    std::shared_ptr<core::Module> mlp = nn::Sequential::Make(std::move(layers));
    // Linear cannot return errors: a layer too large to allocate is recorded instead.
    absl::Status allocated = mlp->ConstructionStatus();
    if (!allocated.ok()) {
      return core::Annotate(allocated,
                            absl::StrCat("--mlp_sizes=", absl::StrJoin(options.mlp_sizes, ",")));
    }
    return mlp;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--model must be gpt or mlp, got '", options.model, "'"));
}

absl::StatusOr<std::string> RunPlanCli(const PlanCliOptions& options,
                                       const PolicyRegistry& registry) {
  if (options.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--world_size must be >= 1, got ", options.world_size));
  }
  ASSIGN_OR_RETURN(ConfiguredPolicy configured, BuildCliPolicy(options, registry));
  ASSIGN_OR_RETURN(std::shared_ptr<core::Module> model, BuildCliModel(options));
  if (options.checkpoint_every < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--checkpoint_every must be >= 0 (0: no activation checkpointing), got ",
                     options.checkpoint_every));
  }
  PlanOptions plan_options;
  plan_options.ignored_paths = configured.ignored_paths;
  const WrapPolicyPtr checkpoint = options.checkpoint_every > 0
                                       ? EveryKth({"TransformerBlock"}, options.checkpoint_every)
                                       : nullptr;
  plan_options.checkpoint_policy = checkpoint.get();
  absl::StatusOr<WrapPlan> plan =
      Plan(*model, *configured.policy, options.world_size, plan_options);
  if (!plan.ok()) return plan.status();

  std::string out = absl::StrCat("Model: ", DescribeCliModel(options), ", ",
                                 WithThousands(model->NumParameterElements()), " parameters\n");
  absl::StrAppend(&out, FormatPlanTable(*plan));
  absl::StrAppend(&out, absl::StrFormat("Plan fingerprint: 0x%016x\n", Fingerprint(*plan)));
  if (options.print_proto) {
    std::string text;
    google::protobuf::TextFormat::PrintToString(*plan, &text);
    absl::StrAppend(&out, "\nWrapPlan (text format):\n", text);
  }
  return out;
}

}  // namespace policy
