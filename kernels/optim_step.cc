#include "kernels/optim_step.h"

#include <cstddef>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/op_profile.h"
#include "kernels/cpu.h"
#include "kernels/cpu_runtime.h"

#ifdef FSDP_WITH_CUDA
#include <cuda_runtime_api.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "core/cuda_status.h"
#include "core/pinned_buffer.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "kernels/cuda/fused.h"
#endif

namespace kernels {
namespace {

// The CPU update of one flat parameter, per ISA; each element bit for bit as AdamWUpdate
// computes it alone.
FSDP_CPU_CLONES void AdamWLoop(float* FSDP_RESTRICT w, float* FSDP_RESTRICT m,
                               float* FSDP_RESTRICT v, const float* FSDP_RESTRICT g, int64_t n,
                               AdamWScalars s) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) AdamWUpdate(&w[j], &m[j], &v[j], g[j], s);
}

// The CPU update of one parameter with the step's flags fixed at compile time, so the loop
// has no branches on them (GCC does not vectorise a select on a loop-invariant bool) and
// the buffer store is unconditional or absent; each element bit for bit as SgdUpdate
// computes it alone.
template <bool kWeightDecay, bool kMomentum, bool kNesterov, bool kFirstStep>
FSDP_CPU_INLINE void SgdRows(float* FSDP_RESTRICT w, float* FSDP_RESTRICT buf,
                             const float* FSDP_RESTRICT g, int64_t n, const SgdScalars& scalars) {
  SgdScalars s = scalars;
  s.use_weight_decay = kWeightDecay;
  s.use_momentum = kMomentum;
  s.nesterov = kNesterov;
  s.first_step = kFirstStep;
  float unused = 0.0f;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    SgdUpdate(&w[j], kMomentum ? &buf[j] : &unused, g[j], s);
  }
}

// Picks the SgdRows instance of s's four flags, one flag per level.
template <bool... kFixed>
FSDP_CPU_INLINE void SgdDispatch(float* w, float* buf, const float* g, int64_t n,
                                 const SgdScalars& s) {
  constexpr size_t kDone = sizeof...(kFixed);
  if constexpr (kDone == 4) {
    SgdRows<kFixed...>(w, buf, g, n, s);
  } else {
    const bool flags[4] = {s.use_weight_decay, s.use_momentum, s.nesterov, s.first_step};
    if (flags[kDone]) {
      SgdDispatch<kFixed..., true>(w, buf, g, n, s);
    } else {
      SgdDispatch<kFixed..., false>(w, buf, g, n, s);
    }
  }
}

// Per ISA; buf is null without momentum.
FSDP_CPU_CLONES void SgdLoop(float* w, float* buf, const float* g, int64_t n, SgdScalars s) {
  SgdDispatch<>(w, buf, g, n, s);
}

// NOTE [Op accounting] of an update: AdamW reads the gradient and reads and writes the
// weight and both moments (28 bytes, about 15 operations per element); SGD reads the
// gradient and reads and writes the weight and, with momentum, its buffer.
core::OpCost SegmentCost(const AdamWSegment& s) {
  return core::OpCost::Memory(28.0 * s.n, 15.0 * s.n, 0);
}
core::OpCost SegmentCost(const SgdSegment& s) {
  return core::OpCost::Memory((s.buf != nullptr ? 20.0 : 12.0) * s.n, 4.0 * s.n, 0);
}

// NOTE [Segment upload]: the CUDA path copies the step's segment table to the device from
// one of two page-locked buffers per device, asynchronously on the compute stream, and
// launches one fused kernel per device and kind. A buffer is refilled only once the copy
// that last read it (two steps back) has finished, so the step never waits for the device.
constexpr core::OpCost kSegmentUpload{0, 0, 1, core::OpEngine::kMemory};

#ifdef FSDP_WITH_CUDA
// NOTE [Segment upload]: a device's two page-locked staging buffers, each with the event
// of the last copy out of it. Shared by the threads that step on the device.
struct UploadSlot {
  core::PinnedBuffer buffer;
  cudaEvent_t copied = nullptr;
};
struct UploadRing {
  absl::Mutex mu;
  UploadSlot slots[2] ABSL_GUARDED_BY(mu);
  int next ABSL_GUARDED_BY(mu) = 0;
};

UploadRing& RingFor(int device_index) {
  static absl::Mutex rings_mu;
  static auto* rings = new std::map<int, std::unique_ptr<UploadRing>>();
  absl::MutexLock lock(&rings_mu);
  std::unique_ptr<UploadRing>& ring = (*rings)[device_index];
  if (ring == nullptr) ring = std::make_unique<UploadRing>();
  return *ring;
}

