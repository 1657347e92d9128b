#include "core/roofline.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace core {

namespace {

// The H200's figures that the H100 SXM's differ in: its memory (NOTE [Rate sets]).
constexpr double kH200MemoryGbps = 4800, kH100MemoryGbps = 3350;

// NOTE [Rate sets]: every figure of every set. GPU run 9's figures are its JSON line's
// op_profile in docs/GPU_RUNS.md (H200, commit e64cf39; the op list it measured is
// bench/testdata/run9_ops.json).
DeviceRates H200Set(RateSet set) {
  DeviceRates r;
  r.peak_bf16_tflops = 989;  // dense bf16, the H100 and H200 datasheets
  r.sm_count = 132;
  switch (set) {
    case RateSet::kDatasheet:
      r.name = "H200 datasheet";
      r.bf16_gemm_tflops = 989;
      r.gemm_output_gbps = 0;  // the main loop hides the output
      r.mma_tflops = 989;
      // The special-function units: 16 ex2 a clock on each of 132 SMs, about 3.9 T/s on
      // an H100 SXM (the FlashAttention-3 paper's figure); the H200 has the same SMs and
      // clocks.
      r.exp_tops = 3.9;
      r.fp32_simt_tflops = 67;
      r.memory_gbps = kH200MemoryGbps;
      r.row_memory_gbps = kH200MemoryGbps;
      r.collective_gbps = kH200MemoryGbps;
      r.min_kernel_us = 0;
      r.launch_us = 2;  // typical of back-to-back kernels on Hopper with CUDA 12-13
      r.host_sync_us = 20;
      return r;
    case RateSet::kAttained:
      r.name = "H200 attained (GPU run 9)";
      // The three GEMM roles together: 3 x 4049 GFLOP in 6.58 + 5.87 + 5.85 ms (615, 690
      // and 692 TFLOP/s apart), their outputs included.
      r.bf16_gemm_tflops = 664;
      r.gemm_output_gbps = 0;
      // The fused attention: 1480 GFLOP of tile products in 12.0 ms, its exponentials
      // included in that rate (so not counted apart).
      r.mma_tflops = 123;
      r.exp_tops = 0;
      r.fp32_simt_tflops = 50;  // not measured: 75% of 67, as cuBLAS SGEMM typically reaches
      // Streaming kernels: the conversions (3567 GB/s) and the optimizer (3558 GB/s); row
      // kernels: the norms (2556 GB/s). A device copy: 4.3 TB/s (../shared/TOOLCHAIN.md).
      r.memory_gbps = 3560;
      r.row_memory_gbps = 2560;
      r.collective_gbps = 4300;
      // Not separable in run 9's per-category figures: an empty kernel's time on Hopper.
      r.min_kernel_us = 3;
      r.launch_us = 2;
      r.host_sync_us = 10;  // run 9: 8 host syncs, 0.080 ms between their events
      return r;
    case RateSet::kCalibrated:
      r.name = "H200 calibrated to GPU run 9";
      // Fit to run 9's op list and per-category times, each largest relative error made
      // least: launch_us with memory_gbps and row_memory_gbps over the norms, elementwise,
      // conversions, optimizer and loss (within 3.4%); then the GEMMs' rate and output rate
      // over the three roles (within 2.5%: the forward's fp32 outputs, 8.7 GB against the
      // input gradients' 4.3 and the weight gradients' 1.0, make it the slowest role); then
      // mma_tflops so that the attention's products and exponentials (at the datasheet's
      // rate) take its 12.0 ms: that splits into the forward's 2.8 ms and the backward's 9.2
      // ms as run 9 measured them apart. min_kernel_us is not fit (no run-9 category
      // depends on it) and host_sync_us is run 9's.
      r.bf16_gemm_tflops = 735;
      r.gemm_output_gbps = 10750;
      r.mma_tflops = 135.5;
      r.exp_tops = 3.9;
      r.fp32_simt_tflops = 50;
      r.memory_gbps = 3690;
      r.row_memory_gbps = 2820;
      r.collective_gbps = 4300;
      r.min_kernel_us = 3;
      r.launch_us = 2.2;
      r.host_sync_us = 10;
      return r;
  }
  return r;
}

}  // namespace

const char* RateSetName(RateSet set) {
  switch (set) {
    case RateSet::kDatasheet:
      return "datasheet";
    case RateSet::kAttained:
      return "attained";
    case RateSet::kCalibrated:
      return "calibrated";
  }
  return "unknown";
}

DeviceRates H200Rates(RateSet set) { return H200Set(set); }

