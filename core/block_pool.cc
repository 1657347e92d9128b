#include "core/block_pool.h"

#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/format_bytes.h"

namespace core {

BlockPool::BlockPool(std::unique_ptr<SegmentSource> source, BlockPoolOptions options)
    : source_(std::move(source)), options_(options) {}

BlockPool::~BlockPool() {
  absl::MutexLock lock(&mu_);
  EmptyCacheLocked();
  // What is left belongs to segments with live blocks: forget the bookkeeping, keep the
  // memory (see the header).
  for (FreeSet* set : {&small_free_, &large_free_}) {
    for (Block* b : *set) delete b;
    set->clear();
  }
  for (auto& [ptr, b] : live_) delete b;
  live_.clear();
}

int64_t BlockPool::RoundSize(int64_t nbytes) const {
  const int64_t g = options_.min_block_size;
  if (nbytes <= g) return g;
  if (nbytes > std::numeric_limits<int64_t>::max() - g) return -1;
  return (nbytes + g - 1) / g * g;
}

int64_t BlockPool::SegmentSize(int64_t size) const {
  if (size <= options_.small_size) return options_.small_segment_size;
  if (size < options_.min_large_alloc) return options_.large_segment_size;
  const int64_t r = options_.large_round;
  if (size > std::numeric_limits<int64_t>::max() - r) return -1;
  return (size + r - 1) / r * r;
}

absl::StatusOr<BlockPool::Block*> BlockPool::NewSegmentLocked(int64_t size, bool small,
                                                              int64_t request) {
  const int64_t segment = SegmentSize(size);
  const auto describe = [&] {
    return absl::StrCat(FormatBytes(request), " (", request, " bytes, a block of ", size,
                        " in a segment of ", segment, ") on ", source_->Describe());
  };
  if (segment < 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", describe(), ": the size overflows"));
  }
  absl::StatusOr<void*> mem = source_->Allocate(segment);
  int64_t released = 0;
  if (!mem.ok() && absl::IsResourceExhausted(mem.status())) {
    // Out of memory: give the cached free segments back and try once more.
    ++stats_.num_oom_retries;
    released = EmptyCacheLocked();
    mem = source_->Allocate(segment);
  }
  if (!mem.ok()) {
    return absl::Status(
        mem.status().code(),
        absl::StrCat("cannot allocate ", describe(), ": ", mem.status().message(),
                     absl::IsResourceExhausted(mem.status())
                         ? absl::StrCat(" (also after releasing ", FormatBytes(released),
                                        " of cached free segments; this pool still reserves ",
                                        FormatBytes(stats_.reserved_bytes), ", of which ",
                                        FormatBytes(stats_.allocated_bytes), " is in use)")
                         : std::string()));
  }
  auto* block = new Block;
  block->ptr = static_cast<char*>(*mem);
  block->size = segment;
  block->small = small;
  ++stats_.num_segment_allocs;
  ++stats_.num_segments;
  stats_.reserved_bytes += segment;
  if (stats_.reserved_bytes > stats_.peak_reserved_bytes) {
    stats_.peak_reserved_bytes = stats_.reserved_bytes;
  }
  return block;
}

absl::StatusOr<void*> BlockPool::Allocate(int64_t nbytes) {
  if (nbytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("allocation of a negative size (", nbytes,
                                                   " bytes) on ", source_->Describe()));
  }
  const int64_t size = RoundSize(nbytes);
  if (size < 0) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", nbytes, " bytes on ",
                                                     source_->Describe(), ": the size overflows"));
  }
  const bool small = size <= options_.small_size;
  absl::MutexLock lock(&mu_);
  FreeSet& pool = PoolFor(small);
  Block key;
  key.size = size;
  key.ptr = nullptr;
  Block* block = nullptr;
  auto it = pool.lower_bound(&key);
  if (it != pool.end()) {
    block = *it;
    pool.erase(it);
  } else {
    absl::StatusOr<Block*> fresh = NewSegmentLocked(size, small, nbytes);
    if (!fresh.ok()) return fresh.status();
    block = *fresh;
  }
  // Split off the rest when it is worth keeping as a block of its own.
  const int64_t rest = block->size - size;
  if (small ? rest >= options_.min_block_size : rest > options_.small_size) {
    auto* tail = new Block;
    tail->ptr = block->ptr + size;
    tail->size = rest;
    tail->small = small;
    tail->prev = block;
    tail->next = block->next;
    if (block->next != nullptr) block->next->prev = tail;
    block->next = tail;
    block->size = size;
    pool.insert(tail);
  }
  block->allocated = true;
  live_[block->ptr] = block;
  ++stats_.num_blocks;
  stats_.allocated_bytes += block->size;
  if (stats_.allocated_bytes > stats_.peak_allocated_bytes) {
    stats_.peak_allocated_bytes = stats_.allocated_bytes;
  }
  return static_cast<void*>(block->ptr);
}

absl::Status BlockPool::Free(void* ptr) {
  absl::MutexLock lock(&mu_);
  auto it = live_.find(ptr);
  if (it == live_.end()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "free of %p on %s: not a live block of this pool (freed twice, or from another "
        "allocator)",
        ptr, source_->Describe()));
  }
  Block* block = it->second;
  live_.erase(it);
  block->allocated = false;
  --stats_.num_blocks;
  stats_.allocated_bytes -= block->size;
  FreeSet& pool = PoolFor(block->small);
  // Merge with free neighbours in the same segment.
  if (Block* prev = block->prev; prev != nullptr && !prev->allocated) {
    pool.erase(prev);
    prev->size += block->size;
    prev->next = block->next;
    if (block->next != nullptr) block->next->prev = prev;
    delete block;
    block = prev;
  }
  if (Block* next = block->next; next != nullptr && !next->allocated) {
    pool.erase(next);
    block->size += next->size;
    block->next = next->next;
    if (next->next != nullptr) next->next->prev = block;
    delete next;
  }
  pool.insert(block);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> BlockPool::BlockSize(void* ptr) const {
  absl::MutexLock lock(&mu_);
  auto it = live_.find(ptr);
  if (it == live_.end()) {
    return absl::NotFoundError(
        absl::StrFormat("%p is not a live block of the pool on %s", ptr, source_->Describe()));
  }
  return it->second->size;
}

int64_t BlockPool::EmptyCache() {
  absl::MutexLock lock(&mu_);
  return EmptyCacheLocked();
}

int64_t BlockPool::EmptyCacheLocked() {
  int64_t released = 0;
  for (FreeSet* set : {&small_free_, &large_free_}) {
    std::vector<Block*> whole;
    for (Block* b : *set) {
      if (b->prev == nullptr && b->next == nullptr) whole.push_back(b);
    }
    for (Block* b : whole) {
      set->erase(b);
      source_->Free(b->ptr, b->size);
      released += b->size;
      stats_.reserved_bytes -= b->size;
      --stats_.num_segments;
      ++stats_.num_segment_frees;
      delete b;
    }
  }
  return released;
}

BlockPoolStats BlockPool::Stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void BlockPool::ResetPeaks() {
  absl::MutexLock lock(&mu_);
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
}

}  // namespace core
