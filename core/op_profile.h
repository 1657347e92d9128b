// Per-op accounting of a training step: each device op (GEMM, kernel, collective, host
// sync) records its category, the FLOPs and device-memory bytes it costs and the engine
// that bounds it, and on CUDA the time its kernels took (CUDA events on the compute
// stream). The records give a per-category table and, through core/roofline.h, an
// estimate of the step on a reference GPU from this machine's op list.
//
//   core::OpProfile profile;
//   {
//     core::ScopedOpProfile on(&profile);     // this thread's ops record into `profile`
//     RETURN_IF_ERROR(TrainStep(...));
//   }
//   RETURN_IF_ERROR(profile.ResolveDeviceTimes());  // CUDA: waits for the events
//   for (const core::OpCategoryTotal& t : profile.Totals()) ...
//
// An op site describes what the device path runs, on every device: the CPU build records
// the same op list the CUDA build launches (NOTE [Op accounting]), which is what makes the
// estimate here mean something there.
//
//   core::ProfiledOp op(core::OpCategory::kNorm, "layernorm.forward", device,
//                       core::OpCost::Memory(bytes));
//   ... launch ...
//   // op's destructor records the end event (CUDA) and the record.
//
// NOTE [Op accounting]: FLOPs are the multiply-adds the kernel performs times 2 (masked
// attention entries included: the unfused path computes them, and the fused attention's
// diagonal tiles too) plus one per other arithmetic operation per element; bytes are the
// device-memory bytes the op's kernels read and write: each kernel's inputs once and its
// outputs once (a GEMM's C also read when beta != 0, an epilogue's bias and aux too), and
// what a kernel reads again only where that data cannot have stayed in cache (a 200 KB row
// read twice); tiles a kernel re-reads from shared memory or L2 (the fused attention's K
// and V) are not device-memory bytes. `exps` are the exponentials the kernels evaluate on
// the special-function units (the fused attention's and the softmaxes'). `launches` is how
// many kernels the CUDA path launches for the op. Nothing is recorded unless a profile is
// installed on the calling thread, so the cost when profiling is off is one thread-local
// read per op.
#ifndef CORE_OP_PROFILE_H_
#define CORE_OP_PROFILE_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/device.h"

namespace core {

// What an op is for, the rows of the profile table.
enum class OpCategory : int {
  kGemmForward = 0,  // a layer's forward GEMM (x W^T)
  kGemmInputGrad,    // dL/dx of a layer's GEMM
  kGemmWeightGrad,   // dL/dW of a layer's GEMM
  kAttention,        // attention's score and value GEMMs, its softmax
  kNorm,             // LayerNorm forward and backward
  kElementwise,      // bias, GELU, residual adds, zeroing, column sums
  kEmbedding,        // embedding gather and its gradient scatter
  kLoss,             // cross-entropy
  kOptimizer,        // AdamW / SGD updates
  kConvert,          // fp32 <-> bf16 casts and copies
  kCollective,       // all-gather, reduce-scatter, all-reduce
  kHostSync,         // a host wait on the device (a D2H read)
};
inline constexpr int kNumOpCategories = static_cast<int>(OpCategory::kHostSync) + 1;

// "gemm.forward", "attention", ...
const char* OpCategoryName(OpCategory category);
// The category OpCategoryName names; nullopt for another string.
std::optional<OpCategory> OpCategoryFromName(absl::string_view name);

// What bounds an op on the device (core/roofline.h holds the rate of each). New engines
// are added at the end, so recorded numbers keep their meaning.
enum class OpEngine : int {
  kTensorCoreBf16 = 0,  // a cuBLAS(Lt) bf16 x bf16 GEMM with fp32 accumulation
  kSimtFp32,            // fp32 GEMM without tensor cores (TF32 off)
  kMemory,              // bandwidth-bound kernels that stream elements, device copies
  kCollective,          // bytes through the collective (one rank: a device copy)
  kHostSync,            // a host round trip; no device work of its own
  // The library's own fused tensor-core kernels (the fused attention): mma.sync tile
  // products and, between them in the same warp, the softmax's exponentials.
  kTensorCoreMma,
  // Bandwidth-bound kernels that reduce each row or column between reading and writing it
  // (LayerNorm, RMSNorm, softmax, cross-entropy, column sums): a warp or block a row, a
  // reduction before its outputs.
  kMemoryRows,
};
inline constexpr int kNumOpEngines = static_cast<int>(OpEngine::kMemoryRows) + 1;
const char* OpEngineName(OpEngine engine);
// The engine OpEngineName names; nullopt for another string.
std::optional<OpEngine> OpEngineFromName(absl::string_view name);

struct OpCost {
  double flops = 0;
  double bytes = 0;
  int launches = 1;
  OpEngine engine = OpEngine::kMemory;
  double exps = 0;  // last, so that OpCost{flops, bytes, launches, engine} means what it did

