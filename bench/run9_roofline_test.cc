// NOTE [Rate sets] (core/roofline.h): the calibrated H200 rates estimate GPU run 9's op list
// (bench/testdata/run9_ops.json, reproduced from commit e64cf39: its header says how) to
// within 15% of the time run 9 measured, in every category that took more than 0.5 ms and
// for the step.
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/op_profile.h"
#include "core/roofline.h"
#include "gtest/gtest.h"
#include "integration/op_profile_report.h"
#include "nlohmann/json.hpp"

namespace {

// Run 9's measured device time per category, ms: its JSON line's
// op_profile.categories.*.measured_ms in docs/GPU_RUNS.md (one H200, commit e64cf39), and
// the number of ops it timed in each.
struct Measured {
  const char* category;
  double ms;
  int ops;
};
constexpr Measured kRun9[] = {
    {"gemm.forward", 6.578560017049313, 49},
    {"gemm.input_grad", 5.868031959980726, 49},
    {"gemm.weight_grad", 5.854111954569817, 49},
    {"attention", 12.00412805378437, 24},
    {"norm", 5.379168011248112, 50},
    {"elementwise", 9.057855990715325, 136},
    {"embedding", 0.1640959968790412, 4},
    {"loss", 2.8340799808502197, 1},
    {"optimizer", 0.9795200228691101, 1},
    {"convert", 5.799103977158666, 173},
    {"host_sync", 0.07977599930018187, 8},
};
constexpr double kRun9TotalMs = 54.59843196440488;  // op_profile.measured_op_ms
constexpr double kTolerance = 0.15;
constexpr double kMeasurableMs = 0.5;

std::vector<core::OpRecord> Run9Ops() {
  std::ifstream file("bench/testdata/run9_ops.json");
  EXPECT_TRUE(file.good()) << "bench/testdata/run9_ops.json";
  std::stringstream text;
  text << file.rdbuf();
  const nlohmann::json data = nlohmann::json::parse(text.str(), nullptr, false);
  EXPECT_FALSE(data.is_discarded());
  absl::StatusOr<std::vector<core::OpRecord>> records =
      integration::OpRecordsFromJson(data["records"]);
  EXPECT_TRUE(records.ok()) << records.status();
  return records.ok() ? *records : std::vector<core::OpRecord>{};
}

TEST(Run9RooflineTest, TheOpListIsTheOneRun9Timed) {
  const std::vector<core::OpCategoryTotal> totals = core::OpProfile::TotalsOf(Run9Ops());
  for (const Measured& m : kRun9) {
    const std::optional<core::OpCategory> c = core::OpCategoryFromName(m.category);
    ASSERT_TRUE(c.has_value()) << m.category;
    EXPECT_EQ(totals[static_cast<int>(*c)].ops, m.ops) << m.category;
  }
}

TEST(Run9RooflineTest, CalibratedRatesEstimateRun9WithinFifteenPercent) {
  const core::DeviceRates rates = core::H200Rates(core::RateSet::kCalibrated);
  const core::RooflineEstimate e = core::EstimateRoofline(Run9Ops(), rates);
  int checked = 0;
  for (const Measured& m : kRun9) {
    const double estimated =
        e.categories[static_cast<int>(*core::OpCategoryFromName(m.category))].ms;
    if (m.ms <= kMeasurableMs) continue;
    ++checked;
    EXPECT_LE(std::abs(estimated / m.ms - 1), kTolerance)
        << m.category << ": estimated " << estimated << " ms, run 9 measured " << m.ms << " ms";
  }
  EXPECT_EQ(checked, 9);
  EXPECT_LE(std::abs(e.total_ms / kRun9TotalMs - 1), kTolerance)
      << "estimated " << e.total_ms << " ms, run 9 measured " << kRun9TotalMs << " ms";
}

}  // namespace
