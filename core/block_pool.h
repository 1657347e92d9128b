// BlockPool: the device-independent heart of the CUDA caching allocator. It carves
// blocks out of large segments obtained from a SegmentSource (cudaMalloc on a GPU, malloc
// in tests), keeps freed blocks in a pool and hands them out again, so a training step
// that repeats the same allocations asks the source for nothing after its first step.
//
//   core::BlockPool pool(core::NewCudaSegmentSource(core::Device::Cuda(0)));
//   void* p = pool.Allocate(1000).value();   // a 1024-byte block of a new 2 MiB segment
//   pool.Free(p);                            // back to the pool, not to cudaFree
//   void* q = pool.Allocate(900).value();    // the same block again; no segment allocated
//   pool.EmptyCache();                       // returns wholly free segments to the source
//
// The policy follows PyTorch's CUDACachingAllocator:
//  * sizes round up to a multiple of 512 bytes (0 bytes gives a 512-byte block);
//  * blocks of at most 1 MiB come from the small pool, whose segments are 2 MiB; larger
//    blocks come from the large pool, whose segments are 20 MiB for requests under
//    10 MiB and the request rounded up to 2 MiB otherwise;
//  * a request takes the smallest free block of its pool that fits (best fit, lowest
//    address among equals) and splits it when the rest is worth keeping (>= 512 bytes in
//    the small pool, > 1 MiB in the large pool; a smaller rest stays part of the block);
//  * a freed block merges with its free neighbours in the same segment;
//  * when the source runs out of memory, every wholly free cached segment goes back to
//    the source and the request is tried once more.
// See NOTE [CUDA caching allocator and streams] in core/allocator.h for why host-side
// Free may hand a block straight to the next request. Thread-safe.
#ifndef CORE_BLOCK_POOL_H_
#define CORE_BLOCK_POOL_H_

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace core {

// Where a BlockPool's segments come from.
class SegmentSource {
 public:
  virtual ~SegmentSource() = default;
  // A new segment of exactly `nbytes` (> 0), aligned to at least 512 bytes.
  // ResourceExhausted when the device is out of memory (the pool then releases its cache
  // and retries once); any other error is returned to the caller as is.
  virtual absl::StatusOr<void*> Allocate(int64_t nbytes) = 0;
  // Returns a segment from Allocate with its size.
  virtual void Free(void* ptr, int64_t nbytes) = 0;
  // What the segments are, for messages: "cuda:0".
  virtual std::string Describe() const = 0;
};

// Counters of a BlockPool. "Reserved" is what the pool holds from its source (live
// segments); "allocated" is what it has handed out, in rounded block sizes.
struct BlockPoolStats {
  int64_t reserved_bytes = 0;
  int64_t peak_reserved_bytes = 0;  // since construction or the last ResetPeaks
  int64_t allocated_bytes = 0;
  int64_t peak_allocated_bytes = 0;
  int64_t num_segments = 0;        // live segments
  int64_t num_blocks = 0;          // blocks handed out and not yet freed
  int64_t num_segment_allocs = 0;  // successful SegmentSource::Allocate calls, ever
  int64_t num_segment_frees = 0;   // SegmentSource::Free calls, ever
  int64_t num_oom_retries = 0;     // out-of-memory answers that emptied the cache and retried
};

// Sizes that shape the pool; the defaults are PyTorch's.
struct BlockPoolOptions {
  int64_t min_block_size = 512;           // rounding granularity and smallest block
  int64_t small_size = int64_t{1} << 20;  // largest block of the small pool
  int64_t small_segment_size = int64_t{2} << 20;
  int64_t min_large_alloc = int64_t{10} << 20;  // requests below get a large_segment_size segment
  int64_t large_segment_size = int64_t{20} << 20;
  int64_t large_round = int64_t{2} << 20;  // larger requests: rounded up to this
};

class BlockPool {
 public:
  explicit BlockPool(std::unique_ptr<SegmentSource> source, BlockPoolOptions options = {});
  // Returns every wholly free segment to the source. Segments that still hold a block
  // handed out (a caller's bug) are left allocated rather than pulled from under it.
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // A block of at least `nbytes` bytes, 512-byte aligned relative to its segment.
  // InvalidArgument for a negative size; ResourceExhausted (naming the request, the
  // source, reserved and allocated bytes) when the source has no memory even after the
  // cache was emptied, or when the rounded size overflows; other source errors as is.
  absl::StatusOr<void*> Allocate(int64_t nbytes);

  // Returns a block from Allocate to the pool. InvalidArgument, naming the pointer, for a
  // pointer that is not a live block of this pool (nothing changes then).
  absl::Status Free(void* ptr);

  // The size of the block behind a live pointer from Allocate; NotFound otherwise.
  absl::StatusOr<int64_t> BlockSize(void* ptr) const;

  // Returns every wholly free segment to the source; returns the bytes released.
  int64_t EmptyCache();

  BlockPoolStats Stats() const;
  // Sets the peaks to the current values.
  void ResetPeaks();

  const BlockPoolOptions& options() const { return options_; }

  // The block size a request of `nbytes` (>= 0) gets before splitting decisions: a
  // multiple of min_block_size, at least min_block_size. -1 when it overflows.
  int64_t RoundSize(int64_t nbytes) const;
  // The size of the segment a new block of rounded size `size` is carved from.
  int64_t SegmentSize(int64_t size) const;

 private:
  struct Block {
    char* ptr = nullptr;
    int64_t size = 0;
    bool small = false;
    bool allocated = false;
    Block* prev = nullptr;  // neighbours in the same segment, by address
    Block* next = nullptr;
  };
  struct BySizeThenAddress {
    bool operator()(const Block* a, const Block* b) const {
      return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
    }
  };
  using FreeSet = std::set<Block*, BySizeThenAddress>;

  FreeSet& PoolFor(bool small) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return small ? small_free_ : large_free_;
  }
  // Allocates a new segment for a block of `size` in the given pool; ResourceExhausted
  // etc. from the source (after one retry with an emptied cache for ResourceExhausted).
  absl::StatusOr<Block*> NewSegmentLocked(int64_t size, bool small, int64_t request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t EmptyCacheLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<SegmentSource> source_;
  const BlockPoolOptions options_;
  mutable absl::Mutex mu_;
  FreeSet small_free_ ABSL_GUARDED_BY(mu_);
  FreeSet large_free_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<void*, Block*> live_ ABSL_GUARDED_BY(mu_);
  BlockPoolStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace core

#endif  // CORE_BLOCK_POOL_H_
