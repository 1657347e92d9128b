#include "nn/tensor_ops.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/cpu/kernels.h"
#include "nn/internal/op_checks.h"
#include "nn/internal/op_costs.h"

#ifdef FSDP_WITH_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/kernels.h"
#endif

namespace nn {
namespace {

namespace kcpu = ::kernels::cpu;
using core::DType;
using core::OpCategory;
using core::ProfiledOp;
using core::RecordOp;
using core::Tensor;
using internal::Arg;
using internal::CheckDevices;
using internal::CheckDistinct;
using internal::CheckDType;
using internal::CheckElementwiseF32;
using internal::CheckFp32OrBf16;
using internal::CheckNumel;
using internal::F32;
using internal::IsBf16;
using internal::MutF32;
#ifdef FSDP_WITH_CUDA
namespace kc = ::kernels::cuda;
using internal::Launched;
using internal::UseDevice;
#else
using internal::NoCuda;
#endif

}  // namespace



absl::Status GeluForward(absl::string_view what, const Tensor& x, const Tensor& y) {
  RETURN_IF_ERROR(CheckElementwiseF32(what, {{"input", &x}, {"output", &y}}));
  const int64_t n = x.numel();
  ProfiledOp op(OpCategory::kElementwise, "gelu.forward", x.device(),
                internal::GeluForwardCost(n));
  if (x.device().is_cuda()) {
    NN_ON_CUDA(x.device(), what, "GELU forward", kc::GeluForward(F32(x), MutF32(y), n));
  }
  kcpu::GeluForward(F32(x), MutF32(y), n);
  return absl::OkStatus();
}

absl::Status GeluBackward(absl::string_view what, const Tensor& x, const Tensor& gy,
                          const Tensor& gx) {
  RETURN_IF_ERROR(CheckElementwiseF32(
      what, {{"input", &x}, {"grad_output", &gy}, {"grad_input", &gx}}));
  const int64_t n = x.numel();
  ProfiledOp op(OpCategory::kElementwise, "gelu.backward", x.device(),
                internal::GeluBackwardCost(n));
  if (x.device().is_cuda()) {
    NN_ON_CUDA(x.device(), what, "GELU backward",
               kc::GeluBackward(F32(x), F32(gy), MutF32(gx), n));
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
  RETURN_IF_ERROR(CheckElementwiseF32(
      what, {{"output", &y}, {"grad_output", &gy}, {"grad_input", &gx}}));
  const int64_t n = y.numel();
  ProfiledOp op(OpCategory::kElementwise, "relu.backward", y.device(),
                internal::ElementwiseCost(n, 3, 1));
  if (y.device().is_cuda()) {
    NN_ON_CUDA(y.device(), what, "ReLU backward",
               kc::ReluBackward(F32(y), F32(gy), MutF32(gx), n));
  }
  kcpu::ReluBackward(F32(y), F32(gy), MutF32(gx), n);
  return absl::OkStatus();
}

absl::Status AddTensors(absl::string_view what, const Tensor& a, const Tensor& b,
                        const Tensor& out) {
  RETURN_IF_ERROR(CheckElementwiseF32(
      what, {{"first operand", &a}, {"second operand", &b}, {"sum", &out}}));
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
    return absl::InvalidArgumentError(absl::StrCat(what, ": bias ", bias.ToString(),
                                                   " does not tile input ", x.ToString()));
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

namespace {

#ifdef FSDP_WITH_CUDA
// The fp32 scratch of `chunks` partial sums of `n` values each that a split reduction
// writes, on `device`; undefined for one chunk (the kernel adds into the result directly).
// kActivation, released by the caller after the launch: the caching allocator orders its
// reuse on the compute stream.
absl::StatusOr<Tensor> PartialSums(const core::Device& device, int64_t chunks, int64_t n) {
  if (chunks <= 1) return Tensor();
  return Tensor::Allocate({chunks * n}, DType::kFloat32, core::MemoryTag::kActivation, device);
}

// kc::ColumnSums of checked CUDA tensors on the current device, with the partial sums'
// scratch. `op` names the launch in an error.
absl::Status ColumnSumsOnCuda(absl::string_view what, absl::string_view op, const Tensor& x,
                              const Tensor& y, const Tensor& acc, int64_t rows, int64_t cols) {
  ASSIGN_OR_RETURN(const Tensor partial,
                   PartialSums(x.device(), ::kernels::ColumnSumChunks(rows, cols), cols));
  float* scratch = partial.defined() ? MutF32(partial) : nullptr;
  if (IsBf16(x)) {
    return Launched(kc::ColumnSumsBf16(static_cast<const uint16_t*>(x.raw_data()), MutF32(acc),
                                       rows, cols, scratch),
                    what, op);
  }
  return Launched(
      kc::ColumnSums(F32(x), y.defined() ? F32(y) : nullptr, MutF32(acc), rows, cols, scratch),
      what, op);
}
#endif

// AccumulateColumnSums's argument checks (y optional); the number of rows.
absl::StatusOr<int64_t> CheckColumnSums(absl::string_view what, const Tensor& x, const Tensor& y,
                                        const Tensor& acc) {
  if (y.defined()) {
    RETURN_IF_ERROR(CheckDevices(what, {{"input", &x}, {"second factor", &y}, {"sums", &acc}}));
    RETURN_IF_ERROR(CheckDType(what, "second factor", y, DType::kFloat32));
    RETURN_IF_ERROR(CheckNumel(what, "second factor", y, x.numel()));
  } else {
    RETURN_IF_ERROR(CheckDevices(what, {{"input", &x}, {"sums", &acc}}));
  }
  // NOTE [GEMM epilogues]: a bf16 input is a gradient stored bf16 for its GEMMs.
  if (!(IsBf16(x) && !y.defined())) RETURN_IF_ERROR(CheckDType(what, "input", x, DType::kFloat32));
  RETURN_IF_ERROR(CheckDType(what, "sums", acc, DType::kFloat32));
  const int64_t cols = acc.numel();
  if (cols == 0 || x.numel() % cols != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": sums ", acc.ToString(),
                                                   " do not tile input ", x.ToString()));
  }
  return x.numel() / cols;
}

}  // namespace

absl::Status AccumulateColumnSums(absl::string_view what, const Tensor& x, const Tensor& y,
                                  const Tensor& acc) {
  ASSIGN_OR_RETURN(const int64_t rows, CheckColumnSums(what, x, y, acc));
  const int64_t cols = acc.numel();
  ProfiledOp op(OpCategory::kElementwise, "column_sums", x.device(),
                internal::ColumnSumsCost(rows, cols, y.defined(), core::DTypeSize(x.dtype())));
  if (x.device().is_cuda()) {
#ifdef FSDP_WITH_CUDA
    RETURN_IF_ERROR(UseDevice(x.device(), what));
    return ColumnSumsOnCuda(what, "column sums", x, y, acc, rows, cols);
#else
    return NoCuda(x.device(), what);
#endif
  }
  if (IsBf16(x)) {
    kcpu::ColumnSumsBf16(static_cast<const uint16_t*>(x.raw_data()), MutF32(acc), rows, cols);
    return absl::OkStatus();
  }
  kcpu::ColumnSums(F32(x), y.defined() ? F32(y) : nullptr, MutF32(acc), rows, cols);
  return absl::OkStatus();
}

namespace {

// The optional bf16 copy of an op's fp32 result: undefined, or bf16 of `like`'s numel on
// its device (`like_name` names it in an error). Its bits, or null.
absl::StatusOr<uint16_t*> Bf16Out(absl::string_view what, const char* name, const Tensor& out,
                                  const char* like_name, const Tensor& like) {
  if (!out.defined()) return nullptr;
  RETURN_IF_ERROR(CheckDevices(what, {{name, &out}, {like_name, &like}}));
  RETURN_IF_ERROR(CheckDType(what, name, out, DType::kBFloat16));
  RETURN_IF_ERROR(CheckNumel(what, name, out, like.numel()));
  return static_cast<uint16_t*>(out.raw_data());
}

// LayerNormForward's argument checks, and RmsNormForward's (without the bias and the mean:
// `centered` false, b and mean then unused); the number of rows.
absl::StatusOr<int64_t> CheckLayerNormForward(absl::string_view what, bool centered,
                                              const Tensor& x, const Tensor& w, const Tensor& b,
                                              const Tensor& y, const Tensor& mean,
                                              const Tensor& rstd) {
  RETURN_IF_ERROR(
      CheckDevices(what, {{"input", &x}, {"weight", &w}, {"output", &y}, {"rstd", &rstd}}));
  RETURN_IF_ERROR(CheckDType(what, "input", x, DType::kFloat32));
  RETURN_IF_ERROR(CheckFp32OrBf16(what, "weight", w));
  const int64_t cols = w.numel();
  if (centered) {
    RETURN_IF_ERROR(CheckDevices(what, {{"input", &x}, {"bias", &b}, {"mean", &mean}}));
    if (b.dtype() != w.dtype()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": bias ", b.ToString(),
                                                     " must have the weight's dtype, ",
                                                     core::DTypeName(w.dtype())));
    }
    RETURN_IF_ERROR(CheckNumel(what, "bias", b, cols));
  }
  if (cols == 0 || x.numel() % cols != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": weight ", w.ToString(),
                                                   " does not tile input ", x.ToString()));
  }
  const int64_t rows = x.numel() / cols;
  // NOTE [GEMM epilogues]: a bf16 output is a bf16 GEMM's operand, stored so directly.
  RETURN_IF_ERROR(CheckFp32OrBf16(what, "output", y));
  RETURN_IF_ERROR(CheckDType(what, "rstd", rstd, DType::kFloat32));
  RETURN_IF_ERROR(CheckNumel(what, "output", y, x.numel()));
  RETURN_IF_ERROR(CheckNumel(what, "rstd", rstd, rows));
  if (centered) {
    RETURN_IF_ERROR(CheckDType(what, "mean", mean, DType::kFloat32));
    RETURN_IF_ERROR(CheckNumel(what, "mean", mean, rows));
    RETURN_IF_ERROR(CheckDistinct(what, "mean", mean, "rstd", rstd));
  }
  return rows;
}

