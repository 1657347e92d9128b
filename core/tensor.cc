#include "core/tensor.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/bf16_hd.h"
#include "core/cuda_status.h"
#include "core/op_profile.h"
#include "core/status_macros.h"
#include "glog/logging.h"

#ifdef FSDP_WITH_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda/kernels.h"
#endif

namespace core {

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) return std::numeric_limits<int64_t>::max();
  }
  return n;
}

std::string ShapeToString(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

Storage::Storage(void* data, int64_t nbytes, MemoryTag tag, std::shared_ptr<Allocator> allocator)
    : data_(data), nbytes_(nbytes), tag_(tag), allocator_(std::move(allocator)) {}

absl::StatusOr<std::shared_ptr<Storage>> Storage::Allocate(int64_t nbytes, Device device,
                                                           MemoryTag tag) {
  return AllocateFrom(Allocator::Current(device), nbytes, tag);
}

absl::StatusOr<std::shared_ptr<Storage>> Storage::AllocateFrom(std::shared_ptr<Allocator> allocator,
                                                               int64_t nbytes, MemoryTag tag) {
  absl::StatusOr<void*> ptr = allocator->Allocate(nbytes, tag);
  if (!ptr.ok()) return ptr.status();
  return std::shared_ptr<Storage>(new Storage(*ptr, nbytes, tag, std::move(allocator)));
}

Storage::~Storage() { allocator_->Free(data_, nbytes_, tag_); }

Tensor::Tensor(std::shared_ptr<Storage> storage, int64_t offset, Shape shape, DType dtype)
    : storage_(std::move(storage)),
      offset_(offset),
      shape_(std::move(shape)),
      numel_(NumElements(shape_)),
      dtype_(dtype) {}

namespace {

// Tensor::Allocate on `allocator` (null: Allocator::Current(device)).
absl::StatusOr<std::shared_ptr<Storage>> AllocateTensorStorage(const Shape& shape, DType dtype,
                                                               MemoryTag tag, Device device,
                                                               std::shared_ptr<Allocator> allocator,
                                                               int64_t* numel_out) {
  const auto describe = [&] {
    return absl::StrCat("tensor ", ShapeToString(shape), " of ", DTypeName(dtype), " for tag ",
                        MemoryTagName(tag), " on ", device.ToString(),
                        allocator != nullptr && allocator->pinned() ? " (pinned)" : "");
  };
  // numel and bytes with overflow checks: a shape from a config or a file may be huge.
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  bool empty = false;
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot allocate ", describe(), ": negative dimension ", d));
    }
    empty = empty || d == 0;
  }
  int64_t numel = empty ? 0 : 1;
  bool overflow = false;
  for (int64_t d : shape) {
    if (empty || overflow) break;
    if (numel > kMax / d) {
      overflow = true;
    } else {
      numel *= d;
    }
  }
  const int64_t element = DTypeSize(dtype);
  if (overflow || numel > kMax / element) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", describe(), ": its size in bytes exceeds 2^63 (",
                     absl::StrJoin(shape, " x "), " x ", element, " bytes)"));
  }
  absl::StatusOr<std::shared_ptr<Storage>> storage =
      allocator != nullptr ? Storage::AllocateFrom(std::move(allocator), numel * element, tag)
                           : Storage::Allocate(numel * element, device, tag);
  if (!storage.ok()) {
    return Annotate(storage.status(),
                    absl::StrCat("cannot allocate ", describe(), " (", numel * element, " bytes)"));
  }
  *numel_out = numel;
  return storage;
}

}  // namespace

absl::StatusOr<Tensor> Tensor::Allocate(const Shape& shape, DType dtype, MemoryTag tag,
                                        Device device) {
  int64_t numel = 0;
  absl::StatusOr<std::shared_ptr<Storage>> storage =
      AllocateTensorStorage(shape, dtype, tag, device, nullptr, &numel);
  if (!storage.ok()) return storage.status();
  return Tensor(*std::move(storage), 0, shape, dtype);
}

absl::StatusOr<Tensor> Tensor::AllocatePinned(const Shape& shape, DType dtype, MemoryTag tag) {
  int64_t numel = 0;
  absl::StatusOr<std::shared_ptr<Storage>> storage =
      AllocateTensorStorage(shape, dtype, tag, Device::Cpu(), Allocator::PinnedHost(), &numel);
  if (!storage.ok()) return storage.status();
  return Tensor(*std::move(storage), 0, shape, dtype);
}

