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
#ifndef INTEGRATION_OP_PROFILE_REPORT_H_
#define INTEGRATION_OP_PROFILE_REPORT_H_

#include <string>
#include <vector>

#include "core/op_profile.h"
#include "core/roofline.h"
#include "nlohmann/json.hpp"

namespace integration {

struct OpProfileReport {
  std::vector<std::string> lines;  // the tables, for a terminal
  nlohmann::json json;
};

// `model_flops` and `tokens` are the step's (MFU: model_flops / time / peak). The measured
// columns are null where no op has a device time (the CPU).
OpProfileReport ReportOpProfile(const std::vector<core::OpRecord>& records,
                                const core::DeviceRates& rates, double model_flops,
                                double tokens);

}  // namespace integration

#endif  // INTEGRATION_OP_PROFILE_REPORT_H_