  static OpCost Memory(double bytes, double flops = 0, int launches = 1) {
    return OpCost{flops, bytes, launches, OpEngine::kMemory};
  }
  // A row or column reduction's kernels (OpEngine::kMemoryRows).
  static OpCost Rows(double bytes, double flops = 0, int launches = 1, double exps = 0) {
    return OpCost{flops, bytes, launches, OpEngine::kMemoryRows, exps};
  }
};

// The problem of a GEMM op, `batch` products of [m x k] by [k x n]; all zero for other ops.
// The report's per-shape table groups GEMMs by it.
struct GemmShape {
  int64_t batch = 0, m = 0, n = 0, k = 0;
};

// One recorded op. `device_ms` is the time between its start and end events on the
// compute stream (CUDA, after ResolveDeviceTimes), or -1.
struct OpRecord {
  OpCategory category = OpCategory::kElementwise;
  std::string name;
  OpCost cost;
  GemmShape gemm;
  double device_ms = -1;
};

struct OpCategoryTotal {
  OpCategory category = OpCategory::kElementwise;
  int64_t ops = 0;
  int64_t launches = 0;
  double flops = 0;
  double bytes = 0;
  double device_ms = 0;  // sum over the ops that have a device time
  int64_t timed_ops = 0;
};

class OpProfile {
 public:
  OpProfile();
  ~OpProfile();
  OpProfile(const OpProfile&) = delete;
  OpProfile& operator=(const OpProfile&) = delete;

  const std::vector<OpRecord>& records() const { return records_; }
  // One entry per category, in OpCategory order (categories with no op included).
  std::vector<OpCategoryTotal> Totals() const { return TotalsOf(records_); }
  static std::vector<OpCategoryTotal> TotalsOf(const std::vector<OpRecord>& records);
  // Waits for every recorded CUDA event and fills each record's device_ms. OK at once
  // when nothing ran on CUDA; an error names the op whose events failed.
  absl::Status ResolveDeviceTimes();
  // Drops every record (and its events).
  void Clear();

  // For ProfiledOp: appends a record and returns its index.
  int64_t Append(OpRecord record);
  // For ProfiledOp on CUDA: the start and end events of record `index` (cudaEvent_t).
  void SetEvents(int64_t index, void* start, void* end);

 private:
  std::vector<OpRecord> records_;
  std::vector<std::array<void*, 2>> events_;  // parallel to records_; null where none
};

// Installs `profile` as the calling thread's profile for its lifetime (nullptr turns
// profiling off), restoring the previous one after.
class ScopedOpProfile {
 public:
  explicit ScopedOpProfile(OpProfile* profile);
  ~ScopedOpProfile();
  ScopedOpProfile(const ScopedOpProfile&) = delete;
  ScopedOpProfile& operator=(const ScopedOpProfile&) = delete;

 private:
  OpProfile* previous_;
};

// The calling thread's profile, or nullptr.
OpProfile* CurrentOpProfile();

// GEMMs recorded inside its lifetime on this thread (ops whose own category is
// kGemmForward, the GEMM's default) take `category` instead: a Linear's backward GEMMs
// are kGemmInputGrad and kGemmWeightGrad, attention's score and value GEMMs kAttention.
// Other ops keep their own category.
class ScopedOpCategory {
 public:
  explicit ScopedOpCategory(OpCategory category);
  ~ScopedOpCategory();
  ScopedOpCategory(const ScopedOpCategory&) = delete;
  ScopedOpCategory& operator=(const ScopedOpCategory&) = delete;

 private:
  int previous_;
};

// Records one op into the thread's profile, if any: at construction the start event
// (CUDA device), at destruction the end event and the record. `name` should be a string
// literal naming the op ("matmul", "layernorm.forward"); a GEMM also gives its shape.
class ProfiledOp {
 public:
  ProfiledOp(OpCategory category, const char* name, Device device, const OpCost& cost,
             const GemmShape& gemm = {});
  ~ProfiledOp();
  ProfiledOp(const ProfiledOp&) = delete;
  ProfiledOp& operator=(const ProfiledOp&) = delete;

 private:
  OpProfile* profile_;
  OpRecord record_;
  void* start_ = nullptr;
};

// Records a cost with no events (ops whose work the caller does not bracket).
void RecordOp(OpCategory category, const char* name, const OpCost& cost);

}  // namespace core

#endif  // CORE_OP_PROFILE_H_
