#include "integration/op_profile_report.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_format.h"

namespace integration {
namespace {

// null for a quantity that was not measured.
nlohmann::json OrNull(bool known, double value) {
  return known ? nlohmann::json(value) : nlohmann::json(nullptr);
}

}  // namespace

OpProfileReport ReportOpProfile(const std::vector<core::OpRecord>& records,
                                const core::DeviceRates& rates, double model_flops,
                                double tokens) {
  OpProfileReport out;
  const core::RooflineEstimate e = core::EstimateRoofline(records, rates);
  const std::vector<core::OpCategoryTotal> totals = core::OpProfile::TotalsOf(records);
  const double peak = rates.peak_bf16_tflops * 1e12;

  out.lines.push_back(absl::StrFormat("%-17s %6s %8s %10s %9s %11s %11s %9s %8s", "category",
                                      "ops", "launches", "GFLOP", "GB", "est_ms", "measured_ms",
                                      "TFLOP/s", "GB/s"));
  nlohmann::json categories = nlohmann::json::array();
  double measured_total = 0;
  bool any_measured = false;
  for (int i = 0; i < core::kNumOpCategories; ++i) {
    const core::OpCategoryTotal& t = totals[i];
    const core::RooflineCategory& c = e.categories[i];
    if (t.ops == 0) continue;
    const bool measured = t.timed_ops > 0 && t.device_ms > 0;
    measured_total += t.device_ms;
    any_measured = any_measured || t.timed_ops > 0;
    const double tflops = measured ? t.flops / (t.device_ms * 1e-3) * 1e-12 : 0;
    const double gbps = measured ? t.bytes / (t.device_ms * 1e-3) * 1e-9 : 0;
    out.lines.push_back(absl::StrFormat(
        "%-17s %6d %8d %10.1f %9.3f %11.3f %11s %9s %8s", core::OpCategoryName(t.category),
        t.ops, t.launches, t.flops * 1e-9, t.bytes * 1e-9, c.ms,
        measured ? absl::StrFormat("%.3f", t.device_ms) : "-",
        measured ? absl::StrFormat("%.1f", tflops) : "-",
        measured ? absl::StrFormat("%.0f", gbps) : "-"));
    categories.push_back({{"category", core::OpCategoryName(t.category)},
                          {"ops", t.ops},
                          {"launches", t.launches},
                          {"flops", t.flops},
                          {"bytes", t.bytes},
                          {"estimated_ms", c.ms},
                          {"estimated_compute_ms", c.compute_ms},
                          {"estimated_memory_ms", c.memory_ms},
                          {"estimated_launch_ms", c.launch_ms},
                          {"measured_ms", OrNull(measured, t.device_ms)},
                          {"achieved_tflops", OrNull(measured, tflops)},
                          {"achieved_gbps", OrNull(measured, gbps)}});
  }

  // Per op kind, largest estimate first; the measured device time where every op of the
  // kind was timed (CUDA).
  struct Kind {
    int64_t count = 0, timed = 0;
    double estimated_ms = 0, measured_ms = 0;
  };
  std::map<std::pair<std::string, std::string>, Kind> kinds;
  for (const core::OpRecord& r : records) {
    Kind& k = kinds[{core::OpCategoryName(r.category), r.name}];
    ++k.count;
    k.estimated_ms += core::EstimateOp(r, rates).ms;
    if (r.device_ms >= 0) {
      ++k.timed;
      k.measured_ms += r.device_ms;
    }
  }
  std::vector<std::pair<double, std::pair<std::string, std::string>>> order;
  for (const auto& [key, v] : kinds) order.push_back({v.estimated_ms, key});
  std::sort(order.rbegin(), order.rend());
  nlohmann::json ops = nlohmann::json::array();
  out.lines.push_back("");
  out.lines.push_back(absl::StrFormat("%-17s %-30s %6s %10s %11s", "category", "op", "count",
                                      "est_ms", "measured_ms"));
  for (const auto& [ms, key] : order) {
    const Kind& k = kinds[key];
    const bool measured = k.timed == k.count;
    out.lines.push_back(absl::StrFormat("%-17s %-30s %6d %10.3f %11s", key.first, key.second,
                                        k.count, ms,
                                        measured ? absl::StrFormat("%.3f", k.measured_ms) : "-"));
    ops.push_back({{"category", key.first},
                   {"op", key.second},
                   {"count", k.count},
                   {"estimated_ms", ms},
                   {"measured_ms", OrNull(measured, k.measured_ms)}});
  }

  // Per GEMM shape (category and problem), the most time first (measured where every GEMM
  // of the shape was timed, else estimated): which GEMMs fall short of the rate.
  struct Shape {
    int64_t count = 0, timed = 0;
    double flops = 0, estimated_ms = 0, measured_ms = 0;
  };
  using ShapeKey = std::tuple<std::string, int64_t, int64_t, int64_t, int64_t>;
  std::map<ShapeKey, Shape> shapes;
  for (const core::OpRecord& r : records) {
    if (r.gemm.m == 0) continue;
    Shape& g = shapes[{core::OpCategoryName(r.category), r.gemm.batch, r.gemm.m, r.gemm.n,
                       r.gemm.k}];
    ++g.count;
    g.flops += r.cost.flops;
    g.estimated_ms += core::EstimateOp(r, rates).ms;
    if (r.device_ms >= 0) {
      ++g.timed;
      g.measured_ms += r.device_ms;
    }
  }
  std::vector<std::pair<double, ShapeKey>> shape_order;
  for (const auto& [key, g] : shapes) {
    shape_order.push_back({g.timed == g.count ? g.measured_ms : g.estimated_ms, key});
  }
  std::sort(shape_order.rbegin(), shape_order.rend());
  nlohmann::json gemm_shapes = nlohmann::json::array();
  if (!shape_order.empty()) {
    out.lines.push_back("");
    out.lines.push_back(absl::StrFormat("%-17s %-26s %6s %10s %10s %11s %9s", "gemm",
                                        "batch x m x n x k", "count", "GFLOP", "est_ms",
                                        "measured_ms", "TFLOP/s"));
  }
  for (const auto& [ms, key] : shape_order) {
    const Shape& g = shapes[key];
    const auto& [category, batch, m, n, k] = key;
    const bool measured = g.timed == g.count && g.measured_ms > 0;
    const double tflops = measured ? g.flops / (g.measured_ms * 1e-3) * 1e-12 : 0;
    out.lines.push_back(absl::StrFormat(
        "%-17s %-26s %6d %10.1f %10.3f %11s %9s", category,
        absl::StrFormat("%d x %d x %d x %d", batch, m, n, k), g.count, g.flops * 1e-9,
        g.estimated_ms, measured ? absl::StrFormat("%.3f", g.measured_ms) : "-",
        measured ? absl::StrFormat("%.1f", tflops) : "-"));
    gemm_shapes.push_back({{"category", category},
                           {"batch", batch},
                           {"m", m},
                           {"n", n},
                           {"k", k},
                           {"count", g.count},
                           {"flops", g.flops},
                           {"estimated_ms", g.estimated_ms},
                           {"measured_ms", OrNull(measured, g.measured_ms)},
                           {"achieved_tflops", OrNull(measured, tflops)}});
  }

  const double est_s = e.total_ms * 1e-3;
  const double measured_s = measured_total * 1e-3;
  const bool have_measured = any_measured && measured_s > 0;
  out.lines.push_back(absl::StrFormat(
      "step: estimated %.2f ms (%.0f tokens/s, MFU %.1f%%) on %s; %d launches, %d host syncs%s",
      e.total_ms, tokens / est_s, 100 * model_flops / est_s / peak, rates.name, e.launches,
      e.host_syncs,
      have_measured
          ? absl::StrFormat("; measured %.2f ms of device time in its ops (MFU %.1f%%)",
                            measured_total, 100 * model_flops / measured_s / peak)
          : ""));
  out.json = {{"categories", categories},
              {"ops", ops},
              {"gemm_shapes", gemm_shapes},
              {"estimated_step_ms", e.total_ms},
              {"estimated_tokens_per_s", tokens / est_s},
              {"estimated_mfu", model_flops / est_s / peak},
              {"measured_op_ms", OrNull(have_measured, measured_total)},
              {"measured_op_mfu", OrNull(have_measured, model_flops / measured_s / peak)},
              {"launches", e.launches},
              {"host_syncs", e.host_syncs},
              {"model_flops", model_flops},
              {"tokens", tokens},
              {"rates",
               {{"device", rates.name},
                {"peak_bf16_tflops", rates.peak_bf16_tflops},
                {"bf16_gemm_tflops", rates.bf16_gemm_tflops},
                {"fp32_simt_tflops", rates.fp32_simt_tflops},
                {"memory_gbps", rates.memory_gbps},
                {"collective_gbps", rates.collective_gbps},
                {"launch_us", rates.launch_us},
                {"host_sync_us", rates.host_sync_us}}}};
  return out;
}

}  // namespace integration
