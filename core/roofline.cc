#include "core/roofline.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace core {

DeviceRates H200Rates() {
  DeviceRates r;
  r.name = "H200 (rates seen on the project's GPU machine)";
  r.peak_bf16_tflops = 989;
  r.bf16_gemm_tflops = 790;
  r.fp32_simt_tflops = 50;
  r.memory_gbps = 4300;
  r.collective_gbps = 4300;
  r.launch_us = 2;
  r.host_sync_us = 20;
  return r;
}

absl::StatusOr<std::vector<OpRecord>> ExtrapolateBatch(const std::vector<OpRecord>& one,
                                                       const std::vector<OpRecord>& two,
                                                       int64_t batch) {
  if (batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("ExtrapolateBatch: batch ", batch, " < 1"));
  }
  using Kind = std::tuple<int, std::string, int>;
  auto kind_of = [](const OpRecord& r) {
    return Kind{static_cast<int>(r.category), r.name, static_cast<int>(r.cost.engine)};
  };
  auto describe = [](const Kind& k) {
    return absl::StrCat(OpCategoryName(static_cast<OpCategory>(std::get<0>(k))), "/",
                        std::get<1>(k), "/", OpEngineName(static_cast<OpEngine>(std::get<2>(k))));
  };
  std::map<Kind, std::vector<const OpRecord*>> by_kind_two;
  std::map<Kind, int64_t> count_one;
  for (const OpRecord& r : two) by_kind_two[kind_of(r)].push_back(&r);
  for (const OpRecord& r : one) ++count_one[kind_of(r)];
  for (const auto& [kind, ops] : by_kind_two) {
    if (count_one.find(kind) == count_one.end()) {
      return absl::InvalidArgumentError(absl::StrCat("ExtrapolateBatch: ", describe(kind),
                                                     " runs at batch 2 but not at batch 1"));
    }
  }
  std::vector<OpRecord> out;
  std::map<Kind, int64_t> seen;
  for (const OpRecord& r : one) {
    const Kind kind = kind_of(r);
    const int64_t n1 = count_one[kind];
    const std::vector<const OpRecord*>& ops2 = by_kind_two[kind];
    const int64_t i = seen[kind]++;
    const double b = static_cast<double>(batch - 1);
    if (static_cast<int64_t>(ops2.size()) == n1) {
      const OpRecord& r2 = *ops2[i];
      OpRecord e = r;
      e.cost.flops = r.cost.flops + (r2.cost.flops - r.cost.flops) * b;
      e.cost.bytes = r.cost.bytes + (r2.cost.bytes - r.cost.bytes) * b;
      // A GEMM's dimension that grows with the batch (its rows, or the weight gradient's
      // reduction) grows linearly too; the others are equal at batch 1 and 2 and stay.
      const auto grow = [b](int64_t d1, int64_t d2) {
        return d1 + (d2 - d1) * static_cast<int64_t>(b);
      };
      e.gemm = {grow(r.gemm.batch, r2.gemm.batch), grow(r.gemm.m, r2.gemm.m),
                grow(r.gemm.n, r2.gemm.n), grow(r.gemm.k, r2.gemm.k)};
      e.device_ms = -1;
      out.push_back(std::move(e));
    } else if (static_cast<int64_t>(ops2.size()) == 2 * n1) {
      OpRecord e = r;
      e.device_ms = -1;
      for (int64_t k = 0; k < batch; ++k) out.push_back(e);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("ExtrapolateBatch: ", describe(kind), " runs ", n1, " times at batch 1 and ",
                       ops2.size(), " at batch 2: neither once per step nor once per sequence"));
    }
  }
  return out;
}

RooflineCategory EstimateOp(const OpRecord& record, const DeviceRates& rates) {
  RooflineCategory out;
  out.category = record.category;
  const OpCost& c = record.cost;
  double flops_ms = 0;
  double bytes_ms = 0;
  switch (c.engine) {
    case OpEngine::kTensorCoreBf16:
      flops_ms = c.flops / (rates.bf16_gemm_tflops * 1e9);
      bytes_ms = c.bytes / (rates.memory_gbps * 1e6);
      break;
    case OpEngine::kSimtFp32:
    case OpEngine::kMemory:
      flops_ms = c.flops / (rates.fp32_simt_tflops * 1e9);
      bytes_ms = c.bytes / (rates.memory_gbps * 1e6);
      break;
    case OpEngine::kCollective:
      bytes_ms = c.bytes / (rates.collective_gbps * 1e6);
      break;
    case OpEngine::kHostSync:
      break;
  }
  if (flops_ms >= bytes_ms) {
    out.compute_ms = flops_ms;
  } else {
    out.memory_ms = bytes_ms;
  }
  out.launch_ms = c.launches * rates.launch_us * 1e-3;
  if (c.engine == OpEngine::kHostSync) out.launch_ms += rates.host_sync_us * 1e-3;
  out.ms = out.compute_ms + out.memory_ms + out.launch_ms;
  return out;
}

RooflineEstimate EstimateRoofline(const std::vector<OpRecord>& records, const DeviceRates& rates) {
  RooflineEstimate e;
  e.categories.resize(kNumOpCategories);
  for (int i = 0; i < kNumOpCategories; ++i) {
    e.categories[i].category = static_cast<OpCategory>(i);
  }
  for (const OpRecord& r : records) {
    const RooflineCategory op = EstimateOp(r, rates);
    RooflineCategory& t = e.categories[static_cast<int>(r.category)];
    t.ms += op.ms;
    t.compute_ms += op.compute_ms;
    t.memory_ms += op.memory_ms;
    t.launch_ms += op.launch_ms;
    e.total_ms += op.ms;
    e.launches += r.cost.launches;
    if (r.cost.engine == OpEngine::kHostSync) ++e.host_syncs;
  }
  return e;
}

}  // namespace core