// LayerNormBackward's argument checks, and RmsNormBackward's (not `centered`: mean and gb
// unused, passed undefined); the number of rows.
absl::StatusOr<int64_t> CheckLayerNormBackward(absl::string_view what, bool centered,
                                               const Tensor& g, const Tensor& x, const Tensor& mean,
                                               const Tensor& rstd, const Tensor& w,
                                               const Tensor& gx, const Tensor& gw,
                                               const Tensor& gb) {
  RETURN_IF_ERROR(CheckDevices(
      what,
      {{"grad_output", &g}, {"input", &x}, {"rstd", &rstd}, {"weight", &w}, {"grad_input", &gx}}));
  if (centered) {
    RETURN_IF_ERROR(CheckDevices(what, {{"grad_output", &g}, {"mean", &mean}}));
    RETURN_IF_ERROR(CheckDType(what, "mean", mean, DType::kFloat32));
  }
  RETURN_IF_ERROR(CheckDType(what, "grad_output", g, DType::kFloat32));
  RETURN_IF_ERROR(CheckDType(what, "input", x, DType::kFloat32));
  RETURN_IF_ERROR(CheckDType(what, "rstd", rstd, DType::kFloat32));
  RETURN_IF_ERROR(CheckDType(what, "grad_input", gx, DType::kFloat32));
  RETURN_IF_ERROR(CheckFp32OrBf16(what, "weight", w));
  const int64_t cols = w.numel();
  if (cols == 0 || g.numel() % cols != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": weight ", w.ToString(),
                                                   " does not tile grad_output ", g.ToString()));
  }
  const int64_t rows = g.numel() / cols;
  RETURN_IF_ERROR(CheckNumel(what, "input", x, g.numel()));
  RETURN_IF_ERROR(CheckNumel(what, "grad_input", gx, g.numel()));
  if (centered) RETURN_IF_ERROR(CheckNumel(what, "mean", mean, rows));
  RETURN_IF_ERROR(CheckNumel(what, "rstd", rstd, rows));
  RETURN_IF_ERROR(CheckDistinct(what, "grad_input", gx, "input", x));
  for (const Arg& a : {Arg{"weight gradient", &gw}, Arg{"bias gradient", &gb}}) {
    if (!a.tensor->defined()) continue;
    RETURN_IF_ERROR(CheckDevices(what, {{"grad_output", &g}, a}));
    RETURN_IF_ERROR(CheckDType(what, a.name, *a.tensor, DType::kFloat32));
    RETURN_IF_ERROR(CheckNumel(what, a.name, *a.tensor, cols));
  }
  return rows;
}

}  // namespace

