// The table and JSON of a recorded training step (core/op_profile.h): per op category its
// ops, launches, FLOPs and bytes, the measured device time with the TFLOP/s and GB/s it
// achieved (CUDA), beside the roofline estimate on a reference GPU (core/roofline.h); per
// op kind (category and op) the estimate, largest first; per GEMM shape (category and
// batch x m x n x k) its count, estimate, measured time and TFLOP/s, the most time first;
// and for the step, the estimated and measured milliseconds, tokens/s and MFU.
//
//   const integration::OpProfileReport report = integration::ReportOpProfile(
//       fit.profiled_ops, core::H200Rates(), model_flops_per_token * tokens, tokens);
//   for (const std::string& line : report.lines) std::printf("%s\n", line.c_str());
//   summary["op_profile"] = report.json;
//
// ReportOpProfile is SummarizeOpProfile (the aggregation, once), then OpProfileTable and
// OpProfileJson of its summary; a caller that wants one of the two may call them itself.
#ifndef INTEGRATION_OP_PROFILE_REPORT_H_
#define INTEGRATION_OP_PROFILE_REPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/op_profile.h"
#include "core/roofline.h"
#include "nlohmann/json.hpp"

namespace integration {

struct OpProfileReport {
  std::vector<std::string> lines;  // the tables, for a terminal
  nlohmann::json json;
};

// The rates to report a step on the device `device_name` names (core::CudaDeviceName, or
// "cpu") against: its calibrated set (core::RatesForDevice, NOTE [Rate sets] in
// core/roofline.h), or, for a device without rates there, the H200's, with `note` set to a
// line that says so (empty otherwise).
core::DeviceRates ReportRates(absl::string_view device_name, std::string* note);

// `model_flops` and `tokens` are the step's (MFU: model_flops / time / peak). The measured
// columns are null where no op has a device time (the CPU).
OpProfileReport ReportOpProfile(const std::vector<core::OpRecord>& records,
                                const core::DeviceRates& rates, double model_flops, double tokens);

// What the table and the JSON both show, aggregated once from a step's records.
struct OpProfileSummary {
  // An op category with ops, and the achieved rates where it was measured (some op timed,
  // device time > 0).
  struct Category {
    core::OpCategoryTotal total;
    core::RooflineCategory estimate;
    bool measured = false;
    double tflops = 0, gbps = 0;  // 0 where not measured
  };
  // An op kind (category and op); measured where every op of the kind was timed (CUDA).
  struct Kind {
    std::string category, op;
    int64_t count = 0, timed = 0;
    double estimated_ms = 0, measured_ms = 0;
    bool measured = false;
  };
  // A GEMM shape (category and batch x m x n x k); measured where every GEMM of the shape
  // was timed and took time.
  struct GemmShape {
    std::string category;
    int64_t batch = 0, m = 0, n = 0, k = 0;
    int64_t count = 0, timed = 0;
    double flops = 0, estimated_ms = 0, measured_ms = 0;
    bool measured = false;
    double tflops = 0;  // achieved; 0 where not measured
  };

  std::vector<Category> categories;        // OpCategory order
  std::vector<Kind> kinds;                 // largest estimate first
  std::vector<GemmShape> gemm_shapes;      // the most time first (measured, else estimated)
  core::RooflineEstimate estimate;         // the step's, on `rates`
  double measured_total_ms = 0;            // the categories' device time
  bool have_measured = false;              // some op timed and measured_total_ms > 0
  double estimated_s = 0, measured_s = 0;  // the step's estimate and device time, seconds
  double peak_flops = 0;                   // rates.peak_bf16_tflops in FLOP/s: MFU's peak
  core::DeviceRates rates;
  double model_flops = 0, tokens = 0;
};
OpProfileSummary SummarizeOpProfile(const std::vector<core::OpRecord>& records,
                                    const core::DeviceRates& rates, double model_flops,
                                    double tokens);

// The tables of OpProfileReport::lines: per category, per op kind, per GEMM shape (when
// there is one), then the step's line.
std::vector<std::string> OpProfileTable(const OpProfileSummary& summary);

// OpProfileReport::json: "categories", "ops", "gemm_shapes", the step's figures and "rates".
nlohmann::json OpProfileJson(const OpProfileSummary& summary);

// The step's estimate on several rate sets side by side (the datasheet, attained and
// calibrated sets of one device, say): a table with a column per set, each category's
// milliseconds, then the step's milliseconds, tokens/s and MFU, each set's name under the
// table; and JSON: "sets" (per set its label, rates name, estimated_step_ms,
// estimated_tokens_per_s, estimated_mfu and "categories" {name: ms}).
struct RateSetColumn {
  std::string label;  // the column's header: "datasheet"
  core::DeviceRates rates;
};
OpProfileReport CompareRateSets(const std::vector<core::OpRecord>& records,
                                const std::vector<RateSetColumn>& sets, double model_flops,
                                double tokens);

// An op list as JSON, one object a record: category, name, engine (their names in
// core/op_profile.h), flops, bytes, exps, launches and gemm [batch, m, n, k]; and back
// (InvalidArgument naming the record and the field that is missing or unknown).
nlohmann::json OpRecordsJson(const std::vector<core::OpRecord>& records);
absl::StatusOr<std::vector<core::OpRecord>> OpRecordsFromJson(const nlohmann::json& json);

}  // namespace integration

#endif  // INTEGRATION_OP_PROFILE_REPORT_H_