absl::StatusOr<Tensor> Tensor::FromStorage(std::shared_ptr<Storage> storage, int64_t byte_offset,
                                           const Shape& shape, DType dtype) {
  if (storage == nullptr) return absl::InvalidArgumentError("FromStorage: no storage");
  const int64_t element = DTypeSize(dtype);
  const auto describe = [&] {
    return absl::StrCat("a ", DTypeName(dtype), " tensor ", ShapeToString(shape), " at byte ",
                        byte_offset, " of a ", storage->nbytes(), "-byte storage on ",
                        storage->device().ToString());
  };
  if (byte_offset < 0 || byte_offset % element != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot place ", describe(), ": the offset must be a non-negative multiple of ", element));
  }
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot place ", describe(), ": negative dimension ", d));
    }
  }
  const int64_t numel = NumElements(shape);  // saturates
  const int64_t room =
      byte_offset > storage->nbytes() ? -1 : (storage->nbytes() - byte_offset) / element;
  if (room < 0 || numel > room) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot place ", describe(), ": it reaches past the storage"));
  }
  return Tensor(std::move(storage), byte_offset / element, shape, dtype);
}

Tensor Tensor::Empty(const Shape& shape, DType dtype, MemoryTag tag, Device device) {
  absl::StatusOr<Tensor> t = Allocate(shape, dtype, tag, device);
  // The documented abort of the infallible API; sizes from user input go through
  // Allocate (or Module::RegisterParameter's StatusOr overload) instead.
  CHECK(t.ok()) << t.status();
  return *std::move(t);
}

Tensor Tensor::Zeros(const Shape& shape, DType dtype, MemoryTag tag, Device device) {
  Tensor t = Empty(shape, dtype, tag, device);
  t.Zero();
  return t;
}

absl::StatusOr<Tensor> Tensor::FromVector(absl::Span<const float> values, const Shape& shape,
                                          MemoryTag tag) {
  if (static_cast<int64_t>(values.size()) != NumElements(shape)) {
    return absl::InvalidArgumentError(
        absl::StrCat("FromVector: ", values.size(), " values for shape ", ShapeToString(shape)));
  }
  absl::StatusOr<Tensor> t = Allocate(shape, DType::kFloat32, tag);
  if (!t.ok()) return t.status();
  if (!values.empty()) std::memcpy(t->raw_data(), values.data(), values.size() * sizeof(float));
  return t;
}

absl::StatusOr<Tensor> Tensor::FromInts(absl::Span<const int32_t> values, const Shape& shape,
                                        MemoryTag tag) {
  if (static_cast<int64_t>(values.size()) != NumElements(shape)) {
    return absl::InvalidArgumentError(
        absl::StrCat("FromInts: ", values.size(), " values for shape ", ShapeToString(shape)));
  }
  absl::StatusOr<Tensor> t = Allocate(shape, DType::kInt32, tag);
  if (!t.ok()) return t.status();
  if (!values.empty()) {
    std::memcpy(t->raw_data(), values.data(), values.size() * sizeof(int32_t));
  }
  return t;
}

void* Tensor::raw_data() const {
  if (storage_ == nullptr) return nullptr;
  return static_cast<char*>(storage_->data()) + offset_ * DTypeSize(dtype_);
}

absl::StatusOr<Tensor> Tensor::View(int64_t offset, const Shape& shape) const {
  if (!defined()) return absl::FailedPreconditionError("View of an undefined tensor");
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("View shape ", ShapeToString(shape), " has a negative dimension"));
    }
  }
  const int64_t n = NumElements(shape);  // saturates rather than overflowing
  if (offset < 0 || offset > numel_ || n > numel_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "View of ", n, " elements at offset ", offset, " with shape ", ShapeToString(shape),
        " reaches outside a tensor of ", numel_, " elements ", ShapeToString(shape_)));
  }
  return Tensor(storage_, offset_ + offset, shape, dtype_);
}

absl::StatusOr<Tensor> Tensor::Reshape(const Shape& shape) const {
  if (NumElements(shape) != numel_) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot reshape ", ShapeToString(shape_), " into ", ShapeToString(shape)));
  }
  return View(0, shape);
}

Tensor Tensor::Flat() const { return Tensor(storage_, offset_, {numel_}, dtype_); }

bool Tensor::SharesStorage(const Tensor& other) const {
  return storage_ != nullptr && storage_ == other.storage_;
}

