// Per-device memory accounting: every tensor allocation goes through an Allocator, which
// counts current and peak bytes by tag. Tests and benchmarks read these counters; memory
// claims in this repo are measured here, never estimated.
//
//   core::Allocator& cpu = *core::Allocator::Current(core::Device::Cpu());
//   cpu.ResetPeaks();
//   ... run a training step ...
//   int64_t peak_params = cpu.Stats().peak(core::MemoryTag::kParam);
//
// Ranks run as threads in one process each install their own allocator with a
// ScopedAllocator, so per-rank figures stay separate.
//
// A CUDA allocator is a caching allocator: its blocks come from a core::BlockPool
// (core/block_pool.h) over cudaMalloc'ed segments, freed blocks go back to the pool and
// are reused, so a training step that repeats its allocations calls cudaMalloc only in
// its first step:
//
//   core::Allocator& gpu = *core::Allocator::Current(core::Device::Cuda(0));
//   ... step 1 ...
//   int64_t mallocs = gpu.Stats().num_device_mallocs;
//   ... step 2 ...
//   assert(gpu.Stats().num_device_mallocs == mallocs);
//   gpu.EmptyCache();   // hands the cached, unused segments back to the driver
//
// NOTE [CUDA caching allocator and streams]: Free returns a block to the pool at once,
// on the host, while kernels that use it may still be queued on the device. That is safe
// because all compute work runs on one stream, the compute stream (NOTE [Compute stream]
// in core/cuda_status.h), and so does the next user of the block: whatever the new owner
// queues runs after everything the old owner queued. Work on another stream (comm's NCCL
// stream) must (1) keep the tensors it reads or writes alive until that work has finished
// (comm's Work holds them until its CUDA event has fired), so their blocks reach the pool
// only when no other stream can still touch them, and (2) wait, before it starts, for an
// event recorded on the compute stream when it is issued (comm's NCCL group does), so it
// cannot write into a reused block while compute work queued by the block's previous
// owner may still read it. Segments go back to the driver only through cudaFree
// (EmptyCache, an out-of-memory retry, the allocator's destruction), which waits for the
// device's queued work.
#ifndef CORE_ALLOCATOR_H_
#define CORE_ALLOCATOR_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/block_pool.h"
#include "core/device.h"
#include "core/format_bytes.h"  // FormatBytes, for the users of this header

namespace core {

// What a block of memory is for.
enum class MemoryTag { kParam, kGrad, kOptim, kActivation, kComm, kOther };
inline constexpr int kNumMemoryTags = 6;

// "param", "grad", "optim", "activation", "comm", "other".
std::string MemoryTagName(MemoryTag tag);

// A snapshot of an allocator's counters.
struct MemoryStats {
  std::array<int64_t, kNumMemoryTags> current_by_tag{};
  // Highest value each tag's current bytes reached since the last reset.
  std::array<int64_t, kNumMemoryTags> peak_by_tag{};
  int64_t current_total = 0;
  // Highest total (all tags together) since the last reset; at most the sum of the
  // per-tag peaks, which need not have happened at the same moment.
  int64_t peak_total = 0;
  int64_t num_allocations = 0;  // live blocks

  // Caching (CUDA) allocators only; all 0 for the CPU. The counters above count the bytes
  // handed out, exactly as requested; these count what the allocator holds from the
  // device: live segments, in use or cached.
  int64_t reserved_bytes = 0;
  int64_t peak_reserved_bytes = 0;  // since the last ResetPeaks
  int64_t num_device_mallocs = 0;   // segments allocated (cudaMalloc calls), ever
  int64_t num_device_frees = 0;     // segments returned (cudaFree calls), ever
  int64_t num_oom_retries = 0;      // out-of-memory answers that emptied the cache and retried

  int64_t current(MemoryTag tag) const { return current_by_tag[static_cast<int>(tag)]; }
  int64_t peak(MemoryTag tag) const { return peak_by_tag[static_cast<int>(tag)]; }

  // One line, e.g. "param=1.50MiB grad=0B ... total=2.00MiB" (peaks), followed by
  // " reserved=2.00MiB" (peak reserved) for a caching allocator that reserved anything.
  std::string PeakSummary() const;
};

class Allocator {
 public:
  // The allocator of `device`: plain host memory for the CPU, a caching allocator over
  // cudaMalloc for a CUDA device (creating it calls no CUDA function).
  explicit Allocator(Device device);
  // A caching allocator for `device` whose segments come from `source` (tests use a fake
  // device backed by host memory).
  Allocator(Device device, std::unique_ptr<SegmentSource> source);
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  Device device() const { return device_; }

