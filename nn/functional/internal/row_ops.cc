#include "nn/functional/internal/row_ops.h"

#include "core/op_profile.h"
#include "core/status_macros.h"
#include "kernels/cpu/functional_rows.h"
#include "nn/internal/op_checks.h"
#include "nn/internal/op_costs.h"

#ifdef FSDP_WITH_CUDA
#include "kernels/cuda/functional_rows.h"
#endif

namespace nn {
namespace functional {
namespace internal {
namespace {

using core::Tensor;
using ::nn::internal::F32;
using ::nn::internal::MutF32;

namespace kcpu = ::kernels::cpu;
#ifdef FSDP_WITH_CUDA
namespace kc = ::kernels::cuda;
#endif

}  // namespace

absl::Status SoftmaxRows(const char* op, bool log, const Tensor& x, const Tensor& y, int64_t rows,
                         int64_t cols) {
  RETURN_IF_ERROR(::nn::internal::CheckDevices(op, {{"input", &x}, {"output", &y}}));
  core::ProfiledOp profiled(core::OpCategory::kElementwise,
                            log ? "log_softmax.forward" : "softmax.forward", x.device(),
                            ::nn::internal::SoftmaxForwardCost(rows, cols, false));
  if (x.device().is_cuda()) {
    NN_ON_CUDA(x.device(), op, log ? "log-softmax forward" : "softmax forward",
               log ? kc::LogSoftmaxForward(F32(x), MutF32(y), rows, cols)
                   : kc::SoftmaxForward(F32(x), MutF32(y), rows, cols));
  }
  if (log) {
    kcpu::LogSoftmaxForward(F32(x), MutF32(y), rows, cols);
  } else {
    kcpu::SoftmaxForward(F32(x), MutF32(y), rows, cols);
  }
  return absl::OkStatus();
}

absl::Status SoftmaxRowsBackward(const char* op, bool log, const Tensor& y, const Tensor& gy,
                                 const Tensor& gx, int64_t rows, int64_t cols) {
  RETURN_IF_ERROR(::nn::internal::CheckDevices(
      op, {{"output", &y}, {"grad_output", &gy}, {"grad_input", &gx}}));
  core::ProfiledOp profiled(core::OpCategory::kElementwise,
                            log ? "log_softmax.backward" : "softmax.backward", y.device(),
                            ::nn::internal::SoftmaxBackwardCost(rows, cols, false, false));
  if (y.device().is_cuda()) {
    NN_ON_CUDA(y.device(), op, log ? "log-softmax backward" : "softmax backward",
               log ? kc::LogSoftmaxBackward(F32(y), F32(gy), MutF32(gx), rows, cols)
                   : kc::SoftmaxBackward(F32(y), F32(gy), MutF32(gx), rows, cols));
  }
  if (log) {
    kcpu::LogSoftmaxBackward(F32(y), F32(gy), MutF32(gx), rows, cols);
  } else {
    kcpu::SoftmaxBackward(F32(y), F32(gy), MutF32(gx), rows, cols);
  }
  return absl::OkStatus();
}

absl::Status ScaleByScalar(const char* op, const char* name, const Tensor& x, const Tensor& s,
                           bool negate, const Tensor& out) {
  RETURN_IF_ERROR(::nn::internal::CheckDevices(
      op, {{"kept gradient", &x}, {"incoming gradient", &s}, {"gradient", &out}}));
  const int64_t n = x.numel();
  core::ProfiledOp profiled(core::OpCategory::kLoss, name, x.device(),
                            ::nn::internal::ElementwiseCost(n, 2, 1));
  if (x.device().is_cuda()) {
    NN_ON_CUDA(x.device(), op, "gradient scale",
               kc::ScaleByScalar(F32(x), F32(s), negate, MutF32(out), n));
  }
  kcpu::ScaleByScalar(F32(x), F32(s), negate, MutF32(out), n);
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace functional
}  // namespace nn
