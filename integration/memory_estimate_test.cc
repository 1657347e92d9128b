#include "integration/memory_estimate.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/allocator.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/gpt.h"
#include "nn/losses.h"
#include "policy/plan.h"
#include "policy/wrap_policy.h"

namespace integration {
namespace {

using ::testing::HasSubstr;

MemoryEstimateInput OneMillionParams(fsdp::ShardingStrategy strategy) {
  MemoryEstimateInput in;
  in.model.num_params = 1000000;
  in.model.largest_unit_params = 100000;
  in.model.root_unit_params = 50000;
  in.model.num_units = 10;
  in.world_size = 8;
  in.strategy = strategy;
  return in;
}

// NOTE [Memory estimate]'s gathered term: c (R + A Lu) + 4 (R + min(U - 1, 2) Lu), with
// A = min(U - 1, 1 + limit_all_gathers); here U = 10 and limit_all_gathers 2, so A = 3.
int64_t Gathered(int64_t c, int64_t root, int64_t lu) {
  return c * (root + 3 * lu) + 4 * (root + 2 * lu);
}

TEST(MemoryEstimateTest, FullShardFollowsTheStatedFormula) {
  MemoryEstimateInput in = OneMillionParams(fsdp::ShardingStrategy::kFullShard);
  absl::StatusOr<MemoryEstimate> e = EstimateMemory(in);
  ASSERT_TRUE(e.ok()) << e.status();
  const int64_t shard = 1000000 / 8 + 10;             // S = ceil(P / G) + U
  const int64_t lu = 100000 + 7;                      // largest unit, padded
  const int64_t root = 50000 + 7;                     // root unit, padded
  const int64_t comm = 4 * ((lu + 7) / 8) * (3 + 1);  // A all-gathers and one reduction
  EXPECT_EQ(e->model_state_bytes, 16 * shard);
  EXPECT_EQ(e->gathered_bytes, Gathered(4, root, lu));
  EXPECT_EQ(e->comm_bytes, comm);
  EXPECT_EQ(e->activation_bytes, 0);
  EXPECT_EQ(e->init_bytes, 4 * (1000000 + lu));
  const int64_t training = 16 * shard + Gathered(4, root, lu) + comm;
  EXPECT_EQ(e->per_rank_bytes, std::max<int64_t>(4 * (1000000 + lu), training));
  EXPECT_EQ(e->per_host_bytes, e->per_rank_bytes);

  // Fewer units gathered ahead: limit_all_gathers 0 keeps only the computing one.
  in.limit_all_gathers = 0;
  e = EstimateMemory(in);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->gathered_bytes, 4 * (root + lu) + 4 * (root + 2 * lu));
  in.limit_all_gathers = 2;

  // A deferred model is never whole: training is the peak.
  in.deferred_init = true;
  e = EstimateMemory(in);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->init_bytes, 0);
  EXPECT_EQ(e->per_rank_bytes, training);
  in.deferred_init = false;

  // bf16 compute halves the gathered copies, not the fp32 state or gradients.
  in.param_dtype = core::DType::kBFloat16;
  e = EstimateMemory(in);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->model_state_bytes, 16 * shard);
  EXPECT_EQ(e->gathered_bytes, Gathered(2, root, lu));
}

TEST(MemoryEstimateTest, StrategiesDifferAsStated) {
  absl::StatusOr<MemoryEstimate> grad_op =
      EstimateMemory(OneMillionParams(fsdp::ShardingStrategy::kShardGradOp));
  ASSERT_TRUE(grad_op.ok()) << grad_op.status();
  EXPECT_EQ(grad_op->model_state_bytes, 16 * (1000000 / 8 + 10));
  EXPECT_EQ(grad_op->gathered_bytes, 4 * 1000000 + 4 * ((50000 + 7) + 2 * (100000 + 7)));

  absl::StatusOr<MemoryEstimate> no_shard =
      EstimateMemory(OneMillionParams(fsdp::ShardingStrategy::kNoShard));
  ASSERT_TRUE(no_shard.ok()) << no_shard.status();
  EXPECT_EQ(no_shard->model_state_bytes, 16 * (1000000 + 10));  // G = 1
  EXPECT_EQ(no_shard->gathered_bytes, 0);
  EXPECT_EQ(no_shard->comm_bytes, 0);
  EXPECT_EQ(no_shard->per_rank_bytes, no_shard->model_state_bytes);

  MemoryEstimateInput hybrid = OneMillionParams(fsdp::ShardingStrategy::kHybridShard);
  hybrid.hybrid_shard_size = 2;
  absl::StatusOr<MemoryEstimate> h = EstimateMemory(hybrid);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->model_state_bytes, 16 * (1000000 / 2 + 10));
  EXPECT_EQ(h->gathered_bytes, Gathered(4, 50000 + 1, 100000 + 1));

  // Gradient accumulation under no_sync holds every unit's fp32 gradient (4 P) instead
  // of those in flight.
  MemoryEstimateInput no_sync = OneMillionParams(fsdp::ShardingStrategy::kFullShard);
  no_sync.no_sync_accumulation = true;
  absl::StatusOr<MemoryEstimate> ns = EstimateMemory(no_sync);
  absl::StatusOr<MemoryEstimate> each =
      EstimateMemory(OneMillionParams(fsdp::ShardingStrategy::kFullShard));
  ASSERT_TRUE(ns.ok() && each.ok()) << ns.status();
  EXPECT_EQ(ns->gathered_bytes - each->gathered_bytes,
            4 * 1000000 - 4 * ((50000 + 7) + 2 * (100000 + 7)));
  no_sync.strategy = fsdp::ShardingStrategy::kNoShard;
  EXPECT_EQ(EstimateMemory(no_sync)->gathered_bytes, 0);
}

