// The norms of nn/tensor_ops.h: LayerNorm forward and backward, their fused residual
// adds (NOTE [Fused ops]), and RMSNorm's, which run LayerNorm's code without the mean and
// the bias.
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/cpu/kernels.h"
#include "kernels/rowwise.h"
#include "nn/internal/op_checks.h"
#include "nn/internal/op_costs.h"
#include "nn/internal/tensor_ops_common.h"
#include "nn/tensor_ops.h"

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
using internal::Arg;
using internal::Bf16Out;
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
using internal::ColumnSumsOnCuda;
using internal::Launched;
using internal::PartialSums;
using internal::UseDevice;
#else
using internal::NoCuda;
#endif

}  // namespace

namespace internal {

// Declared, with what it does, in nn/internal/tensor_ops_common.h.
absl::StatusOr<uint16_t*> Bf16Out(absl::string_view what, const char* name, const Tensor& out,
                                  const char* like_name, const Tensor& like) {
  if (!out.defined()) return nullptr;
  RETURN_IF_ERROR(CheckDevices(what, {{name, &out}, {like_name, &like}}));
  RETURN_IF_ERROR(CheckDType(what, name, out, DType::kBFloat16));
  RETURN_IF_ERROR(CheckNumel(what, name, out, like.numel()));
  return static_cast<uint16_t*>(out.raw_data());
}

}  // namespace internal

namespace {

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
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": weight ", w.ToString(), " does not tile input ", x.ToString()));
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
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": weight ", w.ToString(), " does not tile grad_output ", g.ToString()));
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
    NN_ON_CUDA(
        x.device(), what, "LayerNorm forward",
        kc::LayerNormForward(F32(x), w.raw_data(), b.raw_data(), IsBf16(w), eps, y.raw_data(),
                             MutF32(mean), MutF32(rstd), rows, w.numel(), IsBf16(y)));
  }
  kcpu::LayerNormForward(F32(x), w.raw_data(), b.raw_data(), IsBf16(w), eps, y.raw_data(),
                         MutF32(mean), MutF32(rstd), rows, w.numel(), IsBf16(y));
  return absl::OkStatus();
}

absl::Status AddLayerNormForward(absl::string_view what, const Tensor& a, const Tensor& b,
                                 const Tensor& w, const Tensor& bias, float eps, const Tensor& h,
                                 const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  RETURN_IF_ERROR(
      CheckElementwiseF32(what, {{"first operand", &a}, {"second operand", &b}, {"sum", &h}}));
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
  ProfiledOp op(
      OpCategory::kNorm, "layernorm.backward_add", g.device(),
      internal::LayerNormBackwardCost(rows, w.numel(), core::DTypeSize(w.dtype()), gw.defined(),
                                      gb.defined(), /*residual=*/true, out16 != nullptr));
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

}  // namespace nn