  // Allocates `nbytes` (64-byte aligned, 512-byte for a caching allocator; 0 gives a
  // non-null unique block) and counts them under `tag`. ResourceExhausted, naming the size, the tag
  // and the device, when the device has no memory left or the block would take this allocator's
  // bytes in use past limit(); InvalidArgument for a negative size; Unavailable for a CUDA device
  // when the build has no CUDA. Never aborts.
  absl::StatusOr<void*> Allocate(int64_t nbytes, MemoryTag tag);

  // The most bytes this allocator lets be in use at once (all tags), or 0 for no limit
  // of its own. A CPU allocator starts with the host's capacity (core/host_memory.h:
  // RAM + swap, or the cgroup limit when smaller), since a larger block could only be
  // granted by overcommit and would end in the OOM killer; a CUDA allocator starts with
  // none (cudaMalloc reports exhaustion itself).
  int64_t limit() const;
  // Replaces limit(); `bytes` <= 0 removes it. Blocks already allocated stay.
  void SetLimit(int64_t bytes);

  // Returns a block from Allocate with the same size and tag. A caching allocator keeps
  // it for reuse (NOTE [CUDA caching allocator and streams]).
  void Free(void* ptr, int64_t nbytes, MemoryTag tag);

  MemoryStats Stats() const;

  // Sets every peak (reserved included) to the current value, so the next reading
  // covers what follows.
  void ResetPeaks();

  // A caching allocator returns its cached segments that hold no live block to the
  // device (cudaFree); a CPU allocator frees the blocks it keeps for reuse (NOTE [Host
  // heap] in allocator.cc). Returns the bytes released.
  int64_t EmptyCache();
  ~Allocator();

  // True for a caching allocator (every CUDA allocator).
  bool caching() const { return pool_ != nullptr; }

  // True when this allocator's host blocks are page-locked (PinnedHost() in a CUDA build
  // on a machine with a usable device).
  bool pinned() const;

  // The process-wide allocator of `device`.
  static std::shared_ptr<Allocator> Default(Device device);

  // The process-wide allocator of page-locked host memory (device CPU; blocks from
  // cudaHostAlloc, so host <-> device copies run at full speed and need no staging), for
  // checkpoint I/O buffers (core/pinned_buffer.h). In a build without CUDA, or where no
  // CUDA device is usable, its blocks are ordinary host memory and pinned() is false.
  // Counted like any allocator, under its own counters.
  static std::shared_ptr<Allocator> PinnedHost();

  // The allocator new storage on `device` uses on this thread: the innermost
  // ScopedAllocator's for that device, or Default(device).
  static std::shared_ptr<Allocator> Current(Device device);

 private:
  // Adds `delta` bytes under `tag` and `blocks` (+1 or -1) live blocks.
  void Count(int64_t delta, MemoryTag tag, int blocks);
  void CountLocked(int64_t delta, MemoryTag tag, int blocks) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  enum class HostKind { kPageable, kPinned };
  Allocator(Device device, HostKind host_kind);
  // For HostKind::kPinned: whether blocks are really page-locked (decided on first use).
  bool UsePinned() const;

  const Device device_;
  const HostKind host_kind_ = HostKind::kPageable;
  // The pool of a caching (CUDA) allocator; null for the CPU.
  const std::unique_ptr<BlockPool> pool_;
  mutable absl::Mutex mu_;
  MemoryStats stats_ ABSL_GUARDED_BY(mu_);
  int64_t limit_ ABSL_GUARDED_BY(mu_) = 0;
  // Bytes of allocations between their limit check and their system call.
  int64_t reserved_ ABSL_GUARDED_BY(mu_) = 0;
  // NOTE [Host heap] (allocator.cc): freed pageable CPU blocks of at least 64 KiB, by their
  // size, kept for the next allocation of that size (1 GiB at most).
  std::unordered_map<int64_t, std::vector<void*>> host_cache_ ABSL_GUARDED_BY(mu_);
  int64_t host_cached_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  mutable absl::once_flag pinned_once_;
  mutable bool use_pinned_ = false;  // set once under pinned_once_
};

// Makes `allocator` the current one for its device on this thread until destroyed.
// Scopes nest; destroy them in reverse order of creation.
class ScopedAllocator {
 public:
  explicit ScopedAllocator(std::shared_ptr<Allocator> allocator);
  ~ScopedAllocator();
  ScopedAllocator(const ScopedAllocator&) = delete;
  ScopedAllocator& operator=(const ScopedAllocator&) = delete;

 private:
  std::shared_ptr<Allocator> previous_;
  Device device_;
};

}  // namespace core

#endif  // CORE_ALLOCATOR_H_
