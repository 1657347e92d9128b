// Mixed precision (NOTE [Mixed precision] in options.h): bf16 compute copies of an fp32
// master, bf16 gradient reduction, half the bytes on the wire, and training close to
// fp32 within a bound derived below.
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/testing/thread_ranks.h"
#include "core/status_macros.h"
#include "data/sampler.h"
#include "fsdp/fully_shard.h"
#include "fsdp/summon.h"
#include "fsdp/testing/gpt_training.h"
#include "gtest/gtest.h"
#include "nn/losses.h"
#include "nn/to_device.h"
#include "optim/adamw.h"

namespace fsdp {
namespace {

FullyShardOptions Bf16(bool params, bool reduce) {
  FullyShardOptions o = testing::PerBlockOptions(ShardingStrategy::kFullShard);
  if (params) o.mixed_precision.param_dtype = core::DType::kBFloat16;
  if (reduce) o.mixed_precision.reduce_dtype = core::DType::kBFloat16;
  return o;
}

// An unwrapped copy of the model whose parameters are bf16, rounded from the fp32 ones:
// its layers compute as the wrapped model's do on the gathered bf16 weights (NOTE [bf16
// GEMMs] in nn/linear.h).
absl::StatusOr<std::shared_ptr<nn::Gpt>> RoundedReference(const testing::GptTrainingSetup& setup) {
  ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(setup));
  RETURN_IF_ERROR(nn::ConvertParameters(*gpt, core::DType::kBFloat16));
  return gpt;
}

// The wrapped model's layers see bf16 views of the gathered weights, so the wrapped
// forward equals, bit for bit, an unwrapped forward with bf16 weights rounded from the
// same fp32 values (same input, same operations).
TEST(MixedPrecisionTest, ForwardComputesOnBf16RoundedWeights) {
  const testing::GptTrainingSetup setup = testing::TinySetup();
  absl::Status s =
      comm::testing::RunThreadRanks(2, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(setup));
        ASSIGN_OR_RETURN(auto rounded, RoundedReference(setup));
        ASSIGN_OR_RETURN(auto exact, testing::MakeGpt(setup));
        WrapperRegistry registry;
        ASSIGN_OR_RETURN(auto handle, FullyShard(gpt, ctx.group, Bf16(true, false), &registry));
        ASSIGN_OR_RETURN(data::MarkovLanguage language, testing::MakeLanguage(setup));
        ASSIGN_OR_RETURN(data::TokenBatch batch, language.Batch(3, 4, setup.seq_len));
        ASSIGN_OR_RETURN(core::Tensor got, gpt->Forward(batch.inputs));
        ASSIGN_OR_RETURN(core::Tensor want, rounded->Forward(batch.inputs));
        ASSIGN_OR_RETURN(core::Tensor fp32, exact->Forward(batch.inputs));
        EXPECT_EQ(got.ToVector(), want.ToVector());
        EXPECT_NE(got.ToVector(), fp32.ToVector());  // rounding really happened
        // The master stays exact: summoning gives the unrounded fp32 values.
        ASSIGN_OR_RETURN(auto scope, SummonFullParams(*gpt, &registry, {/*writeback=*/false}));
        EXPECT_EQ(testing::ParameterValues(*gpt), testing::ParameterValues(*exact));
        return scope->Close();
      });
  EXPECT_TRUE(s.ok()) << s;
}

