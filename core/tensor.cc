#include "core/tensor.h"

#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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
  std::shared_ptr<Allocator> allocator = Allocator::Current(device);
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

absl::StatusOr<Tensor> Tensor::Allocate(const Shape& shape, DType dtype, MemoryTag tag,
                                        Device device) {
  const auto describe = [&] {
    return absl::StrCat("tensor ", ShapeToString(shape), " of ", DTypeName(dtype), " for tag ",
                        MemoryTagName(tag), " on ", device.ToString());
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
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate ", describe(), ": its size in bytes exceeds 2^63 (",
        absl::StrJoin(shape, " x "), " x ", element, " bytes)"));
  }
  absl::StatusOr<std::shared_ptr<Storage>> storage =
      Storage::Allocate(numel * element, device, tag);
  if (!storage.ok()) {
    return absl::Status(storage.status().code(),
                        absl::StrCat("cannot allocate ", describe(), " (", numel * element,
                                     " bytes): ", storage.status().message()));
  }
  return Tensor(*std::move(storage), 0, shape, dtype);
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
    return absl::InvalidArgumentError(absl::StrCat("FromVector: ", values.size(),
                                                   " values for shape ", ShapeToString(shape)));
  }
  absl::StatusOr<Tensor> t = Allocate(shape, DType::kFloat32, tag);
  if (!t.ok()) return t.status();
  if (!values.empty()) std::memcpy(t->raw_data(), values.data(), values.size() * sizeof(float));
  return t;
}

absl::StatusOr<Tensor> Tensor::FromInts(absl::Span<const int32_t> values, const Shape& shape,
                                        MemoryTag tag) {
  if (static_cast<int64_t>(values.size()) != NumElements(shape)) {
    return absl::InvalidArgumentError(absl::StrCat("FromInts: ", values.size(),
                                                   " values for shape ", ShapeToString(shape)));
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
    return absl::InvalidArgumentError(absl::StrCat("cannot reshape ", ShapeToString(shape_),
                                                   " into ", ShapeToString(shape)));
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
  absl::StatusOr<Tensor> out = Allocate(shape_, dtype, tag, device());
  if (!out.ok()) return out.status();
  absl::Status s = out->CopyFrom(*this);
  if (!s.ok()) return s;
  return out;
}

absl::Status Tensor::CopyFrom(const Tensor& src) const {
  if (!defined() || !src.defined()) {
    return absl::FailedPreconditionError("CopyFrom with an undefined tensor");
  }
  if (src.numel() != numel_) {
    return absl::InvalidArgumentError(absl::StrCat("CopyFrom: source has ", src.numel(),
                                                   " elements ", ShapeToString(src.shape()),
                                                   ", destination ", numel_, " ",
                                                   ShapeToString(shape_)));
  }
  if (numel_ == 0) return absl::OkStatus();
  if (src.dtype() == dtype_) {
    if (device().is_cpu() && src.device().is_cpu()) {
      std::memmove(raw_data(), src.raw_data(), nbytes());
      return absl::OkStatus();
    }
#ifdef FSDP_WITH_CUDA
    cudaError_t err = cudaMemcpy(raw_data(), src.raw_data(), nbytes(), cudaMemcpyDefault);
    if (err != cudaSuccess) {
      return absl::InternalError(absl::StrCat("cudaMemcpy ", src.device().ToString(), " -> ",
                                              device().ToString(),
                                              " failed: ", cudaGetErrorString(err)));
    }
    return absl::OkStatus();
#else
    return absl::UnavailableError("CopyFrom on a CUDA tensor in a build without CUDA");
#endif
  }
  if (!device().is_cpu() || !src.device().is_cpu()) {
    return absl::UnimplementedError(absl::StrCat("dtype conversion on ", device().ToString(),
                                                 " is not supported; convert on the CPU"));
  }
  if (src.dtype() == DType::kFloat32 && dtype_ == DType::kBFloat16) {
    const float* s = src.data<float>();
    BFloat16* d = data<BFloat16>();
    for (int64_t i = 0; i < numel_; ++i) d[i] = BFloat16::FromFloat(s[i]);
    return absl::OkStatus();
  }
  if (src.dtype() == DType::kBFloat16 && dtype_ == DType::kFloat32) {
    const BFloat16* s = src.data<BFloat16>();
    float* d = data<float>();
    for (int64_t i = 0; i < numel_; ++i) d[i] = s[i].ToFloat();
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("CopyFrom cannot convert ",
                                                 DTypeName(src.dtype()), " to ",
                                                 DTypeName(dtype_)));
}

void Tensor::Fill(float value) const {
  if (!defined() || numel_ == 0) return;
  if (!device().is_cpu()) {
#ifdef FSDP_WITH_CUDA
    const absl::Status filled = cuda::Fill(raw_data(), numel_, dtype_, value);
    CHECK(filled.ok()) << filled;
#endif
    return;
  }
  switch (dtype_) {
    case DType::kFloat32: {
      float* d = data<float>();
      for (int64_t i = 0; i < numel_; ++i) d[i] = value;
      break;
    }
    case DType::kBFloat16: {
      const BFloat16 h = BFloat16::FromFloat(value);
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
}

void Tensor::Zero() const {
  if (!defined() || numel_ == 0) return;
  if (device().is_cpu()) {
    std::memset(raw_data(), 0, nbytes());
  } else {
    Fill(0.0f);
  }
}

std::vector<float> Tensor::ToVector() const {
  std::vector<float> out(numel_);
  if (!defined() || !device().is_cpu()) return out;
  for (int64_t i = 0; i < numel_; ++i) {
    switch (dtype_) {
      case DType::kFloat32:
        out[i] = data<float>()[i];
        break;
      case DType::kBFloat16:
        out[i] = data<BFloat16>()[i].ToFloat();
        break;
      case DType::kInt32:
        out[i] = static_cast<float>(data<int32_t>()[i]);
        break;
    }
  }
  return out;
}

std::string Tensor::ToString() const {
  if (!defined()) return "Tensor(undefined)";
  return absl::StrCat("Tensor(", DTypeName(dtype_), ", ", ShapeToString(shape_), ", ",
                      device().ToString(), ")");
}

}  // namespace core
