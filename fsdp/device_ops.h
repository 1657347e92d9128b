// Gradient and buffer arithmetic fsdp needs on whichever device a unit lives: adding a
// reduced chunk into the gradient shard, dtype conversion of a buffer, squared norms
// and scaling for ClipGradNorm. CPU tensors run the CPU launchers of the FSDP_HD bodies in
// kernels/grad.h (kernels/cpu/kernels.h); CUDA tensors launch the same bodies on the
// compute stream (kernels/cuda/grad.h, --config=cuda only; without it a CUDA tensor gives
// Unavailable).
//
//   RETURN_IF_ERROR(fsdp::internal::AddInto(shard_grad, reduced, "fsdp unit blocks.0"));
//   ASSIGN_OR_RETURN(double sq, fsdp::internal::SumOfSquares(grad, "ClipGradNorm"));
//
// Every function names `what` (the unit or operation) in its errors.
#ifndef FSDP_DEVICE_OPS_H_
#define FSDP_DEVICE_OPS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/allocator.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace fsdp {
namespace internal {

// dst += src elementwise. dst fp32, src fp32 or bf16, same numel and device;
// InvalidArgument otherwise.
absl::Status AddInto(const core::Tensor& dst, const core::Tensor& src, const std::string& what);

// A fresh 1-D tensor of `dtype` (fp32 or bf16) on src's device holding src's values
// (rounded to nearest even into bf16, exact into fp32), counted under `tag`.
absl::StatusOr<core::Tensor> Convert(const core::Tensor& src, core::DType dtype,
                                     core::MemoryTag tag, const std::string& what);

// Copies src into dst (same numel, same device), converting between fp32 and bf16.
absl::Status ConvertInto(const core::Tensor& dst, const core::Tensor& src, const std::string& what);

// Sum of the squares of an fp32 tensor's elements, in double. Synchronises a CUDA
// tensor's compute stream (the result is read on the host).
absl::StatusOr<double> SumOfSquares(const core::Tensor& t, const std::string& what);

// t *= factor, for an fp32 tensor.
absl::Status Scale(const core::Tensor& t, float factor, const std::string& what);

}  // namespace internal
}  // namespace fsdp

#endif  // FSDP_DEVICE_OPS_H_
