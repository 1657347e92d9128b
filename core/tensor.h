// Tensor: a contiguous, typed window (offset + shape) onto shared Storage. Copying a
// Tensor copies the handle, not the data; View() aliases and never allocates.
//
//   core::Tensor w = core::Tensor::Zeros({4, 3}, core::DType::kFloat32, core::MemoryTag::kParam);
//   core::Tensor row = w.View(3, {3}).value();   // second row, same storage
//   row.data<float>()[0] = 1.0f;                 // w[1][0] == 1
//   w.SharesStorage(row);                        // true
//
// A tensor may carry an autograd record (core/autograd.h, NOTE [Autograd]): the node of the
// differentiable op that produced it, or the leaf it stands for. Copies share the record;
// View, Reshape, Clone and the other methods here return tensors without one. Element
// access through data<T>() is for CPU tensors only.
//
// CUDA tensors (Device::Cuda(i), built with --config=cuda) live in the caching allocator's
// blocks (core/allocator.h). Their operations run on the compute stream (NOTE [Compute
// stream] in core/cuda_status.h): Fill, Zero, Clone, ToDType and device-to-device CopyFrom
// only queue work and return; CopyFrom into a CPU tensor, ToVector and anything that
// reads the host side wait for the data.
//
//   core::Tensor h = core::Tensor::FromVector({1, 2, 3}, {3}).value();
//   core::Tensor d = h.To(core::Device::Cuda(0), core::MemoryTag::kParam).value();
//   core::Tensor b = d.ToDType(core::DType::kBFloat16, core::MemoryTag::kParam).value();
//   std::vector<float> back = b.ToVector();  // {1, 2, 3}, copied to the host
#ifndef CORE_TENSOR_H_
#define CORE_TENSOR_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/allocator.h"
#include "core/device.h"
#include "core/dtype.h"

namespace core {

using Shape = std::vector<int64_t>;

// A tensor's autograd record, defined in core/autograd.h; a Tensor only carries it.
class AutogradMeta;

// Product of the dimensions (1 for a scalar shape {}); INT64_MAX when the product does
// not fit in an int64 (never undefined behaviour, whatever the shape).
int64_t NumElements(const Shape& shape);

// "[2, 3, 4]".
std::string ShapeToString(const Shape& shape);

// One block of device memory, freed through its allocator when the last Tensor
// referring to it goes away.
class Storage {
 public:
  // Allocates from Allocator::Current(device), counted under `tag`.
  static absl::StatusOr<std::shared_ptr<Storage>> Allocate(int64_t nbytes, Device device,
                                                           MemoryTag tag);
  // Allocates from `allocator` (e.g. Allocator::PinnedHost()), counted under `tag`.
  static absl::StatusOr<std::shared_ptr<Storage>> AllocateFrom(std::shared_ptr<Allocator> allocator,
                                                               int64_t nbytes, MemoryTag tag);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  int64_t nbytes() const { return nbytes_; }
  Device device() const { return allocator_->device(); }
  MemoryTag tag() const { return tag_; }
  // True for page-locked host memory (from Allocator::PinnedHost() where it pins).
  bool pinned() const { return allocator_->pinned(); }

  // NOTE [Autograd] (core/autograd.h): counts the in-place writes through the Tensor API
  // (CopyFrom, CopyFromAsync, TryFill, TryZero and what calls them) and the in-place ops
  // that bump it, so a backward can tell that a tensor it saved was changed since.
  uint64_t version() const { return version_.load(std::memory_order_relaxed); }
  void BumpVersion() { version_.fetch_add(1, std::memory_order_relaxed); }

 private:
  Storage(void* data, int64_t nbytes, MemoryTag tag, std::shared_ptr<Allocator> allocator);

  void* data_;
  int64_t nbytes_;
  MemoryTag tag_;
  std::shared_ptr<Allocator> allocator_;
  std::atomic<uint64_t> version_{0};
};

class Tensor {
 public:
  // An undefined tensor (no storage); defined() is false.
  Tensor() = default;

