#include "core/allocator.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/cuda/caching_allocator.h"
#include "core/host_memory.h"
#include "core/status_macros.h"

#ifdef FSDP_WITH_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda_status.h"
#endif

namespace core {
namespace {

constexpr int64_t kAlignment = 64;

// The innermost ScopedAllocator per device on this thread (CPU and up to 16 GPUs).
constexpr int kMaxDevices = 17;
thread_local std::shared_ptr<Allocator> current_allocators[kMaxDevices];

int Slot(Device device) { return device.is_cpu() ? 0 : 1 + (device.index % (kMaxDevices - 1)); }

// NOTE [Host heap]: a training step frees and allocates the same tensors again, step after step.
// glibc gives memory back to the system (the top of its heap past the trim threshold, and every
// chunk it mmapped), so a step whose frees return its activations pays page faults for every
// one of them in the next step: 5% of a small model's step with two ranks on two cores,
// depending only on the order of small and large frees (the autograd graph's small allocations
// made it happen every step). As a caching allocator keeps GPU memory (core/block_pool.h), the
// CPU allocator keeps freed blocks of at least kHostCacheMin bytes for the next allocation of
// the same size, up to kHostCacheMax bytes in all (EmptyCache and the allocator's destruction
// free them). glibc's own thresholds are left to adjust themselves: fixing the trim threshold
// with mallopt also fixes the mmap threshold at 128 KiB, so every larger allocation outside the
// tensors (oneDNN's GEMM scratch) was mmapped and faulted in anew on every call (2.8x the page
// faults of the library before the graph on config c, 0.95x its speed); fixing the mmap
// threshold higher slows the graph's small allocations by a third (core's autograd_bench). The
// memory figures by tag count tensors and do not change.
constexpr int64_t kHostCacheMin = int64_t{64} << 10;
constexpr int64_t kHostCacheMax = int64_t{1} << 30;

// The bytes a CPU block of `nbytes` takes: rounded up to the alignment (at least one
// alignment), or -1 when that overflows.
int64_t HostBlockBytes(int64_t nbytes) {
  if (nbytes > INT64_MAX - kAlignment) return -1;
  const int64_t rounded = ((nbytes + kAlignment - 1) / kAlignment) * kAlignment;
  return rounded == 0 ? kAlignment : rounded;
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

std::string MemoryStats::PeakSummary() const {
  std::string out;
  for (int t = 0; t < kNumMemoryTags; ++t) {
    absl::StrAppend(&out, MemoryTagName(static_cast<MemoryTag>(t)), "=",
                    FormatBytes(peak_by_tag[t]), " ");
  }
  absl::StrAppend(&out, "total=", FormatBytes(peak_total));
  if (peak_reserved_bytes > 0) {
    absl::StrAppend(&out, " reserved=", FormatBytes(peak_reserved_bytes));
  }
  return out;
}

Allocator::Allocator(Device device)
    : device_(device),
      pool_(device.is_cpu() ? nullptr
                            : std::make_unique<BlockPool>(cuda::NewCudaSegmentSource(device))) {
  if (device_.is_cpu()) limit_ = HostMemoryCapacityBytes();
}

Allocator::Allocator(Device device, std::unique_ptr<SegmentSource> source)
    : device_(device), pool_(std::make_unique<BlockPool>(std::move(source))) {}

Allocator::Allocator(Device device, HostKind host_kind) : device_(device), host_kind_(host_kind) {
  limit_ = HostMemoryCapacityBytes();
}

bool Allocator::UsePinned() const {
  if (host_kind_ != HostKind::kPinned) return false;
  absl::call_once(pinned_once_, [this] {
#ifdef FSDP_WITH_CUDA
    int n = 0;
    use_pinned_ = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
    if (!use_pinned_) cuda::ClearLastError();
#endif
  });
  return use_pinned_;
}

bool Allocator::pinned() const { return UsePinned(); }

int64_t Allocator::limit() const {
  absl::MutexLock lock(&mu_);
  return limit_;
}

void Allocator::SetLimit(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  limit_ = bytes > 0 ? bytes : 0;
}

absl::StatusOr<void*> Allocator::Allocate(int64_t nbytes, MemoryTag tag) {
  if (nbytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("allocation of a negative size (", nbytes,
                                                   " bytes) for tag ", MemoryTagName(tag), " on ",
                                                   device_.ToString()));
  }
  // Built only for an error message: this is the path of every tensor allocation.
  const auto what = [&] {
    return absl::StrCat(FormatBytes(nbytes), " (", nbytes, " bytes) for tag ", MemoryTagName(tag),
                        " on ", device_.ToString());
  };
  // Reserve the bytes against the limit before asking the system, so that concurrent
  // allocations cannot both pass the check; the counters change only on success.
  {
    absl::MutexLock lock(&mu_);
    const int64_t in_use = stats_.current_total + reserved_;
    if (limit_ > 0 && nbytes > limit_ - in_use) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", what(), ": ", FormatBytes(in_use),
                       " already in use and the limit is ", FormatBytes(limit_), " (", limit_,
                       " bytes; for the CPU the host's RAM + swap or cgroup limit), short by ",
                       FormatBytes(nbytes - (limit_ - in_use))));
    }
    reserved_ += nbytes;
  }
  void* ptr = nullptr;
  absl::Status failed;
  if (pool_ != nullptr) {
    absl::StatusOr<void*> block = pool_->Allocate(nbytes);
    if (block.ok()) {
      ptr = *block;
    } else {
      failed = Annotate(block.status(), absl::StrCat("cannot allocate ", what()));
    }
  } else if (UsePinned()) {
#ifdef FSDP_WITH_CUDA
    const cudaError_t err =
        cudaHostAlloc(&ptr, nbytes == 0 ? kAlignment : nbytes, cudaHostAllocPortable);
    if (err != cudaSuccess) {
      ptr = nullptr;
      cuda::ClearLastError();
      failed = cuda::StatusFromCuda(err, absl::StrCat("cudaHostAlloc (pinned) of ", what()));
    }
#endif
  } else if (device_.is_cpu()) {
    const int64_t bytes = HostBlockBytes(nbytes);
    if (bytes >= kHostCacheMin) {
      absl::MutexLock lock(&mu_);
      auto it = host_cache_.find(bytes);
      if (it != host_cache_.end() && !it->second.empty()) {
        ptr = it->second.back();
        it->second.pop_back();
        host_cached_bytes_ -= bytes;
      }
    }
    if (ptr == nullptr && bytes > 0) ptr = std::aligned_alloc(kAlignment, bytes);
    if (ptr == nullptr) {
      failed = absl::ResourceExhaustedError(absl::StrCat("out of host memory allocating ", what()));
    }
  } else {
    failed = absl::InternalError(
        absl::StrCat("cannot allocate ", what(), ": a device allocator without a pool"));
  }
  absl::MutexLock lock(&mu_);
  reserved_ -= nbytes;
  if (!failed.ok()) return failed;
  CountLocked(nbytes, tag, +1);
  return ptr;
}