absl::Status LayerNormForward(absl::string_view what, const Tensor& x, const Tensor& w,
                              const Tensor& b, float eps, const Tensor& y, const Tensor& mean,
                              const Tensor& rstd) {
  ASSIGN_OR_RETURN(const int64_t rows,
                   CheckLayerNormForward(what, /*centered=*/true, x, w, b, y, mean, rstd));
  ProfiledOp op(OpCategory::kNorm, "layernorm.forward", x.device(),
                internal::LayerNormForwardCost(rows, w.numel(), core::DTypeSize(w.dtype()),
                                               /*add=*/false, core::DTypeSize(y.dtype())));
  if (x.device().is_cuda()) {
    NN_ON_CUDA(x.device(), what, "LayerNorm forward",
               kc::LayerNormForward(F32(x), w.raw_data(), b.raw_data(), IsBf16(w), eps,
                                    y.raw_data(), MutF32(mean), MutF32(rstd), rows, w.numel(),
                                    IsBf16(y)));
  }
  kcpu::LayerNormForward(F32(x), w.raw_data(), b.raw_data(), IsBf16(w), eps, y.raw_data(),
                         MutF32(mean), MutF32(rstd), rows, w.numel(), IsBf16(y));
  return absl::OkStatus();
}

absl::Status AddLayerNormForward(absl::string_view what, const Tensor& a, const Tensor& b,
                                 const Tensor& w, const Tensor& bias, float eps, const Tensor& h,
                                 const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  RETURN_IF_ERROR(CheckElementwiseF32(
      what, {{"first operand", &a}, {"second operand", &b}, {"sum", &h}}));
  ASSIGN_OR_RETURN(const int64_t rows,
                   CheckLayerNormForward(what, /*centered=*/true, h, w, bias, y, mean, rstd));
  for (const Arg& out : {Arg{"output", &y}, Arg{"mean", &mean}, Arg{"rstd", &rstd}}) {
    for (const Arg& in : {Arg{"first operand", &a}, Arg{"second operand", &b}, Arg{"sum", &h}}) {
      RETURN_IF_ERROR(CheckDistinct(what, out.name, *out.tensor, in.name, *in.tensor));
    }
  }
  ProfiledOp op(OpCategory::kNorm, "add_layernorm.forward", a.device(),
                internal::LayerNormForwardCost(rows, w.numel(), core::DTypeSize(w.dtype()),
                                               /*add=*/true, core::DTypeSize(y.dtype())));
  if (a.device().is_cuda()) {
    NN_ON_CUDA(a.device(), what, "residual + LayerNorm forward",
               kc::AddLayerNormForward(F32(a), F32(b), MutF32(h), w.raw_data(), bias.raw_data(),
                                       IsBf16(w), eps, y.raw_data(), MutF32(mean), MutF32(rstd),
                                       rows, w.numel(), IsBf16(y)));
  }
  kcpu::AddLayerNormForward(F32(a), F32(b), MutF32(h), w.raw_data(), bias.raw_data(), IsBf16(w),
                            eps, y.raw_data(), MutF32(mean), MutF32(rstd), rows, w.numel(),
                            IsBf16(y));
  return absl::OkStatus();
}