TEST(MemoryEstimateTest, LocalRanksMultiplyThePerHostFigure) {
  MemoryEstimateInput in = OneMillionParams(fsdp::ShardingStrategy::kFullShard);
  in.local_ranks = 4;
  absl::StatusOr<MemoryEstimate> e = EstimateMemory(in);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->per_host_bytes, 4 * e->per_rank_bytes);
  EXPECT_THAT(e->Describe(), HasSubstr("x 4 ranks on this host"));
}

TEST(MemoryEstimateTest, ModelStateMatchesThePlansZeroThreeFigure) {
  nn::GptConfig config;  // vocab 64, context 32, width 64, 2 layers, 4 heads
  absl::StatusOr<std::shared_ptr<nn::Gpt>> gpt = nn::Gpt::Create(config);
  ASSERT_TRUE(gpt.ok()) << gpt.status();
  absl::StatusOr<policy::WrapPlan> plan =
      policy::Plan(**gpt, *policy::ModuleTypes({"TransformerBlock"}), /*world_size=*/4);
  ASSERT_TRUE(plan.ok()) << plan.status();
  MemoryEstimateInput in;
  in.model = ModelSizesFromPlan(*plan);
  EXPECT_EQ(in.model.num_params, (*gpt)->NumParameterElements());
  EXPECT_EQ(in.model.num_units, 3);
  in.world_size = 4;
  absl::StatusOr<MemoryEstimate> e = EstimateMemory(in);
  ASSERT_TRUE(e.ok()) << e.status();
  // The plan pads each unit exactly; the estimate's bound is at most 16 B per unit above.
  const int64_t plan_bytes = plan->totals().per_rank_fp32_bytes();
  EXPECT_GE(e->model_state_bytes, plan_bytes);
  EXPECT_LE(e->model_state_bytes, plan_bytes + 16 * in.model.num_units);
}

// One training step of a fresh Gpt of `config` on `rows` x `seq` tokens, as the GPT's
// training step runs it (the logits freed before the backward), with the blocks
// `checkpointed` checkpointed: the peak activation bytes above what was held before.
absl::StatusOr<int64_t> MeasuredActivationPeak(const nn::GptConfig& config, int64_t rows,
                                               int64_t seq,
                                               const std::vector<int64_t>& checkpointed) {
  auto allocator = std::make_shared<core::Allocator>(core::Device::Cpu());
  core::ScopedAllocator scope(allocator);
  ASSIGN_OR_RETURN(std::shared_ptr<nn::Gpt> gpt, nn::Gpt::Create(config));
  for (int64_t b : checkpointed) (*gpt->blocks())[b]->set_checkpoint_activations(true);
  std::vector<int32_t> ids(rows * seq);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int32_t>((i * 7) % config.vocab_size);
  }
  ASSIGN_OR_RETURN(core::Tensor tokens, core::Tensor::FromInts(ids, {rows, seq}));
  ASSIGN_OR_RETURN(core::Tensor targets, core::Tensor::FromInts(ids, {rows, seq}));
  allocator->ResetPeaks();
  const int64_t before = allocator->Stats().current(core::MemoryTag::kActivation);
  {
    ASSIGN_OR_RETURN(core::Tensor logits, gpt->Forward(tokens));
    ASSIGN_OR_RETURN(nn::LossResult loss, nn::CrossEntropyLoss(logits, targets));
    logits = core::Tensor();
    RETURN_IF_ERROR(gpt->Backward(loss.grad).status());
  }
  return allocator->Stats().peak(core::MemoryTag::kActivation) - before;
}

