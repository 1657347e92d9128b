#include "policy/plan_report.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace policy {
namespace {

constexpr double kMib = 1024.0 * 1024.0;

// Left-aligned text columns, right-aligned numbers, two spaces between columns.
class Table {
 public:
  explicit Table(std::vector<bool> right_aligned) : right_(std::move(right_aligned)) {}

  void Row(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }

  std::string Render(const std::string& indent) const {
    std::vector<size_t> width(right_.size(), 0);
    for (const auto& row : rows_) {
      for (size_t c = 0; c < row.size() && c < width.size(); ++c) {
        width[c] = std::max(width[c], row[c].size());
      }
    }
    std::string out;
    for (const auto& row : rows_) {
      std::string line = indent;
      for (size_t c = 0; c < row.size() && c < width.size(); ++c) {
        const std::string pad(width[c] - row[c].size(), ' ');
        const bool last = c + 1 == row.size();
        if (right_[c]) {
          absl::StrAppend(&line, pad, row[c]);
        } else {
          absl::StrAppend(&line, row[c], last ? "" : pad);
        }
        if (!last) line += "  ";
      }
      out += line + "\n";
    }
    return out;
  }

 private:
  std::vector<bool> right_;
  std::vector<std::vector<std::string>> rows_;
};

std::string Label(const std::string& path) { return path.empty() ? "<root>" : path; }

}  // namespace

ZeroThreeFormula ZeroThreeFromTotals(const WrapPlan& plan) {
  ZeroThreeFormula f;
  const int64_t n = std::max(plan.world_size(), 1);
  const int64_t psi_padded = plan.totals().padded_numel();
  const double psi = static_cast<double>(plan.totals().numel());
  f.fp32_padded_bytes = 16 * psi_padded / n;
  f.mixed_padded_bytes = (2 + 2 + 12) * psi_padded / n;
  f.fp32_unpadded_bytes = 16.0 * psi / static_cast<double>(n);
  f.mixed_unpadded_bytes = (2.0 + 2.0 + 12.0) * psi / static_cast<double>(n);
  return f;
}

std::string WithThousands(int64_t value) {
  const bool negative = value < 0;
  std::string digits =
      absl::StrCat(negative ? -static_cast<uint64_t>(value) : static_cast<uint64_t>(value));
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return negative ? "-" + out : out;
}

std::string Mib(double bytes) { return absl::StrFormat("%.2f", bytes / kMib); }

namespace {

// Thousands separators and one decimal, the decimal dropped when it is 0:
// "248,879,616" or "1,234.5".
std::string Bytes(double bytes) {
  const std::string text = absl::StrFormat("%.1f", bytes);
  const size_t dot = text.find('.');
  int64_t whole = 0;
  if (!absl::SimpleAtoi(text.substr(0, dot), &whole)) return text;
  const std::string fraction = text.substr(dot);
  return WithThousands(whole) + (fraction == ".0" ? "" : fraction);
}

}  // namespace

std::string FormatPlanTable(const WrapPlan& plan) {
  const PlanTotals& totals = plan.totals();
  std::string out = absl::StrCat("Wrap plan: ", plan.units_size(), " units, world size ",
                                 plan.world_size(), ", policy ", plan.policy(), "\n");
  absl::StrAppend(&out, "Per-rank model-state memory in MiB (2^20 bytes): fp32 = 4 B params ",
                  "+ 4 B grads + 8 B AdamW per shard element; bf16 mixed = 2 + 2 + 12 ",
                  "(fp32 master, m, v).\n\n");

  Table units({true, false, false, true, true, true, true, true, true, true, true, false});
  units.Row({"#", "unit", "type", "#params", "numel", "padded", "params", "grads", "AdamW", "total",
             "bf16 mix", "reason"});
  for (int i = 0; i < plan.units_size(); ++i) {
    const WrapUnit& u = plan.units(i);
    units.Row({absl::StrCat(i), Label(u.path()), u.type_name(), absl::StrCat(u.param_names_size()),
               WithThousands(u.numel()), WithThousands(u.padded_numel()),
               Mib(u.fp32().params_bytes()), Mib(u.fp32().grads_bytes()),
               Mib(u.fp32().optim_bytes()), Mib(u.fp32().total_bytes()),
               Mib(u.bf16_mixed().total_bytes()), u.reason()});
  }
  out += units.Render("");

  const ZeroThreeFormula f = ZeroThreeFromTotals(plan);
  absl::StrAppend(&out, "\nTotals per rank (N = ", plan.world_size(), "):\n");
  Table sums({false, true, true, true, true, true});
  sums.Row({"", "Psi", "fp32 MiB", "fp32 bytes", "bf16 mix MiB", "bf16 mix bytes"});
  sums.Row({"plan (sum over units)", WithThousands(totals.padded_numel()),
            Mib(totals.per_rank_fp32_bytes()), WithThousands(totals.per_rank_fp32_bytes()),
            Mib(totals.per_rank_bf16_mixed_bytes()),
            WithThousands(totals.per_rank_bf16_mixed_bytes())});
  sums.Row({"ZeRO-3 formula, Psi = padded numel", WithThousands(totals.padded_numel()),
            Mib(f.fp32_padded_bytes), WithThousands(f.fp32_padded_bytes), Mib(f.mixed_padded_bytes),
            WithThousands(f.mixed_padded_bytes)});
  sums.Row({"ZeRO-3 formula, Psi = numel (no padding)", WithThousands(totals.numel()),
            Mib(f.fp32_unpadded_bytes), Bytes(f.fp32_unpadded_bytes), Mib(f.mixed_unpadded_bytes),
            Bytes(f.mixed_unpadded_bytes)});
  sums.Row({"unsharded (one rank holds all, 16 Psi)", WithThousands(totals.numel()),
            Mib(totals.unsharded_fp32_bytes()), WithThousands(totals.unsharded_fp32_bytes()),
            Mib(totals.unsharded_bf16_mixed_bytes()),
            WithThousands(totals.unsharded_bf16_mixed_bytes())});
  out += sums.Render("  ");
  absl::StrAppend(&out, "  formulas: fp32 16 * Psi / N; bf16 mixed (2 + 2 + 12) * Psi / N\n");
  absl::StrAppend(&out, "Transient, while one unit computes: its gathered parameters, largest ",
                  Mib(totals.max_gathered_fp32_bytes()), " MiB fp32 / ",
                  Mib(totals.max_gathered_bf16_bytes()), " MiB bf16\n");
  if (totals.ignored_numel() > 0) {
    absl::StrAppend(&out, "Ignored (unmanaged): ", WithThousands(totals.ignored_numel()),
                    " elements\n");
  }
  for (const TiedParameter& tied : plan.tied()) absl::StrAppend(&out, "Tied: ", tied.note(), "\n");
  for (const IgnoredParameter& ignored : plan.ignored()) {
    absl::StrAppend(&out, "Ignored: ", ignored.name(), " (", WithThousands(ignored.numel()),
                    " elements) of ", Label(ignored.ignored_module()), "\n");
  }
  if (!plan.checkpoint_policy().empty()) {
    std::vector<std::string> paths;
    for (const CheckpointedModule& m : plan.checkpointed()) paths.push_back(Label(m.path()));
    absl::StrAppend(&out, "Activation checkpointing (", plan.checkpoint_policy(),
                    "): ", paths.empty() ? "no module" : absl::StrJoin(paths, ", "),
                    " (activations recomputed in the backward)\n");
  }
  return out;
}

}  // namespace policy
