// The plan CLI's work, separate from flag parsing so tests can call it: build a model
// configuration (a Gpt, or an MLP of Linears), build the policy (a registered name with
// its parameters, or a WrapPolicyConfig file), plan it for a world size and render the
// table (policy/plan_report.h), optionally followed by the WrapPlan in text format.
//
//   policy::PlanCliOptions options;               // GPT-2 small, world size 8
//   options.policy = "module_types";
//   options.module_types = {"TransformerBlock"};
//   ASSIGN_OR_RETURN(std::string report, policy::RunPlanCli(options));
//   std::cout << report;
//
// Option errors are InvalidArgument naming the flag (--world_size, --mlp_sizes, ...);
// an unknown policy name is NotFound listing the registered ones.
#ifndef POLICY_PLAN_CLI_H_
#define POLICY_PLAN_CLI_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/module.h"
#include "nn/gpt.h"
#include "policy/registry.h"

namespace policy {

struct PlanCliOptions {
  // "gpt" or "mlp".
  std::string model = "gpt";
  // The Gpt sizes (GPT-2 small by default).
  nn::GptConfig gpt = [] {
    nn::GptConfig c;
    c.vocab_size = 50257;
    c.block_size = 1024;
    c.n_embd = 768;
    c.n_layer = 12;
    c.n_head = 12;
    return c;
  }();
  // For "mlp": layer widths; Linear(sizes[i], sizes[i+1]) with a ReLU between each pair.
  std::vector<int64_t> mlp_sizes = {1024, 4096, 4096, 1024};

  // A registered policy name, or empty when `policy_config` is given.
  std::string policy;
  // --min_num_params, only with policy "size_based".
  std::optional<int64_t> min_num_params;
  // --module_types, only with policy "module_types".
  std::vector<std::string> module_types;
  // --policy_params: "key=value;key=value" for any registered policy (a value may be a
  // comma list), e.g. "pattern=blocks.*;every=2" for path_glob.
  std::string policy_params;
  // A WrapPolicyConfig text file; exclusive with `policy`.
  std::string policy_config;

  int world_size = 8;
  // Activation checkpointing of every k-th TransformerBlock (policy::EveryKth); 0: none.
  int checkpoint_every = 0;
  // Append the WrapPlan in protobuf text format.
  bool print_proto = false;
};

// The model `options` describes, freshly initialised. InvalidArgument naming the flag;
// ResourceExhausted naming the flag and the tensor when its parameters cannot be
// allocated (their size overflows or exceeds the host's memory).
absl::StatusOr<std::shared_ptr<core::Module>> BuildCliModel(const PlanCliOptions& options);

// "Gpt(vocab_size=50257, block_size=1024, n_embd=768, n_layer=12, n_head=12)" or
// "MLP(1024-4096-4096-1024)".
std::string DescribeCliModel(const PlanCliOptions& options);

// The whole report: model line, table, fingerprint, and the proto if asked for.
absl::StatusOr<std::string> RunPlanCli(const PlanCliOptions& options,
                                       const PolicyRegistry& registry = PolicyRegistry::Global());

}  // namespace policy

#endif  // POLICY_PLAN_CLI_H_
