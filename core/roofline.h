// A roofline estimate of a recorded op list (core/op_profile.h) on a reference GPU: each
// op takes the longer of its FLOPs at its engine's rate and its bytes at the memory rate,
// plus a fixed cost per kernel launch; a host sync adds a round trip. The estimate says
// what the op structure allows (fp32 or tensor-core GEMMs, extra passes, stored T x T
// scores, launches, syncs), not how well each kernel is written.
//
//   const core::DeviceRates rates = core::H200Rates();
//   core::RooflineEstimate e = core::EstimateRoofline(profile.records(), rates);
//   double mfu = model_flops / (e.total_ms * 1e-3) / (rates.peak_bf16_tflops * 1e12);
#ifndef CORE_ROOFLINE_H_
#define CORE_ROOFLINE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/op_profile.h"

namespace core {

// The rates of one GPU. All in one place: change them here when a device run measures
// better figures.
struct DeviceRates {
  std::string name;
  double peak_bf16_tflops = 0;  // the datasheet's dense bf16 peak: MFU's denominator
  double bf16_gemm_tflops = 0;  // bf16 GEMMs with fp32 accumulation, as measured
  double fp32_simt_tflops = 0;  // fp32 without tensor cores (TF32 off)
  double memory_gbps = 0;       // device memory, as a device copy achieves
  double collective_gbps = 0;   // bytes through a collective (one rank: a device copy)
  double launch_us = 0;         // device time between back-to-back kernels
  double host_sync_us = 0;      // a host round trip that drains the queue
};

// One H200 (SXM, 141 GB) with the rates seen on the project's GPU machine
// (../shared/TOOLCHAIN.md): cuBLAS bf16 GEMM 8192^3 at about 790 TFLOP/s, device copies at
// about 4.3 TB/s. fp32 without tensor cores: 67 TFLOP/s on the datasheet, 75% of it as
// cuBLAS SGEMM typically reaches. Launch gap 2 us and a host sync 20 us, typical for
// Hopper with CUDA 12-13 (not yet measured there). MFU against 989 TFLOP/s dense bf16.
DeviceRates H200Rates();

struct RooflineCategory {
  OpCategory category = OpCategory::kElementwise;
  double ms = 0;          // estimated device time
  double compute_ms = 0;  // of which the FLOPs bound
  double memory_ms = 0;   // of which the bytes bound
  double launch_ms = 0;   // of which launches and host syncs
};

struct RooflineEstimate {
  std::vector<RooflineCategory> categories;  // OpCategory order
  double total_ms = 0;
  int64_t launches = 0;
  int64_t host_syncs = 0;
};

// The op list of a step at `batch` sequences from the op lists of the same step at 1
// (`one`) and 2 (`two`) sequences, exactly when every op's FLOPs and bytes are affine in
// the batch (a GEMM's weight is read once, its rows grow with the batch). Ops are matched
// by (category, name, engine) in order: a kind with as many ops in both lists is one op
// per step whose cost is extrapolated; a kind with twice as many in `two` is one op per
// sequence (attention's per-sequence GEMMs), repeated `batch` times. InvalidArgument
// naming the kind when the lists match neither way.
absl::StatusOr<std::vector<OpRecord>> ExtrapolateBatch(const std::vector<OpRecord>& one,
                                                       const std::vector<OpRecord>& two,
                                                       int64_t batch);

// The time of one record on `rates`, in milliseconds, and its parts.
RooflineCategory EstimateOp(const OpRecord& record, const DeviceRates& rates);
RooflineEstimate EstimateRoofline(const std::vector<OpRecord>& records, const DeviceRates& rates);

}  // namespace core

#endif  // CORE_ROOFLINE_H_
