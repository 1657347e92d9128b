#include "checkpoint/internal/host_staging.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/pinned_buffer.h"
#include "core/status_macros.h"

#ifdef FSDP_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace checkpoint {
namespace internal {

absl::StatusOr<core::Tensor> PinnedStaging(int64_t numel, core::DType dtype,
                                           const std::string& what) {
  absl::StatusOr<core::PinnedBuffer> buffer =
      core::PinnedBuffer::Allocate(numel * core::DTypeSize(dtype), kStagingTag);
  if (!buffer.ok()) return core::Annotate(buffer.status(), what);
  absl::StatusOr<core::Tensor> t = buffer->AsTensor(0, {numel}, dtype);
  if (!t.ok()) return core::Annotate(t.status(), what);
  return t;
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
      if (!c.ok()) return core::Annotate(c.status(), what);
      out.cpu_ = *std::move(c);
    }
    return out;
  }
#ifdef FSDP_WITH_CUDA
  ASSIGN_OR_RETURN(core::Tensor raw, PinnedStaging(t.numel(), t.dtype(), what));
  const int64_t src_bytes = t.nbytes();
  cudaError_t err = cudaSetDevice(t.device().index);
  // Synchronous with the legacy default stream: earlier kernels' results are copied.
  if (err == cudaSuccess && src_bytes > 0) {
    err = cudaMemcpy(raw.raw_data(), t.raw_data(), static_cast<size_t>(src_bytes),
                     cudaMemcpyDeviceToHost);
  }
  if (err != cudaSuccess) {
    return absl::InternalError(absl::StrCat(what, ": copying ", t.ToString(),
                                            " to pinned host memory: ", cudaGetErrorString(err)));
  }
  if (t.dtype() == dtype) {
    out.cpu_ = std::move(raw);
    return out;
  }
  ASSIGN_OR_RETURN(out.cpu_, PinnedStaging(t.numel(), dtype, what));
  RETURN_IF_ERROR(core::Annotate(out.cpu_.CopyFrom(raw), what));
  return out;
#else
  return absl::UnavailableError(
      absl::StrCat(what, ": ", t.ToString(), " is on a device this build (no CUDA) cannot read"));
#endif
}

absl::Status CopyHostToTensor(const core::Tensor& dst, const core::Tensor& src,
                              const std::string& what) {
  if (!src.device().is_cpu()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": CopyHostToTensor source ", src.ToString(), " is not on the CPU"));
  }
  if (dst.numel() != src.numel()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", src.numel(), " elements into ", dst.ToString()));
  }
  if (dst.device().is_cpu()) return core::Annotate(dst.CopyFrom(src), what);
#ifdef FSDP_WITH_CUDA
  ASSIGN_OR_RETURN(core::Tensor staged, PinnedStaging(dst.numel(), dst.dtype(), what));
  RETURN_IF_ERROR(core::Annotate(staged.CopyFrom(src), what));  // converts on the host
  cudaError_t err = cudaSetDevice(dst.device().index);
  if (err == cudaSuccess && dst.nbytes() > 0) {
    // Synchronous: the pinned buffer may be freed when this returns.
    err = cudaMemcpy(dst.raw_data(), staged.raw_data(), static_cast<size_t>(dst.nbytes()),
                     cudaMemcpyHostToDevice);
  }
  if (err != cudaSuccess) {
    return absl::InternalError(absl::StrCat(what, ": copying into ", dst.ToString(),
                                            " from pinned host memory: ", cudaGetErrorString(err)));
  }
  return absl::OkStatus();
#else
  return absl::UnavailableError(absl::StrCat(what, ": ", dst.ToString(),
                                             " is on a device this build (no CUDA) cannot write"));
#endif
}

}  // namespace internal
}  // namespace checkpoint