  // Allocates an uninitialised tensor: the fallible path, for any size that comes from
  // user input (configs, flags, files). Never aborts. InvalidArgument for a negative
  // dimension; ResourceExhausted when the byte count overflows int64, exceeds the
  // allocator's limit (Allocator::limit(): on the CPU the host's capacity) or the device
  // has no memory left. Messages name the shape, dtype, tag, device and byte count.
  static absl::StatusOr<Tensor> Allocate(const Shape& shape, DType dtype = DType::kFloat32,
                                         MemoryTag tag = MemoryTag::kOther,
                                         Device device = Device::Cpu());

  // Like Allocate, for shapes the caller has already validated and knows to be small
  // (internal buffers); aborts with Allocate's message if it fails. Sizes from user
  // input go through Allocate.
  static Tensor Empty(const Shape& shape, DType dtype = DType::kFloat32,
                      MemoryTag tag = MemoryTag::kOther, Device device = Device::Cpu());
  static Tensor Zeros(const Shape& shape, DType dtype = DType::kFloat32,
                      MemoryTag tag = MemoryTag::kOther, Device device = Device::Cpu());

  // Like Allocate, on the CPU in page-locked memory from Allocator::PinnedHost() (ordinary
  // host memory where the build or the machine cannot pin; see Storage::pinned()): the
  // staging buffer of fast host <-> device copies. Counted on the pinned allocator.
  static absl::StatusOr<Tensor> AllocatePinned(const Shape& shape, DType dtype = DType::kFloat32,
                                               MemoryTag tag = MemoryTag::kOther);

  // A tensor of `shape` and `dtype` over `storage`, starting `byte_offset` bytes in.
  // InvalidArgument when the offset is negative or not a multiple of the element size,
  // a dimension is negative, or the tensor would reach past the storage.
  static absl::StatusOr<Tensor> FromStorage(std::shared_ptr<Storage> storage, int64_t byte_offset,
                                            const Shape& shape, DType dtype);

  // CPU tensors holding a copy of `values`; InvalidArgument if the sizes differ.
  static absl::StatusOr<Tensor> FromVector(absl::Span<const float> values, const Shape& shape,
                                           MemoryTag tag = MemoryTag::kOther);
  static absl::StatusOr<Tensor> FromInts(absl::Span<const int32_t> values, const Shape& shape,
                                         MemoryTag tag = MemoryTag::kOther);