// NOTE [bf16 reduction bound]: each rank rounds its float32 gradient g_r to bf16
// (8 significant bits, 7 stored: round to nearest is within half an ulp, u = 2^-8
// relative), the group sums in float32 and the average is rounded to bf16 once more
// (<= u of the result; comm's gloo backend rounds once). So the reduced gradient
// differs from the exact average mean_r(g_r) by at most
//   u mean_r |g_r| + u |mean_r g_r| (+ float32 summation error, ~1e-7 relative),
// checked elementwise with 1% slack on the bf16 terms for the float32 part.
TEST(MixedPrecisionTest, GradientsAreReducedInBf16WithinItsRoundingBound) {
  const testing::GptTrainingSetup setup = testing::TinySetup();
  constexpr int kWorld = 2;
  absl::Status s =
      comm::testing::RunThreadRanks(kWorld, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(data::MarkovLanguage language, testing::MakeLanguage(setup));
        ASSIGN_OR_RETURN(data::TokenBatch global, language.Batch(1, 4, setup.seq_len));
        // Per-rank full gradients of the rounded model, computed unwrapped.
        std::vector<std::map<std::string, std::vector<float>>> per_rank(kWorld);
        for (int r = 0; r < kWorld; ++r) {
          ASSIGN_OR_RETURN(auto ref, RoundedReference(setup));
          ASSIGN_OR_RETURN(data::RankSampler sampler, data::RankSampler::Create(r, kWorld));
          ASSIGN_OR_RETURN(data::TokenBatch local, sampler.Local(global));
          RETURN_IF_ERROR(testing::ForwardBackward(*ref, local).status());
          for (const auto& [name, p] : ref->NamedParameters())
            per_rank[r][name] = p->grad.ToVector();
        }
        ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(setup));
        WrapperRegistry registry;
        ASSIGN_OR_RETURN(auto handle, FullyShard(gpt, ctx.group, Bf16(true, true), &registry));
        ASSIGN_OR_RETURN(data::RankSampler sampler, data::RankSampler::Create(ctx.rank, kWorld));
        ASSIGN_OR_RETURN(data::TokenBatch local, sampler.Local(global));
        RETURN_IF_ERROR(testing::ForwardBackward(*gpt, local).status());
        const double u = std::ldexp(1.0, -8);
        int checked = 0;
        double max_rel = 0;
        for (const auto& unit : handle->units()) {
          const flatten::FlatParameter& flat = unit->flat();
          for (size_t i = 0; i < flat.records().size(); ++i) {
            const flatten::ParamRecord& rec = flat.records()[i];
            const flatten::ShardSlice& slice = rec.shards[ctx.rank];
            const std::vector<float> got = flat.params()[i]->grad.ToVector();
            EXPECT_EQ(static_cast<int64_t>(got.size()), slice.numel()) << rec.name;
            for (int64_t k = 0; k < slice.numel(); ++k) {
              double mean = 0, mean_abs = 0;
              for (int r = 0; r < kWorld; ++r) {
                const double g = per_rank[r].at(rec.name)[slice.begin + k];
                mean += g / kWorld;
                mean_abs += std::abs(g) / kWorld;
              }
              const double bound = 1.01 * u * (mean_abs + std::abs(mean)) + 1e-30;
              const double err = std::abs(got[k] - mean);
              EXPECT_LE(err, bound) << rec.name << "[" << slice.begin + k << "]";
              if (mean_abs > 1e-6) max_rel = std::max(max_rel, err / mean_abs);
              ++checked;
            }
          }
        }
        EXPECT_GT(checked, 1000);
        EXPECT_GT(max_rel, 1e-4);  // the reduction really was bf16 (fp32 would be ~1e-7)
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
}

