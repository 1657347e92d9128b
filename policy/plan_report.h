// Human-readable wrap plans: a table of units with per-rank memory, the totals beside
// the unsharded total and ZeRO-3's formula, tied and ignored parameters.
//
//   ASSIGN_OR_RETURN(policy::WrapPlan plan, policy::Plan(*model, *p, 8));
//   std::cout << policy::FormatPlanTable(plan);
//
// Memory follows NOTE [Plan memory accounting] in policy/plan.proto. MiB = 2^20 bytes.
#ifndef POLICY_PLAN_REPORT_H_
#define POLICY_PLAN_REPORT_H_

#include <cstdint>
#include <string>

#include "policy/plan.pb.h"

namespace policy {

// ZeRO-3 model-state memory per rank from the formula, for Psi = the plan's padded numel
// (what a rank really holds: each unit's buffer is padded to a multiple of N) and for
// Psi = its unpadded numel (the paper's figure). Bytes; the unpadded ones may be
// fractional.
struct ZeroThreeFormula {
  // 16 * Psi / N with Psi = totals.padded_numel (exact: padded_numel divides by N).
  int64_t fp32_padded_bytes = 0;
  // (2 + 2 + 12) * Psi / N with Psi = totals.padded_numel.
  int64_t mixed_padded_bytes = 0;
  // The same with Psi = totals.numel.
  double fp32_unpadded_bytes = 0;
  double mixed_unpadded_bytes = 0;
};

// The formula figures for `plan`'s totals and world size.
ZeroThreeFormula ZeroThreeFromTotals(const WrapPlan& plan);

// "1,234,567".
std::string WithThousands(int64_t value);

// Bytes as MiB with two decimals: "118.69".
std::string Mib(double bytes);

// The table: a header line (policy, world size, unit count), one row per unit (index,
// path, type, #params, numel, padded numel, per-rank MiB fp32 params / grads / AdamW /
// total, bf16-mixed total, reason), then totals: plan figures beside the ZeRO-3 formula
// (padded and unpadded Psi) and the unsharded total, the transient gathered copy of the
// largest unit, and one line per tied and per ignored parameter.
std::string FormatPlanTable(const WrapPlan& plan);

}  // namespace policy

#endif  // POLICY_PLAN_REPORT_H_
