// FullyShard in place: the seed scenario (a C++ port of the test in fairscale issue
// 648), identity of modules and Parameter objects, the sharded steady state, and the
// optimizer that stepped before wrapping.
#include "fsdp/fully_shard.h"

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "comm/testing/thread_ranks.h"
#include "core/status_macros.h"
#include "flatten/shard_math.h"
#include "fsdp/registry.h"
#include "glog/logging.h"
#include "gtest/gtest.h"
#include "nn/linear.h"
#include "nn/losses.h"
#include "nn/sequential.h"
#include "optim/adamw.h"

namespace fsdp {
namespace {

core::Tensor Input() {
  std::vector<float> v(4 * 5);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.1f * static_cast<float>(i % 7) - 0.3f;
  return core::Tensor::FromVector(v, {4, 5}).value();
}

std::shared_ptr<nn::Sequential> SeedModel(std::shared_ptr<nn::Linear>* inner) {
  *inner = std::make_shared<nn::Linear>(5, 5, true, /*seed=*/2);
  return nn::Sequential::Make({std::make_shared<nn::Linear>(5, 5, true, /*seed=*/1), *inner});
}

// One AdamW step of MSE(model(x), x) on the full batch, unwrapped: the reference.
std::vector<float> ReferenceOutputAfterOneStep() {
  std::shared_ptr<nn::Linear> inner;
  auto model = SeedModel(&inner);
  auto adamw = optim::AdamW::Create(model->NamedParameters()).value();
  core::Tensor x = Input();
  core::Tensor out = model->Forward(x).value();
  CHECK(model->Backward(nn::MseLoss(out, x).value().grad).ok());
  CHECK(adamw->Step().ok());
  return model->Forward(x).value().ToVector();
}

struct SeedResult {
  std::shared_ptr<nn::Sequential> model;  // released, plain
  std::vector<float> output_after_step;
};

TEST(FullyShardSeedScenarioTest, NestedWrapRewrapAndReleaseKeepTheSameModule) {
  constexpr int kWorld = 2;
  const std::vector<float> reference = ReferenceOutputAfterOneStep();
  std::vector<SeedResult> results(kWorld);
  absl::Status s =
      comm::testing::RunThreadRanks(kWorld, [&](comm::testing::RankContext& ctx) -> absl::Status {
        std::shared_ptr<nn::Linear> inner;
        std::shared_ptr<nn::Sequential> module = SeedModel(&inner);
        const std::vector<core::NamedParameter> before = module->NamedParameters();
        const std::vector<core::NamedModule> modules_before = module->NamedModules();
        WrapperRegistry registry;
        FullyShardOptions options;
        options.timeout = absl::Seconds(30);
        ASSIGN_OR_RETURN(auto inner_handle, FullyShard(inner, ctx.group, options, &registry));
        ASSIGN_OR_RETURN(auto training, FullyShard(module, ctx.group, options, &registry));
        EXPECT_NE(inner_handle, training);
        EXPECT_EQ(registry.NumUnits(), 2);  // the user's inner unit, kept, and the root
        EXPECT_EQ(training->units().size(), 2u);
        EXPECT_EQ(training->units()[0], inner_handle->root_unit());

        // One training step.
        ASSIGN_OR_RETURN(auto adamw, optim::AdamW::Create(module->NamedParameters()));
        core::Tensor x = Input();
        ASSIGN_OR_RETURN(core::Tensor out, module->Forward(x));
        ASSIGN_OR_RETURN(nn::LossResult loss, nn::MseLoss(out, x));
        RETURN_IF_ERROR(module->Backward(loss.grad).status());
        RETURN_IF_ERROR(adamw->Step());
        ASSIGN_OR_RETURN(core::Tensor first, module->Forward(x));

        // Re-wrap: the same handle, nothing allocated or copied.
        const RegistryCounters counters = registry.counters();
        ctx.allocator->ResetPeaks();
        const core::MemoryStats mem = ctx.allocator->Stats();
        ASSIGN_OR_RETURN(auto inference, FullyShard(module, ctx.group, options, &registry));
        const core::MemoryStats mem_after = ctx.allocator->Stats();
        EXPECT_EQ(inference, training);
        EXPECT_EQ(registry.counters().reuses, counters.reuses + 1);
        EXPECT_EQ(registry.counters().wraps, counters.wraps);
        EXPECT_EQ(registry.counters().param_bytes_copied, counters.param_bytes_copied);
        EXPECT_EQ(mem_after.current(core::MemoryTag::kParam), mem.current(core::MemoryTag::kParam));
        EXPECT_EQ(mem_after.peak(core::MemoryTag::kParam), mem.current(core::MemoryTag::kParam));
        EXPECT_EQ(mem_after.peak_total, mem.current_total);  // no allocation at all
        EXPECT_EQ(mem_after.num_allocations, mem.num_allocations);

        // A second forward equals the first; same parameter objects, same names, same order.
        ASSIGN_OR_RETURN(core::Tensor second, module->Forward(x));
        EXPECT_EQ(first.ToVector(), second.ToVector());
        const std::vector<core::NamedParameter> after = module->NamedParameters();
        EXPECT_EQ(after.size(), before.size());
        for (size_t i = 0; i < before.size() && i < after.size(); ++i) {
          EXPECT_EQ(after[i].first, before[i].first);
          EXPECT_EQ(after[i].second, before[i].second) << before[i].first;
        }
        const std::vector<core::NamedModule> modules_after = module->NamedModules();
        EXPECT_EQ(modules_after.size(), modules_before.size());
        for (size_t i = 0; i < modules_before.size() && i < modules_after.size(); ++i) {
          EXPECT_EQ(modules_after[i].second, modules_before[i].second);
        }

        RETURN_IF_ERROR(Release(*module, &registry));
        EXPECT_EQ(registry.NumUnits(), 0);
        EXPECT_EQ(module->NumHooks(), 0);
        EXPECT_EQ(inner->NumHooks(), 0);
        EXPECT_TRUE(training->released());
        results[ctx.rank] = SeedResult{module, first.ToVector()};
        return absl::OkStatus();
      });
  ASSERT_TRUE(s.ok()) << s;

  // The groups are gone now; the released modules are plain and hold the trained values.
  for (int r = 0; r < kWorld; ++r) {
    SeedResult& res = results[r];
    ASSERT_NE(res.model, nullptr);
    // Same as the unwrapped run: identical float32 operations except the averaging of
    // two identical gradients ((g + g) / 2 == g exactly), so exact equality is expected
    // up to the final AdamW arithmetic, which is the same code; allow 1 ulp-ish 1e-6.
    ASSERT_EQ(res.output_after_step.size(), reference.size());
    for (size_t i = 0; i < reference.size(); ++i) {
      EXPECT_NEAR(res.output_after_step[i], reference[i], 1e-6) << "rank " << r << " element " << i;
    }
    absl::StatusOr<core::Tensor> plain = res.model->Forward(Input());
    ASSERT_TRUE(plain.ok()) << plain.status();
    EXPECT_EQ(plain->ToVector(), res.output_after_step) << "rank " << r;
    for (const auto& [name, p] : res.model->NamedParameters()) {
      EXPECT_EQ(p->data.dim(), name.find("weight") != std::string::npos ? 2 : 1) << name;
    }
  }
}

TEST(FullyShardTest, OutsideForwardBackwardDataAndGradAreLocalSlices) {
  absl::Status s =
      comm::testing::RunThreadRanks(3, [](comm::testing::RankContext& ctx) -> absl::Status {
        std::shared_ptr<nn::Linear> inner;
        auto module = SeedModel(&inner);
        WrapperRegistry registry;
        ASSIGN_OR_RETURN(auto handle, FullyShard(module, ctx.group, {}, &registry));
        const Unit& unit = *handle->root_unit();
        EXPECT_EQ(unit.state(), UnitState::kSharded);
        const int64_t total = 2 * (25 + 5);
        EXPECT_EQ(unit.flat().padded_numel(), flatten::PaddedNumel(total, 3).value());
        int64_t local = 0;
        for (const auto& [name, p] : module->NamedParameters()) {
          EXPECT_EQ(p->data.dim(), 1) << name;
          local += p->data.numel();
        }
        EXPECT_LE(local, unit.flat().shard_numel());
        core::Tensor x = Input();
        ASSIGN_OR_RETURN(core::Tensor out, module->Forward(x));
        ASSIGN_OR_RETURN(nn::LossResult loss, nn::MseLoss(out, x));
        RETURN_IF_ERROR(module->Backward(loss.grad).status());
        for (const auto& [name, p] : module->NamedParameters()) {
          EXPECT_EQ(p->data.dim(), 1) << name;
          EXPECT_TRUE(p->grad.defined()) << name;
          EXPECT_EQ(p->grad.numel(), p->data.numel()) << name;
          EXPECT_TRUE(p->grad.SharesStorage(unit.flat().shard_grad())) << name;
        }
        EXPECT_EQ(unit.state(), UnitState::kSharded);
        EXPECT_FALSE(unit.flat().full().defined());
        EXPECT_FALSE(unit.flat().full_grad().defined());
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(FullyShardTest, OptimizerSteppedBeforeWrappingFailsNamingTheParameter) {
  absl::Status s =
      comm::testing::RunThreadRanks(2, [](comm::testing::RankContext& ctx) -> absl::Status {
        std::shared_ptr<nn::Linear> inner;
        auto module = SeedModel(&inner);
        ASSIGN_OR_RETURN(auto adamw, optim::AdamW::Create(module->NamedParameters()));
        core::Tensor x = Input();
        ASSIGN_OR_RETURN(core::Tensor out, module->Forward(x));
        RETURN_IF_ERROR(module->Backward(nn::MseLoss(out, x).value().grad).status());
        RETURN_IF_ERROR(adamw->Step());  // state sized for the full parameters
        std::vector<int64_t> full_numels;
        for (const auto& [name, p] : module->NamedParameters())
          full_numels.push_back(p->data.numel());
        WrapperRegistry registry;
        ASSIGN_OR_RETURN(auto handle, FullyShard(module, ctx.group, {}, &registry));
        ASSIGN_OR_RETURN(out, module->Forward(x));
        RETURN_IF_ERROR(module->Backward(nn::MseLoss(out, x).value().grad).status());
        // The first parameter whose local slice is not the whole parameter on this rank.
        std::string expected;
        const std::vector<core::NamedParameter> named = module->NamedParameters();
        for (size_t i = 0; i < named.size() && expected.empty(); ++i) {
          if (named[i].second->data.numel() != full_numels[i]) expected = named[i].first;
        }
        EXPECT_FALSE(expected.empty());  // 60 elements over 2 ranks: some slice is partial
        absl::Status step = adamw->Step();
        EXPECT_EQ(step.code(), absl::StatusCode::kFailedPrecondition) << step;
        EXPECT_TRUE(absl::StrContains(step.message(), "parameter '" + expected + "'")) << step;
        EXPECT_TRUE(absl::StrContains(step.message(), "before the model was sharded")) << step;
        // An optimizer built after wrapping steps the shard.
        ASSIGN_OR_RETURN(auto fresh, optim::AdamW::Create(module->NamedParameters()));
        EXPECT_TRUE(fresh->Step().ok());
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(FullyShardTest, NullArgumentsAndBadOptionsAreInvalidArgument) {
  absl::Status s =
      comm::testing::RunThreadRanks(2, [](comm::testing::RankContext& ctx) -> absl::Status {
        std::shared_ptr<nn::Linear> inner;
        auto module = SeedModel(&inner);
        WrapperRegistry registry;
        EXPECT_EQ(FullyShard(nullptr, ctx.group, {}, &registry).status().code(),
                  absl::StatusCode::kInvalidArgument);
        EXPECT_EQ(FullyShard(module, nullptr, {}, &registry).status().code(),
                  absl::StatusCode::kInvalidArgument);
        EXPECT_EQ(FullyShard(module, ctx.group, {}, nullptr).status().code(),
                  absl::StatusCode::kInvalidArgument);
        FullyShardOptions bad;
        bad.strategy = ShardingStrategy::kHybridShard;
        bad.hybrid_shard_size = 3;
        absl::Status st = FullyShard(module, ctx.group, bad, &registry).status();
        EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
        EXPECT_TRUE(absl::StrContains(st.message(), "FullyShardOptions.hybrid_shard_size")) << st;
        EXPECT_TRUE(absl::StrContains(st.message(), "<root> (Sequential)")) << st;
        EXPECT_EQ(registry.NumUnits(), 0);
        for (const auto& [name, p] : module->NamedParameters())
          EXPECT_EQ(p->data.dim(), name == "0.weight" || name == "1.weight" ? 2 : 1);
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
}

// A collective that fails inside a hook comes out of Forward as a status; the unit is
// failed from then on and later calls say so, naming it, instead of crashing or
// hanging. Rank 1 wraps (a collective) and leaves; rank 0's forward all-gather then
// times out.
TEST(FullyShardErrorTest, ACollectiveFailureMakesLaterCallsFailedPrecondition) {
  absl::Status s =
      comm::testing::RunThreadRanks(2, [](comm::testing::RankContext& ctx) -> absl::Status {
        std::shared_ptr<nn::Linear> inner;
        auto module = SeedModel(&inner);
        WrapperRegistry registry;
        FullyShardOptions options;
        options.timeout = absl::Seconds(1);
        ASSIGN_OR_RETURN(auto handle, FullyShard(module, ctx.group, options, &registry));
        if (ctx.rank == 1) return absl::OkStatus();
        absl::Status first = module->Forward(Input()).status();
        EXPECT_FALSE(first.ok());
        EXPECT_TRUE(absl::StrContains(first.message(), "fsdp unit <root> (Sequential)")) << first;
        EXPECT_EQ(handle->root_unit()->state(), UnitState::kFailed);
        for (int i = 0; i < 2; ++i) {
          absl::Status later = module->Forward(Input()).status();
          EXPECT_EQ(later.code(), absl::StatusCode::kFailedPrecondition) << later;
          EXPECT_TRUE(
              absl::StrContains(later.message(),
                                "fsdp unit <root> (Sequential): cannot run forward after an "
                                "earlier error"))
              << later;
        }
        EXPECT_EQ(Release(*module, &registry).code(), absl::StatusCode::kFailedPrecondition);
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
}

// A layer error in the middle of a forward leaves the root unit computing; the next
// forward cleans up and gives the same result as a forward that never failed.
TEST(FullyShardErrorTest, AForwardInterruptedByALayerErrorIsCleanedUpByTheNext) {
  absl::Status s =
      comm::testing::RunThreadRanks(2, [](comm::testing::RankContext& ctx) -> absl::Status {
        std::shared_ptr<nn::Linear> inner;
        auto module = SeedModel(&inner);
        WrapperRegistry registry;
        ASSIGN_OR_RETURN(auto handle, FullyShard(module, ctx.group, {}, &registry));
        ASSIGN_OR_RETURN(core::Tensor expected, module->Forward(Input()));
        core::Tensor bad = core::Tensor::Zeros({4, 3});  // the first Linear wants 5 features
        absl::Status st = module->Forward(bad).status();
        EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
        EXPECT_FALSE(registry.runtime().idle());
        ASSIGN_OR_RETURN(core::Tensor again, module->Forward(Input()));
        EXPECT_EQ(again.ToVector(), expected.ToVector());
        EXPECT_TRUE(registry.runtime().idle());
        EXPECT_EQ(handle->root_unit()->state(), UnitState::kSharded);
        // And training still works end to end.
        ASSIGN_OR_RETURN(nn::LossResult loss, nn::MseLoss(again, Input()));
        RETURN_IF_ERROR(module->Backward(loss.grad).status());
        return Release(*module, &registry);
      });
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace fsdp
