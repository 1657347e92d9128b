// Private to nn/functional: the device dispatch of the row launchers nn/functional adds
// (kernels/cpu/functional_rows.h, kernels/cuda/functional_rows.h), as nn/tensor_ops.h
// dispatches the layers' launchers: each records its core::ProfiledOp, then runs the CUDA
// launcher on a CUDA tensor (FailedPrecondition in a build without CUDA) or the CPU one.
// Callers pass defined fp32 tensors of the sizes named, on one device: these check only
// the devices.
//
//   RETURN_IF_ERROR(internal::SoftmaxRows("Softmax", /*log=*/false, x, y, rows, cols));
#ifndef NN_FUNCTIONAL_INTERNAL_ROW_OPS_H_
#define NN_FUNCTIONAL_INTERNAL_ROW_OPS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "core/tensor.h"

namespace nn {
namespace functional {
namespace internal {

// y [rows, cols] = the softmax (log false) or log-softmax of each row of x. `op` names the
// caller in an error.
absl::Status SoftmaxRows(const char* op, bool log, const core::Tensor& x, const core::Tensor& y,
                         int64_t rows, int64_t cols);
// gx [rows, cols] = the input gradient of those rows from the forward's output y and gy.
absl::Status SoftmaxRowsBackward(const char* op, bool log, const core::Tensor& y,
                                 const core::Tensor& gy, const core::Tensor& gx, int64_t rows,
                                 int64_t cols);
// out = x * s[0] (x * -s[0] when `negate`), s one element on x's device (read there);
// `name` is the op recorded ("cross_entropy.backward"), a string literal.
absl::Status ScaleByScalar(const char* op, const char* name, const core::Tensor& x,
                           const core::Tensor& s, bool negate, const core::Tensor& out);

}  // namespace internal
}  // namespace functional
}  // namespace nn

#endif  // NN_FUNCTIONAL_INTERNAL_ROW_OPS_H_
