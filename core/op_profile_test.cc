#include "core/op_profile.h"

#include <thread>

#include "core/roofline.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace core {
namespace {

OpCost Gemm(double flops, double bytes) {
  return OpCost{flops, bytes, 1, OpEngine::kTensorCoreBf16};
}

TEST(OpProfileTest, NothingIsRecordedWithoutAProfile) {
  ASSERT_EQ(CurrentOpProfile(), nullptr);
  OpProfile profile;
  { ProfiledOp op(OpCategory::kNorm, "norm", Device::Cpu(), OpCost::Memory(10)); }
  RecordOp(OpCategory::kLoss, "loss", OpCost::Memory(10));
  EXPECT_TRUE(profile.records().empty());
}

TEST(OpProfileTest, RecordsIntoTheInstalledProfileAndRestoresThePrevious) {
  OpProfile outer, inner;
  {
    ScopedOpProfile on(&outer);
    { ProfiledOp op(OpCategory::kNorm, "norm", Device::Cpu(), OpCost::Memory(100, 8)); }
    {
      ScopedOpProfile nested(&inner);
      RecordOp(OpCategory::kLoss, "loss", OpCost::Memory(7));
    }
    EXPECT_EQ(CurrentOpProfile(), &outer);
    RecordOp(OpCategory::kElementwise, "add", OpCost::Memory(12));
  }
  EXPECT_EQ(CurrentOpProfile(), nullptr);
  ASSERT_EQ(outer.records().size(), 2u);
  EXPECT_EQ(outer.records()[0].category, OpCategory::kNorm);
  EXPECT_EQ(outer.records()[0].name, "norm");
  EXPECT_EQ(outer.records()[0].cost.bytes, 100);
  EXPECT_EQ(outer.records()[0].cost.flops, 8);
  EXPECT_EQ(outer.records()[0].device_ms, -1);  // no device events on the CPU
  EXPECT_EQ(outer.records()[1].name, "add");
  ASSERT_EQ(inner.records().size(), 1u);
  EXPECT_EQ(inner.records()[0].category, OpCategory::kLoss);
}

TEST(OpProfileTest, ACategoryScopeRenamesGemmsOnly) {
  OpProfile profile;
  ScopedOpProfile on(&profile);
  {
    ScopedOpCategory role(OpCategory::kGemmWeightGrad);
    RecordOp(OpCategory::kGemmForward, "matmul", Gemm(10, 1));
    RecordOp(OpCategory::kConvert, "round", OpCost::Memory(6));
    {
      ScopedOpCategory attention(OpCategory::kAttention);
      RecordOp(OpCategory::kGemmForward, "matmul", Gemm(10, 1));
    }
    RecordOp(OpCategory::kGemmForward, "matmul", Gemm(10, 1));
  }
  RecordOp(OpCategory::kGemmForward, "matmul", Gemm(10, 1));
  ASSERT_EQ(profile.records().size(), 5u);
  EXPECT_EQ(profile.records()[0].category, OpCategory::kGemmWeightGrad);
  EXPECT_EQ(profile.records()[1].category, OpCategory::kConvert);
  EXPECT_EQ(profile.records()[2].category, OpCategory::kAttention);
  EXPECT_EQ(profile.records()[3].category, OpCategory::kGemmWeightGrad);
  EXPECT_EQ(profile.records()[4].category, OpCategory::kGemmForward);
}

TEST(OpProfileTest, TotalsAddUpPerCategory) {
  OpProfile profile;
  {
    ScopedOpProfile on(&profile);
    RecordOp(OpCategory::kGemmForward, "matmul", Gemm(100, 10));
    RecordOp(OpCategory::kGemmForward, "matmul", Gemm(50, 5));
    RecordOp(OpCategory::kNorm, "norm", OpCost::Memory(40, 4, 3));
  }
  const std::vector<OpCategoryTotal> totals = profile.Totals();
  ASSERT_EQ(totals.size(), static_cast<size_t>(kNumOpCategories));
  const OpCategoryTotal& gemm = totals[static_cast<int>(OpCategory::kGemmForward)];
  EXPECT_EQ(gemm.ops, 2);
  EXPECT_EQ(gemm.launches, 2);
  EXPECT_EQ(gemm.flops, 150);
  EXPECT_EQ(gemm.bytes, 15);
  const OpCategoryTotal& norm = totals[static_cast<int>(OpCategory::kNorm)];
  EXPECT_EQ(norm.ops, 1);
  EXPECT_EQ(norm.launches, 3);
  EXPECT_EQ(totals[static_cast<int>(OpCategory::kLoss)].ops, 0);
  profile.Clear();
  EXPECT_TRUE(profile.records().empty());
}

TEST(OpProfileTest, EachThreadRecordsIntoItsOwnProfile) {
  OpProfile mine, theirs;
  ScopedOpProfile on(&mine);
  std::thread other([&] {
    ScopedOpProfile on_other(&theirs);
    RecordOp(OpCategory::kLoss, "loss", OpCost::Memory(1));
    RecordOp(OpCategory::kLoss, "loss", OpCost::Memory(1));
  });
  other.join();
  RecordOp(OpCategory::kNorm, "norm", OpCost::Memory(1));
  EXPECT_EQ(mine.records().size(), 1u);
  EXPECT_EQ(theirs.records().size(), 2u);
}

TEST(OpProfileTest, CopyFromRecordsAConvertOfBothTensorsBytes) {
  Tensor src = Tensor::Zeros({1000});
  absl::StatusOr<Tensor> dst = Tensor::Allocate({1000}, DType::kBFloat16, MemoryTag::kOther);
  ASSERT_TRUE(dst.ok()) << dst.status();
  OpProfile profile;
  {
    ScopedOpProfile on(&profile);
    ASSERT_TRUE(dst->CopyFrom(src).ok());
  }
  ASSERT_EQ(profile.records().size(), 1u);
  const OpRecord& r = profile.records()[0];
  EXPECT_EQ(r.category, OpCategory::kConvert);
  EXPECT_EQ(r.name, "convert");
  EXPECT_EQ(r.cost.bytes, 4000 + 2000);
  EXPECT_EQ(r.cost.launches, 1);
  EXPECT_EQ(r.cost.engine, OpEngine::kMemory);
}

TEST(RooflineTest, AnOpTakesTheLongerOfItsBoundsPlusItsLaunches) {
  DeviceRates rates;
  rates.bf16_gemm_tflops = 100;  // 1e11 FLOP per ms
  rates.fp32_simt_tflops = 10;
  rates.memory_gbps = 1000;  // 1e9 bytes per ms
  rates.collective_gbps = 100;
  rates.launch_us = 5;
  rates.host_sync_us = 30;

  OpRecord gemm;
  gemm.cost = Gemm(2e11, 1e8);  // compute 2 ms, memory 0.1 ms
  RooflineCategory t = EstimateOp(gemm, rates);
  EXPECT_DOUBLE_EQ(t.compute_ms, 2.0);
  EXPECT_DOUBLE_EQ(t.memory_ms, 0.0);
  EXPECT_DOUBLE_EQ(t.launch_ms, 0.005);
  EXPECT_DOUBLE_EQ(t.ms, 2.005);

  OpRecord simt = gemm;
  simt.cost.engine = OpEngine::kSimtFp32;  // the same GEMM without tensor cores: 20 ms
  EXPECT_DOUBLE_EQ(EstimateOp(simt, rates).compute_ms, 20.0);

  OpRecord copy;
  copy.cost = OpCost::Memory(3e9, 1e6, 2);  // memory 3 ms, compute 1e-4 ms
  t = EstimateOp(copy, rates);
  EXPECT_DOUBLE_EQ(t.memory_ms, 3.0);
  EXPECT_DOUBLE_EQ(t.compute_ms, 0.0);
  EXPECT_DOUBLE_EQ(t.ms, 3.01);

  OpRecord sync;
  sync.category = OpCategory::kHostSync;
  sync.cost = OpCost{0, 8, 0, OpEngine::kHostSync};
  EXPECT_DOUBLE_EQ(EstimateOp(sync, rates).ms, 0.03);

  OpRecord gather;
  gather.category = OpCategory::kCollective;
  gather.cost = OpCost{0, 1e9, 1, OpEngine::kCollective};  // 10 ms at 100 GB/s
  EXPECT_DOUBLE_EQ(EstimateOp(gather, rates).memory_ms, 10.0);

  const RooflineEstimate e = EstimateRoofline({gemm, copy, sync, gather}, rates);
  EXPECT_DOUBLE_EQ(e.total_ms, 2.005 + 3.01 + 0.03 + 10.005);
  EXPECT_EQ(e.launches, 1 + 2 + 0 + 1);
  EXPECT_EQ(e.host_syncs, 1);
  EXPECT_DOUBLE_EQ(e.categories[static_cast<int>(OpCategory::kHostSync)].ms, 0.03);
}

OpRecord Op(OpCategory category, const char* name, double flops, double bytes) {
  OpRecord r;
  r.category = category;
  r.name = name;
  r.cost = OpCost::Memory(bytes, flops);
  return r;
}

TEST(RooflineTest, ExtrapolatesPerStepOpsAffinelyAndRepeatsPerSequenceOps) {
  // A weight-gradient GEMM (weight bytes fixed, the rest per sequence) and a per-sequence
  // attention op, at batch 1 and 2.
  std::vector<OpRecord> one = {Op(OpCategory::kGemmWeightGrad, "matmul", 10, 100 + 5),
                               Op(OpCategory::kAttention, "matmul", 7, 3)};
  std::vector<OpRecord> two = {Op(OpCategory::kGemmWeightGrad, "matmul", 20, 100 + 10),
                               Op(OpCategory::kAttention, "matmul", 7, 3),
                               Op(OpCategory::kAttention, "matmul", 7, 3)};
  // The weight gradient's reduction runs over the rows: 64 per sequence.
  one[0].gemm = GemmShape{1, 32, 48, 64};
  two[0].gemm = GemmShape{1, 32, 48, 128};
  one[0].cost.exps = 3;
  two[0].cost.exps = 6;
  absl::StatusOr<std::vector<OpRecord>> at16 = ExtrapolateBatch(one, two, 16);
  ASSERT_TRUE(at16.ok()) << at16.status();
  ASSERT_EQ(at16->size(), 1u + 16u);
  EXPECT_EQ((*at16)[0].cost.flops, 160);
  EXPECT_EQ((*at16)[0].cost.bytes, 100 + 80);
  EXPECT_EQ((*at16)[0].cost.exps, 16 * 3);  // 3 exponentials a sequence
  // Its shape grows the same way: k = 16 x 64, m and n as they were.
  EXPECT_EQ((*at16)[0].gemm.batch, 1);
  EXPECT_EQ((*at16)[0].gemm.m, 32);
  EXPECT_EQ((*at16)[0].gemm.n, 48);
  EXPECT_EQ((*at16)[0].gemm.k, 16 * 64);
  for (size_t i = 1; i < at16->size(); ++i) {
    EXPECT_EQ((*at16)[i].category, OpCategory::kAttention);
    EXPECT_EQ((*at16)[i].cost.flops, 7);
  }
  // A kind that runs three times at batch 2 for once at batch 1 fits neither rule.
  std::vector<OpRecord> three = two;
  three.push_back(Op(OpCategory::kAttention, "matmul", 7, 3));
  absl::StatusOr<std::vector<OpRecord>> bad = ExtrapolateBatch(one, three, 16);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("attention/matmul/memory"), std::string::npos)
      << bad.status();
  // A kind missing at batch 1.
  std::vector<OpRecord> extra = two;
  extra.push_back(Op(OpCategory::kLoss, "cross_entropy", 1, 1));
  EXPECT_EQ(ExtrapolateBatch(one, extra, 16).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(OpProfileTest, EngineAndCategoryNamesParseBack) {
  for (int i = 0; i < kNumOpEngines; ++i) {
    const OpEngine e = static_cast<OpEngine>(i);
    EXPECT_EQ(OpEngineFromName(OpEngineName(e)), e) << OpEngineName(e);
  }
  for (int i = 0; i < kNumOpCategories; ++i) {
    const OpCategory c = static_cast<OpCategory>(i);
    EXPECT_EQ(OpCategoryFromName(OpCategoryName(c)), c) << OpCategoryName(c);
  }
  EXPECT_EQ(OpEngineFromName("warp_drive"), std::nullopt);
  EXPECT_EQ(OpCategoryFromName("gemm"), std::nullopt);
}

// The rates the next tests use: 1e11 FLOP, 1e9 bytes (streaming), 5e8 bytes (rows) per ms.
DeviceRates TestRates() {
  DeviceRates r;
  r.bf16_gemm_tflops = 100;
  r.fp32_simt_tflops = 10;
  r.memory_gbps = 1000;
  r.row_memory_gbps = 500;
  r.collective_gbps = 100;
  return r;
}

// A GEMM's FLOPs at its shape's rate, plus the output bytes its main loop does not hide.
TEST(RooflineTest, AGemmTakesItsShapesRateAndItsOutputBeyondItsOperands) {
  DeviceRates rates = TestRates();
  rates.sm_count = 100;
  OpRecord gemm;
  gemm.cost = Gemm(2e11, 0);                 // 2 ms at the full rate
  gemm.gemm = GemmShape{1, 1280, 1280, 64};  // 10 x 10 blocks of 128 x 128: one full wave
  EXPECT_DOUBLE_EQ(GemmFill(gemm.gemm, rates), 1.0);
  EXPECT_DOUBLE_EQ(EstimateOp(gemm, rates).ms, 2.0);
  // 5 x 10 blocks leave half the SMs idle: the same FLOPs take twice as long.
  gemm.gemm = GemmShape{1, 640, 1280, 64};
  EXPECT_DOUBLE_EQ(GemmFill(gemm.gemm, rates), 0.5);
  EXPECT_DOUBLE_EQ(EstimateOp(gemm, rates).compute_ms, 4.0);
  // A long reduction is split: k = 4096 gives 2 parts of each block.
  gemm.gemm = GemmShape{1, 640, 1280, 4096};
  EXPECT_DOUBLE_EQ(GemmFill(gemm.gemm, rates), 1.0);
  // A batch of small products fills the device together.
  EXPECT_DOUBLE_EQ(GemmFill(GemmShape{20, 128, 640, 64}, rates), 1.0);
  // Without SMs in the rates, or a shape in the record, every GEMM fills the device.
  EXPECT_DOUBLE_EQ(GemmFill(GemmShape{1, 128, 128, 64}, TestRates()), 1.0);
  EXPECT_DOUBLE_EQ(GemmFill(GemmShape{}, rates), 1.0);

  // Its output: bytes beyond the bf16 operands (A 1280 x 64, B 64 x 1280), at the output
  // rate on top of the main loop.
  gemm.gemm = GemmShape{1, 1280, 1280, 64};
  const double operands = 2.0 * (1280 * 64 + 64 * 1280);
  gemm.cost.bytes = operands + 4.0 * 1280 * 1280;     // an fp32 C
  EXPECT_DOUBLE_EQ(EstimateOp(gemm, rates).ms, 2.0);  // hidden while gemm_output_gbps is 0
  rates.gemm_output_gbps = 2000;                      // 2e9 bytes a ms
  EXPECT_DOUBLE_EQ(EstimateOp(gemm, rates).compute_ms, 2.0 + 4.0 * 1280 * 1280 / 2e9);
}

// NOTE [Op accounting]: the fused attention's time is its tile products at the mma rate
// and then its exponentials, in the same warps; its bytes bound it only when they take
// longer.
TEST(RooflineTest, FusedAttentionTakesItsProductsThenItsExponentials) {
  DeviceRates rates = TestRates();
  rates.mma_tflops = 50;  // 5e10 FLOP a ms
  rates.exp_tops = 2;     // 2e9 exponentials a ms
  OpRecord attention;
  attention.category = OpCategory::kAttention;
  attention.cost = OpCost{1e11, 1e8, 1, OpEngine::kTensorCoreMma, 4e9};
  RooflineCategory t = EstimateOp(attention, rates);
  EXPECT_DOUBLE_EQ(t.compute_ms, 2.0 + 2.0);
  EXPECT_DOUBLE_EQ(t.memory_ms, 0.0);
  // Without an exponential rate, only the products; without an mma rate, cuBLAS's.
  rates.exp_tops = 0;
  EXPECT_DOUBLE_EQ(EstimateOp(attention, rates).ms, 2.0);
  rates.mma_tflops = 0;
  EXPECT_DOUBLE_EQ(EstimateOp(attention, rates).ms, 1.0);
  // A bandwidth-bound kernel's exponentials are one more bound beside its bytes.
  rates.exp_tops = 2;
  OpRecord softmax;
  softmax.cost = OpCost::Rows(1e8, 0, 1, 4e9);  // bytes 0.2 ms, exponentials 2 ms
  EXPECT_DOUBLE_EQ(EstimateOp(softmax, rates).ms, 2.0);
}

// A row kernel's bytes at the row rate, a streaming kernel's at the memory rate; a kernel
// takes at least min_kernel_us, each launch also launch_us.
TEST(RooflineTest, RowKernelsTakeTheRowRateAndEveryKernelItsFloor) {
  DeviceRates rates = TestRates();
  EXPECT_DOUBLE_EQ(
      EstimateOp(OpRecord{OpCategory::kNorm, "layernorm.forward", OpCost::Rows(1e9)}, rates)
          .memory_ms,
      2.0);
  EXPECT_DOUBLE_EQ(
      EstimateOp(OpRecord{OpCategory::kConvert, "convert", OpCost::Memory(1e9)}, rates).memory_ms,
      1.0);
  rates.row_memory_gbps = 0;  // rows at the streaming rate
  EXPECT_DOUBLE_EQ(
      EstimateOp(OpRecord{OpCategory::kNorm, "layernorm.forward", OpCost::Rows(1e9)}, rates)
          .memory_ms,
      1.0);
  rates.min_kernel_us = 4;
  rates.launch_us = 1;
  // Two launches of 1e6 bytes (1 us) take two floors of 4 us, plus their launches.
  const RooflineCategory tiny =
      EstimateOp(OpRecord{OpCategory::kElementwise, "zero", OpCost::Memory(1e6, 0, 2)}, rates);
  EXPECT_DOUBLE_EQ(tiny.memory_ms, 1e-3);
  EXPECT_DOUBLE_EQ(tiny.ms, 8e-3 + 2e-3);
  // A kernel longer than its floor takes its own time.
  EXPECT_DOUBLE_EQ(
      EstimateOp(OpRecord{OpCategory::kConvert, "convert", OpCost::Memory(1e9)}, rates).ms,
      1.0 + 1e-3);
}

// NOTE [Rate sets]: each device in each set; the H100 SXM's rates are the H200's with its
// device memory, and a name picks the device.
TEST(RooflineTest, RatesAreChosenByTheDevicesName) {
  for (int i = 0; i < kNumRateSets; ++i) {
    const RateSet set = static_cast<RateSet>(i);
    const DeviceRates h200 = H200Rates(set), h100 = H100Rates(set);
    EXPECT_EQ(h200.peak_bf16_tflops, 989) << RateSetName(set);
    EXPECT_EQ(h100.peak_bf16_tflops, 989) << RateSetName(set);
    EXPECT_EQ(h100.bf16_gemm_tflops, h200.bf16_gemm_tflops) << RateSetName(set);
    EXPECT_EQ(h100.mma_tflops, h200.mma_tflops) << RateSetName(set);
    EXPECT_DOUBLE_EQ(h100.memory_gbps, h200.memory_gbps * 3350 / 4800) << RateSetName(set);
    EXPECT_DOUBLE_EQ(h100.row_memory_gbps, h200.row_memory_gbps * 3350 / 4800);
    EXPECT_DOUBLE_EQ(h100.gemm_output_gbps, h200.gemm_output_gbps * 3350 / 4800);
    // No set is faster than the datasheet.
    const DeviceRates sheet = H200Rates(RateSet::kDatasheet);
    EXPECT_LE(h200.bf16_gemm_tflops, sheet.bf16_gemm_tflops);
    EXPECT_LE(h200.mma_tflops, sheet.mma_tflops);
    EXPECT_LE(h200.memory_gbps, sheet.memory_gbps);
    EXPECT_LE(h200.row_memory_gbps, sheet.row_memory_gbps);
  }
  EXPECT_EQ(H200Rates(RateSet::kDatasheet).memory_gbps, 4800);
  EXPECT_EQ(H100Rates(RateSet::kDatasheet).memory_gbps, 3350);

  const std::optional<DeviceRates> h200 = RatesForDevice("NVIDIA H200, 139.8 GiB, sm_90");
  ASSERT_TRUE(h200.has_value());
  EXPECT_EQ(h200->name, H200Rates(RateSet::kCalibrated).name);
  const std::optional<DeviceRates> h100 =
      RatesForDevice("NVIDIA H100 80GB HBM3, 79.1 GiB, sm_90", RateSet::kDatasheet);
  ASSERT_TRUE(h100.has_value());
  EXPECT_EQ(h100->name, H100Rates(RateSet::kDatasheet).name);
  EXPECT_EQ(h100->memory_gbps, 3350);
  // Other H100s have other memory and clocks; other devices have no rates here.
  EXPECT_FALSE(RatesForDevice("NVIDIA H100 PCIe, 79.1 GiB, sm_90").has_value());
  EXPECT_FALSE(RatesForDevice("NVIDIA H100 NVL, 93.1 GiB, sm_90").has_value());
  EXPECT_FALSE(RatesForDevice("NVIDIA A100-SXM4-80GB, 79.1 GiB, sm_80").has_value());
  EXPECT_FALSE(RatesForDevice("cpu").has_value());
}

}  // namespace
}  // namespace core
