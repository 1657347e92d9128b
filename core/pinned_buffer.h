// PinnedBuffer: page-locked host memory for staging host <-> device copies (checkpoint
// I/O), with CPU tensors over it.
//
//   core::PinnedBuffer buf = core::PinnedBuffer::Allocate(shard.nbytes()).value();
//   core::Tensor host = buf.AsTensor(0, shard.shape(), shard.dtype()).value();
//   RETURN_IF_ERROR(host.CopyFrom(shard));      // device -> pinned host, done on return
//   write(fd, buf.data(), buf.size());
//
// Memory comes from Allocator::PinnedHost(): cudaHostAlloc (portable to every device) in
// a CUDA build with a usable device, ordinary host memory otherwise (pinned() tells which;
// copies are correct either way, only slower). A PinnedBuffer is a handle: copies share
// the memory, which is freed when the last handle and the last tensor over it are gone.
#ifndef CORE_PINNED_BUFFER_H_
#define CORE_PINNED_BUFFER_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "core/allocator.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace core {

class PinnedBuffer {
 public:
  // An empty buffer: defined() is false, size() 0.
  PinnedBuffer() = default;

  // `nbytes` (>= 0) of host memory, counted under `tag` on Allocator::PinnedHost().
  // InvalidArgument for a negative size; ResourceExhausted (naming the size) when the
  // host cannot provide it.
  static absl::StatusOr<PinnedBuffer> Allocate(int64_t nbytes, MemoryTag tag = MemoryTag::kOther);

  bool defined() const { return storage_ != nullptr; }
  void* data() const { return storage_ ? storage_->data() : nullptr; }
  int64_t size() const { return storage_ ? storage_->nbytes() : 0; }
  // True when the memory is page-locked.
  bool pinned() const { return storage_ != nullptr && storage_->pinned(); }

  // A CPU tensor of `shape` and `dtype` over the bytes starting at `byte_offset`; it keeps
  // the memory alive. InvalidArgument (as Tensor::FromStorage) when it does not fit or is
  // misaligned; FailedPrecondition for an empty buffer.
  absl::StatusOr<Tensor> AsTensor(int64_t byte_offset, const Shape& shape, DType dtype) const;

 private:
  explicit PinnedBuffer(std::shared_ptr<Storage> storage) : storage_(std::move(storage)) {}

  std::shared_ptr<Storage> storage_;
};

}  // namespace core

#endif  // CORE_PINNED_BUFFER_H_