Tensor Tensor::Clone(MemoryTag tag) const {
  if (!defined()) return Tensor();
  Tensor out = Empty(shape_, dtype_, tag, device());
  const absl::Status copied = out.CopyFrom(*this);
  CHECK(copied.ok()) << copied;
  return out;
}

absl::StatusOr<Tensor> Tensor::ToDType(DType dtype, MemoryTag tag) const {
  if (!defined()) return absl::FailedPreconditionError("ToDType of an undefined tensor");
  if (dtype != dtype_ && (dtype == DType::kInt32 || dtype_ == DType::kInt32)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ToDType cannot convert ", ToString(), " to ", DTypeName(dtype)));
  }
  absl::StatusOr<Tensor> out = Allocate(shape_, dtype, tag, device());
  if (!out.ok()) return out.status();
  RETURN_IF_ERROR(out->CopyFrom(*this));
  return out;
}

absl::StatusOr<Tensor> Tensor::To(Device device, MemoryTag tag) const {
  if (!defined()) return absl::FailedPreconditionError("To() of an undefined tensor");
  absl::StatusOr<Tensor> out = Allocate(shape_, dtype_, tag, device);
  if (!out.ok()) return out.status();
  RETURN_IF_ERROR(out->CopyFrom(*this));
  return out;
}

namespace {

// Element conversion on the host with the FSDP_HD bodies the CUDA kernels use.
void ConvertOnHost(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n) {
  if (src_dtype == DType::kFloat32 && dst_dtype == DType::kBFloat16) {
    const float* s = static_cast<const float*>(src);
    uint16_t* d = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = FloatToBf16Bits(s[i]);
  } else {  // bf16 -> fp32, the only other conversion
    const uint16_t* s = static_cast<const uint16_t*>(src);
    float* d = static_cast<float*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = Bf16BitsToFloat(s[i]);
  }
}

#ifdef FSDP_WITH_CUDA
// Copies `nbytes` between any two places, at least one on a device. Into the host: done
// on return. Into a device: queued on that device's compute stream.
absl::Status CopyBytes(void* dst, Device dst_device, const void* src, Device src_device,
                       int64_t nbytes, const std::string& what) {
  if (dst_device.is_cpu()) {
    // Device -> host: cudaMemcpy on the source's legacy stream runs after its queued
    // work and returns when the data is on the host.
    RETURN_IF_ERROR(cuda::SetDevice(src_device));
    return cuda::StatusFromCuda(cudaMemcpy(dst, src, nbytes, cudaMemcpyDeviceToHost),
                                absl::StrCat("cudaMemcpy device -> host for ", what));
  }
  RETURN_IF_ERROR(cuda::SetDevice(dst_device));
  if (src_device.is_cpu()) {
    // Host -> device: cudaMemcpy returns once the source may be reused (staged or, from
    // pinned memory, copied); the data lands before later compute-stream work.
    return cuda::StatusFromCuda(cudaMemcpy(dst, src, nbytes, cudaMemcpyHostToDevice),
                                absl::StrCat("cudaMemcpy host -> device for ", what));
  }
  if (src_device != dst_device) {
    // Another device's compute stream is not ordered with this one: let it finish.
    RETURN_IF_ERROR(cuda::Synchronize(src_device));
    RETURN_IF_ERROR(cuda::SetDevice(dst_device));
  }
  return cuda::StatusFromCuda(
      cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, cuda::ComputeStream()),
      absl::StrCat("cudaMemcpyAsync device -> device for ", what));
}
#endif  // FSDP_WITH_CUDA

}  // namespace

absl::Status Tensor::CopyFromAsync(const Tensor& src) const {
#ifdef FSDP_WITH_CUDA
  if (defined() && src.defined() && src.numel() == numel_ && src.dtype() == dtype_ && numel_ > 0 &&
      device().is_cpu() != src.device().is_cpu()) {
    const Tensor& host = device().is_cpu() ? *this : src;
    const Device cuda_device = device().is_cpu() ? src.device() : device();
    if (host.storage()->pinned()) {
      storage_->BumpVersion();  // CopyFrom bumps it on every other path
      ProfiledOp op(OpCategory::kConvert, "copy_async", cuda_device,
                    OpCost{0, static_cast<double>(2 * nbytes()), 1, OpEngine::kMemory});
      RETURN_IF_ERROR(cuda::SetDevice(cuda_device));
      return cuda::StatusFromCuda(
          cudaMemcpyAsync(raw_data(), src.raw_data(), nbytes(), cudaMemcpyDefault,
                          cuda::ComputeStream()),
          absl::StrCat("cudaMemcpyAsync ", src.ToString(), " -> ", ToString()));
    }
  }
#endif  // FSDP_WITH_CUDA
  return CopyFrom(src);
}

