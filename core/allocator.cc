#include "core/allocator.h"

#include <cstdlib>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

#ifdef FSDP_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace core {
namespace {

constexpr int64_t kAlignment = 64;

// The innermost ScopedAllocator per device on this thread (CPU and up to 16 GPUs).
constexpr int kMaxDevices = 17;
thread_local std::shared_ptr<Allocator> current_allocators[kMaxDevices];

int Slot(Device device) {
  return device.is_cpu() ? 0 : 1 + (device.index % (kMaxDevices - 1));
}

}  // namespace

std::string MemoryTagName(MemoryTag tag) {
  switch (tag) {
    case MemoryTag::kParam:
      return "param";
    case MemoryTag::kGrad:
      return "grad";
    case MemoryTag::kOptim:
      return "optim";
    case MemoryTag::kActivation:
      return "activation";
    case MemoryTag::kComm:
      return "comm";
    case MemoryTag::kOther:
      return "other";
  }
  return "unknown";
}

std::string FormatBytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes < 1024) return absl::StrCat(bytes, "B");
  if (bytes < (int64_t{1} << 20)) return absl::StrFormat("%.2fKiB", b / 1024);
  if (bytes < (int64_t{1} << 30)) return absl::StrFormat("%.2fMiB", b / (1 << 20));
  return absl::StrFormat("%.2fGiB", b / (1 << 30));
}

std::string MemoryStats::PeakSummary() const {
  std::string out;
  for (int t = 0; t < kNumMemoryTags; ++t) {
    absl::StrAppend(&out, MemoryTagName(static_cast<MemoryTag>(t)), "=",
                    FormatBytes(peak_by_tag[t]), " ");
  }
  absl::StrAppend(&out, "total=", FormatBytes(peak_total));
  return out;
}

Allocator::Allocator(Device device) : device_(device) {}

absl::StatusOr<void*> Allocator::Allocate(int64_t nbytes, MemoryTag tag) {
  if (nbytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("allocation of a negative size (", nbytes, " bytes) on ", device_.ToString()));
  }
  void* ptr = nullptr;
  if (device_.is_cpu()) {
    const int64_t rounded = ((nbytes + kAlignment - 1) / kAlignment) * kAlignment;
    ptr = std::aligned_alloc(kAlignment, rounded == 0 ? kAlignment : rounded);
    if (ptr == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "out of host memory allocating ", FormatBytes(nbytes), " for tag ", MemoryTagName(tag)));
    }
  } else {
#ifdef FSDP_WITH_CUDA
    cudaError_t err = cudaSetDevice(device_.index);
    if (err == cudaSuccess) err = cudaMalloc(&ptr, nbytes == 0 ? kAlignment : nbytes);
    if (err != cudaSuccess) {
      const auto make_error = err == cudaErrorMemoryAllocation ? absl::ResourceExhaustedError
                                                                : absl::UnavailableError;
      return make_error(absl::StrCat(
          "cudaMalloc of ", FormatBytes(nbytes), " on ", device_.ToString(), " for tag ",
          MemoryTagName(tag), " failed: ", cudaGetErrorString(err)));
    }
#else
    return absl::UnavailableError(absl::StrCat(
        "cannot allocate on ", device_.ToString(),
        ": this build has no CUDA support; build with --config=cuda"));
#endif
  }
  Count(nbytes, tag, +1);
  return ptr;
}

void Allocator::Free(void* ptr, int64_t nbytes, MemoryTag tag) {
  if (ptr == nullptr) return;
  if (device_.is_cpu()) {
    std::free(ptr);
  } else {
#ifdef FSDP_WITH_CUDA
    cudaSetDevice(device_.index);
    cudaFree(ptr);
#endif
  }
  Count(-nbytes, tag, -1);
}

void Allocator::Count(int64_t delta, MemoryTag tag, int blocks) {
  absl::MutexLock lock(&mu_);
  const int t = static_cast<int>(tag);
  stats_.current_by_tag[t] += delta;
  stats_.current_total += delta;
  stats_.num_allocations += blocks;
  if (stats_.current_by_tag[t] > stats_.peak_by_tag[t]) {
    stats_.peak_by_tag[t] = stats_.current_by_tag[t];
  }
  if (stats_.current_total > stats_.peak_total) stats_.peak_total = stats_.current_total;
}

MemoryStats Allocator::Stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void Allocator::ResetPeaks() {
  absl::MutexLock lock(&mu_);
  stats_.peak_by_tag = stats_.current_by_tag;
  stats_.peak_total = stats_.current_total;
}

std::shared_ptr<Allocator> Allocator::Default(Device device) {
  static absl::Mutex mu;
  // Leaked on purpose: storage freed during static destruction still finds its allocator.
  static auto* defaults = new std::map<std::pair<int, int>, std::shared_ptr<Allocator>>();
  absl::MutexLock lock(&mu);
  auto& slot = (*defaults)[{static_cast<int>(device.type), device.index}];
  if (slot == nullptr) slot = std::make_shared<Allocator>(device);
  return slot;
}

std::shared_ptr<Allocator> Allocator::Current(Device device) {
  const auto& scoped = current_allocators[Slot(device)];
  if (scoped != nullptr && scoped->device() == device) return scoped;
  return Default(device);
}

ScopedAllocator::ScopedAllocator(std::shared_ptr<Allocator> allocator)
    : device_(allocator->device()) {
  previous_ = std::move(current_allocators[Slot(device_)]);
  current_allocators[Slot(device_)] = std::move(allocator);
}

ScopedAllocator::~ScopedAllocator() { current_allocators[Slot(device_)] = std::move(previous_); }

}  // namespace core