namespace {

#ifdef FSDP_WITH_CUDA
// The name a norm's launch errors give: LayerNorm's with its rows' mean, else RMSNorm's.
const char* NormName(const Tensor& mean) { return mean.defined() ? "LayerNorm" : "RMSNorm"; }

// xhat of LayerNorm's input x [rows, cols] on CUDA from its rows' mean and rstd (the
// forward's bits; RMSNorm's from rstd where mean is undefined), as scratch for the weight
// gradient's column sums of g * xhat where the backward's kernel cannot take them.
absl::StatusOr<Tensor> LayerNormHatOnCuda(absl::string_view what, const Tensor& x,
                                          const Tensor& mean, const Tensor& rstd, int64_t rows,
                                          int64_t cols) {
  ASSIGN_OR_RETURN(Tensor xhat, Tensor::Allocate({rows * cols}, DType::kFloat32,
                                                 core::MemoryTag::kActivation, x.device()));
  const float* mu = mean.defined() ? F32(mean) : nullptr;
  RETURN_IF_ERROR(Launched(kc::LayerNormHat(F32(x), mu, F32(rstd), MutF32(xhat), rows, cols), what,
                           absl::StrCat(NormName(mean), " xhat")));
  return xhat;
}
#endif

// A norm backward's checks of what the residual add brings (NOTE [Fused ops]): residual
// fp32 like g and not gx, and gx16 (when defined) bf16 of g's numel apart from every other
// tensor; gx16's data, or null when undefined.
absl::StatusOr<uint16_t*> CheckBackwardAdd(absl::string_view what, const Tensor& g, const Tensor& x,
                                           const Tensor& residual, const Tensor& gx,
                                           const Tensor& gx16) {
  RETURN_IF_ERROR(CheckElementwiseF32(what, {{"grad_output", &g}, {"residual", &residual}}));
  RETURN_IF_ERROR(CheckDistinct(what, "grad_input", gx, "residual", residual));
  ASSIGN_OR_RETURN(uint16_t* const out16, Bf16Out(what, "bf16 grad_input", gx16, "grad_output", g));
  if (out16 != nullptr) {
    for (const Arg& in : {Arg{"grad_output", &g}, Arg{"input", &x}, Arg{"residual", &residual},
                          Arg{"grad_input", &gx}}) {
      RETURN_IF_ERROR(CheckDistinct(what, "bf16 grad_input", gx16, in.name, *in.tensor));
    }
  }
  return out16;
}

#ifdef FSDP_WITH_CUDA
// LayerNorm's backward on CUDA (checked tensors; RMSNorm's where mean is undefined, gb then
// too): the input gradient, plus `residual` when it is defined, and the weight and bias
// gradients' column sums in the same pass (kc::LayerNormBackward) where the row fits
// (kernels::LayerNormGradWarps); otherwise the input gradient's kernel, then the column
// sums' own (the weight's over xhat made again).
absl::Status LayerNormBackwardCuda(absl::string_view what, const Tensor& g, const Tensor& x,
                                   const Tensor& mean, const Tensor& rstd, const Tensor& w,
                                   const Tensor& residual, const Tensor& gx, uint16_t* out16,
                                   const Tensor& gw, const Tensor& gb, int64_t rows) {
  const int64_t cols = w.numel();
  const float* mu = mean.defined() ? F32(mean) : nullptr;
  const std::string name = NormName(mean);
  RETURN_IF_ERROR(UseDevice(g.device(), what));
  const int stats = ::kernels::NormGradStats(mean.defined());
  if ((gw.defined() || gb.defined()) && ::kernels::LayerNormGradWarps(cols, stats) > 0) {
    ASSIGN_OR_RETURN(
        const Tensor partial,
        PartialSums(g.device(), ::kernels::LayerNormGradChunks(rows, cols, stats), stats * cols));
    return Launched(kc::LayerNormBackward(F32(g), F32(x), mu, F32(rstd), w.raw_data(), IsBf16(w),
                                          residual.defined() ? F32(residual) : nullptr, MutF32(gx),
                                          gw.defined() ? MutF32(gw) : nullptr,
                                          gb.defined() ? MutF32(gb) : nullptr, rows, cols,
                                          partial.defined() ? MutF32(partial) : nullptr, out16),
                    what, absl::StrCat(name, " backward"));
  }
  // xhat for the weight gradient's column sums first: the largest scratch, so that one
  // cannot fail the op after gx is written.
  Tensor xhat;
  if (gw.defined()) {
    ASSIGN_OR_RETURN(xhat, LayerNormHatOnCuda(what, x, mean, rstd, rows, cols));
  }
  RETURN_IF_ERROR(Launched(
      residual.defined()
          ? kc::LayerNormBackwardInputAdd(F32(g), F32(x), mu, F32(rstd), w.raw_data(), IsBf16(w),
                                          F32(residual), MutF32(gx), rows, cols, out16)
          : kc::LayerNormBackwardInput(F32(g), F32(x), mu, F32(rstd), w.raw_data(), IsBf16(w),
                                       MutF32(gx), rows, cols),
      what, absl::StrCat(name, " backward")));
  if (gw.defined()) {
    RETURN_IF_ERROR(
        ColumnSumsOnCuda(what, absl::StrCat(name, " weight gradient"), g, xhat, gw, rows, cols));
  }
  if (gb.defined()) {
    RETURN_IF_ERROR(ColumnSumsOnCuda(what, "LayerNorm bias gradient", g, Tensor(), gb, rows, cols));
  }
  return absl::OkStatus();
}
#endif

// LayerNorm's backward on the CPU (checked tensors; RMSNorm's where mean is undefined): gw +=
// column sums of g * xhat and gb += column sums of g, each when defined, in one pass over g
// and x that makes xhat again (kcpu::NormParamGrads, before anything else is written), then
// the input gradient, plus `residual` when it is defined.
absl::Status LayerNormBackwardCpu(absl::string_view what, const Tensor& g, const Tensor& x,
                                  const Tensor& mean, const Tensor& rstd, const Tensor& w,
                                  const Tensor& residual, const Tensor& gx, uint16_t* out16,
                                  const Tensor& gw, const Tensor& gb, int64_t rows) {
  const int64_t cols = w.numel();
  const float* mu = mean.defined() ? F32(mean) : nullptr;
  kcpu::NormParamGrads(F32(g), F32(x), mu, F32(rstd), gw.defined() ? MutF32(gw) : nullptr,
                       gb.defined() ? MutF32(gb) : nullptr, rows, cols);
  if (residual.defined()) {
    kcpu::LayerNormBackwardInputAdd(F32(g), F32(x), mu, F32(rstd), w.raw_data(), IsBf16(w),
                                    F32(residual), MutF32(gx), rows, cols, out16);
  } else {
    kcpu::LayerNormBackwardInput(F32(g), F32(x), mu, F32(rstd), w.raw_data(), IsBf16(w), MutF32(gx),
                                 rows, cols);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LayerNormBackward(absl::string_view what, const Tensor& g, const Tensor& x,
                               const Tensor& mean, const Tensor& rstd, const Tensor& w,
                               const Tensor& gx, const Tensor& gw, const Tensor& gb) {
  ASSIGN_OR_RETURN(const int64_t rows, CheckLayerNormBackward(what, /*centered=*/true, g, x, mean,
                                                              rstd, w, gx, gw, gb));
  ProfiledOp op(OpCategory::kNorm, "layernorm.backward", g.device(),
                internal::LayerNormBackwardCost(rows, w.numel(), core::DTypeSize(w.dtype()),
                                                gw.defined(), gb.defined()));
  if (g.device().is_cuda()) {
#ifdef FSDP_WITH_CUDA
    return LayerNormBackwardCuda(what, g, x, mean, rstd, w, Tensor(), gx, nullptr, gw, gb, rows);
#else
    return NoCuda(g.device(), what);
#endif
  }
  return LayerNormBackwardCpu(what, g, x, mean, rstd, w, Tensor(), gx, nullptr, gw, gb, rows);
}

absl::Status LayerNormBackwardAdd(absl::string_view what, const Tensor& g, const Tensor& x,
                                  const Tensor& mean, const Tensor& rstd, const Tensor& w,
                                  const Tensor& residual, const Tensor& gx, const Tensor& gw,
                                  const Tensor& gb, const Tensor& gx16) {
  ASSIGN_OR_RETURN(const int64_t rows, CheckLayerNormBackward(what, /*centered=*/true, g, x, mean,
                                                              rstd, w, gx, gw, gb));
  ASSIGN_OR_RETURN(uint16_t* const out16, CheckBackwardAdd(what, g, x, residual, gx, gx16));
  ProfiledOp op(OpCategory::kNorm, "layernorm.backward_add", g.device(),
                internal::LayerNormBackwardCost(rows, w.numel(), core::DTypeSize(w.dtype()),
                                                gw.defined(), gb.defined(), /*residual=*/true,
                                                out16 != nullptr));
  if (g.device().is_cuda()) {
#ifdef FSDP_WITH_CUDA
    return LayerNormBackwardCuda(what, g, x, mean, rstd, w, residual, gx, out16, gw, gb, rows);
#else
    return NoCuda(g.device(), what);
#endif
  }
  return LayerNormBackwardCpu(what, g, x, mean, rstd, w, residual, gx, out16, gw, gb, rows);
}

absl::Status RmsNormForward(absl::string_view what, const Tensor& x, const Tensor& w, float eps,
                            const Tensor& y, const Tensor& rstd) {
  ASSIGN_OR_RETURN(const int64_t rows, CheckLayerNormForward(what, /*centered=*/false, x, w,
                                                             Tensor(), y, Tensor(), rstd));
  const int64_t cols = w.numel();
  ProfiledOp op(OpCategory::kNorm, "rmsnorm.forward", x.device(),
                internal::RmsNormForwardCost(rows, cols, core::DTypeSize(w.dtype()),
                                             core::DTypeSize(y.dtype())));
  if (x.device().is_cuda()) {
    NN_ON_CUDA(x.device(), what, "RMSNorm forward",
               kc::RmsNormForward(F32(x), w.raw_data(), IsBf16(w), eps, y.raw_data(), MutF32(rstd),
                                  rows, cols, IsBf16(y)));
  }
  kcpu::RmsNormForward(F32(x), w.raw_data(), IsBf16(w), eps, y.raw_data(), MutF32(rstd), rows, cols,
                       IsBf16(y));
  return absl::OkStatus();
}

absl::Status RmsNormBackward(absl::string_view what, const Tensor& g, const Tensor& x,
                             const Tensor& rstd, const Tensor& w, const Tensor& gx,
                             const Tensor& gw) {
  ASSIGN_OR_RETURN(const int64_t rows, CheckLayerNormBackward(what, /*centered=*/false, g, x,
                                                              Tensor(), rstd, w, gx, gw, Tensor()));
  ProfiledOp op(
      OpCategory::kNorm, "rmsnorm.backward", g.device(),
      internal::RmsNormBackwardCost(rows, w.numel(), core::DTypeSize(w.dtype()), gw.defined()));
  if (g.device().is_cuda()) {
#ifdef FSDP_WITH_CUDA
    return LayerNormBackwardCuda(what, g, x, Tensor(), rstd, w, Tensor(), gx, nullptr, gw, Tensor(),
                                 rows);
#else
    return NoCuda(g.device(), what);
#endif
  }
  return LayerNormBackwardCpu(what, g, x, Tensor(), rstd, w, Tensor(), gx, nullptr, gw, Tensor(),
                              rows);
}

absl::Status RmsNormBackwardAdd(absl::string_view what, const Tensor& g, const Tensor& x,
                                const Tensor& rstd, const Tensor& w, const Tensor& residual,
                                const Tensor& gx, const Tensor& gw, const Tensor& gx16) {
  ASSIGN_OR_RETURN(const int64_t rows, CheckLayerNormBackward(what, /*centered=*/false, g, x,
                                                              Tensor(), rstd, w, gx, gw, Tensor()));
  ASSIGN_OR_RETURN(uint16_t* const out16, CheckBackwardAdd(what, g, x, residual, gx, gx16));
  ProfiledOp op(OpCategory::kNorm, "rmsnorm.backward_add", g.device(),
                internal::RmsNormBackwardCost(rows, w.numel(), core::DTypeSize(w.dtype()),
                                              gw.defined(), /*residual=*/true, out16 != nullptr));
  if (g.device().is_cuda()) {
#ifdef FSDP_WITH_CUDA
    return LayerNormBackwardCuda(what, g, x, Tensor(), rstd, w, residual, gx, out16, gw, Tensor(),
                                 rows);
#else
    return NoCuda(g.device(), what);
#endif
  }
  return LayerNormBackwardCpu(what, g, x, Tensor(), rstd, w, residual, gx, out16, gw, Tensor(),
                              rows);
}

absl::Status CausalSoftmaxForward(absl::string_view what, const Tensor& scores, int64_t T,
                                  const Tensor& probs16) {
  RETURN_IF_ERROR(CheckDevices(what, {{"attention scores", &scores}}));
  RETURN_IF_ERROR(CheckDType(what, "attention scores", scores, DType::kFloat32));
  if (T <= 0 || scores.numel() % T != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": attention scores ", scores.ToString(),
                                                   " are not rows of ", T));
  }
  ASSIGN_OR_RETURN(uint16_t* const out16,
                   Bf16Out(what, "bf16 probabilities", probs16, "scores", scores));
  const int64_t rows = scores.numel() / T;
  ProfiledOp op(OpCategory::kAttention, "causal_softmax.forward", scores.device(),
                internal::SoftmaxForwardCost(rows, T, out16 != nullptr));
  if (scores.device().is_cuda()) {
    NN_ON_CUDA(scores.device(), what, "causal softmax forward",
               kc::CausalSoftmaxForward(MutF32(scores), rows, T, out16));
  }
  kcpu::CausalSoftmaxForward(MutF32(scores), rows, T, out16);
  return absl::OkStatus();
}

absl::Status CausalSoftmaxBackward(absl::string_view what, const Tensor& p, const Tensor& g,
                                   int64_t T, float scale, const Tensor& out16) {
  RETURN_IF_ERROR(CheckDevices(what, {{"attention probabilities", &p}, {"their gradient", &g}}));
  RETURN_IF_ERROR(CheckFp32OrBf16(what, "attention probabilities", p));
  RETURN_IF_ERROR(CheckDType(what, "their gradient", g, DType::kFloat32));
  RETURN_IF_ERROR(CheckNumel(what, "their gradient", g, p.numel()));
  if (T <= 0 || p.numel() % T != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": attention probabilities ",
                                                   p.ToString(), " are not rows of ", T));
  }
  ASSIGN_OR_RETURN(uint16_t* const o16,
                   Bf16Out(what, "bf16 score gradient", out16, "scores", g));
  const int64_t rows = p.numel() / T;
  ProfiledOp op(OpCategory::kAttention, "causal_softmax.backward", p.device(),
                internal::SoftmaxBackwardCost(rows, T, IsBf16(p), o16 != nullptr));
  if (p.device().is_cuda()) {
    NN_ON_CUDA(p.device(), what, "causal softmax backward",
               kc::CausalSoftmaxBackward(p.raw_data(), IsBf16(p), MutF32(g), rows, T, scale, o16));
  }
  kcpu::CausalSoftmaxBackward(p.raw_data(), IsBf16(p), MutF32(g), rows, T, scale, o16);
  return absl::OkStatus();
}

