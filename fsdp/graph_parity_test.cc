// FSDP on the autograd graph: a language model written as graph modules (forward only,
// fsdp/testing/graph_lm.h), wrapped one unit per GraphBlock plus the root, trains on N = 1..4
// ranks under each strategy to the same losses and final full parameters as one unwrapped
// process. FullyShard's hooks fire from the graph (NOTE [Graph modules] in core/module.h):
// the unshard before a unit's forward and when its outputs' first gradient arrives, the
// reduce-scatter when its inputs' gradients (and with them its parameters') are final, the
// end of the backward for the root, whose input (token ids) takes no gradient.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "comm/testing/thread_ranks.h"
#include "core/autograd.h"
#include "core/param_init.h"
#include "core/status_macros.h"
#include "data/sampler.h"
#include "fsdp/fully_shard.h"
#include "fsdp/grad_utils.h"
#include "fsdp/internal/host_offload.h"
#include "fsdp/options.h"
#include "fsdp/registry.h"
#include "fsdp/testing/gpt_training.h"
#include "fsdp/testing/graph_lm.h"
#include "gtest/gtest.h"
#include "nn/functional/functional.h"
#include "nn/functional/loss.h"
#include "optim/adamw.h"
#include "policy/wrap_policy.h"

namespace fsdp {
namespace {

// NOTE [Parity tolerance] in parity_test.cc.
constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;

using Case = testing::StrategyCase;

testing::GptTrainingSetup GraphSetup() {
  testing::GptTrainingSetup setup = testing::TinySetup();
  setup.graph_model = true;
  return setup;
}

testing::ModelFactory GraphFactory() {
  return []() -> absl::StatusOr<std::shared_ptr<core::Module>> {
    return std::shared_ptr<core::Module>(
        std::make_shared<testing::GraphLm>(testing::GraphLmConfig{}));
  };
}

class GraphParityTest : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<testing::TrainingRun> run =
        testing::TrainUnwrapped(GraphSetup(), GraphFactory());
    ASSERT_TRUE(run.ok()) << run.status();
    reference_ = new testing::TrainingRun(*std::move(run));
  }
  static void TearDownTestSuite() {
    delete reference_;
    reference_ = nullptr;
  }
  static testing::TrainingRun* reference_;
};

testing::TrainingRun* GraphParityTest::reference_ = nullptr;