absl::Status Tensor::CopyFrom(const Tensor& src) const {
  if (!defined() || !src.defined()) {
    return absl::FailedPreconditionError("CopyFrom with an undefined tensor");
  }
  storage_->BumpVersion();
  const auto what = [&] { return absl::StrCat(src.ToString(), " -> ", ToString()); };
  if (src.numel() != numel_) {
    return absl::InvalidArgumentError(
        absl::StrCat("CopyFrom: source has ", src.numel(), " elements ", ShapeToString(src.shape()),
                     ", destination ", numel_, " ", ShapeToString(shape_)));
  }
  const bool convert = src.dtype() != dtype_;
  if (convert && (src.dtype() == DType::kInt32 || dtype_ == DType::kInt32)) {
    return absl::InvalidArgumentError(absl::StrCat("CopyFrom cannot convert ",
                                                   DTypeName(src.dtype()), " to ",
                                                   DTypeName(dtype_), " (", what(), ")"));
  }
  if (numel_ == 0) return absl::OkStatus();
  const bool host_only = device().is_cpu() && src.device().is_cpu();
  // NOTE [Op accounting]: a copy or cast on one device is a bandwidth-bound kernel; one
  // between the host and a device is a synchronous transfer.
  const bool same_device = device() == src.device();
  ProfiledOp op(same_device ? OpCategory::kConvert : OpCategory::kHostSync,
                convert ? "convert" : "copy", device(),
                OpCost{0, static_cast<double>(nbytes() + src.nbytes()), same_device ? 1 : 0,
                       same_device ? OpEngine::kMemory : OpEngine::kHostSync});
  if (host_only) {
    if (convert) {
      ConvertOnHost(src.raw_data(), src.dtype(), raw_data(), dtype_, numel_);
    } else {
      std::memmove(raw_data(), src.raw_data(), nbytes());
    }
    return absl::OkStatus();
  }
#ifdef FSDP_WITH_CUDA
  if (!convert) {
    return CopyBytes(raw_data(), device(), src.raw_data(), src.device(), nbytes(), what());
  }
  if (device().is_cpu()) {
    // Device -> host with conversion: bring the source's bytes over, convert on the host.
    absl::StatusOr<Tensor> staged = Allocate({numel_}, src.dtype(), MemoryTag::kOther);
    if (!staged.ok()) return staged.status();
    if (absl::Status s = CopyBytes(staged->raw_data(), Device::Cpu(), src.raw_data(), src.device(),
                                   src.nbytes(), what());
        !s.ok()) {
      return s;
    }
    ConvertOnHost(staged->raw_data(), src.dtype(), raw_data(), dtype_, numel_);
    return absl::OkStatus();
  }
  if (src.device().is_cpu()) {
    // Host -> device with conversion: convert on the host, copy the result's bytes.
    absl::StatusOr<Tensor> staged = Allocate({numel_}, dtype_, MemoryTag::kOther);
    if (!staged.ok()) return staged.status();
    ConvertOnHost(src.raw_data(), src.dtype(), staged->raw_data(), dtype_, numel_);
    return CopyBytes(raw_data(), device(), staged->raw_data(), Device::Cpu(), nbytes(), what());
  }
  // Device -> device with conversion: a kernel on the destination's device, reading a
  // same-device copy of the source when it lives elsewhere.
  Tensor input = src;
  if (src.device() != device()) {
    absl::StatusOr<Tensor> moved = src.To(device(), MemoryTag::kOther);
    if (!moved.ok()) return moved.status();
    input = *std::move(moved);
  }
  RETURN_IF_ERROR(cuda::SetDevice(device()));
  absl::Status launched =
      dtype_ == DType::kBFloat16
          ? cuda::ConvertFloatToBf16(input.data<float>(), static_cast<uint16_t*>(raw_data()),
                                     numel_)
          : cuda::ConvertBf16ToFloat(static_cast<const uint16_t*>(input.raw_data()), data<float>(),
                                     numel_);
  if (!launched.ok()) {
    return Annotate(launched, what());
  }
  return absl::OkStatus();
#else
  return absl::UnavailableError(absl::StrCat("cannot copy ", what(),
                                             ": this build has no CUDA support; build with "
                                             "--config=cuda"));
#endif
}

