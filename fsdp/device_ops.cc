#include "fsdp/device_ops.h"

#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/op_profile.h"
#include "core/status_macros.h"
#include "kernels/cpu/kernels.h"

#ifdef FSDP_WITH_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/grad.h"
#endif

namespace fsdp {
namespace internal {
namespace {

absl::Status CheckFp32(const core::Tensor& t, const std::string& what, const char* op) {
  if (!t.defined() || t.dtype() != core::DType::kFloat32) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", op, " needs a float32 tensor, got ", t.ToString()));
  }
  return absl::OkStatus();
}

#ifdef FSDP_WITH_CUDA
absl::Status Cuda(cudaError_t err, const std::string& what, const char* op, const core::Tensor& t) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, ": ", op, " on ", t.ToString(), " failed: ", cudaGetErrorString(err)));
}
absl::Status SetDevice(const core::Tensor& t, const std::string& what) {
  return Cuda(cudaSetDevice(t.device().index), what, "cudaSetDevice", t);
}
#else
absl::Status NoCuda(const core::Tensor& t, const std::string& what, const char* op) {
  return absl::UnavailableError(
      absl::StrCat(what, ": ", op, " on ", t.ToString(), " needs a build with --config=cuda"));
}
#endif

}  // namespace

absl::Status AddInto(const core::Tensor& dst, const core::Tensor& src, const std::string& what) {
  RETURN_IF_ERROR(CheckFp32(dst, what, "AddInto"));
  if (!src.defined() || src.numel() != dst.numel() || src.device() != dst.device() ||
      src.dtype() == core::DType::kInt32) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": AddInto of ", src.ToString(), " into ", dst.ToString()));
  }
  const int64_t n = dst.numel();
  const bool src_bf16 = src.dtype() == core::DType::kBFloat16;
  core::ProfiledOp op(core::OpCategory::kElementwise, "grad_accumulate", dst.device(),
                      core::OpCost::Memory((src_bf16 ? 10.0 : 12.0) * n, 1.0 * n));
  if (dst.device().is_cpu()) {
    kernels::cpu::AddInto(dst.data<float>(), src.raw_data(), src_bf16, n);
    return absl::OkStatus();
  }
#ifdef FSDP_WITH_CUDA
  RETURN_IF_ERROR(SetDevice(dst, what));
  return Cuda(kernels::cuda::AddInto(dst.data<float>(), src.raw_data(), src_bf16, n), what,
              "AddInto", dst);
#else
  return NoCuda(dst, what, "AddInto");
#endif
}

absl::Status ConvertInto(const core::Tensor& dst, const core::Tensor& src,
                         const std::string& what) {
  if (!dst.defined() || !src.defined() || dst.numel() != src.numel() ||
      dst.device() != src.device()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": cannot convert ", src.ToString(), " into ", dst.ToString()));
  }
  // Tensor::CopyFrom converts fp32 <-> bf16 on either device (on the compute stream).
  return core::Annotate(dst.CopyFrom(src), what);
}

absl::StatusOr<core::Tensor> Convert(const core::Tensor& src, core::DType dtype,
                                     core::MemoryTag tag, const std::string& what) {
  ASSIGN_OR_RETURN(core::Tensor out,
                   core::Tensor::Allocate({src.numel()}, dtype, tag, src.device()));
  RETURN_IF_ERROR(ConvertInto(out, src, what));
  return out;
}

absl::StatusOr<double> SumOfSquares(const core::Tensor& t, const std::string& what) {
  RETURN_IF_ERROR(CheckFp32(t, what, "SumOfSquares"));
  if (t.device().is_cpu()) return kernels::cpu::SumOfSquares(t.data<float>(), t.numel());
#ifdef FSDP_WITH_CUDA
  RETURN_IF_ERROR(SetDevice(t, what));
  ASSIGN_OR_RETURN(
      core::Tensor scratch,
      core::Tensor::Allocate({2 * kernels::cuda::kSumScratchDoubles}, core::DType::kFloat32,
                             core::MemoryTag::kOther, t.device()));
  double result = 0;
  RETURN_IF_ERROR(
      Cuda(kernels::cuda::SumOfSquares(t.data<float>(), t.numel(),
                                       static_cast<double*>(scratch.raw_data()), &result),
           what, "SumOfSquares", t));
  return result;
#else
  return NoCuda(t, what, "SumOfSquares");
#endif
}

absl::Status Scale(const core::Tensor& t, float factor, const std::string& what) {
  RETURN_IF_ERROR(CheckFp32(t, what, "Scale"));
  core::ProfiledOp op(core::OpCategory::kElementwise, "scale", t.device(),
                      core::OpCost::Memory(8.0 * t.numel(), 1.0 * t.numel()));
  if (t.device().is_cpu()) {
    kernels::cpu::Scale(t.data<float>(), t.numel(), factor);
    return absl::OkStatus();
  }
#ifdef FSDP_WITH_CUDA
  RETURN_IF_ERROR(SetDevice(t, what));
  return Cuda(kernels::cuda::Scale(t.data<float>(), t.numel(), factor), what, "Scale", t);
#else
  return NoCuda(t, what, "Scale");
#endif
}

}  // namespace internal
}  // namespace fsdp