TEST(MemoryEstimateTest, GptActivationEstimateBoundsTheMeasuredPeak) {
  nn::GptConfig config;
  config.vocab_size = 96;
  config.block_size = 32;
  config.n_embd = 32;
  config.n_layer = 3;
  config.n_head = 4;
  const int64_t rows = 4, seq = 32;
  absl::StatusOr<int64_t> peak = MeasuredActivationPeak(config, rows, seq, {});
  ASSERT_TRUE(peak.ok()) << peak.status();
  const int64_t measured = *peak;

  MemoryEstimateInput in;
  in.activations = GptActivations(config, rows, seq);
  absl::StatusOr<MemoryEstimate> e = EstimateMemory(in);
  ASSERT_TRUE(e.ok()) << e.status();
  // The stated formula without checkpointing, 4 B T (max(S + 2 C + 2 V, S + 5 C + V) + 4)
  // with S = L (16 C + H T + 4); here 3 C > V, so the backward's term.
  EXPECT_EQ(e->activation_bytes, 4 * rows * seq * (3 * (16 * 32 + 4 * seq + 4) + 5 * 32 + 96 + 4));
  // An estimate, but a faithful one: never below the real peak, and not wildly above.
  EXPECT_GE(e->activation_bytes, measured) << "measured " << measured;
  EXPECT_LE(e->activation_bytes, 2 * measured) << "measured " << measured;
}

// The estimate against the measured peak with none, some and every block checkpointed,
// on a step as the GPT's training step runs it (the logits freed before the backward).
TEST(MemoryEstimateTest, GptActivationEstimateWithAndWithoutCheckpointingIsWithinFivePercent) {
  nn::GptConfig config;
  config.vocab_size = 512;
  config.block_size = 128;
  config.n_embd = 128;
  config.n_layer = 4;
  config.n_head = 4;
  const int64_t rows = 4, seq = 128;
  const std::vector<std::vector<int64_t>> choices = {{}, {0, 1}, {2, 3}, {0, 2}, {0, 1, 2, 3}};
  for (const std::vector<int64_t>& chosen : choices) {
    const std::string k = absl::StrJoin(chosen, ",");
    SCOPED_TRACE(absl::StrCat("blocks checkpointed: ", k));
    absl::StatusOr<int64_t> peak = MeasuredActivationPeak(config, rows, seq, chosen);
    ASSERT_TRUE(peak.ok()) << peak.status();
    const int64_t measured = *peak;
    MemoryEstimateInput in;
    in.activations = GptActivations(config, rows, seq);
    in.activations->checkpointed_blocks = chosen;
    absl::StatusOr<MemoryEstimate> e = EstimateMemory(in);
    ASSERT_TRUE(e.ok()) << e.status();
    const double ratio = static_cast<double>(e->activation_bytes) / measured;
    std::printf("checkpointed blocks [%s]: estimate %lld, measured peak %lld, ratio %.4f\n",
                k.c_str(), static_cast<long long>(e->activation_bytes),
                static_cast<long long>(measured), ratio);
    // Never below the measured peak, and within 5% of it.
    EXPECT_GE(ratio, 1.0);
    EXPECT_LE(ratio, 1.05);
  }
}

TEST(MemoryEstimateTest, BadInputsNameTheField) {
  struct Case {
    std::function<void(MemoryEstimateInput*)> edit;
    const char* field;
  };
  const Case cases[] = {
      {[](MemoryEstimateInput* in) { in->world_size = 0; }, "MemoryEstimateInput.world_size = 0"},
      {[](MemoryEstimateInput* in) { in->local_ranks = 9; }, "MemoryEstimateInput.local_ranks = 9"},
      {[](MemoryEstimateInput* in) { in->model.num_params = -1; }, "model.num_params = -1"},
      {[](MemoryEstimateInput* in) { in->model.largest_unit_params = 2000000; },
       "model.largest_unit_params = 2000000"},
      {[](MemoryEstimateInput* in) {
         in->strategy = fsdp::ShardingStrategy::kHybridShard;
         in->hybrid_shard_size = 3;
       },
       "hybrid_shard_size = 3"},
      {[](MemoryEstimateInput* in) {
         in->activations = GptActivationShape();
         in->activations->seq_len = -5;
       },
       "activations.seq_len = -5"},
  };
  for (const Case& c : cases) {
    MemoryEstimateInput in = OneMillionParams(fsdp::ShardingStrategy::kFullShard);
    c.edit(&in);
    absl::StatusOr<MemoryEstimate> e = EstimateMemory(in);
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_THAT(e.status().message(), HasSubstr(c.field));
  }
}

TEST(MemoryEstimateTest, OverflowingSizesAreResourceExhausted) {
  MemoryEstimateInput in = OneMillionParams(fsdp::ShardingStrategy::kFullShard);
  in.model.num_params = int64_t{1} << 62;
  in.model.largest_unit_params = int64_t{1} << 62;
  absl::StatusOr<MemoryEstimate> e = EstimateMemory(in);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kResourceExhausted) << e.status();
  EXPECT_THAT(e.status().message(), HasSubstr("overflows"));
}

