// A roofline estimate of a recorded op list (core/op_profile.h) on a GPU: each op takes the
// longer of its work at its engine's rate and its bytes at the memory rate, no less than a
// tiny kernel's floor, plus a cost per kernel launch; a host sync adds a round trip. What
// an engine's work is: a GEMM's FLOPs at its shape's rate and its output and epilogue bytes
// beyond them; the fused attention's tile products and exponentials; a bandwidth-bound
// kernel's bytes at the rate of its kind (streaming, or reducing rows).
//
//   const core::DeviceRates rates = core::H200Rates(core::RateSet::kCalibrated);
//   core::RooflineEstimate e = core::EstimateRoofline(profile.records(), rates);
//   double mfu = model_flops / (e.total_ms * 1e-3) / (rates.peak_bf16_tflops * 1e12);
#ifndef CORE_ROOFLINE_H_
#define CORE_ROOFLINE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/op_profile.h"

namespace core {

// NOTE [Rate sets]: each device has three sets of rates, all in roofline.cc.
//   kDatasheet   the vendor's peaks: what the op structure allows, however well each kernel
//                is written.
//   kAttained    the rates GPU run 9 (docs/GPU_RUNS.md: one H200, commit e64cf39) measured,
//                each read off its per-category figures: the GEMM roles' TFLOP/s, the fused
//                attention's, the streaming and the row kernels' GB/s.
//   kCalibrated  the same model with its parameters fit so that run 9's op list
//                (bench/testdata/run9_ops.json) estimates to run 9's measured time per
//                category (bench/run9_roofline_test.cc checks it): what the code would take
//                with kernels as good as run 9's.
// The H100's attained and calibrated sets are the H200's fractions of the datasheet scaled
// by the H100's datasheet figures: not measured on an H100.
enum class RateSet : int { kDatasheet = 0, kAttained, kCalibrated };
inline constexpr int kNumRateSets = static_cast<int>(RateSet::kCalibrated) + 1;
// "datasheet", "attained", "calibrated".
const char* RateSetName(RateSet set);

// The rates of one GPU. A rate of 0 for an optional term leaves that term out (say so
// below); the required rates (peak, GEMM, fp32, memory, collective) must be positive.
struct DeviceRates {
  std::string name;
  double peak_bf16_tflops = 0;  // the datasheet's dense bf16 peak: MFU's denominator
  // kTensorCoreBf16 (cuBLAS(Lt)): a GEMM's FLOPs at this rate when its blocks fill every SM
  // (GemmFill), plus its output and epilogue bytes (C written, and read when beta != 0,
  // bias, aux: the bytes beyond A and B) at gemm_output_gbps, which the main loop does not
  // hide (0: hidden entirely).
  double bf16_gemm_tflops = 0;
  double gemm_output_gbps = 0;
  int sm_count = 0;  // GemmFill's SMs (0: every GEMM fills the device)
  // kTensorCoreMma (the fused attention): its tile products at mma_tflops (0: at
  // bf16_gemm_tflops) plus its exponentials at exp_tops (tera-exponentials per second; 0:
  // not counted), in sequence: a tile's exponentials sit between its two products in the
  // same warp. For the other engines the exponentials are one more bound beside bytes.
  double mma_tflops = 0;
  double exp_tops = 0;
  double fp32_simt_tflops = 0;  // fp32 without tensor cores (TF32 off)
  double memory_gbps = 0;       // kMemory: streaming kernels
  double row_memory_gbps = 0;   // kMemoryRows: row and column reductions (0: memory_gbps)
  double collective_gbps = 0;   // bytes through a collective (one rank: a device copy)
  double min_kernel_us = 0;     // the least time a kernel takes, however little it does
  double launch_us = 0;         // device time between back-to-back kernels
  double host_sync_us = 0;      // a host round trip that drains the queue
};

// One H200 (SXM, 141 GB HBM3e at 4.8 TB/s, 989 TFLOP/s dense bf16) and one H100 SXM (80 GB
// HBM3 at 3.35 TB/s, 989 TFLOP/s), in each set (NOTE [Rate sets]).
DeviceRates H200Rates(RateSet set = RateSet::kCalibrated);
DeviceRates H100Rates(RateSet set = RateSet::kCalibrated);

// The rates of the device a CUDA device name names ("NVIDIA H200, 139.8 GiB, sm_90",
// core::CudaDeviceName): an H200, or an H100 SXM ("H100" without "PCIe" or "NVL"); nullopt
// for another device (the caller says which rates it used instead).
std::optional<DeviceRates> RatesForDevice(absl::string_view device_name,
                                          RateSet set = RateSet::kCalibrated);

// The fraction of the SMs a GEMM's blocks keep busy in its one wave, 1 when it has a wave
// or more (and for a record without a shape, or rates without sm_count): cuBLAS(Lt) covers
// the output with blocks of about 128 x 128 and splits a long reduction into parts of at
// least 2048 when the output has few blocks, so blocks = batch x ceil(m / 128) x
// ceil(n / 128) x max(1, k / 2048). No GEMM of run 9 has fewer than 288 blocks (GPT-2's
// 768 x 768 weight gradient over 16384 tokens): this class is not measured.
double GemmFill(const GemmShape& shape, const DeviceRates& rates);

struct RooflineCategory {
  OpCategory category = OpCategory::kElementwise;
  double ms = 0;          // estimated device time
  double compute_ms = 0;  // of which the engine's work (FLOPs, exponentials, GEMM output)
  double memory_ms = 0;   // of which the bytes bound
  double launch_ms = 0;   // of which launches, kernels' floors and host syncs
};

struct RooflineEstimate {
  std::vector<RooflineCategory> categories;  // OpCategory order
  double total_ms = 0;
  int64_t launches = 0;
  int64_t host_syncs = 0;
};

// The op list of a step at `batch` sequences from the op lists of the same step at 1
// (`one`) and 2 (`two`) sequences, exactly when every op's FLOPs, bytes and exponentials
// are affine in the batch (a GEMM's weight is read once, its rows grow with the batch). Ops are
// matched by (category, name, engine) in order: a kind with as many ops in both lists is one op per
// step whose cost is extrapolated; a kind with twice as many in `two` is one op per sequence
// (attention's per-sequence GEMMs), repeated `batch` times. InvalidArgument naming the kind when
// the lists match neither way.
absl::StatusOr<std::vector<OpRecord>> ExtrapolateBatch(const std::vector<OpRecord>& one,
                                                       const std::vector<OpRecord>& two,
                                                       int64_t batch);

// The time of one record on `rates`, in milliseconds, and its parts: the longer of its
// engine's work and its bytes at the memory rate of its kind, raised to launches x
// min_kernel_us, plus launches x launch_us (and host_sync_us for a host sync).
RooflineCategory EstimateOp(const OpRecord& record, const DeviceRates& rates);
RooflineEstimate EstimateRoofline(const std::vector<OpRecord>& records, const DeviceRates& rates);

}  // namespace core

#endif  // CORE_ROOFLINE_H_