// bf16 all-gathers and reduce-scatters move half of FULL_SHARD's fp32 bytes.
TEST(MixedPrecisionTest, Bf16HalvesTheBytesOnTheWire) {
  const testing::GptTrainingSetup setup = testing::TinySetup();
  absl::Status s =
      comm::testing::RunThreadRanks(2, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(auto gpt, testing::MakeGpt(setup));
        WrapperRegistry registry;
        ASSIGN_OR_RETURN(auto handle, FullyShard(gpt, ctx.group, Bf16(true, true), &registry));
        ASSIGN_OR_RETURN(data::MarkovLanguage language, testing::MakeLanguage(setup));
        ASSIGN_OR_RETURN(data::TokenBatch batch, language.Batch(0, 2, setup.seq_len));
        int64_t padded = 0;
        for (const auto& u : handle->units()) padded += u->flat().padded_numel();
        ctx.group->ResetStats();
        RETURN_IF_ERROR(testing::ForwardBackward(*gpt, batch).status());
        // 3 collectives per unit of padded * 2 bytes, (N - 1) / N = 1/2 of them per rank.
        EXPECT_EQ(ctx.group->Stats().Total().bytes_sent, 3 * padded * 2 / 2);
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
}

float RoundBf16(float v) { return core::BFloat16::FromFloat(v).ToFloat(); }

// A single process doing exactly the arithmetic of NOTE [Mixed precision] for N ranks:
// an fp32 master; each step every rank's slice is run on a model whose bf16 weights are
// the master rounded;
// each slice's gradient is rounded to bf16, the N are summed in rank order in fp32,
// divided by N and rounded to bf16 once (comm's bf16 average); AdamW steps the master.
absl::StatusOr<testing::TrainingRun> EmulateBf16(const testing::GptTrainingSetup& setup,
                                                 int world) {
  ASSIGN_OR_RETURN(data::MarkovLanguage language, testing::MakeLanguage(setup));
  ASSIGN_OR_RETURN(auto master, testing::MakeGpt(setup));
  ASSIGN_OR_RETURN(auto compute, RoundedReference(setup));
  ASSIGN_OR_RETURN(auto adamw, optim::AdamW::Create(master->NamedParameters(), setup.adamw));
  const std::vector<core::ParameterPtr> m = master->Parameters();
  const std::vector<core::ParameterPtr> w = compute->Parameters();
  testing::TrainingRun run;
  for (int step = 0; step < setup.steps; ++step) {
    for (size_t i = 0; i < m.size(); ++i) {
      RETURN_IF_ERROR(w[i]->data.CopyFrom(m[i]->data));  // rounds to bf16
    }
    ASSIGN_OR_RETURN(data::TokenBatch global,
                     language.Batch(step, setup.global_batch, setup.seq_len));
    std::vector<std::vector<float>> acc(m.size());
    double loss_sum = 0;
    for (int r = 0; r < world; ++r) {
      ASSIGN_OR_RETURN(data::RankSampler sampler, data::RankSampler::Create(r, world));
      ASSIGN_OR_RETURN(data::TokenBatch local, sampler.Local(global));
      compute->ZeroGrad(/*set_to_none=*/true);
      ASSIGN_OR_RETURN(double loss, testing::ForwardBackward(*compute, local));
      loss_sum += loss;
      for (size_t i = 0; i < m.size(); ++i) {
        const std::vector<float> g = w[i]->grad.ToVector();
        if (r == 0) acc[i].assign(g.size(), 0.0f);
        for (size_t k = 0; k < g.size(); ++k) acc[i][k] += RoundBf16(g[k]);
      }
    }
    for (size_t i = 0; i < m.size(); ++i) {
      RETURN_IF_ERROR(m[i]->EnsureGrad());
      for (size_t k = 0; k < acc[i].size(); ++k) {
        m[i]->grad.data<float>()[k] = RoundBf16(acc[i][k] / static_cast<float>(world));
      }
    }
    RETURN_IF_ERROR(adamw->Step());
    run.losses.push_back(loss_sum / world);
  }
  run.params = testing::ParameterValues(*master);
  return run;
}

// NOTE [bf16 training bound]: the bf16 run is compared with EmulateBf16, which performs
// the same mixed-precision roundings in one process. What remains between the two is
// what remains in fp32 parity (NOTE [Parity tolerance] in parity_test.cc: float32
// summation order in the averaged losses; the rounded values themselves coincide), so
// the bound is the fp32 one, rtol 1e-5 and atol 1e-6, for 20 AdamW steps at N = 2 and
// N = 4. Against the plain fp32 run the bf16 run must differ (by more than 1e-5: bf16
// was in effect), and it must still train; the distance is printed for information
// (about 2e-3 in loss and 7e-3 in parameters here).
class MixedPrecisionTrainingTest : public ::testing::TestWithParam<int> {};

TEST_P(MixedPrecisionTrainingTest, MatchesSingleProcessBf16ArithmeticWithinFp32Tolerance) {
  const int world = GetParam();
  const testing::GptTrainingSetup setup = testing::TinySetup();
  absl::StatusOr<testing::TrainingRun> emulated = EmulateBf16(setup, world);
  ASSERT_TRUE(emulated.ok()) << emulated.status();
  absl::StatusOr<testing::TrainingRun> fp32 = testing::TrainUnwrapped(setup);
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  absl::Status s =
      comm::testing::RunThreadRanks(world, [&](comm::testing::RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(testing::TrainingRun run,
                         testing::TrainFullyShardedRank(ctx, setup, Bf16(true, true)));
        double worst = 0;
        RETURN_IF_ERROR(testing::CompareRuns(*emulated, run, 1e-5, 1e-6, &worst));
        double max_loss = 0, max_param = 0;
        for (size_t i = 0; i < run.losses.size(); ++i) {
          max_loss = std::max(max_loss, std::abs(run.losses[i] - fp32->losses[i]));
        }
        for (size_t i = 0; i < run.params.size(); ++i) {
          for (size_t k = 0; k < run.params[i].second.size(); ++k) {
            max_param = std::max(
                max_param,
                static_cast<double>(std::abs(run.params[i].second[k] - fp32->params[i].second[k])));
          }
        }
        if (ctx.rank == 0) {
          std::printf(
              "N=%d bf16 vs emulation: worst |error| / tolerance %.3g; bf16 vs fp32: max "
              "loss diff %.3g, max param diff %.3g\n",
              world, worst, max_loss, max_param);
        }
        EXPECT_GT(std::max(max_loss, max_param), 1e-5);
        EXPECT_LT(run.losses.back(), run.losses.front() - 0.1);  // it trains
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, MixedPrecisionTrainingTest, ::testing::Values(2, 4));

}  // namespace
}  // namespace fsdp
