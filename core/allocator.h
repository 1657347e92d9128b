// Per-device memory accounting: every tensor allocation goes through an Allocator, which
// counts current and peak bytes by tag. Tests and benchmarks read these counters; memory
// claims in this repo are measured here, never estimated.
//
//   core::Allocator& cpu = core::Allocator::Current(core::Device::Cpu());
//   cpu.ResetPeaks();
//   ... run a training step ...
//   int64_t peak_params = cpu.Stats().peak(core::MemoryTag::kParam);
//
// Ranks run as threads in one process each install their own allocator with a
// ScopedAllocator, so per-rank figures stay separate.
#ifndef CORE_ALLOCATOR_H_
#define CORE_ALLOCATOR_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
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

  int64_t current(MemoryTag tag) const { return current_by_tag[static_cast<int>(tag)]; }
  int64_t peak(MemoryTag tag) const { return peak_by_tag[static_cast<int>(tag)]; }

  // One line, e.g. "param=1.50MiB grad=0B ... total=2.00MiB" (peaks).
  std::string PeakSummary() const;
};

class Allocator {
 public:
  explicit Allocator(Device device);
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  Device device() const { return device_; }

  // Allocates `nbytes` (64-byte aligned; 0 gives a non-null unique block) and counts
  // them under `tag`. ResourceExhausted, naming the size, the tag and the device, when
  // the device has no memory left or the block would take this allocator's bytes in use
  // past limit(); InvalidArgument for a negative size; Unavailable for a CUDA device
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

  // Returns a block from Allocate with the same size and tag.
  void Free(void* ptr, int64_t nbytes, MemoryTag tag);

  MemoryStats Stats() const;

  // Sets every peak to the current value, so the next reading covers what follows.
  void ResetPeaks();

  // The process-wide allocator of `device`.
  static std::shared_ptr<Allocator> Default(Device device);

  // The allocator new storage on `device` uses on this thread: the innermost
  // ScopedAllocator's for that device, or Default(device).
  static std::shared_ptr<Allocator> Current(Device device);

 private:
  // Adds `delta` bytes under `tag` and `blocks` (+1 or -1) live blocks.
  void Count(int64_t delta, MemoryTag tag, int blocks);
  void CountLocked(int64_t delta, MemoryTag tag, int blocks) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Device device_;
  mutable absl::Mutex mu_;
  MemoryStats stats_ ABSL_GUARDED_BY(mu_);
  int64_t limit_ ABSL_GUARDED_BY(mu_) = 0;
  // Bytes of allocations between their limit check and their system call.
  int64_t reserved_ ABSL_GUARDED_BY(mu_) = 0;
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