// Numbers the segments' chunks, uploads the segment array to `device` (NOTE [Segment
// upload]) and runs `launch` (FusedAdamW or FusedSgd) once on the compute stream. The
// segment array lives in a device tensor (tag kOptim) released on return; the copy into
// it is stream-ordered before the launch. Errors name `what`.
template <typename Segment>
absl::Status LaunchSegments(const core::Device& device, std::vector<Segment> segments,
                            cudaError_t (*launch)(const Segment*, int64_t, int64_t),
                            absl::string_view what) {
  if (segments.empty()) return absl::OkStatus();
  int64_t chunks = 0;
  for (Segment& s : segments) {
    s.first_chunk = chunks;
    chunks += (s.n + cuda::kFusedChunk - 1) / cuda::kFusedChunk;
  }
  // Empty segments own no chunk; drop them so every chunk maps to a non-empty one.
  std::vector<Segment> live;
  for (const Segment& s : segments) {
    if (s.n > 0) live.push_back(s);
  }
  if (live.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(core::cuda::StatusFromCuda(cudaSetDevice(device.index),
                                             absl::StrCat(what, ": cudaSetDevice")));
  const int64_t bytes = static_cast<int64_t>(live.size() * sizeof(Segment));
  core::OpCost cost;
  for (const Segment& s : live) {
    const core::OpCost c = SegmentCost(s);
    cost.bytes += c.bytes;
    cost.flops += c.flops;
  }
  core::RecordOp(core::OpCategory::kConvert, "optimizer.segment_upload", kSegmentUpload);
  core::ProfiledOp op(core::OpCategory::kOptimizer, "optimizer.fused_update", device, cost);
  ASSIGN_OR_RETURN(core::Tensor table,
                   core::Tensor::Allocate({(bytes + 3) / 4}, core::DType::kInt32,
                                          core::MemoryTag::kOptim, device));
  // NOTE [Segment upload].
  UploadRing& ring = RingFor(device.index);
  absl::MutexLock lock(&ring.mu);
  UploadSlot& slot = ring.slots[ring.next];
  ring.next = 1 - ring.next;
  const std::string where =
      absl::StrCat(what, ": upload of ", live.size(), " segments to ", device.ToString());
  if (slot.copied == nullptr) {
    RETURN_IF_ERROR(core::cuda::StatusFromCuda(
        cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming), where));
  } else {
    RETURN_IF_ERROR(core::cuda::StatusFromCuda(cudaEventSynchronize(slot.copied), where));
  }
  if (slot.buffer.size() < bytes) {
    ASSIGN_OR_RETURN(slot.buffer, core::PinnedBuffer::Allocate(bytes, core::MemoryTag::kOptim));
  }
  std::memcpy(slot.buffer.data(), live.data(), static_cast<size_t>(bytes));
  RETURN_IF_ERROR(core::cuda::StatusFromCuda(
      cudaMemcpyAsync(table.raw_data(), slot.buffer.data(), static_cast<size_t>(bytes),
                      cudaMemcpyHostToDevice, core::cuda::ComputeStream()),
      where));
  RETURN_IF_ERROR(
      core::cuda::StatusFromCuda(cudaEventRecord(slot.copied, core::cuda::ComputeStream()), where));
  return core::cuda::StatusFromCuda(
      launch(static_cast<const Segment*>(table.raw_data()), static_cast<int64_t>(live.size()),
             chunks),
      absl::StrCat(what, ": fused update of ", live.size(), " parameters on ", device.ToString()));
}
#endif  // FSDP_WITH_CUDA

}  // namespace

void AdamWOnCpu(const AdamWSegment& seg) {
  // Elements are independent: chunks on 64-byte lines over the intra-op threads.
  ParallelChunks(IntraOpThreads(), seg.n, seg.n, 16, [&](int64_t b, int64_t e) {
    AdamWLoop(seg.w + b, seg.m + b, seg.v + b, seg.g + b, e - b, seg.s);
  });
}

void SgdOnCpu(const SgdSegment& seg) {
  ParallelChunks(IntraOpThreads(), seg.n, seg.n, 16, [&](int64_t b, int64_t e) {
    SgdLoop(seg.w + b, seg.buf != nullptr ? seg.buf + b : nullptr, seg.g + b, e - b, seg.s);
  });
}

template <typename Segment>
absl::Status OptimizerStep::Route(core::Device device, absl::string_view param_name,
                                  const Segment& seg, void (*on_cpu)(const Segment&),
                                  std::map<int, std::vector<Segment>>* queued) {
  if (!device.is_cuda()) {
    on_cpu(seg);
    const core::OpCost c = SegmentCost(seg);
    cpu_cost_.bytes += c.bytes;
    cpu_cost_.flops += c.flops;
    cpu_cost_.launches = 1;
    return absl::OkStatus();
  }
#ifdef FSDP_WITH_CUDA
  (void)param_name;
  (*queued)[device.index].push_back(seg);
  return absl::OkStatus();
#else
  (void)queued;
  return absl::FailedPreconditionError(absl::StrCat(optimizer_, ": parameter '", param_name,
                                                    "' is on ", device.ToString(),
                                                    " but this build has no CUDA support"));
#endif
}

absl::Status OptimizerStep::Add(core::Device device, absl::string_view param_name,
                                const AdamWSegment& seg) {
  return Route(device, param_name, seg, &AdamWOnCpu, &adamw_);
}

absl::Status OptimizerStep::Add(core::Device device, absl::string_view param_name,
                                const SgdSegment& seg) {
  return Route(device, param_name, seg, &SgdOnCpu, &sgd_);
}

absl::Status OptimizerStep::Finish() {
  if (cpu_cost_.launches > 0) {
    // The CPU segments' op list, as the CUDA path would run them.
    core::RecordOp(core::OpCategory::kConvert, "optimizer.segment_upload", kSegmentUpload);
    core::RecordOp(core::OpCategory::kOptimizer, "optimizer.fused_update", cpu_cost_);
    cpu_cost_ = core::OpCost::Memory(0, 0, 0);
  }
#ifdef FSDP_WITH_CUDA
  for (auto& [index, segments] : adamw_) {
    RETURN_IF_ERROR(LaunchSegments(core::Device::Cuda(index), std::move(segments),
                                   &cuda::FusedAdamW, optimizer_));
  }
  for (auto& [index, segments] : sgd_) {
    RETURN_IF_ERROR(LaunchSegments(core::Device::Cuda(index), std::move(segments), &cuda::FusedSgd,
                                   optimizer_));
  }
  adamw_.clear();
  sgd_.clear();
#endif
  return absl::OkStatus();
}

}  // namespace kernels