absl::Status Tensor::TryFill(float value) const {
  if (!defined() || numel_ == 0) return absl::OkStatus();
  storage_->BumpVersion();
  if (!device().is_cpu()) {
#ifdef FSDP_WITH_CUDA
    absl::Status filled = cuda::SetDevice(device());
    if (filled.ok()) filled = cuda::Fill(raw_data(), numel_, dtype_, value);
    if (!filled.ok()) {
      return Annotate(filled, absl::StrCat("Fill of ", ToString()));
    }
    return absl::OkStatus();
#else
    return absl::UnavailableError(
        absl::StrCat("Fill of ", ToString(), ": this build has no CUDA support"));
#endif
  }
  switch (dtype_) {
    case DType::kFloat32: {
      float* d = data<float>();
      for (int64_t i = 0; i < numel_; ++i) d[i] = value;
      break;
    }
    case DType::kBFloat16: {
      BFloat16 h;
      h.bits = FloatToBf16Bits(value);
      BFloat16* d = data<BFloat16>();
      for (int64_t i = 0; i < numel_; ++i) d[i] = h;
      break;
    }
    case DType::kInt32: {
      int32_t* d = data<int32_t>();
      for (int64_t i = 0; i < numel_; ++i) d[i] = static_cast<int32_t>(value);
      break;
    }
  }
  return absl::OkStatus();
}

absl::Status Tensor::TryZero() const {
  if (!defined() || numel_ == 0) return absl::OkStatus();
  storage_->BumpVersion();
  // NOTE [Op accounting]: a memset writes the tensor once.
  ProfiledOp op(OpCategory::kElementwise, "zero", device(),
                OpCost::Memory(static_cast<double>(nbytes())));
  if (device().is_cpu()) {
    std::memset(raw_data(), 0, nbytes());
    return absl::OkStatus();
  }
#ifdef FSDP_WITH_CUDA
  absl::Status zeroed = cuda::SetDevice(device());
  if (zeroed.ok()) {
    zeroed = cuda::StatusFromCuda(cudaMemsetAsync(raw_data(), 0, nbytes(), cuda::ComputeStream()),
                                  absl::StrCat("Zero of ", ToString(), ": cudaMemsetAsync"));
  }
  return zeroed;
#else
  return absl::UnavailableError(
      absl::StrCat("Zero of ", ToString(), ": this build has no CUDA support"));
#endif
}

void Tensor::Fill(float value) const {
  const absl::Status s = TryFill(value);
  CHECK(s.ok()) << s;
}

void Tensor::Zero() const {
  const absl::Status s = TryZero();
  CHECK(s.ok()) << s;
}

std::vector<float> Tensor::ToVector() const {
  if (defined() && !device().is_cpu()) {
    absl::StatusOr<Tensor> host = To(Device::Cpu(), MemoryTag::kOther);
    CHECK(host.ok()) << "ToVector of " << ToString() << ": " << host.status();
    return host->ToVector();
  }
  std::vector<float> out(numel_);
  if (!defined()) return out;
  for (int64_t i = 0; i < numel_; ++i) {
    switch (dtype_) {
      case DType::kFloat32:
        out[i] = data<float>()[i];
        break;
      case DType::kBFloat16:
        out[i] = Bf16BitsToFloat(data<BFloat16>()[i].bits);
        break;
      case DType::kInt32:
        out[i] = static_cast<float>(data<int32_t>()[i]);
        break;
    }
  }
  return out;
}

Tensor Tensor::Meta(const Shape& shape, DType dtype, Device device) {
  Shape clamped = shape;
  for (int64_t& d : clamped) d = std::max<int64_t>(d, 0);
  Tensor t(nullptr, 0, std::move(clamped), dtype);
  t.meta_ = true;
  t.meta_device_ = device;
  return t;
}

std::string Tensor::ToString() const {
  if (meta_) {
    return absl::StrCat("Tensor(", DTypeName(dtype_), ", ", ShapeToString(shape_), ", meta ",
                        meta_device_.ToString(), ")");
  }
  if (!defined()) return "Tensor(undefined)";
  return absl::StrCat("Tensor(", DTypeName(dtype_), ", ", ShapeToString(shape_), ", ",
                      device().ToString(), ")");
}

}  // namespace core