TEST_P(GraphParityTest, LossesAndFinalParametersMatchOneUnwrappedProcess) {
  ASSERT_NE(reference_, nullptr);
  ASSERT_LT(reference_->losses.back(), reference_->losses.front() - 0.1);  // it trains
  const Case c = GetParam();
  const testing::GptTrainingSetup setup = GraphSetup();
  const FullyShardOptions options =
      testing::PerBlockOptions(c.strategy, c.hybrid_shard_size, "GraphBlock");
  const testing::TrainingRun& reference = *reference_;
  absl::Status s =
      comm::testing::RunThreadRanks(c.world_size, [&](comm::testing::RankContext& ctx) {
        ASSIGN_OR_RETURN(testing::TrainingRun run,
                         testing::TrainFullyShardedRank(ctx, setup, options, GraphFactory()));
        double worst = 0;
        RETURN_IF_ERROR(testing::CompareRuns(reference, run, kRtol, kAtol, &worst));
        if (ctx.rank == 0) std::printf("worst |error| / tolerance: %.3g\n", worst);
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
}

// Rank 0's runtime events of one step of the graph model on 2 ranks under FULL_SHARD
// (`checkpoint`: every block's activations checkpointed).
std::vector<std::string> RecordGraphStep(bool checkpoint = false) {
  const testing::GptTrainingSetup setup = GraphSetup();
  std::vector<std::string> out;
  absl::Status s =
      comm::testing::RunThreadRanks(2, [&](comm::testing::RankContext& ctx) -> absl::Status {
        auto model = std::make_shared<testing::GraphLm>(testing::GraphLmConfig{});
        ASSIGN_OR_RETURN(data::MarkovLanguage language, testing::MakeLanguage(setup));
        WrapperRegistry registry;
        FullyShardOptions options =
            testing::PerBlockOptions(ShardingStrategy::kFullShard, 0, "GraphBlock");
        if (checkpoint) options.checkpoint_policy = policy::ModuleTypes({"GraphBlock"});
        ASSIGN_OR_RETURN(auto handle, FullyShard(model, ctx.group, options, &registry));
        if (model->blocks()[0]->checkpoint_activations() != checkpoint) {
          return absl::InternalError("the checkpoint policy was not applied");
        }
        ASSIGN_OR_RETURN(data::TokenBatch batch, language.Batch(0, 4, setup.seq_len));
        registry.RecordEvents(true);
        RETURN_IF_ERROR(testing::ForwardBackwardGraph(*model, batch).status());
        registry.RecordEvents(false);
        if (ctx.rank == 0) out = registry.events();
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

int Find(const std::vector<std::string>& events, const std::string& event) {
  for (int i = 0; i < static_cast<int>(events.size()); ++i) {
    if (events[i] == event) return i;
  }
  ADD_FAILURE() << "no event '" << event << "' in:\n" << absl::StrJoin(events, "\n");
  return -1;
}

TEST(GraphHooksTest, UnitsGatherReshardAndReduceInTheirPlacesOnTheGraph) {
  const std::vector<std::string> e = RecordGraphStep();
  const std::string root = "<root> (GraphLm)", b0 = "block0 (GraphBlock)",
                    b1 = "block1 (GraphBlock)";
  // Forward: the root, then each block, gathered before it computes and resharded after.
  EXPECT_LT(Find(e, "forward_compute_begin " + root), Find(e, "forward_compute_begin " + b0));
  EXPECT_LT(Find(e, "forward_compute_begin " + b0), Find(e, "reshard " + b0));
  EXPECT_LT(Find(e, "reshard " + b0), Find(e, "forward_compute_begin " + b1));
  // Backward, in reverse: block1's gradients are reduced as soon as its backward is done,
  // before block0's backward begins (the reduce-scatter overlaps the next unit's compute);
  // the root's last, at the end of the backward.
  const int bwd_b1 = Find(e, "backward_compute_begin " + b1);
  const int reduce_b1 = Find(e, "reduce_issued " + b1);
  const int bwd_b0 = Find(e, "backward_compute_begin " + b0);
  const int reduce_b0 = Find(e, "reduce_issued " + b0);
  EXPECT_LT(Find(e, "backward_compute_begin " + root), bwd_b1);
  EXPECT_LT(bwd_b1, reduce_b1);
  EXPECT_LT(reduce_b1, bwd_b0);
  EXPECT_LT(bwd_b0, reduce_b0);
  EXPECT_LT(reduce_b0, Find(e, "reduce_issued " + root));
  EXPECT_EQ(e.back(), "backward_end");
}

// One run on `world` ranks under FULL_SHARD with `options` changed by `change`, the model
// built eagerly or (deferred) under core::DeferredInitScope; rank 0's run.
testing::TrainingRun RunFullShard(int world, const std::function<void(FullyShardOptions&)>& change,
                                  bool deferred = false, bool host_offload = false) {
  FullyShardOptions options =
      testing::PerBlockOptions(ShardingStrategy::kFullShard, 0, "GraphBlock");
  change(options);
  testing::TrainingRun out;
  absl::Status s = comm::testing::RunThreadRanks(world, [&](comm::testing::RankContext& ctx) {
    // NOTE [CPU offload] in options.h: the offload path on the CPU build (a test-only switch).
    const bool previous = internal::SetHostOffloadOnCpuForThisThread(host_offload);
    struct Restore {
      bool value;
      ~Restore() { internal::SetHostOffloadOnCpuForThisThread(value); }
    } restore{previous};
    testing::ModelFactory make = [deferred]() -> absl::StatusOr<std::shared_ptr<core::Module>> {
      std::unique_ptr<core::DeferredInitScope> scope;
      if (deferred) scope = std::make_unique<core::DeferredInitScope>();
      return std::shared_ptr<core::Module>(
          std::make_shared<testing::GraphLm>(testing::GraphLmConfig{}));
    };
    ASSIGN_OR_RETURN(testing::TrainingRun run,
                     testing::TrainFullyShardedRank(ctx, GraphSetup(), options, make));
    if (ctx.rank == 0) out = run;
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

void ExpectSameBits(const testing::TrainingRun& a, const testing::TrainingRun& b) {
  EXPECT_EQ(a.losses, b.losses);
  ASSERT_EQ(a.params.size(), b.params.size());
  for (size_t i = 0; i < a.params.size(); ++i) {
    EXPECT_EQ(a.params[i], b.params[i]) << a.params[i].first;
  }
}

TEST(GraphFeaturesTest, ActivationCheckpointingGivesThePlainRunsBits) {
  const testing::TrainingRun plain = RunFullShard(2, [](FullyShardOptions&) {});
  const testing::TrainingRun checkpointed = RunFullShard(
      2, [](FullyShardOptions& o) { o.checkpoint_policy = policy::ModuleTypes({"GraphBlock"}); });
  ASSERT_FALSE(plain.losses.empty());
  ExpectSameBits(plain, checkpointed);
}

TEST(GraphFeaturesTest, ActivationCheckpointingGathersNoUnitTwice) {
  const auto gathers = [](const std::vector<std::string>& events) {
    return std::count_if(events.begin(), events.end(),
                         [](const std::string& e) { return e.rfind("allgather_issued", 0) == 0; });
  };
  const std::vector<std::string> plain = RecordGraphStep(false);
  const std::vector<std::string> checkpointed = RecordGraphStep(true);
  EXPECT_GT(gathers(plain), 0);
  EXPECT_EQ(gathers(checkpointed), gathers(plain));
}

TEST(GraphFeaturesTest, DeferredInitialisationGivesTheEagerRunsBits) {
  const testing::TrainingRun eager = RunFullShard(2, [](FullyShardOptions&) {});
  const testing::TrainingRun deferred = RunFullShard(
      2, [](FullyShardOptions&) {}, true);
  ASSERT_FALSE(eager.losses.empty());
  ExpectSameBits(eager, deferred);
}

TEST(GraphFeaturesTest, CpuOffloadGivesTheOnDeviceRunsBits) {
  const testing::TrainingRun plain = RunFullShard(2, [](FullyShardOptions&) {});
  const testing::TrainingRun offloaded = RunFullShard(
      2, [](FullyShardOptions& o) { o.cpu_offload = true; }, false, true);
  ASSERT_FALSE(plain.losses.empty());
  ExpectSameBits(plain, offloaded);
}

TEST(GraphFeaturesTest, MixedPrecisionTrainsAndNRanksMatchOne) {
  const auto bf16 = [](FullyShardOptions& o) {
    o.mixed_precision.param_dtype = core::DType::kBFloat16;
  };
  const testing::TrainingRun one = RunFullShard(1, bf16);
  const testing::TrainingRun two = RunFullShard(2, bf16);
  ASSERT_FALSE(one.losses.empty());
  EXPECT_LT(one.losses.back(), one.losses.front() - 0.1);
  EXPECT_TRUE(testing::CompareRuns(one, two, kRtol, kAtol).ok());
}

// Shared weights: block0 of a GraphLm called twice in one forward, then block1, the final
// norm and the tied head. Its unit gathers, reshards and reduces once per call.
class TwiceLm : public core::Module {
 public:
  TwiceLm()
      : lm_(RegisterModule("lm", std::make_shared<testing::GraphLm>(testing::GraphLmConfig{}))) {}
  std::string TypeName() const override { return "TwiceLm"; }

 protected:
  absl::StatusOr<core::Tensors> ForwardGraph(const core::Tensors& in) override {
    const std::vector<core::ParameterPtr> p = lm_->Parameters();  // wte, norm, blocks'
    absl::StatusOr<core::Tensor> x = nn::functional::Embedding(in[0], p[0]);
    x = lm_->blocks()[0]->CallOne({x});
    x = lm_->blocks()[0]->CallOne({x});
    x = lm_->blocks()[1]->CallOne({x});
    absl::StatusOr<core::Tensor> logits =
        nn::functional::Linear(nn::functional::RmsNorm(x, p[1]), p[0]);
    RETURN_IF_ERROR(logits.status());
    return core::Tensors{*logits};
  }

 private:
  std::shared_ptr<testing::GraphLm> lm_;
};

TEST(GraphFeaturesTest, AUnitCalledTwiceInAForwardMatchesOneUnwrappedProcess) {
  const testing::GptTrainingSetup setup = GraphSetup();
  const testing::ModelFactory make = []() -> absl::StatusOr<std::shared_ptr<core::Module>> {
    return std::shared_ptr<core::Module>(std::make_shared<TwiceLm>());
  };
  absl::StatusOr<testing::TrainingRun> reference = testing::TrainUnwrapped(setup, make);
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_LT(reference->losses.back(), reference->losses.front() - 0.1);
  for (const int world : {1, 2, 4}) {
    absl::Status s = comm::testing::RunThreadRanks(world, [&](comm::testing::RankContext& ctx) {
      ASSIGN_OR_RETURN(
          testing::TrainingRun run,
          testing::TrainFullyShardedRank(
              ctx, setup, testing::PerBlockOptions(ShardingStrategy::kFullShard, 0, "GraphBlock"),
              make));
      return testing::CompareRuns(*reference, run, kRtol, kAtol);
    });
    EXPECT_TRUE(s.ok()) << "N = " << world << ": " << s;
  }
}

// NOTE [Deterministic reduction] (fsdp/options.h) on a graph model: rank r runs its aligned
// range of a step's 4 micro-batches (all but the last under no_sync(), each backward seeded
// with 1/4), so gradients accumulate across backwards before one reduction; the step's loss
// is the micro-batch losses gathered and added in order. Returns rank 0's losses and final
// parameters.
testing::TrainingRun TrainDeterministic(int world) {
  constexpr int kMicroBatches = 4;
  testing::GptTrainingSetup setup = GraphSetup();
  setup.global_batch = 16;
  setup.steps = 10;
  FullyShardOptions options =
      testing::PerBlockOptions(ShardingStrategy::kFullShard, 0, "GraphBlock");
  options.deterministic = true;
  testing::TrainingRun out;
  absl::Status s =
      comm::testing::RunThreadRanks(world, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(data::MarkovLanguage language, testing::MakeLanguage(setup));
        auto model = std::make_shared<testing::GraphLm>(testing::GraphLmConfig{});
        WrapperRegistry registry;
        ASSIGN_OR_RETURN(auto handle, FullyShard(model, ctx.group, options, &registry));
        ASSIGN_OR_RETURN(auto adamw, optim::AdamW::Create(model->NamedParameters(), setup.adamw));
        const int mine = kMicroBatches / ctx.world_size;
        testing::TrainingRun run;
        for (int step = 0; step < setup.steps; ++step) {
          ASSIGN_OR_RETURN(data::TokenBatch global,
                           language.Batch(step, setup.global_batch, setup.seq_len));
          adamw->ZeroGrad();
          std::vector<float> losses;
          for (int j = 0; j < mine; ++j) {
            ASSIGN_OR_RETURN(data::RankSampler slot,
                             data::RankSampler::Create(ctx.rank * mine + j, kMicroBatches));
            ASSIGN_OR_RETURN(data::TokenBatch micro, slot.Local(global));
            std::unique_ptr<NoSyncScope> no_sync;
            if (j + 1 < mine) {
              ASSIGN_OR_RETURN(no_sync, NoSync(*model, &registry));
            }
            absl::StatusOr<core::Tensor> loss =
                nn::functional::CrossEntropy(model->CallOne({micro.inputs}), micro.targets);
            RETURN_IF_ERROR(loss.status());
            ASSIGN_OR_RETURN(core::Tensor seed, core::Tensor::FromVector({0.25f}, {}));
            RETURN_IF_ERROR(core::Backward({*loss}, {seed}));
            losses.push_back(loss->ToVector()[0]);
          }
          RETURN_IF_ERROR(adamw->Step());
          ASSIGN_OR_RETURN(double loss, testing::MicroBatchMeanLoss(ctx, losses));
          run.losses.push_back(loss);
        }
        RETURN_IF_ERROR(Release(*model, &registry));
        run.params = testing::ParameterValues(*model);
        if (ctx.rank == 0) out = run;
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

TEST(GraphFeaturesTest, DeterministicModeGivesOneRanksBitsAtTwoAndFourRanks) {
  const testing::TrainingRun one = TrainDeterministic(1);
  ASSERT_FALSE(one.losses.empty());
  EXPECT_LT(one.losses.back(), one.losses.front() - 0.1);
  ExpectSameBits(one, TrainDeterministic(2));
  ExpectSameBits(one, TrainDeterministic(4));
}

INSTANTIATE_TEST_SUITE_P(AllStrategies, GraphParityTest,
                         ::testing::ValuesIn(testing::SomeStrategyCases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return testing::StrategyCaseName(info.param);
                         });

}  // namespace
}  // namespace fsdp
