#include "integration/op_profile_report.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace integration {
namespace {

core::OpRecord Op(core::OpCategory category, const char* name, core::OpCost cost,
                  double device_ms) {
  core::OpRecord r;
  r.category = category;
  r.name = name;
  r.cost = cost;
  r.device_ms = device_ms;
  return r;
}

core::DeviceRates Rates() {
  core::DeviceRates r;
  r.name = "test GPU";
  r.peak_bf16_tflops = 1000;
  r.bf16_gemm_tflops = 500;
  r.fp32_simt_tflops = 50;
  r.memory_gbps = 1000;
  r.collective_gbps = 100;
  r.launch_us = 0;
  r.host_sync_us = 0;
  return r;
}

TEST(OpProfileReportTest, MeasuredTimesGiveAchievedRatesBesideTheEstimate) {
  // A GEMM of 1e12 FLOP (2 ms at 500 TFLOP/s) measured at 4 ms, and a copy of 1e9 bytes
  // (1 ms at 1000 GB/s) measured at 2 ms.
  const std::vector<core::OpRecord> records = {
      Op(core::OpCategory::kGemmForward, "matmul",
         core::OpCost{1e12, 1e6, 1, core::OpEngine::kTensorCoreBf16}, 4.0),
      Op(core::OpCategory::kConvert, "convert", core::OpCost::Memory(1e9), 2.0)};
  const OpProfileReport r = ReportOpProfile(records, Rates(), /*model_flops=*/1e12, 1000);
  const nlohmann::json& cats = r.json["categories"];
  ASSERT_EQ(cats.size(), 2u);
  EXPECT_EQ(cats[0]["category"], "gemm.forward");
  EXPECT_DOUBLE_EQ(cats[0]["estimated_ms"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(cats[0]["measured_ms"].get<double>(), 4.0);
  EXPECT_DOUBLE_EQ(cats[0]["achieved_tflops"].get<double>(), 250.0);
  EXPECT_EQ(cats[1]["category"], "convert");
  EXPECT_DOUBLE_EQ(cats[1]["achieved_gbps"].get<double>(), 500.0);
  EXPECT_DOUBLE_EQ(r.json["estimated_step_ms"].get<double>(), 3.0);
  EXPECT_DOUBLE_EQ(r.json["measured_op_ms"].get<double>(), 6.0);
  // MFU: 1e12 FLOP in 3 ms estimated (1e12 / 3e-3 / 1e15) and in 6 ms measured.
  EXPECT_NEAR(r.json["estimated_mfu"].get<double>(), 1.0 / 3.0, 1e-12);
  EXPECT_NEAR(r.json["measured_op_mfu"].get<double>(), 1.0 / 6.0, 1e-12);
  // The op kinds, largest estimate first.
  ASSERT_EQ(r.json["ops"].size(), 2u);
  EXPECT_EQ(r.json["ops"][0]["op"], "matmul");
  EXPECT_EQ(r.json["ops"][1]["op"], "convert");
  bool step_line = false;
  for (const std::string& line : r.lines) {
    if (line.rfind("step: estimated 3.00 ms", 0) == 0) step_line = true;
  }
  EXPECT_TRUE(step_line);
}

core::OpRecord Gemm(core::OpCategory category, core::GemmShape shape, double device_ms) {
  core::OpRecord r = Op(category, "matmul",
                        core::OpCost{2.0 * shape.batch * shape.m * shape.n * shape.k, 1e6, 1,
                                     core::OpEngine::kTensorCoreBf16},
                        device_ms);
  r.gemm = shape;
  return r;
}

TEST(OpProfileReportTest, GemmShapesAreGroupedWithTheirAchievedRateMostTimeFirst) {
  // Two forward GEMMs of one shape (2e12 FLOP each, 5 ms each: 400 TFLOP/s), one of
  // another (1e12 FLOP in 4 ms: 250), the first shape again as a weight gradient (its own
  // row), and a copy (no shape).
  const core::GemmShape big{1, 1000, 1000, 1000000}, small{2, 1000, 500, 500000};
  const std::vector<core::OpRecord> records = {
      Gemm(core::OpCategory::kGemmForward, big, 5.0),
      Gemm(core::OpCategory::kGemmForward, small, 4.0),
      Gemm(core::OpCategory::kGemmForward, big, 5.0),
      Gemm(core::OpCategory::kGemmWeightGrad, big, 1.0),
      Op(core::OpCategory::kConvert, "convert", core::OpCost::Memory(1e9), 2.0)};
  const OpProfileReport r = ReportOpProfile(records, Rates(), 1e12, 1000);
  const nlohmann::json& shapes = r.json["gemm_shapes"];
  ASSERT_EQ(shapes.size(), 3u) << shapes.dump();
  EXPECT_EQ(shapes[0]["category"], "gemm.forward");
  EXPECT_EQ(shapes[0]["m"], 1000);
  EXPECT_EQ(shapes[0]["k"], 1000000);
  EXPECT_EQ(shapes[0]["count"], 2);
  EXPECT_DOUBLE_EQ(shapes[0]["measured_ms"].get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(shapes[0]["achieved_tflops"].get<double>(), 400.0);
  // 4e12 FLOP at the test GPU's 500 TFLOP/s.
  EXPECT_DOUBLE_EQ(shapes[0]["estimated_ms"].get<double>(), 8.0);
  EXPECT_EQ(shapes[1]["batch"], 2);
  EXPECT_EQ(shapes[1]["n"], 500);
  EXPECT_DOUBLE_EQ(shapes[1]["achieved_tflops"].get<double>(), 250.0);
  EXPECT_EQ(shapes[2]["category"], "gemm.weight_grad");
  EXPECT_EQ(shapes[2]["count"], 1);
  bool row = false;
  for (const std::string& line : r.lines) {
    row = row || (line.find("2 x 1000 x 500 x 500000") != std::string::npos &&
                  line.find("250.0") != std::string::npos);
  }
  EXPECT_TRUE(row);
}

TEST(OpProfileReportTest, TableAndJsonOfOneSummaryAreTheReport) {
  const std::vector<core::OpRecord> records = {
      Gemm(core::OpCategory::kGemmForward, core::GemmShape{1, 64, 64, 64}, 0.5),
      Op(core::OpCategory::kConvert, "convert", core::OpCost::Memory(1e9), 2.0),
      Op(core::OpCategory::kNorm, "layernorm.forward", core::OpCost::Memory(1e6), -1)};
  const OpProfileReport r = ReportOpProfile(records, Rates(), 1e12, 1000);
  const OpProfileSummary s = SummarizeOpProfile(records, Rates(), 1e12, 1000);
  ASSERT_EQ(s.categories.size(), 3u);
  ASSERT_EQ(s.kinds.size(), 3u);
  ASSERT_EQ(s.gemm_shapes.size(), 1u);
  EXPECT_EQ(OpProfileTable(s), r.lines);
  EXPECT_EQ(OpProfileJson(s), r.json);
}

TEST(OpProfileReportTest, WithoutDeviceTimesTheMeasuredFiguresAreNull) {
  const std::vector<core::OpRecord> records = {
      Op(core::OpCategory::kNorm, "layernorm.forward", core::OpCost::Memory(1e6), -1)};
  const OpProfileReport r = ReportOpProfile(records, Rates(), 1e9, 10);
  EXPECT_TRUE(r.json["categories"][0]["measured_ms"].is_null());
  EXPECT_TRUE(r.json["categories"][0]["achieved_gbps"].is_null());
  EXPECT_TRUE(r.json["measured_op_ms"].is_null());
  EXPECT_TRUE(r.json["measured_op_mfu"].is_null());
  EXPECT_DOUBLE_EQ(r.json["estimated_step_ms"].get<double>(), 1e-3);
  EXPECT_TRUE(r.json["gemm_shapes"].empty());
}

// NOTE [Rate sets] (core/roofline.h): the main job reports against the rates of the device
// it runs on, and says so when it has none for it.
TEST(OpProfileReportTest, TheReportTakesTheRatesOfItsDeviceOrSaysWhoseItTook) {
  std::string note = "stale";
  const core::DeviceRates h100 = ReportRates("NVIDIA H100 80GB HBM3, 79.1 GiB, sm_90", &note);
  EXPECT_EQ(h100.name, core::H100Rates(core::RateSet::kCalibrated).name);
  EXPECT_TRUE(note.empty()) << note;
  const core::DeviceRates h200 = ReportRates("NVIDIA H200, 139.8 GiB, sm_90", &note);
  EXPECT_EQ(h200.name, core::H200Rates(core::RateSet::kCalibrated).name);
  EXPECT_TRUE(note.empty()) << note;
  const core::DeviceRates other = ReportRates("NVIDIA A100-SXM4-80GB, 79.1 GiB, sm_80", &note);
  EXPECT_EQ(other.name, core::H200Rates(core::RateSet::kCalibrated).name);
  EXPECT_NE(note.find("A100"), std::string::npos) << note;
  EXPECT_NE(note.find(other.name), std::string::npos) << note;
}

TEST(OpProfileReportTest, RateSetsAreComparedSideBySide) {
  const std::vector<core::OpRecord> records = {
      Op(core::OpCategory::kConvert, "convert", core::OpCost::Memory(1e9), -1),
      Op(core::OpCategory::kNorm, "layernorm.forward", core::OpCost::Rows(1e9), -1)};
  core::DeviceRates slow = Rates();
  slow.memory_gbps = 500;
  slow.row_memory_gbps = 250;
  const OpProfileReport r =
      CompareRateSets(records, {{"fast", Rates()}, {"slow", slow}}, /*model_flops=*/1e12, 1000);
  const nlohmann::json& sets = r.json["sets"];
  ASSERT_EQ(sets.size(), 2u);
  EXPECT_EQ(sets[0]["label"], "fast");
  EXPECT_DOUBLE_EQ(sets[0]["categories"]["convert"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(sets[0]["categories"]["norm"].get<double>(), 1.0);  // rows at 1000 too
  EXPECT_DOUBLE_EQ(sets[1]["categories"]["convert"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(sets[1]["categories"]["norm"].get<double>(), 4.0);
  EXPECT_DOUBLE_EQ(sets[1]["estimated_step_ms"].get<double>(), 6.0);
  EXPECT_DOUBLE_EQ(sets[1]["estimated_tokens_per_s"].get<double>(), 1000 / 6e-3);
  EXPECT_DOUBLE_EQ(sets[1]["estimated_mfu"].get<double>(), 1e12 / 6e-3 / 1e15);
  bool row = false;
  for (const std::string& line : r.lines) {
    row =
        row || (line.find("norm") != std::string::npos && line.find("1.000") != std::string::npos &&
                line.find("4.000") != std::string::npos);
  }
  EXPECT_TRUE(row);
}

TEST(OpProfileReportTest, AnOpListRoundTripsThroughJson) {
  core::OpRecord gemm = Op(core::OpCategory::kGemmWeightGrad, "matmul",
                           core::OpCost{2e9, 3e6, 1, core::OpEngine::kTensorCoreBf16}, -1);
  gemm.gemm = core::GemmShape{1, 768, 2304, 16384};
  const std::vector<core::OpRecord> records = {
      gemm,
      Op(core::OpCategory::kAttention, "fused_attention.backward",
         core::OpCost{1e9, 2e6, 3, core::OpEngine::kTensorCoreMma, 5e6}, -1),
      Op(core::OpCategory::kHostSync, "copy", core::OpCost{0, 8, 0, core::OpEngine::kHostSync},
         -1)};
  absl::StatusOr<std::vector<core::OpRecord>> back = OpRecordsFromJson(OpRecordsJson(records));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    const core::OpRecord &a = records[i], &b = (*back)[i];
    EXPECT_EQ(b.category, a.category) << i;
    EXPECT_EQ(b.name, a.name) << i;
    EXPECT_EQ(b.cost.engine, a.cost.engine) << i;
    EXPECT_EQ(b.cost.flops, a.cost.flops) << i;
    EXPECT_EQ(b.cost.bytes, a.cost.bytes) << i;
    EXPECT_EQ(b.cost.exps, a.cost.exps) << i;
    EXPECT_EQ(b.cost.launches, a.cost.launches) << i;
    EXPECT_EQ(b.gemm.k, a.gemm.k) << i;
    EXPECT_EQ(b.gemm.n, a.gemm.n) << i;
  }
  nlohmann::json bad = OpRecordsJson(records);
  bad[1]["engine"] = "warp_drive";
  absl::StatusOr<std::vector<core::OpRecord>> refused = OpRecordsFromJson(bad);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("record 1"), std::string::npos) << refused.status();
  EXPECT_NE(refused.status().message().find("engine"), std::string::npos) << refused.status();
}

}  // namespace
}  // namespace integration