bool FusedAttentionSupported(const core::Device& device, int64_t head_dim) {
#ifndef FSDP_WITH_CUDA
  if (device.is_cuda()) return false;
#endif
  return ::kernels::FlashAttentionSupports(head_dim);
}

namespace {

// The fused kernels' accesses: 16-byte copies of q, k, v and dL/dy, two-element stores of
// y and dL/dqkv. A view that starts elsewhere is refused, naming it.
absl::Status CheckFusedAligned(absl::string_view what, const char* name, const Tensor& t,
                               int64_t bytes) {
  if (reinterpret_cast<uintptr_t>(t.raw_data()) % bytes == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, ": fused attention needs ", name, " ",
                                                 bytes, "-byte aligned, got ", t.ToString()));
}

// The shapes FusedAttentionForward/Backward share: qkv [B, T, 3C] bf16 with C = n_head * hd
// and hd supported, on a CUDA device; returns hd.
absl::StatusOr<int64_t> CheckFusedAttention(absl::string_view what, const Tensor& qkv,
                                            int64_t n_head) {
  RETURN_IF_ERROR(CheckDType(what, "q, k and v", qkv, DType::kBFloat16));
  if (qkv.dim() != 3 || qkv.size(2) % 3 != 0 || n_head <= 0 || qkv.size(2) / 3 % n_head != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": fused attention needs q, k and v as [B, T, 3C] with C divisible by n_head (",
        n_head, "), got ", qkv.ToString()));
  }
  const int64_t hd = qkv.size(2) / 3 / n_head;
  if (!FusedAttentionSupported(qkv.device(), hd)) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": fused attention runs with head width 64 or 128 (on CUDA with --config=cuda); ",
        "q, k and v ", qkv.ToString(), " have head width ", hd));
  }
  RETURN_IF_ERROR(CheckFusedAligned(what, "q, k and v", qkv, 16));
  return hd;
}