  // A tensor with a shape and dtype but no storage (defined() false, is_meta() true):
  // what a parameter built under core::DeferredInitScope holds until it is materialized
  // (NOTE [Deferred initialisation] in core/param_init.h). Nothing can read or write it;
  // numel(), shape(), dtype() and device() describe the tensor it stands for (the device
  // where it will be materialized: nn::ToDevice moves a deferred parameter by changing
  // it). Negative dimensions count as 0.
  static Tensor Meta(const Shape& shape, DType dtype = DType::kFloat32,
                     Device device = Device::Cpu());
  bool is_meta() const { return meta_; }

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  // Size of dimension `i`; negative `i` counts from the end.
  int64_t size(int64_t i) const { return shape_[i < 0 ? i + dim() : i]; }
  int64_t numel() const { return numel_; }
  int64_t nbytes() const { return numel_ * DTypeSize(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : meta_device_; }
  // Offset of the first element in its storage, in elements.
  int64_t offset() const { return offset_; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  // Raw pointer to the first element (device memory for CUDA tensors).
  void* raw_data() const;

  // Typed pointer to the first element. T must match dtype(): float, BFloat16, int32_t.
  template <typename T>
  T* data() const {
    return static_cast<T*>(raw_data());
  }

  // A tensor of `shape` starting `offset` elements after this one's first element, in
  // the same storage. InvalidArgument if it would reach outside this tensor.
  absl::StatusOr<Tensor> View(int64_t offset, const Shape& shape) const;

  // The same elements under another shape of equal numel; aliases.
  absl::StatusOr<Tensor> Reshape(const Shape& shape) const;

  // The same elements as a 1-D tensor; aliases.
  Tensor Flat() const;

  // True when both are defined and use the same storage block.
  bool SharesStorage(const Tensor& other) const;

  // A copy into fresh storage (same shape, dtype and device), counted under `tag`;
  // asynchronous on a CUDA device. Aborts if the allocation or the copy fails (use
  // To(device(), tag) for the fallible form).
  Tensor Clone(MemoryTag tag) const;

  // Converts into fresh storage of `dtype` on the same device (fp32 <-> bf16, rounding to
  // nearest even with core::FloatToBf16Bits; any dtype to itself), counted under `tag`.
  // On a CUDA device the conversion is a kernel on the compute stream. InvalidArgument
  // for int32 <-> float conversions; allocation errors as Allocate.
  absl::StatusOr<Tensor> ToDType(DType dtype, MemoryTag tag) const;

  // A copy on `device` (same shape and dtype) in fresh storage counted under `tag`.
  absl::StatusOr<Tensor> To(Device device, MemoryTag tag) const;

  // Copies `src`'s elements into this tensor in place: requires equal numel; converts
  // between fp32 and bf16 (as ToDType); copies between any two devices (host <-> device,
  // device <-> device). A copy into a CPU tensor has finished when this returns; a copy
  // into a CUDA tensor is queued on the compute stream of its device (the source may be
  // reused at once). FailedPrecondition for an undefined tensor, InvalidArgument for a
  // size or dtype mismatch, Unavailable for a CUDA tensor in a build without CUDA, the
  // CUDA error otherwise; messages name both tensors.
  absl::Status CopyFrom(const Tensor& src) const;

  // NOTE [Asynchronous host copies]: CopyFrom, except that a copy of the same dtype between
  // a CUDA tensor and page-locked host memory (Storage::pinned(): PinnedBuffer,
  // Allocator::PinnedHost()) is only queued on the compute stream of the CUDA side's
  // device. Until that device is synchronised (cuda::Synchronize, or a synchronous copy
  // into the host), the host side must not be read (device -> host) nor written (host ->
  // device). Every other pair (host only, pageable host memory, a conversion) is exactly
  // CopyFrom, finished as documented there.
  absl::Status CopyFromAsync(const Tensor& src) const;

  // Sets every element to `value` (converted to the dtype: bf16 rounds to nearest even,
  // int32 truncates); on a CUDA device a kernel queued on the compute stream, without
  // waiting. Returns the CUDA error (naming the tensor) if the launch is refused, or
  // Unavailable for a CUDA tensor in a build without CUDA; OK for an undefined tensor.
  absl::Status TryFill(float value) const;
  // TryFill(0), as a memset (cudaMemsetAsync on the compute stream for a CUDA tensor).
  absl::Status TryZero() const;
  // TryFill / TryZero for tensors whose device is known to work; abort on an error.
  void Fill(float value) const;
  void Zero() const;

  // Elements as floats (bf16 and int32 converted). A CUDA tensor is copied to the host
  // (waiting for its pending work); aborts if that copy fails.
  std::vector<float> ToVector() const;

  // NOTE [Autograd] (core/autograd.h): the graph record this handle carries (null for
  // tensors that no differentiable op produced and that are no leaf requiring gradients).
  const std::shared_ptr<AutogradMeta>& autograd_meta() const { return autograd_; }
  void set_autograd_meta(std::shared_ptr<AutogradMeta> meta) { autograd_ = std::move(meta); }

  // The storage's in-place write count (Storage::version); 0 for an undefined tensor.
  uint64_t version() const { return storage_ ? storage_->version() : 0; }

  // "Tensor(float32, [2, 3], cpu)" ("Tensor(float32, [2, 3], meta cpu)" for a meta tensor)
  // (shape and place only: no element is read, so it
  // never waits for a device).
  std::string ToString() const;

 private:
  Tensor(std::shared_ptr<Storage> storage, int64_t offset, Shape shape, DType dtype);

  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;
  Shape shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::kFloat32;
  bool meta_ = false;
  Device meta_device_ = Device::Cpu();  // a meta tensor's device
  std::shared_ptr<AutogradMeta> autograd_;
};

}  // namespace core

#endif  // CORE_TENSOR_H_
