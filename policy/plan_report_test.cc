// The plan's per-rank totals against ZeRO-3's formula on a 12-layer Gpt, and the table
// that prints them.
#include "policy/plan_report.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "nn/gpt.h"
#include "policy/plan.h"
#include "policy/wrap_policy.h"

namespace policy {
namespace {

// A 12-layer Gpt small enough to build in well under a second (1.5M parameters), with
// sizes chosen so that padding is not zero at world size 8: a block has
// 12 C^2 + 13 C = 121300 elements (121300 % 8 = 4) and the root keeps
// V C + T C + 2 C = 56700 (56700 % 8 = 4).
constexpr int64_t kV = 501, kT = 64, kC = 100, kLayers = 12;
constexpr int kWorld = 8;

int64_t RoundUp(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

class ZeroThreeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    nn::GptConfig config;
    config.vocab_size = kV;
    config.block_size = kT;
    config.n_embd = kC;
    config.n_layer = kLayers;
    config.n_head = 4;
    gpt_ = nn::Gpt::Create(config).value();
    absl::StatusOr<WrapPlan> plan = Plan(*gpt_, *ModuleTypes({"TransformerBlock"}), kWorld);
    ASSERT_TRUE(plan.ok()) << plan.status();
    plan_ = *plan;
  }
  std::shared_ptr<nn::Gpt> gpt_;
  WrapPlan plan_;
};

TEST_F(ZeroThreeTest, PerRankTotalsEqualTheFormulaWithPaddedPsi) {
  const int64_t block = 12 * kC * kC + 13 * kC;
  const int64_t root = kV * kC + kT * kC + 2 * kC;
  const int64_t psi = kLayers * block + root;
  ASSERT_EQ(gpt_->NumParameterElements(), psi);
  ASSERT_NE(block % kWorld, 0);  // the padding is really exercised
  ASSERT_NE(root % kWorld, 0);
  const int64_t psi_padded = kLayers * RoundUp(block, kWorld) + RoundUp(root, kWorld);

  ASSERT_EQ(plan_.units_size(), kLayers + 1);
  const PlanTotals& t = plan_.totals();
  EXPECT_EQ(t.numel(), psi);
  EXPECT_EQ(t.padded_numel(), psi_padded);
  // Exact integer equality: psi_padded divides by N by construction.
  EXPECT_EQ(t.per_rank_fp32_bytes(), 16 * psi_padded / kWorld);
  EXPECT_EQ(t.per_rank_bf16_mixed_bytes(), (2 + 2 + 12) * psi_padded / kWorld);
  EXPECT_EQ(t.unsharded_fp32_bytes(), 16 * psi);
  EXPECT_EQ(t.unsharded_bf16_mixed_bytes(), 16 * psi);
  // Against the paper's unpadded figure the plan is larger by exactly the padding:
  // 16 bytes per padding element, spread over N ranks.
  EXPECT_EQ(t.per_rank_fp32_bytes() * kWorld - 16 * psi, 16 * (psi_padded - psi));

  int64_t sum = 0, sum_mixed = 0;
  for (const WrapUnit& u : plan_.units()) {
    sum += u.fp32().params_bytes() + u.fp32().grads_bytes() + u.fp32().optim_bytes();
    sum_mixed +=
        u.bf16_mixed().params_bytes() + u.bf16_mixed().grads_bytes() + u.bf16_mixed().optim_bytes();
  }
  EXPECT_EQ(sum, t.per_rank_fp32_bytes());
  EXPECT_EQ(sum_mixed, t.per_rank_bf16_mixed_bytes());

  const ZeroThreeFormula f = ZeroThreeFromTotals(plan_);
  EXPECT_EQ(f.fp32_padded_bytes, 16 * psi_padded / kWorld);
  EXPECT_EQ(f.mixed_padded_bytes, 16 * psi_padded / kWorld);
  EXPECT_DOUBLE_EQ(f.fp32_unpadded_bytes, 16.0 * psi / kWorld);  // exact in double: < 2^53
  const int64_t largest = std::max(RoundUp(block, kWorld), RoundUp(root, kWorld));
  EXPECT_EQ(t.max_gathered_fp32_bytes(), 4 * largest);
  EXPECT_EQ(t.max_gathered_bf16_bytes(), 2 * largest);
}

// The numeric cells of the totals row that starts with `label`.
std::vector<std::string> RowCells(const std::string& table, const std::string& label) {
  for (absl::string_view line : absl::StrSplit(table, '\n')) {
    absl::string_view rest = line;
    while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
    if (!absl::ConsumePrefix(&rest, label)) continue;
    return absl::StrSplit(rest, ' ', absl::SkipEmpty());
  }
  ADD_FAILURE() << "no row " << label << " in\n" << table;
  return {};
}

TEST_F(ZeroThreeTest, TablePrintsPlanAndFormulaSideBySide) {
  const std::string table = FormatPlanTable(plan_);
  const std::vector<std::string> plan_row = RowCells(table, "plan (sum over units)");
  const std::vector<std::string> formula_row =
      RowCells(table, "ZeRO-3 formula, Psi = padded numel");
  ASSERT_EQ(plan_row.size(), 5u) << table;
  EXPECT_EQ(plan_row, formula_row) << table;
  EXPECT_EQ(plan_row[0], WithThousands(plan_.totals().padded_numel()));
  EXPECT_EQ(plan_row[2], WithThousands(plan_.totals().per_rank_fp32_bytes()));
  const std::vector<std::string> unpadded =
      RowCells(table, "ZeRO-3 formula, Psi = numel (no padding)");
  ASSERT_EQ(unpadded.size(), 5u) << table;
  EXPECT_EQ(unpadded[0], WithThousands(plan_.totals().numel()));
  EXPECT_NE(unpadded[2], plan_row[2]);  // the padding shows
  const std::vector<std::string> unsharded =
      RowCells(table, "unsharded (one rank holds all, 16 Psi)");
  ASSERT_EQ(unsharded.size(), 5u) << table;
  EXPECT_EQ(unsharded[2], WithThousands(16 * plan_.totals().numel()));

  // One row per unit, in plan order, and the tied embedding.
  for (int i = 0; i < plan_.units_size(); ++i) {
    const std::string path = plan_.units(i).path().empty() ? "<root>" : plan_.units(i).path();
    EXPECT_NE(table.find(absl::StrCat(i, "  ", path)), std::string::npos) << path << "\n" << table;
  }
  EXPECT_NE(table.find("Tied: tied parameter wte.weight (also lm_head.weight) placed in unit "
                       "<root> (Gpt)"),
            std::string::npos)
      << table;
}

TEST(PlanReportTest, NumberFormatting) {
  EXPECT_EQ(WithThousands(0), "0");
  EXPECT_EQ(WithThousands(999), "999");
  EXPECT_EQ(WithThousands(1000), "1,000");
  EXPECT_EQ(WithThousands(124439808), "124,439,808");
  EXPECT_EQ(WithThousands(-1234567), "-1,234,567");
  EXPECT_EQ(Mib(1024 * 1024), "1.00");
  EXPECT_EQ(Mib(1.5 * 1024 * 1024), "1.50");
}

}  // namespace
}  // namespace policy