// The dtype an output that may be fp32 or bf16 is checked against: its own when bf16.
DType FloatOrBf16(const Tensor& t) {
  return t.defined() && t.dtype() == DType::kBFloat16 ? DType::kBFloat16 : DType::kFloat32;
}

absl::Status CheckShape(absl::string_view what, const char* name, const Tensor& t, DType dtype,
                        const core::Shape& shape, const Tensor& like) {
  RETURN_IF_ERROR(CheckDevices(what, {{name, &t}, {"q, k and v", &like}}));
  RETURN_IF_ERROR(CheckDType(what, name, t, dtype));
  if (t.shape() != shape) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", name, " must be ",
                                                   core::ShapeToString(shape), ", got ",
                                                   t.ToString()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status FusedAttentionForward(absl::string_view what, const Tensor& qkv, int64_t n_head,
                                   float scale, const Tensor& y, const Tensor& lse) {
  ASSIGN_OR_RETURN(const int64_t hd, CheckFusedAttention(what, qkv, n_head));
  const int64_t B = qkv.size(0), T = qkv.size(1), C = n_head * hd;
  RETURN_IF_ERROR(CheckShape(what, "attention output", y, FloatOrBf16(y), {B, T, C}, qkv));
  RETURN_IF_ERROR(CheckShape(what, "softmax statistics", lse, DType::kFloat32, {B, n_head, T}, qkv));
  RETURN_IF_ERROR(CheckFusedAligned(what, "attention output", y, 2 * core::DTypeSize(y.dtype())));
  ProfiledOp op(OpCategory::kAttention, "fused_attention.forward", qkv.device(),
                internal::FusedAttentionForwardCost(B, T, n_head, hd, core::DTypeSize(y.dtype())));
  if (qkv.device().is_cuda()) {
    NN_ON_CUDA(qkv.device(), what, "fused attention forward",
               kc::FlashAttentionForward(static_cast<const uint16_t*>(qkv.raw_data()),
                                         y.raw_data(), IsBf16(y), MutF32(lse), B, T, n_head, hd,
                                         scale));
  }
  kcpu::FlashAttentionForward(static_cast<const uint16_t*>(qkv.raw_data()), y.raw_data(),
                              IsBf16(y), MutF32(lse), B, T, n_head, hd, scale);
  return absl::OkStatus();
}

absl::Status FusedAttentionBackward(absl::string_view what, const Tensor& qkv, const Tensor& y,
                                    const Tensor& gy, const Tensor& lse, const Tensor& delta,
                                    int64_t n_head, float scale, const Tensor& gqkv) {
  ASSIGN_OR_RETURN(const int64_t hd, CheckFusedAttention(what, qkv, n_head));
  const int64_t B = qkv.size(0), T = qkv.size(1), C = n_head * hd;
  RETURN_IF_ERROR(CheckShape(what, "attention output", y, FloatOrBf16(y), {B, T, C}, qkv));
  RETURN_IF_ERROR(CheckShape(what, "its gradient", gy, DType::kBFloat16, {B, T, C}, qkv));
  RETURN_IF_ERROR(CheckShape(what, "softmax statistics", lse, DType::kFloat32, {B, n_head, T}, qkv));
  RETURN_IF_ERROR(CheckShape(what, "row scratch", delta, DType::kFloat32, {B, n_head, T}, qkv));
  RETURN_IF_ERROR(
      CheckShape(what, "q, k and v gradient", gqkv, FloatOrBf16(gqkv), qkv.shape(), qkv));
  RETURN_IF_ERROR(CheckFusedAligned(what, "its gradient", gy, 16));
  RETURN_IF_ERROR(
      CheckFusedAligned(what, "q, k and v gradient", gqkv, 2 * core::DTypeSize(gqkv.dtype())));
  ProfiledOp op(OpCategory::kAttention, "fused_attention.backward", qkv.device(),
                internal::FusedAttentionBackwardCost(B, T, n_head, hd, core::DTypeSize(y.dtype()),
                                                     core::DTypeSize(gqkv.dtype())));
  const auto* q16 = static_cast<const uint16_t*>(qkv.raw_data());
  const auto* gy16 = static_cast<const uint16_t*>(gy.raw_data());
  if (qkv.device().is_cuda()) {
    NN_ON_CUDA(qkv.device(), what, "fused attention backward",
               kc::FlashAttentionBackward(q16, y.raw_data(), IsBf16(y), gy16, F32(lse),
                                          MutF32(delta), gqkv.raw_data(), IsBf16(gqkv), B, T,
                                          n_head, hd, scale));
  }
  kcpu::FlashAttentionBackward(q16, y.raw_data(), IsBf16(y), gy16, F32(lse), MutF32(delta),
                               gqkv.raw_data(), IsBf16(gqkv), B, T, n_head, hd, scale);
  return absl::OkStatus();
}

absl::Status EmbeddingForward(absl::string_view what, const Tensor& table, const Tensor& ids,
                              const Tensor& y) {
  RETURN_IF_ERROR(CheckDevices(what, {{"weight", &table}, {"ids", &ids}, {"output", &y}}));
  RETURN_IF_ERROR(CheckFp32OrBf16(what, "weight", table));
  RETURN_IF_ERROR(CheckDType(what, "ids", ids, DType::kInt32));
  RETURN_IF_ERROR(CheckDType(what, "output", y, DType::kFloat32));
  if (table.dim() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": weight must be 2-D [num, dim], got ", table.ToString()));
  }
  const int64_t num = table.size(0), dim = table.size(1), n = ids.numel();
  RETURN_IF_ERROR(CheckNumel(what, "output", y, n * dim));
  ProfiledOp op(OpCategory::kEmbedding, "embedding.forward", table.device(),
                internal::EmbeddingForwardCost(n, dim, core::DTypeSize(table.dtype())));
  if (table.device().is_cuda()) {
    NN_ON_CUDA(table.device(), what, "embedding gather",
               kc::EmbeddingForward(ids.data<int32_t>(), n, table.raw_data(), IsBf16(table),
                                      num, dim, MutF32(y)));
  }
  kcpu::EmbeddingForward(ids.data<int32_t>(), n, table.raw_data(), IsBf16(table), num, dim,
                         MutF32(y));
  return absl::OkStatus();
}