DeviceRates H100Rates(RateSet set) {
  // The same SMs at the same clocks: the compute rates stay; whatever moves bytes through
  // device memory scales with it (not measured on an H100).
  DeviceRates r = H200Set(set);
  const double scale = kH100MemoryGbps / kH200MemoryGbps;
  r.name = absl::StrCat("H100 SXM ", RateSetName(set),
                        set == RateSet::kDatasheet ? "" : " (H200 run 9's fractions)");
  r.gemm_output_gbps *= scale;
  r.memory_gbps *= scale;
  r.row_memory_gbps *= scale;
  r.collective_gbps *= scale;
  return r;
}

std::optional<DeviceRates> RatesForDevice(absl::string_view device_name, RateSet set) {
  const std::string name = absl::AsciiStrToLower(device_name);
  if (absl::StrContains(name, "h200")) return H200Rates(set);
  if (absl::StrContains(name, "h100") && !absl::StrContains(name, "pcie") &&
      !absl::StrContains(name, "nvl")) {
    return H100Rates(set);
  }
  return std::nullopt;
}

double GemmFill(const GemmShape& shape, const DeviceRates& rates) {
  if (rates.sm_count <= 0 || shape.m <= 0 || shape.n <= 0) return 1.0;
  const auto blocks_of = [](int64_t d) { return static_cast<double>((d + 127) / 128); };
  const double splits = std::max<double>(1.0, static_cast<double>(shape.k / 2048));
  const double blocks = static_cast<double>(std::max<int64_t>(shape.batch, 1)) *
                        blocks_of(shape.m) * blocks_of(shape.n) * splits;
  return std::min(1.0, blocks / rates.sm_count);
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
      e.cost.exps = r.cost.exps + (r2.cost.exps - r.cost.exps) * b;
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

namespace {

// Milliseconds for `amount` at `per_ms` a millisecond; 0 where the rate is 0 (a term the
// rates leave out).
double MsAt(double amount, double per_ms) { return per_ms > 0 ? amount / per_ms : 0.0; }

// A bf16 GEMM's bytes beyond its operands A and B (2 bytes an element): its output and
// its epilogue's bias and aux.
double GemmOutputBytes(const OpRecord& r) {
  const GemmShape& g = r.gemm;
  const double operands = 2.0 * static_cast<double>(std::max<int64_t>(g.batch, 1)) *
                          (static_cast<double>(g.m) * g.k + static_cast<double>(g.k) * g.n);
  return std::max(0.0, r.cost.bytes - operands);
}

}  // namespace

RooflineCategory EstimateOp(const OpRecord& record, const DeviceRates& rates) {
  RooflineCategory out;
  out.category = record.category;
  const OpCost& c = record.cost;
  const double exps_ms = MsAt(c.exps, rates.exp_tops * 1e9);
  double work_ms = 0;
  double bytes_ms = 0;
  switch (c.engine) {
    case OpEngine::kTensorCoreBf16:
      work_ms = c.flops / (rates.bf16_gemm_tflops * 1e9 * GemmFill(record.gemm, rates));
      if (record.gemm.m > 0) {
        work_ms += MsAt(GemmOutputBytes(record), rates.gemm_output_gbps * 1e6);
      }
      bytes_ms = c.bytes / (rates.memory_gbps * 1e6);
      break;
    case OpEngine::kTensorCoreMma:
      work_ms =
          c.flops / ((rates.mma_tflops > 0 ? rates.mma_tflops : rates.bf16_gemm_tflops) * 1e9) +
          exps_ms;
      bytes_ms = c.bytes / (rates.memory_gbps * 1e6);
      break;
    case OpEngine::kSimtFp32:
    case OpEngine::kMemory:
      work_ms = std::max(c.flops / (rates.fp32_simt_tflops * 1e9), exps_ms);
      bytes_ms = c.bytes / (rates.memory_gbps * 1e6);
      break;
    case OpEngine::kMemoryRows:
      work_ms = std::max(c.flops / (rates.fp32_simt_tflops * 1e9), exps_ms);
      bytes_ms =
          c.bytes / ((rates.row_memory_gbps > 0 ? rates.row_memory_gbps : rates.memory_gbps) * 1e6);
      break;
    case OpEngine::kCollective:
      bytes_ms = c.bytes / (rates.collective_gbps * 1e6);
      break;
    case OpEngine::kHostSync:
      break;
  }
  if (work_ms >= bytes_ms) {
    out.compute_ms = work_ms;
  } else {
    out.memory_ms = bytes_ms;
  }
  // A kernel that does less than a tiny kernel's worth still takes that long.
  const double floor_ms = c.launches * rates.min_kernel_us * 1e-3;
  out.launch_ms =
      c.launches * rates.launch_us * 1e-3 + std::max(0.0, floor_ms - std::max(work_ms, bytes_ms));
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
