#include "core/pinned_buffer.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace core {

absl::StatusOr<PinnedBuffer> PinnedBuffer::Allocate(int64_t nbytes, MemoryTag tag) {
  if (nbytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("pinned host buffer of a negative size (", nbytes, " bytes)"));
  }
  absl::StatusOr<std::shared_ptr<Storage>> storage =
      Storage::AllocateFrom(Allocator::PinnedHost(), nbytes, tag);
  if (!storage.ok()) {
    return Annotate(storage.status(),
                    absl::StrCat("cannot allocate a pinned host buffer of ", nbytes, " bytes"));
  }
  return PinnedBuffer(*std::move(storage));
}

absl::StatusOr<Tensor> PinnedBuffer::AsTensor(int64_t byte_offset, const Shape& shape,
                                              DType dtype) const {
  if (storage_ == nullptr) {
    return absl::FailedPreconditionError("AsTensor of an empty PinnedBuffer");
  }
  return Tensor::FromStorage(storage_, byte_offset, shape, dtype);
}

}  // namespace core