absl::Status EmbeddingBackward(absl::string_view what, const Tensor& ids, const Tensor& g,
                               const Tensor& gw) {
  RETURN_IF_ERROR(CheckDevices(what, {{"weight gradient", &gw}, {"ids", &ids},
                                      {"grad_output", &g}}));
  RETURN_IF_ERROR(CheckDType(what, "ids", ids, DType::kInt32));
  RETURN_IF_ERROR(CheckDType(what, "grad_output", g, DType::kFloat32));
  RETURN_IF_ERROR(CheckDType(what, "weight gradient", gw, DType::kFloat32));
  if (gw.dim() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": weight gradient must be 2-D [num, dim], got ", gw.ToString()));
  }
  const int64_t num = gw.size(0), dim = gw.size(1), n = ids.numel();
  RETURN_IF_ERROR(CheckNumel(what, "grad_output", g, n * dim));
  ProfiledOp op(OpCategory::kEmbedding, "embedding.backward", gw.device(),
                internal::EmbeddingBackwardCost(n, dim));
  if (gw.device().is_cuda()) {
#ifdef FSDP_WITH_CUDA
    // The ids sorted with their positions (kernels/cuda/kernels.h), int32 words.
    size_t scratch_bytes = 0;
    RETURN_IF_ERROR(internal::UseDevice(gw.device(), what));
    RETURN_IF_ERROR(internal::Launched(kc::EmbeddingBackwardScratchBytes(n, &scratch_bytes),
                                       what, "embedding gradient scratch size"));
    ASSIGN_OR_RETURN(Tensor scratch,
                     Tensor::Allocate({static_cast<int64_t>((scratch_bytes + 3) / 4)},
                                      DType::kInt32, core::MemoryTag::kActivation, gw.device()));
#endif
    NN_ON_CUDA(gw.device(), what, "embedding gradient scatter-add",
               kc::EmbeddingBackward(ids.data<int32_t>(), n, F32(g), num, dim, MutF32(gw),
                                     scratch.raw_data(), scratch_bytes));
  }
  kcpu::EmbeddingBackward(ids.data<int32_t>(), n, F32(g), num, dim, MutF32(gw));
  return absl::OkStatus();
}

