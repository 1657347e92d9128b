// The elementwise ops of nn/tensor_ops.h (GELU, ReLU, add, bias add) and ZeroTensor. The
// other families are in tensor_ops_<family>.cc beside it (column sums: _reduce, LayerNorm
// and RMSNorm: _norm, softmax and fused attention: _attention, _embedding, cross-entropy:
// _loss), MatMul in matmul.cc and the Llama ops in llama_ops.cc. Each op checks its
// tensors, records its op and calls the CPU launcher (kernels/cpu/kernels.h) or the CUDA
// one (kernels/cuda/kernels.h).
#include "nn/tensor_ops.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/cpu/kernels.h"
#include "nn/internal/op_checks.h"
#include "nn/internal/op_costs.h"

#ifdef FSDP_WITH_CUDA
#include "kernels/cuda/kernels.h"
#endif

namespace nn {
namespace {

namespace kcpu = ::kernels::cpu;
using core::DType;
using core::OpCategory;
using core::ProfiledOp;
using core::Tensor;
using internal::CheckDevices;
using internal::CheckDType;
using internal::CheckElementwiseF32;
using internal::CheckFp32OrBf16;
using internal::CheckNumel;
using internal::F32;
using internal::IsBf16;
using internal::MutF32;
#ifdef FSDP_WITH_CUDA
namespace kc = ::kernels::cuda;
#endif

}  // namespace

absl::Status GeluForward(absl::string_view what, const Tensor& x, const Tensor& y) {
  RETURN_IF_ERROR(CheckElementwiseF32(what, {{"input", &x}, {"output", &y}}));
  const int64_t n = x.numel();
  ProfiledOp op(OpCategory::kElementwise, "gelu.forward", x.device(), internal::GeluForwardCost(n));
  if (x.device().is_cuda()) {
    NN_ON_CUDA(x.device(), what, "GELU forward", kc::GeluForward(F32(x), MutF32(y), n));
  }
  kcpu::GeluForward(F32(x), MutF32(y), n);
  return absl::OkStatus();
}

absl::Status GeluBackward(absl::string_view what, const Tensor& x, const Tensor& gy,
                          const Tensor& gx) {
  RETURN_IF_ERROR(
      CheckElementwiseF32(what, {{"input", &x}, {"grad_output", &gy}, {"grad_input", &gx}}));
  const int64_t n = x.numel();
  ProfiledOp op(OpCategory::kElementwise, "gelu.backward", x.device(),
                internal::GeluBackwardCost(n));
  if (x.device().is_cuda()) {
    NN_ON_CUDA(x.device(), what, "GELU backward", kc::GeluBackward(F32(x), F32(gy), MutF32(gx), n));
  }
  kcpu::GeluBackward(F32(x), F32(gy), MutF32(gx), n);
  return absl::OkStatus();
}

absl::Status ReluForward(absl::string_view what, const Tensor& x, const Tensor& y) {
  RETURN_IF_ERROR(CheckElementwiseF32(what, {{"input", &x}, {"output", &y}}));
  const int64_t n = x.numel();
  ProfiledOp op(OpCategory::kElementwise, "relu.forward", x.device(),
                internal::ElementwiseCost(n, 2, 1));
  if (x.device().is_cuda()) {
    NN_ON_CUDA(x.device(), what, "ReLU forward", kc::ReluForward(F32(x), MutF32(y), n));
  }
  kcpu::ReluForward(F32(x), MutF32(y), n);
  return absl::OkStatus();
}

absl::Status ReluBackward(absl::string_view what, const Tensor& y, const Tensor& gy,
                          const Tensor& gx) {
  RETURN_IF_ERROR(
      CheckElementwiseF32(what, {{"output", &y}, {"grad_output", &gy}, {"grad_input", &gx}}));
  const int64_t n = y.numel();
  ProfiledOp op(OpCategory::kElementwise, "relu.backward", y.device(),
                internal::ElementwiseCost(n, 3, 1));
  if (y.device().is_cuda()) {
    NN_ON_CUDA(y.device(), what, "ReLU backward", kc::ReluBackward(F32(y), F32(gy), MutF32(gx), n));
  }
  kcpu::ReluBackward(F32(y), F32(gy), MutF32(gx), n);
  return absl::OkStatus();
}

absl::Status AddTensors(absl::string_view what, const Tensor& a, const Tensor& b,
                        const Tensor& out) {
  RETURN_IF_ERROR(
      CheckElementwiseF32(what, {{"first operand", &a}, {"second operand", &b}, {"sum", &out}}));
  const int64_t n = a.numel();
  ProfiledOp op(OpCategory::kElementwise, "add", a.device(), internal::AddCost(n));
  if (a.device().is_cuda()) {
    NN_ON_CUDA(a.device(), what, "add", kc::Add(F32(a), F32(b), MutF32(out), n));
  }
  kcpu::Add(F32(a), F32(b), MutF32(out), n);
  return absl::OkStatus();
}

namespace {

// BiasAdd's argument checks; the number of rows.
absl::StatusOr<int64_t> CheckBiasAdd(absl::string_view what, const Tensor& x, const Tensor& bias,
                                     const Tensor& out) {
  RETURN_IF_ERROR(CheckDevices(what, {{"input", &x}, {"bias", &bias}, {"output", &out}}));
  RETURN_IF_ERROR(CheckDType(what, "input", x, DType::kFloat32));
  RETURN_IF_ERROR(CheckFp32OrBf16(what, "bias", bias));
  RETURN_IF_ERROR(CheckDType(what, "output", out, DType::kFloat32));
  RETURN_IF_ERROR(CheckNumel(what, "output", out, x.numel()));
  const int64_t cols = bias.numel();
  if (cols == 0 || x.numel() % cols != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": bias ", bias.ToString(), " does not tile input ", x.ToString()));
  }
  return x.numel() / cols;
}

}  // namespace

absl::Status BiasAdd(absl::string_view what, const Tensor& x, const Tensor& bias,
                     const Tensor& out) {
  ASSIGN_OR_RETURN(const int64_t rows, CheckBiasAdd(what, x, bias, out));
  const int64_t cols = bias.numel();
  ProfiledOp op(OpCategory::kElementwise, "bias_add", x.device(),
                internal::BiasAddCost(rows, cols, core::DTypeSize(bias.dtype())));
  if (x.device().is_cuda()) {
    NN_ON_CUDA(x.device(), what, "bias add",
               kc::BiasAdd(F32(x), bias.raw_data(), IsBf16(bias), MutF32(out), rows, cols));
  }
  kcpu::BiasAdd(F32(x), bias.raw_data(), IsBf16(bias), MutF32(out), rows, cols);
  return absl::OkStatus();
}

absl::Status ZeroTensor(absl::string_view what, const Tensor& t) {
  if (!t.defined()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": zeroing an undefined tensor"));
  }
  // core::Tensor::TryZero: a memset on the compute stream, recorded as the op "zero".
  return core::Annotate(t.TryZero(), what);
}

}  // namespace nn
