#include "nn/functional/softmax.h"

#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nn/functional/internal/row_ops.h"
#include "nn/internal/op_checks.h"
#include "nn/internal/validate.h"

namespace nn {
namespace functional {
namespace {

using core::Tensor;

// Softmax or LogSoftmax (`op`, log-softmax when `log`): checks, the forward rows and the
// record, which keeps y for the backward.
absl::StatusOr<Tensor> SoftmaxOp(const char* op, bool log, core::Arg x_arg, int64_t dim) {
  RETURN_IF_ERROR(x_arg.status());
  const Tensor& x = x_arg.tensor();
  RETURN_IF_ERROR(::nn::internal::CheckDevices(op, {{"input", &x}}));
  RETURN_IF_ERROR(::nn::internal::CheckDType(op, "input", x, core::DType::kFloat32));
  const int64_t nd = x.dim();
  if (nd == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": input must be at least 1-D, got ", x.ToString()));
  }
  if (dim < -nd || dim >= nd) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": dim ", dim, " is outside [", -nd, ", ",
                                                   nd, ") for input ", x.ToString()));
  }
  if ((dim < 0 ? dim + nd : dim) != nd - 1) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": only the last dim (-1) is supported, ",
                                                   "got dim ", dim, " of input ", x.ToString()));
  }
  const int64_t cols = x.size(-1);
  const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  ASSIGN_OR_RETURN(Tensor y, ::nn::internal::NewActivation(x.shape(), x.device()));
  RETURN_IF_ERROR(internal::SoftmaxRows(op, log, x, y, rows, cols));
  RETURN_IF_ERROR(core::RecordFunction(
      op, {x}, {&y}, {y},
      [op, log, rows,
       cols](const core::BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
        const Tensor& g = ctx.grad(0);
        ASSIGN_OR_RETURN(Tensor gx, ::nn::internal::NewActivation(g.shape(), g.device()));
        RETURN_IF_ERROR(internal::SoftmaxRowsBackward(op, log, ctx.saved(0), g, gx, rows, cols));
        return std::vector<Tensor>{gx};
      },
      {"output"}));
  return y;
}

}  // namespace

absl::StatusOr<Tensor> Softmax(core::Arg x, int64_t dim) {
  return SoftmaxOp("Softmax", /*log=*/false, x, dim);
}

absl::StatusOr<Tensor> LogSoftmax(core::Arg x, int64_t dim) {
  return SoftmaxOp("LogSoftmax", /*log=*/true, x, dim);
}

}  // namespace functional
}  // namespace nn
