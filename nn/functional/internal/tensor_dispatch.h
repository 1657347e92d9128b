// Private to nn/functional's general tensor ops (elementwise, shape, reduce): the device
// dispatch of the kernels/tensor.h launchers. Each call records a core::ProfiledOp with
// its cost and runs the CPU launcher (kernels/cpu/tensor_kernels.h) or, for CUDA tensors,
// the CUDA one (kernels/cuda/tensor_kernels.h; FailedPrecondition in a build without
// CUDA). Callers check dtypes, devices and shapes first; outputs are allocated by them.
// Errors name `what`, the caller.
//
//   RETURN_IF_ERROR(internal::RunBinary("Add", kernels::kBinaryAdd, a, b, out));
#ifndef NN_FUNCTIONAL_INTERNAL_TENSOR_DISPATCH_H_
#define NN_FUNCTIONAL_INTERNAL_TENSOR_DISPATCH_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/tensor.h"
#include "kernels/tensor.h"

namespace nn {
namespace functional {
namespace internal {

// out = a op b (kernels::BinaryKind), fp32, with NOTE [Broadcasting] (elementwise.h): out
// has the broadcast shape of a and b.
absl::Status RunBinary(absl::string_view what, int kind, const core::Tensor& a,
                       const core::Tensor& b, const core::Tensor& out);
// y = kernels::UnaryOp(kind, x, c) and gx = kernels::UnaryGrad(kind, v, g), fp32 of one numel.
absl::Status RunUnary(absl::string_view what, int kind, const core::Tensor& x, float c,
                      const core::Tensor& y);
absl::Status RunUnaryGrad(absl::string_view what, int kind, const core::Tensor& v,
                          const core::Tensor& g, const core::Tensor& gx);

// dst[dst_offset + off_dst(i)] = src[src_offset + off_src(i)] for the 4-byte elements
// (fp32 or int32) of an iteration over `sizes` with src's and dst's strides.
absl::Status CopyStrided(absl::string_view what, const core::Tensor& src, int64_t src_offset,
                         const core::Shape& src_strides, const core::Tensor& dst,
                         int64_t dst_offset, const core::Shape& dst_strides,
                         const core::Shape& sizes);

// NOTE [Gather and scatter] (kernels/tensor.h): out[other(i)] = data at index for every i
// of g's index shape; data[e] += the src elements whose index points at e, in index order.
// Index values are not checked here: one out of range reads 0 (gather) or is skipped
// (scatter) on both devices, so nothing is touched out of bounds; the CPU ops check them
// first (NOTE [Index checks] in nn/functional/shape.h).
absl::Status RunGather(absl::string_view what, const core::Tensor& data, const core::Tensor& index,
                       const core::Tensor& out, const kernels::GatherScatter& g);
absl::Status RunScatterAdd(absl::string_view what, const core::Tensor& src,
                           const core::Tensor& index, const core::Tensor& data,
                           const kernels::GatherScatter& g);

// NOTE [Sum order]: out (contiguous, x's dims not marked in `reduced`, in order) = scale *
// the sums of x over the marked dims.
absl::Status RunSum(absl::string_view what, const core::Tensor& x, const std::vector<bool>& reduced,
                    double scale, const core::Tensor& out);
// out = x stretched over the dims of out marked in `expanded` (x holds out's other dims,
// contiguously in order), times scale: RunSum's adjoint.
absl::Status RunExpand(absl::string_view what, const core::Tensor& x,
                       const std::vector<bool>& expanded, float scale, const core::Tensor& out);
// values (fp32) and indices (int32), contiguous over x's dims but d = the maximum of x
// along d (not empty) and its first position.
absl::Status RunMax(absl::string_view what, const core::Tensor& x, int d,
                    const core::Tensor& values, const core::Tensor& indices);

}  // namespace internal
}  // namespace functional
}  // namespace nn

#endif  // NN_FUNCTIONAL_INTERNAL_TENSOR_DISPATCH_H_
