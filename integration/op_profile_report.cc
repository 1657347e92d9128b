#include "integration/op_profile_report.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace integration {
namespace {

// null for a quantity that was not measured.
nlohmann::json OrNull(bool known, double value) {
  return known ? nlohmann::json(value) : nlohmann::json(nullptr);
}

// Per op kind, largest estimate first; the measured device time where every op of the kind
// was timed (CUDA).
std::vector<OpProfileSummary::Kind> KindsOf(const std::vector<core::OpRecord>& records,
                                            const core::DeviceRates& rates) {
  using Kind = OpProfileSummary::Kind;
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
  std::vector<Kind> out;
  for (const auto& [ms, key] : order) {
    Kind k = kinds[key];
    k.category = key.first;
    k.op = key.second;
    k.measured = k.timed == k.count;
    out.push_back(std::move(k));
  }
  return out;
}

// Per GEMM shape (category and problem), the most time first (measured where every GEMM of
// the shape was timed, else estimated): which GEMMs fall short of the rate.
std::vector<OpProfileSummary::GemmShape> GemmShapesOf(const std::vector<core::OpRecord>& records,
                                                      const core::DeviceRates& rates) {
  using Shape = OpProfileSummary::GemmShape;
  using ShapeKey = std::tuple<std::string, int64_t, int64_t, int64_t, int64_t>;
  std::map<ShapeKey, Shape> shapes;
  for (const core::OpRecord& r : records) {
    if (r.gemm.m == 0) continue;
    Shape& g =
        shapes[{core::OpCategoryName(r.category), r.gemm.batch, r.gemm.m, r.gemm.n, r.gemm.k}];
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
  std::vector<Shape> out;
  for (const auto& [ms, key] : shape_order) {
    Shape g = shapes[key];
    std::tie(g.category, g.batch, g.m, g.n, g.k) = key;
    g.measured = g.timed == g.count && g.measured_ms > 0;
    g.tflops = g.measured ? g.flops / (g.measured_ms * 1e-3) * 1e-12 : 0;
    out.push_back(std::move(g));
  }
  return out;
}

nlohmann::json RatesJson(const core::DeviceRates& rates) {
  return {{"device", rates.name},
          {"peak_bf16_tflops", rates.peak_bf16_tflops},
          {"bf16_gemm_tflops", rates.bf16_gemm_tflops},
          {"gemm_output_gbps", rates.gemm_output_gbps},
          {"sm_count", rates.sm_count},
          {"mma_tflops", rates.mma_tflops},
          {"exp_tops", rates.exp_tops},
          {"fp32_simt_tflops", rates.fp32_simt_tflops},
          {"memory_gbps", rates.memory_gbps},
          {"row_memory_gbps", rates.row_memory_gbps},
          {"collective_gbps", rates.collective_gbps},
          {"min_kernel_us", rates.min_kernel_us},
          {"launch_us", rates.launch_us},
          {"host_sync_us", rates.host_sync_us}};
}

}  // namespace

core::DeviceRates ReportRates(absl::string_view device_name, std::string* note) {
  note->clear();
  std::optional<core::DeviceRates> rates = core::RatesForDevice(device_name);
  if (rates.has_value()) return *rates;
  const core::DeviceRates h200 = core::H200Rates(core::RateSet::kCalibrated);
  *note = absl::StrCat("no rates for device \"", device_name,
                       "\" in core/roofline.h: estimated on ", h200.name);
  return h200;
}

OpProfileSummary SummarizeOpProfile(const std::vector<core::OpRecord>& records,
                                    const core::DeviceRates& rates, double model_flops,
                                    double tokens) {
  OpProfileSummary s;
  s.estimate = core::EstimateRoofline(records, rates);
  const std::vector<core::OpCategoryTotal> totals = core::OpProfile::TotalsOf(records);
  bool any_measured = false;
  for (int i = 0; i < core::kNumOpCategories; ++i) {
    const core::OpCategoryTotal& t = totals[i];
    if (t.ops == 0) continue;
    OpProfileSummary::Category c;
    c.total = t;
    c.estimate = s.estimate.categories[i];
    c.measured = t.timed_ops > 0 && t.device_ms > 0;
    s.measured_total_ms += t.device_ms;
    any_measured = any_measured || t.timed_ops > 0;
    c.tflops = c.measured ? t.flops / (t.device_ms * 1e-3) * 1e-12 : 0;
    c.gbps = c.measured ? t.bytes / (t.device_ms * 1e-3) * 1e-9 : 0;
    s.categories.push_back(c);
  }
  s.kinds = KindsOf(records, rates);
  s.gemm_shapes = GemmShapesOf(records, rates);
  s.estimated_s = s.estimate.total_ms * 1e-3;
  s.measured_s = s.measured_total_ms * 1e-3;
  s.have_measured = any_measured && s.measured_s > 0;
  s.peak_flops = rates.peak_bf16_tflops * 1e12;
  s.rates = rates;
  s.model_flops = model_flops;
  s.tokens = tokens;
  return s;
}

std::vector<std::string> OpProfileTable(const OpProfileSummary& s) {
  std::vector<std::string> lines;
  lines.push_back(absl::StrFormat("%-17s %6s %8s %10s %9s %11s %11s %9s %8s", "category", "ops",
                                  "launches", "GFLOP", "GB", "est_ms", "measured_ms", "TFLOP/s",
                                  "GB/s"));
  for (const OpProfileSummary::Category& c : s.categories) {
    const core::OpCategoryTotal& t = c.total;
    lines.push_back(absl::StrFormat("%-17s %6d %8d %10.1f %9.3f %11.3f %11s %9s %8s",
                                    core::OpCategoryName(t.category), t.ops, t.launches,
                                    t.flops * 1e-9, t.bytes * 1e-9, c.estimate.ms,
                                    c.measured ? absl::StrFormat("%.3f", t.device_ms) : "-",
                                    c.measured ? absl::StrFormat("%.1f", c.tflops) : "-",
                                    c.measured ? absl::StrFormat("%.0f", c.gbps) : "-"));
  }

  lines.push_back("");
  lines.push_back(absl::StrFormat("%-17s %-30s %6s %10s %11s", "category", "op", "count", "est_ms",
                                  "measured_ms"));
  for (const OpProfileSummary::Kind& k : s.kinds) {
    lines.push_back(absl::StrFormat("%-17s %-30s %6d %10.3f %11s", k.category, k.op, k.count,
                                    k.estimated_ms,
                                    k.measured ? absl::StrFormat("%.3f", k.measured_ms) : "-"));
  }

  if (!s.gemm_shapes.empty()) {
    lines.push_back("");
    lines.push_back(absl::StrFormat("%-17s %-26s %6s %10s %10s %11s %9s", "gemm",
                                    "batch x m x n x k", "count", "GFLOP", "est_ms", "measured_ms",
                                    "TFLOP/s"));
  }
  for (const OpProfileSummary::GemmShape& g : s.gemm_shapes) {
    lines.push_back(absl::StrFormat("%-17s %-26s %6d %10.1f %10.3f %11s %9s", g.category,
                                    absl::StrFormat("%d x %d x %d x %d", g.batch, g.m, g.n, g.k),
                                    g.count, g.flops * 1e-9, g.estimated_ms,
                                    g.measured ? absl::StrFormat("%.3f", g.measured_ms) : "-",
                                    g.measured ? absl::StrFormat("%.1f", g.tflops) : "-"));
  }

  const core::RooflineEstimate& e = s.estimate;
  lines.push_back(absl::StrFormat(
      "step: estimated %.2f ms (%.0f tokens/s, MFU %.1f%%) on %s; %d launches, %d host syncs%s",
      e.total_ms, s.tokens / s.estimated_s, 100 * s.model_flops / s.estimated_s / s.peak_flops,
      s.rates.name, e.launches, e.host_syncs,
      s.have_measured
          ? absl::StrFormat("; measured %.2f ms of device time in its ops (MFU %.1f%%)",
                            s.measured_total_ms, 100 * s.model_flops / s.measured_s / s.peak_flops)
          : ""));
  return lines;
}

nlohmann::json OpProfileJson(const OpProfileSummary& s) {
  nlohmann::json categories = nlohmann::json::array();
  for (const OpProfileSummary::Category& c : s.categories) {
    const core::OpCategoryTotal& t = c.total;
    categories.push_back({{"category", core::OpCategoryName(t.category)},
                          {"ops", t.ops},
                          {"launches", t.launches},
                          {"flops", t.flops},
                          {"bytes", t.bytes},
                          {"estimated_ms", c.estimate.ms},
                          {"estimated_compute_ms", c.estimate.compute_ms},
                          {"estimated_memory_ms", c.estimate.memory_ms},
                          {"estimated_launch_ms", c.estimate.launch_ms},
                          {"measured_ms", OrNull(c.measured, t.device_ms)},
                          {"achieved_tflops", OrNull(c.measured, c.tflops)},
                          {"achieved_gbps", OrNull(c.measured, c.gbps)}});
  }
  nlohmann::json ops = nlohmann::json::array();
  for (const OpProfileSummary::Kind& k : s.kinds) {
    ops.push_back({{"category", k.category},
                   {"op", k.op},
                   {"count", k.count},
                   {"estimated_ms", k.estimated_ms},
                   {"measured_ms", OrNull(k.measured, k.measured_ms)}});
  }
  nlohmann::json gemm_shapes = nlohmann::json::array();
  for (const OpProfileSummary::GemmShape& g : s.gemm_shapes) {
    gemm_shapes.push_back({{"category", g.category},
                           {"batch", g.batch},
                           {"m", g.m},
                           {"n", g.n},
                           {"k", g.k},
                           {"count", g.count},
                           {"flops", g.flops},
                           {"estimated_ms", g.estimated_ms},
                           {"measured_ms", OrNull(g.measured, g.measured_ms)},
                           {"achieved_tflops", OrNull(g.measured, g.tflops)}});
  }
  const core::RooflineEstimate& e = s.estimate;
  const core::DeviceRates& rates = s.rates;
  return {{"categories", categories},
          {"ops", ops},
          {"gemm_shapes", gemm_shapes},
          {"estimated_step_ms", e.total_ms},
          {"estimated_tokens_per_s", s.tokens / s.estimated_s},
          {"estimated_mfu", s.model_flops / s.estimated_s / s.peak_flops},
          {"measured_op_ms", OrNull(s.have_measured, s.measured_total_ms)},
          {"measured_op_mfu", OrNull(s.have_measured, s.model_flops / s.measured_s / s.peak_flops)},
          {"launches", e.launches},
          {"host_syncs", e.host_syncs},
          {"model_flops", s.model_flops},
          {"tokens", s.tokens},
          {"rates", RatesJson(rates)}};
}

OpProfileReport ReportOpProfile(const std::vector<core::OpRecord>& records,
                                const core::DeviceRates& rates, double model_flops, double tokens) {
  const OpProfileSummary summary = SummarizeOpProfile(records, rates, model_flops, tokens);
  OpProfileReport out;
  out.lines = OpProfileTable(summary);
  out.json = OpProfileJson(summary);
  return out;
}

OpProfileReport CompareRateSets(const std::vector<core::OpRecord>& records,
                                const std::vector<RateSetColumn>& sets, double model_flops,
                                double tokens) {
  OpProfileReport out;
  std::vector<core::RooflineEstimate> estimates;
  for (const RateSetColumn& set : sets) {
    estimates.push_back(core::EstimateRoofline(records, set.rates));
  }
  const std::vector<core::OpCategoryTotal> totals = core::OpProfile::TotalsOf(records);
  std::string header = absl::StrFormat("%-17s %6s", "category", "ops");
  for (const RateSetColumn& set : sets)
    absl::StrAppend(&header, absl::StrFormat(" %12s", set.label));
  out.lines.push_back(header + "   (estimated ms)");
  nlohmann::json columns = nlohmann::json::array();
  for (size_t s = 0; s < sets.size(); ++s) {
    columns.push_back({{"label", sets[s].label},
                       {"rates", sets[s].rates.name},
                       {"categories", nlohmann::json::object()}});
  }
  for (int i = 0; i < core::kNumOpCategories; ++i) {
    if (totals[i].ops == 0) continue;
    const char* name = core::OpCategoryName(static_cast<core::OpCategory>(i));
    std::string line = absl::StrFormat("%-17s %6d", name, totals[i].ops);
    for (size_t s = 0; s < sets.size(); ++s) {
      const double ms = estimates[s].categories[i].ms;
      absl::StrAppend(&line, absl::StrFormat(" %12.3f", ms));
      columns[s]["categories"][name] = ms;
    }
    out.lines.push_back(line);
  }
  std::string total = absl::StrFormat("%-17s %6s", "step ms", "");
  std::string rate = absl::StrFormat("%-17s %6s", "tokens/s", "");
  std::string mfu = absl::StrFormat("%-17s %6s", "MFU", "");
  for (size_t s = 0; s < sets.size(); ++s) {
    const double seconds = estimates[s].total_ms * 1e-3;
    const double step_mfu = model_flops / seconds / (sets[s].rates.peak_bf16_tflops * 1e12);
    absl::StrAppend(&total, absl::StrFormat(" %12.2f", estimates[s].total_ms));
    absl::StrAppend(&rate, absl::StrFormat(" %12.0f", tokens / seconds));
    absl::StrAppend(&mfu, absl::StrFormat(" %11.1f%%", 100 * step_mfu));
    columns[s]["estimated_step_ms"] = estimates[s].total_ms;
    columns[s]["estimated_tokens_per_s"] = tokens / seconds;
    columns[s]["estimated_mfu"] = step_mfu;
    columns[s]["rates_used"] = RatesJson(sets[s].rates);
  }
  out.lines.push_back(total);
  out.lines.push_back(rate);
  out.lines.push_back(mfu);
  for (const RateSetColumn& set : sets) {
    out.lines.push_back(absl::StrFormat("  %s: %s", set.label, set.rates.name));
  }
  out.json = {{"sets", columns}};
  return out;
}

nlohmann::json OpRecordsJson(const std::vector<core::OpRecord>& records) {
  nlohmann::json out = nlohmann::json::array();
  for (const core::OpRecord& r : records) {
    out.push_back({{"category", core::OpCategoryName(r.category)},
                   {"name", r.name},
                   {"engine", core::OpEngineName(r.cost.engine)},
                   {"flops", r.cost.flops},
                   {"bytes", r.cost.bytes},
                   {"exps", r.cost.exps},
                   {"launches", r.cost.launches},
                   {"gemm", {r.gemm.batch, r.gemm.m, r.gemm.n, r.gemm.k}}});
  }
  return out;
}

absl::StatusOr<std::vector<core::OpRecord>> OpRecordsFromJson(const nlohmann::json& json) {
  if (!json.is_array()) {
    return absl::InvalidArgumentError("OpRecordsFromJson: an op list is a JSON array");
  }
  std::vector<core::OpRecord> out;
  for (size_t i = 0; i < json.size(); ++i) {
    const nlohmann::json& j = json[i];
    const auto bad = [i](absl::string_view field) {
      return absl::InvalidArgumentError(
          absl::StrCat("OpRecordsFromJson: record ", i, " has no valid \"", field, "\""));
    };
    for (const char* field : {"category", "name", "engine"}) {
      if (!j.contains(field) || !j[field].is_string()) return bad(field);
    }
    for (const char* field : {"flops", "bytes", "launches"}) {
      if (!j.contains(field) || !j[field].is_number()) return bad(field);
    }
    core::OpRecord r;
    const std::optional<core::OpCategory> category =
        core::OpCategoryFromName(j["category"].get<std::string>());
    const std::optional<core::OpEngine> engine =
        core::OpEngineFromName(j["engine"].get<std::string>());
    if (!category.has_value()) return bad("category");
    if (!engine.has_value()) return bad("engine");
    r.category = *category;
    r.name = j["name"].get<std::string>();
    r.cost.engine = *engine;
    r.cost.flops = j["flops"].get<double>();
    r.cost.bytes = j["bytes"].get<double>();
    r.cost.launches = j["launches"].get<int>();
    if (j.contains("exps")) {  // older lists have none
      if (!j["exps"].is_number()) return bad("exps");
      r.cost.exps = j["exps"].get<double>();
    }
    if (j.contains("gemm")) {
      const nlohmann::json& g = j["gemm"];
      if (!g.is_array() || g.size() != 4) return bad("gemm");
      for (const nlohmann::json& d : g) {
        if (!d.is_number_integer()) return bad("gemm");
      }
      r.gemm = {g[0].get<int64_t>(), g[1].get<int64_t>(), g[2].get<int64_t>(), g[3].get<int64_t>()};
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace integration
