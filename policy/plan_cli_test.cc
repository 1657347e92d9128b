#include "policy/plan_cli.h"

#include <string>

#include "gtest/gtest.h"

namespace policy {
namespace {

bool Has(absl::string_view haystack, const std::string& needle) {
  return haystack.find(needle) != absl::string_view::npos;
}

PlanCliOptions SmallGpt() {
  PlanCliOptions o;
  o.gpt = nn::GptConfig();  // vocab 64, block 32, n_embd 64, 2 layers, 4 heads
  o.world_size = 4;
  o.policy = "module_types";
  o.module_types = {"TransformerBlock"};
  return o;
}

TEST(PlanCliTest, GptReportHasUnitsTotalsAndFingerprint) {
  absl::StatusOr<std::string> out = RunPlanCli(SmallGpt());
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(Has(*out,
                  "Model: Gpt(vocab_size=64, block_size=32, n_embd=64, n_layer=2, n_head=4), "
                  "106,240 parameters"))
      << *out;
  EXPECT_TRUE(Has(*out, "Wrap plan: 3 units, world size 4, policy module_types(TransformerBlock)"))
      << *out;
  EXPECT_TRUE(Has(*out, "blocks.1")) << *out;
  EXPECT_TRUE(Has(*out, "ZeRO-3 formula, Psi = padded numel")) << *out;
  EXPECT_TRUE(Has(*out, "Plan fingerprint: 0x")) << *out;
  EXPECT_FALSE(Has(*out, "WrapPlan (text format)")) << *out;
}

TEST(PlanCliTest, CheckpointEveryListsTheCheckpointedBlocks) {
  PlanCliOptions o = SmallGpt();
  absl::StatusOr<std::string> plain = RunPlanCli(o);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(Has(*plain, "Activation checkpointing")) << *plain;
  o.gpt.n_layer = 4;
  o.checkpoint_every = 2;
  absl::StatusOr<std::string> out = RunPlanCli(o);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(Has(*out,
                  "Activation checkpointing (every_kth(TransformerBlock; k=2)): "
                  "blocks.0, blocks.2 (activations recomputed in the backward)"))
      << *out;
  o.checkpoint_every = -1;
  out = RunPlanCli(o);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(out.status().message(), "--checkpoint_every")) << out.status();
}

TEST(PlanCliTest, MlpWithSizeBasedAndProto) {
  PlanCliOptions o;
  o.model = "mlp";
  o.mlp_sizes = {8, 16, 4};
  o.policy = "size_based";
  o.min_num_params = 100;  // Linear(8, 16) = 144 wraps, Linear(16, 4) = 68 does not
  o.world_size = 2;
  o.print_proto = true;
  absl::StatusOr<std::string> out = RunPlanCli(o);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(Has(*out, "Model: MLP(8-16-4), 212 parameters")) << *out;
  EXPECT_TRUE(Has(*out, "Wrap plan: 2 units")) << *out;
  EXPECT_TRUE(Has(*out, "WrapPlan (text format):\nworld_size: 2")) << *out;
  EXPECT_TRUE(Has(*out, "path: \"0\"")) << *out;
  EXPECT_TRUE(Has(*out, "param_names: \"2.weight\"")) << *out;  // the ReLU is child 1
}

TEST(PlanCliTest, PolicyParamsReachAnyRegisteredPolicy) {
  PlanCliOptions o = SmallGpt();
  o.policy = "size_based";
  o.module_types.clear();
  o.policy_params = "min_num_params=40000;force_leaf_types=TransformerBlock";
  absl::StatusOr<std::string> out = RunPlanCli(o);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(
      Has(*out, "policy size_based(min_num_params=40000, force_leaf_types=[TransformerBlock])"))
      << *out;
}

TEST(PlanCliTest, ModelsTooLargeToAllocateAreResourceExhaustedNotAborts) {
  PlanCliOptions gpt = SmallGpt();
  gpt.gpt.vocab_size = int64_t{1} << 40;  // wte alone: 2^40 x 64 floats = 256 TiB
  absl::StatusOr<std::string> out = RunPlanCli(gpt);
  ASSERT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted) << out.status();
  EXPECT_TRUE(Has(out.status().message(), "--model=gpt")) << out.status();
  EXPECT_TRUE(Has(out.status().message(), "wte.weight [1099511627776, 64]")) << out.status();

  PlanCliOptions mlp = SmallGpt();
  mlp.model = "mlp";
  mlp.mlp_sizes = {8, int64_t{1} << 62, 4};  // Linear(8, 2^62): bytes overflow
  out = RunPlanCli(mlp);
  ASSERT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted) << out.status();
  EXPECT_TRUE(Has(out.status().message(),
                  "--mlp_sizes=8,4611686018427387904,4: 0 (Linear): "
                  "parameter 'weight'"))
      << out.status();
}

TEST(PlanCliTest, BadOptionsNameTheFlag) {
  struct Case {
    std::function<void(PlanCliOptions*)> edit;
    absl::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](PlanCliOptions* o) { o->world_size = 0; }, absl::StatusCode::kInvalidArgument,
       "--world_size must be >= 1, got 0"},
      {[](PlanCliOptions* o) { o->model = "cnn"; }, absl::StatusCode::kInvalidArgument,
       "--model must be gpt or mlp, got 'cnn'"},
      {[](PlanCliOptions* o) {
         o->policy.clear();
         o->module_types.clear();
       },
       absl::StatusCode::kInvalidArgument, "give a policy: --policy=<name> (one of always"},
      {[](PlanCliOptions* o) { o->policy_config = "x.txt"; }, absl::StatusCode::kInvalidArgument,
       "--policy and --policy_config are exclusive"},
      {[](PlanCliOptions* o) { o->min_num_params = 5; }, absl::StatusCode::kInvalidArgument,
       "--min_num_params applies only to --policy=size_based"},
      {[](PlanCliOptions* o) { o->policy = "always"; }, absl::StatusCode::kInvalidArgument,
       "--module_types applies only to --policy=module_types"},
      {[](PlanCliOptions* o) { o->policy_params = "oops"; }, absl::StatusCode::kInvalidArgument,
       "--policy_params: expected key=value, got 'oops'"},
      {[](PlanCliOptions* o) {
         o->policy = "nope";
         o->module_types.clear();
       },
       absl::StatusCode::kNotFound, "unknown wrap policy 'nope'; known policies: always"},
      {[](PlanCliOptions* o) { o->gpt.n_head = 3; }, absl::StatusCode::kInvalidArgument,
       "--model=gpt (sizes from"},
      {[](PlanCliOptions* o) {
         o->model = "mlp";
         o->mlp_sizes = {5};
       },
       absl::StatusCode::kInvalidArgument, "--mlp_sizes needs at least two sizes"},
      {[](PlanCliOptions* o) {
         o->model = "mlp";
         o->mlp_sizes = {5, 0};
       },
       absl::StatusCode::kInvalidArgument, "--mlp_sizes: every size must be positive"},
      {[](PlanCliOptions* o) {
         o->policy.clear();
         o->module_types.clear();
         o->policy_config = "/nonexistent";
       },
       absl::StatusCode::kNotFound, "cannot read policy config file '/nonexistent'"},
  };
  for (const Case& c : cases) {
    PlanCliOptions o = SmallGpt();
    c.edit(&o);
    absl::StatusOr<std::string> out = RunPlanCli(o);
    EXPECT_EQ(out.status().code(), c.code) << c.message << ": " << out.status();
    EXPECT_TRUE(Has(out.status().message(), c.message)) << out.status();
  }
}

}  // namespace
}  // namespace policy