TEST(MemoryEstimateTest, OnACudaDeviceTheRankFigureIsDeviceMemoryAndTheHostHoldsTheCpuModel) {
  MemoryEstimateInput in = OneMillionParams(fsdp::ShardingStrategy::kFullShard);
  in.local_ranks = 4;
  const MemoryEstimate cpu = EstimateMemory(in).value();
  in.device = core::Device::Cuda(0);
  const MemoryEstimate gpu = EstimateMemory(in).value();
  EXPECT_EQ(gpu.per_rank_bytes, cpu.per_rank_bytes);
  EXPECT_EQ(gpu.per_device_bytes, gpu.per_rank_bytes);
  EXPECT_EQ(cpu.per_device_bytes, 0);
  // The host: 4 bytes per parameter per local rank (the CPU-built fp32 model).
  EXPECT_EQ(gpu.per_host_bytes, 4 * (in.model.num_params + in.model.ignored_params) * 4);
  EXPECT_THAT(gpu.Describe(), HasSubstr("on cuda:0"));
  EXPECT_TRUE(CheckFitsInDeviceMemory(gpu, gpu.per_device_bytes, "test").ok());
  absl::Status s = CheckFitsInDeviceMemory(gpu, gpu.per_device_bytes - 1, "free 1 byte less");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("cuda:0"));
  EXPECT_THAT(s.message(), HasSubstr("short by 1B"));
  EXPECT_TRUE(CheckFitsInDeviceMemory(cpu, 0, "cpu: nothing to check").ok());
}

// NOTE [Memory estimate]'s offload terms: the managed state (16 S) and a staging shard per
// unit (4 S) leave the device for the host; the device adds a float32 shard per
// all-gather in flight; CPU parameters cannot offload.
TEST(MemoryEstimateTest, OffloadMovesTheModelStateToTheHost) {
  MemoryEstimateInput in = OneMillionParams(fsdp::ShardingStrategy::kFullShard);
  in.device = core::Device::Cuda(0);
  in.local_ranks = 2;
  const MemoryEstimate plain = EstimateMemory(in).value();
  in.cpu_offload = true;
  const MemoryEstimate offload = EstimateMemory(in).value();
  const int64_t shard = 1000000 / 8 + 10;
  const int64_t lu = 100000 + 7;
  EXPECT_EQ(offload.model_state_bytes, 0);
  EXPECT_EQ(offload.offloaded_bytes, 20 * shard);
  EXPECT_EQ(offload.comm_bytes, plain.comm_bytes + 4 * ((lu + 7) / 8) * 3);
  EXPECT_EQ(offload.gathered_bytes, plain.gathered_bytes);
  EXPECT_EQ(offload.per_device_bytes,
            std::max(offload.init_bytes, offload.gathered_bytes + offload.comm_bytes));
  EXPECT_EQ(offload.per_host_bytes, 2 * std::max<int64_t>(4 * 1000000, 20 * shard));
  EXPECT_THAT(offload.Describe(), HasSubstr("offloaded to the host"));
  in.device = core::Device::Cpu();
  absl::StatusOr<MemoryEstimate> refused = EstimateMemory(in);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("MemoryEstimateInput.cpu_offload on cpu"));
}

TEST(CheckFitsInMemoryTest, ComparesThePerHostFigureWithTheAvailableMemory) {
  MemoryEstimate e;
  e.model_state_bytes = 3 << 20;
  e.per_rank_bytes = 3 << 20;
  e.local_ranks = 2;
  e.per_host_bytes = 6 << 20;
  EXPECT_TRUE(CheckFitsInMemory(e, 6 << 20, "test").ok());
  EXPECT_TRUE(CheckFitsInMemory(e, 7 << 20, "test").ok());
  absl::Status s = CheckFitsInMemory(e, 4 << 20, "MemAvailable 4.00MiB (injected)");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("needs an estimated 6.00MiB (6291456 bytes"));
  EXPECT_THAT(s.message(), HasSubstr("x 2 ranks on this host"));
  EXPECT_THAT(s.message(), HasSubstr("4.00MiB (4194304 bytes) are available"));
  EXPECT_THAT(s.message(), HasSubstr("MemAvailable 4.00MiB (injected)"));
  EXPECT_THAT(s.message(), HasSubstr("short by 2.00MiB"));
}

TEST(CheckFitsInMemoryTest, TheRealHostFitsATinyRunButNotAPetabyte) {
  MemoryEstimate tiny;
  tiny.per_rank_bytes = tiny.per_host_bytes = 1 << 20;
  EXPECT_TRUE(CheckFitsInHostMemory(tiny).ok());
  MemoryEstimate huge;
  huge.per_rank_bytes = huge.per_host_bytes = int64_t{1} << 50;
  absl::Status s = CheckFitsInHostMemory(huge);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("MemAvailable"));
}

}  // namespace
}  // namespace integration
