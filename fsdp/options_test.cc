#include "fsdp/options.h"

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace fsdp {
namespace {

TEST(OptionsTest, EqualOptionsHaveNoDifference) {
  FullyShardOptions a;
  FullyShardOptions b;
  EXPECT_EQ(FirstDifferingOption(a, b), "");
  // A null policy means Never(); two instances of one policy compare by Name().
  b.policy = policy::Never();
  EXPECT_EQ(FirstDifferingOption(a, b), "");
  a.policy = policy::ModuleTypes({"TransformerBlock"});
  b.policy = policy::ModuleTypes({"TransformerBlock"});
  EXPECT_EQ(FirstDifferingOption(a, b), "");
}

TEST(OptionsTest, FirstDifferingOptionNamesTheOptionAndBothValues) {
  const FullyShardOptions base;
  struct Change {
    void (*apply)(FullyShardOptions*);
    const char* expected;
  };
  const Change changes[] = {
      {[](FullyShardOptions* o) { o->policy = policy::Always(); }, "policy: "},
      {[](FullyShardOptions* o) {
         o->checkpoint_policy = policy::EveryKth({"TransformerBlock"}, 2);
       },
       "checkpoint_policy: never vs every_kth(TransformerBlock; k=2)"},
      {[](FullyShardOptions* o) { o->strategy = ShardingStrategy::kNoShard; },
       "strategy: FULL_SHARD vs NO_SHARD"},
      {[](FullyShardOptions* o) { o->hybrid_shard_size = 2; }, "hybrid_shard_size: 0 vs 2"},
      {[](FullyShardOptions* o) { o->mixed_precision.param_dtype = core::DType::kBFloat16; },
       "mixed_precision.param_dtype: float32 vs bfloat16"},
      {[](FullyShardOptions* o) { o->mixed_precision.reduce_dtype = core::DType::kBFloat16; },
       "mixed_precision.reduce_dtype: float32 vs bfloat16"},
      {[](FullyShardOptions* o) { o->backward_prefetch = false; },
       "backward_prefetch: true vs false"},
      {[](FullyShardOptions* o) { o->forward_prefetch = true; }, "forward_prefetch: false vs true"},
      {[](FullyShardOptions* o) { o->limit_all_gathers = 1; }, "limit_all_gathers: 2 vs 1"},
      {[](FullyShardOptions* o) { o->ignored_paths = {"lm_head"}; },
       "ignored_paths: [] vs [lm_head]"},
      {[](FullyShardOptions* o) { o->sync_module_states = true; },
       "sync_module_states: false vs true"},
      {[](FullyShardOptions* o) { o->timeout = absl::Seconds(3); }, "timeout: 5m vs 3s"},
  };
  for (const Change& c : changes) {
    FullyShardOptions other = base;
    c.apply(&other);
    const std::string diff = FirstDifferingOption(base, other);
    EXPECT_TRUE(absl::StartsWith(diff, c.expected)) << diff << " expected " << c.expected;
  }
}

TEST(OptionsTest, ValidateNamesTheOption) {
  FullyShardOptions o;
  EXPECT_TRUE(o.Validate(4).ok());
  o.strategy = ShardingStrategy::kHybridShard;
  o.hybrid_shard_size = 3;
  absl::Status s = o.Validate(4);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "FullyShardOptions.hybrid_shard_size")) << s;
  o.hybrid_shard_size = 2;
  EXPECT_TRUE(o.Validate(4).ok());
  o.strategy = ShardingStrategy::kFullShard;
  EXPECT_TRUE(absl::StrContains(o.Validate(4).message(), "HYBRID_SHARD only"));
  o.hybrid_shard_size = 0;
  o.limit_all_gathers = -1;
  EXPECT_TRUE(absl::StrContains(o.Validate(4).message(), "FullyShardOptions.limit_all_gathers"));
  o.limit_all_gathers = 2;
  o.mixed_precision.param_dtype = core::DType::kInt32;
  EXPECT_TRUE(
      absl::StrContains(o.Validate(4).message(), "FullyShardOptions.mixed_precision.param_dtype"));
  o.mixed_precision.param_dtype = core::DType::kFloat32;
  o.timeout = absl::ZeroDuration();
  EXPECT_TRUE(absl::StrContains(o.Validate(4).message(), "FullyShardOptions.timeout"));
  o.timeout = absl::Seconds(1);
  o.policy = policy::Lambda(nullptr);
  EXPECT_TRUE(absl::StrContains(o.Validate(4).message(), "FullyShardOptions.policy"));
  o.policy = nullptr;
  o.checkpoint_policy = policy::EveryKth({"TransformerBlock"}, 0);
  EXPECT_TRUE(
      absl::StrContains(o.Validate(4).message(),
                        "FullyShardOptions.checkpoint_policy (every_kth(TransformerBlock; k=0))"))
      << o.Validate(4);
}

}  // namespace
}  // namespace fsdp
