#include "checkpoint/internal/host_staging.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

#ifdef FSDP_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace checkpoint {
namespace internal {

absl::StatusOr<std::unique_ptr<PinnedBuffer>> PinnedBuffer::Allocate(int64_t nbytes,
                                                                     const std::string& what) {
  if (nbytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": pinned buffer of ", nbytes, " bytes"));
  }
#ifdef FSDP_WITH_CUDA
  void* p = nullptr;
  const cudaError_t err = cudaMallocHost(&p, static_cast<size_t>(nbytes > 0 ? nbytes : 1));
  if (err != cudaSuccess) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": cudaMallocHost of ", nbytes,
                                                     " bytes failed: ", cudaGetErrorString(err)));
  }
  return std::unique_ptr<PinnedBuffer>(new PinnedBuffer(p, nbytes));
#else
  return absl::UnavailableError(
      absl::StrCat(what, ": pinned host memory needs a build with --config=cuda"));
#endif
}

PinnedBuffer::~PinnedBuffer() {
#ifdef FSDP_WITH_CUDA
  if (data_ != nullptr) cudaFreeHost(data_);
#endif
}

absl::Status ConvertHostElements(const void* src, core::DType src_dtype, void* dst,
                                 core::DType dst_dtype, int64_t n, const std::string& what) {
  if (n <= 0) return absl::OkStatus();
  if (src_dtype == dst_dtype) {
    std::memcpy(dst, src, static_cast<size_t>(n * core::DTypeSize(src_dtype)));
    return absl::OkStatus();
  }
  if (src_dtype == core::DType::kFloat32 && dst_dtype == core::DType::kBFloat16) {
    const float* s = static_cast<const float*>(src);
    core::BFloat16* d = static_cast<core::BFloat16*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = core::BFloat16::FromFloat(s[i]);
    return absl::OkStatus();
  }
  if (src_dtype == core::DType::kBFloat16 && dst_dtype == core::DType::kFloat32) {
    const core::BFloat16* s = static_cast<const core::BFloat16*>(src);
    float* d = static_cast<float*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = s[i].ToFloat();
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(what, ": cannot convert ",
                                                 core::DTypeName(src_dtype), " to ",
                                                 core::DTypeName(dst_dtype)));
}

absl::StatusOr<HostBytes> HostBytes::Of(const core::Tensor& t, core::DType dtype,
                                        const std::string& what) {
  HostBytes out;
  out.nbytes_ = t.numel() * core::DTypeSize(dtype);
  if (t.device().is_cpu()) {
    if (t.dtype() == dtype) {
      out.cpu_ = t;
    } else {
      absl::StatusOr<core::Tensor> c = t.ToDType(dtype, core::MemoryTag::kOther);
      if (!c.ok()) return absl::Status(c.status().code(), absl::StrCat(what, ": ", c.status().message()));
      out.cpu_ = *std::move(c);
    }
    out.data_ = out.cpu_.raw_data();
    return out;
  }
#ifdef FSDP_WITH_CUDA
  const int64_t src_bytes = t.nbytes();
  ASSIGN_OR_RETURN(std::unique_ptr<PinnedBuffer> raw, PinnedBuffer::Allocate(src_bytes, what));
  cudaError_t err = cudaSetDevice(t.device().index);
  // Synchronous with the legacy default stream: earlier kernels' results are copied.
  if (err == cudaSuccess && src_bytes > 0) {
    err = cudaMemcpy(raw->data(), t.raw_data(), static_cast<size_t>(src_bytes),
                     cudaMemcpyDeviceToHost);
  }
  if (err != cudaSuccess) {
    return absl::InternalError(absl::StrCat(what, ": copying ", t.ToString(),
                                            " to pinned host memory: ", cudaGetErrorString(err)));
  }
  if (t.dtype() == dtype) {
    out.pinned_ = std::move(raw);
    out.data_ = out.pinned_->data();
    return out;
  }
  ASSIGN_OR_RETURN(std::unique_ptr<PinnedBuffer> converted,
                   PinnedBuffer::Allocate(out.nbytes_, what));
  RETURN_IF_ERROR(ConvertHostElements(raw->data(), t.dtype(), converted->data(), dtype,
                                      t.numel(), what));
  out.pinned_ = std::move(converted);
  out.data_ = out.pinned_->data();
  return out;
#else
  return absl::UnavailableError(absl::StrCat(what, ": ", t.ToString(),
                                             " is on a device this build (no CUDA) cannot read"));
#endif
}

absl::Status CopyHostToTensor(const core::Tensor& dst, const core::Tensor& src,
                              const std::string& what) {
  if (!src.device().is_cpu()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": CopyHostToTensor source ", src.ToString(), " is not on the CPU"));
  }
  if (dst.numel() != src.numel()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", src.numel(),
                                                   " elements into ", dst.ToString()));
  }
  if (dst.device().is_cpu()) {
    absl::Status s = dst.CopyFrom(src);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
    return absl::OkStatus();
  }
#ifdef FSDP_WITH_CUDA
  ASSIGN_OR_RETURN(std::unique_ptr<PinnedBuffer> staged, PinnedBuffer::Allocate(dst.nbytes(), what));
  RETURN_IF_ERROR(ConvertHostElements(src.raw_data(), src.dtype(), staged->data(), dst.dtype(),
                                      src.numel(), what));
  cudaError_t err = cudaSetDevice(dst.device().index);
  if (err == cudaSuccess && dst.nbytes() > 0) {
    // Synchronous: the pinned buffer may be freed when this returns.
    err = cudaMemcpy(dst.raw_data(), staged->data(), static_cast<size_t>(dst.nbytes()),
                     cudaMemcpyHostToDevice);
  }
  if (err != cudaSuccess) {
    return absl::InternalError(absl::StrCat(what, ": copying into ", dst.ToString(),
                                            " from pinned host memory: ", cudaGetErrorString(err)));
  }
  return absl::OkStatus();
#else
  return absl::UnavailableError(
      absl::StrCat(what, ": ", dst.ToString(), " is on a device this build (no CUDA) cannot write"));
#endif
}

}  // namespace internal
}  // namespace checkpoint
