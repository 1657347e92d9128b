// plan_main: prints the wrap plan of a model configuration, with per-rank memory beside
// the unsharded total and the ZeRO-3 formula. Nothing is sharded; no process group.
//
//   bazel run //policy:plan_main -- --model=gpt --n_layer=12 --world_size=8
//       --policy=module_types --module_types=TransformerBlock
//   bazel run //policy:plan_main -- --model=mlp --mlp_sizes=1024,4096,1024
//       --policy=size_based --min_num_params=1000000 --world_size=4 --print_proto
//   bazel run //policy:plan_main -- --policy_config=/path/to/policy.txt
//
// Exit status: 0 on success; 1 with absl's message for a flag absl cannot parse (unknown
// flag, a value that is not of the flag's type, a missing value); 2 for flag values that
// parse but are invalid, a stray argument or a bad policy (with a message on stderr
// naming the flag); 1 for any other failure.
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "policy/plan_cli.h"

ABSL_FLAG(std::string, model, "gpt", "gpt or mlp");
ABSL_FLAG(int64_t, vocab_size, 50257, "Gpt vocabulary size");
ABSL_FLAG(int64_t, block_size, 1024, "Gpt context length");
ABSL_FLAG(int64_t, n_embd, 768, "Gpt width");
ABSL_FLAG(int64_t, n_layer, 12, "Gpt number of TransformerBlocks");
ABSL_FLAG(int64_t, n_head, 12, "Gpt attention heads");
ABSL_FLAG(std::string, mlp_sizes, "1024,4096,4096,1024",
          "for --model=mlp: comma-separated layer widths");
ABSL_FLAG(std::string, policy, "",
          "registered policy name: size_based, module_types, always, never, path_glob, ...");
ABSL_FLAG(std::string, min_num_params, "", "for --policy=size_based: the threshold");
ABSL_FLAG(std::string, module_types, "", "for --policy=module_types: comma-separated type names");
ABSL_FLAG(std::string, policy_params, "",
          "parameters for any --policy: key=value;key=value (e.g. pattern=blocks.*;every=2)");
ABSL_FLAG(std::string, policy_config, "", "a WrapPolicyConfig text file (instead of --policy)");
ABSL_FLAG(int32_t, world_size, 8, "number of ranks to plan for");
ABSL_FLAG(int32_t, checkpoint_every, 0,
          "activation checkpointing of every k-th TransformerBlock (0: none); the plan lists them");
ABSL_FLAG(bool, print_proto, false, "also print the WrapPlan in protobuf text format");

namespace {

constexpr int kBadUsage = 2;

absl::StatusOr<policy::PlanCliOptions> OptionsFromFlags() {
  policy::PlanCliOptions o;
  o.model = absl::GetFlag(FLAGS_model);
  o.gpt.vocab_size = absl::GetFlag(FLAGS_vocab_size);
  o.gpt.block_size = absl::GetFlag(FLAGS_block_size);
  o.gpt.n_embd = absl::GetFlag(FLAGS_n_embd);
  o.gpt.n_layer = absl::GetFlag(FLAGS_n_layer);
  o.gpt.n_head = absl::GetFlag(FLAGS_n_head);
  o.mlp_sizes.clear();
  for (absl::string_view piece :
       absl::StrSplit(absl::GetFlag(FLAGS_mlp_sizes), ',', absl::SkipWhitespace())) {
    int64_t size = 0;
    if (!absl::SimpleAtoi(piece, &size)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--mlp_sizes: '", piece, "' is not an integer"));
    }
    o.mlp_sizes.push_back(size);
  }
  o.policy = absl::GetFlag(FLAGS_policy);
  const std::string min = absl::GetFlag(FLAGS_min_num_params);
  if (!min.empty()) {
    int64_t value = 0;
    if (!absl::SimpleAtoi(min, &value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--min_num_params: '", min, "' is not an integer"));
    }
    o.min_num_params = value;
  }
  for (absl::string_view type :
       absl::StrSplit(absl::GetFlag(FLAGS_module_types), ',', absl::SkipWhitespace())) {
    o.module_types.emplace_back(type);
  }
  o.policy_params = absl::GetFlag(FLAGS_policy_params);
  o.policy_config = absl::GetFlag(FLAGS_policy_config);
  o.world_size = absl::GetFlag(FLAGS_world_size);
  o.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  o.print_proto = absl::GetFlag(FLAGS_print_proto);
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Prints the FSDP wrap plan of a Gpt or MLP configuration for a world size.\n"
      "  plan_main --model=gpt --n_layer=12 --world_size=8 --policy=module_types "
      "--module_types=TransformerBlock");
  // absl refuses unknown flags, values that do not parse and flags missing their value
  // (its message, exit status 1); what it accepts is checked below (exit status 2).
  const std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() > 1) {
    std::cerr << "plan_main: unexpected argument '" << positional[1]
              << "' (flags look like --name=value)\n";
    return kBadUsage;
  }
  absl::StatusOr<policy::PlanCliOptions> options = OptionsFromFlags();
  if (!options.ok()) {
    std::cerr << "plan_main: " << options.status().message() << "\n";
    return kBadUsage;
  }
  absl::StatusOr<std::string> report = policy::RunPlanCli(*options);
  if (!report.ok()) {
    std::cerr << "plan_main: " << report.status() << "\n";
    const absl::StatusCode code = report.status().code();
    return code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kNotFound ||
                   code == absl::StatusCode::kFailedPrecondition
               ? kBadUsage
               : 1;
  }
  std::cout << *report;
  return 0;
}
