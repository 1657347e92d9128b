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

// Formats a byte count as "512B", "1.50KiB", "3.25MiB", "1.00GiB".
std::string FormatBytes(int64_t bytes);

class Allocator {
 public:
  explicit Allocator(Device device);
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  Device device() const { return device_; }

  // Allocates `nbytes` (64-byte aligned; 0 gives a non-null unique block) and counts
  // them under `tag`. ResourceExhausted when the device has no memory left;
  // Unavailable for a CUDA device when the build has no CUDA.
  absl::StatusOr<void*> Allocate(int64_t nbytes, MemoryTag tag);

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

  const Device device_;
  mutable absl::Mutex mu_;
  MemoryStats stats_ ABSL_GUARDED_BY(mu_);
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