void Allocator::Free(void* ptr, int64_t nbytes, MemoryTag tag) {
  if (ptr == nullptr) return;
  if (pool_ != nullptr) {
    const absl::Status freed = pool_->Free(ptr);
    if (!freed.ok()) {
      // A caller's bug (double free); the counters stay as they are.
      std::fprintf(stderr, "Allocator::Free of %s for tag %s: %s\n", FormatBytes(nbytes).c_str(),
                   MemoryTagName(tag).c_str(), std::string(freed.message()).c_str());
      return;
    }
  } else if (UsePinned()) {
#ifdef FSDP_WITH_CUDA
    if (cudaFreeHost(ptr) != cudaSuccess) cuda::ClearLastError();
#endif
  } else {
    const int64_t bytes = HostBlockBytes(nbytes);
    bool kept = false;
    if (bytes >= kHostCacheMin) {
      absl::MutexLock lock(&mu_);
      if (host_cached_bytes_ + bytes <= kHostCacheMax) {
        host_cache_[bytes].push_back(ptr);
        host_cached_bytes_ += bytes;
        kept = true;
      }
    }
    if (!kept) std::free(ptr);
  }
  Count(-nbytes, tag, -1);
}

void Allocator::Count(int64_t delta, MemoryTag tag, int blocks) {
  absl::MutexLock lock(&mu_);
  CountLocked(delta, tag, blocks);
}

void Allocator::CountLocked(int64_t delta, MemoryTag tag, int blocks) {
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
  MemoryStats out;
  {
    absl::MutexLock lock(&mu_);
    out = stats_;
  }
  if (pool_ != nullptr) {
    const BlockPoolStats p = pool_->Stats();
    out.reserved_bytes = p.reserved_bytes;
    out.peak_reserved_bytes = p.peak_reserved_bytes;
    out.num_device_mallocs = p.num_segment_allocs;
    out.num_device_frees = p.num_segment_frees;
    out.num_oom_retries = p.num_oom_retries;
  }
  return out;
}

void Allocator::ResetPeaks() {
  {
    absl::MutexLock lock(&mu_);
    stats_.peak_by_tag = stats_.current_by_tag;
    stats_.peak_total = stats_.current_total;
  }
  if (pool_ != nullptr) pool_->ResetPeaks();
}

int64_t Allocator::EmptyCache() {
  int64_t freed = 0;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [bytes, blocks] : host_cache_) {
      for (void* p : blocks) std::free(p);
      freed += bytes * static_cast<int64_t>(blocks.size());
    }
    host_cache_.clear();
    host_cached_bytes_ = 0;
  }
  return freed + (pool_ != nullptr ? pool_->EmptyCache() : 0);
}

Allocator::~Allocator() { EmptyCache(); }

std::shared_ptr<Allocator> Allocator::PinnedHost() {
  // Leaked on purpose, like Default's.
  static auto* pinned =
      new std::shared_ptr<Allocator>(new Allocator(Device::Cpu(), HostKind::kPinned));
  return *pinned;
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