absl::StatusOr<double> CrossEntropyForwardBackward(
    absl::string_view what, const Tensor& logits, const Tensor& targets, const Tensor& grad,
    std::function<absl::StatusOr<double>()>* deferred) {
  RETURN_IF_ERROR(CheckDevices(what, {{"logits", &logits}, {"targets", &targets},
                                      {"gradient", &grad}}));
  RETURN_IF_ERROR(CheckFp32OrBf16(what, "logits", logits));  // fp32 or bf16
  RETURN_IF_ERROR(CheckDType(what, "targets", targets, DType::kInt32));
  RETURN_IF_ERROR(CheckFp32OrBf16(what, "gradient", grad));  // fp32 or bf16
  RETURN_IF_ERROR(CheckNumel(what, "gradient", grad, logits.numel()));
  float* const grad32 = IsBf16(grad) ? nullptr : MutF32(grad);
  uint16_t* const grad16 = IsBf16(grad) ? static_cast<uint16_t*>(grad.raw_data()) : nullptr;
  const int64_t n = targets.numel();
  if (n == 0 || logits.numel() % n != 0 || logits.numel() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": logits ", logits.ToString(),
                                                   " are not rows for targets ",
                                                   targets.ToString()));
  }
  const int64_t V = logits.numel() / n;
  const double inv_n = 1.0 / static_cast<double>(n);
  // The mean of the row losses, added in row order whatever the device or thread count.
  auto mean = [inv_n](const std::vector<double>& rows) {
    double total = 0.0;
    for (double v : rows) total += v;
    return total * inv_n;
  };
  // What reads the mean loss on the host: on CUDA the row losses' copy back (the step's
  // host sync), on the CPU the value already computed.
  std::function<absl::StatusOr<double>()> read;
  {
    ProfiledOp op(OpCategory::kLoss, "cross_entropy", logits.device(),
                  internal::CrossEntropyCost(n, V, IsBf16(grad), IsBf16(logits)));
    if (logits.device().is_cuda()) {
#ifdef FSDP_WITH_CUDA
      RETURN_IF_ERROR(UseDevice(logits.device(), what));
      // Per-row losses as doubles (8 bytes = 2 int32 elements each).
      ASSIGN_OR_RETURN(Tensor row_loss, Tensor::Allocate({2 * n}, DType::kInt32,
                                                         core::MemoryTag::kActivation,
                                                         logits.device()));
      auto* const losses = static_cast<double*>(row_loss.raw_data());
      RETURN_IF_ERROR(Launched(
          IsBf16(logits) ? kc::CrossEntropy(static_cast<const uint16_t*>(logits.raw_data()),
                                            targets.data<int32_t>(), n, V, inv_n, grad32,
                                            losses, grad16)
                         : kc::CrossEntropy(F32(logits), targets.data<int32_t>(), n, V, inv_n,
                                            grad32, losses, grad16),
          what, "cross-entropy"));
      read = [row_loss, n, mean, what = std::string(what)]() -> absl::StatusOr<double> {
        RETURN_IF_ERROR(UseDevice(row_loss.device(), what));
        std::vector<double> host(static_cast<size_t>(n));
        RETURN_IF_ERROR(Launched(cudaMemcpy(host.data(), row_loss.raw_data(),
                                            sizeof(double) * static_cast<size_t>(n),
                                            cudaMemcpyDeviceToHost),
                                 what, "copy of the cross-entropy row losses to the host"));
        return mean(host);
      };
#else
      return NoCuda(logits.device(), what);
#endif
    } else {
      std::vector<double> row_loss(static_cast<size_t>(n));
      if (IsBf16(logits)) {
        kcpu::CrossEntropy(static_cast<const uint16_t*>(logits.raw_data()),
                           targets.data<int32_t>(), n, V, inv_n, grad32, row_loss.data(), grad16);
      } else {
        kcpu::CrossEntropy(F32(logits), targets.data<int32_t>(), n, V, inv_n, grad32,
                           row_loss.data(), grad16);
      }
      read = [loss = mean(row_loss)]() -> absl::StatusOr<double> { return loss; };
    }
  }
  // The read is the step's host sync, recorded where it happens (NOTE [Deferred loss]).
  auto recorded = [read = std::move(read), n]() -> absl::StatusOr<double> {
    RecordOp(OpCategory::kHostSync, "cross_entropy.loss_to_host",
             core::OpCost{0, 8.0 * n, 0, core::OpEngine::kHostSync});
    return read();
  };
  if (deferred == nullptr) return recorded();
  *deferred = std::move(recorded);
  return std::nan("");
}

absl::Status ZeroTensor(absl::string_view what, const Tensor& t) {
  if (!t.defined()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": zeroing an undefined tensor"));
  }
  // core::Tensor::TryZero: a memset on the compute stream, recorded as the op "zero".
  const absl::Status zeroed = t.TryZero();
  if (!zeroed.ok()) {
    return absl::Status(zeroed.code(), absl::StrCat(what, ": ", zeroed.message()));
  }
  return absl::OkStatus();
}

}  // namespace nn
