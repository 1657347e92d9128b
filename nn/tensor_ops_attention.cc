// The attention ops of nn/tensor_ops.h: the causal softmax forward and backward, and the
// fused attention (NOTE [Fused attention] in nn/attention.h).
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/cpu/kernels.h"
#include "kernels/rowwise.h"
#include "nn/internal/op_checks.h"
#include "nn/internal/op_costs.h"
#include "nn/internal/tensor_ops_common.h"
#include "nn/tensor_ops.h"

#ifdef FSDP_WITH_CUDA
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/kernels.h"
#include "kernels/tuning_switches.h"
#endif

namespace nn {
namespace {

namespace kcpu = ::kernels::cpu;
using core::DType;
using core::OpCategory;
using core::ProfiledOp;
using core::Tensor;
using internal::Bf16Out;
using internal::CheckDevices;
using internal::CheckDType;
using internal::CheckFp32OrBf16;
using internal::CheckNumel;
using internal::F32;
using internal::IsBf16;
using internal::MutF32;
#ifdef FSDP_WITH_CUDA
namespace kc = ::kernels::cuda;
#endif

}  // namespace

absl::Status CausalSoftmaxForward(absl::string_view what, const Tensor& scores, int64_t T,
                                  const Tensor& probs16) {
  RETURN_IF_ERROR(CheckDevices(what, {{"attention scores", &scores}}));
  RETURN_IF_ERROR(CheckDType(what, "attention scores", scores, DType::kFloat32));
  if (T <= 0 || scores.numel() % T != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": attention scores ", scores.ToString(), " are not rows of ", T));
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
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": attention probabilities ", p.ToString(), " are not rows of ", T));
  }
  ASSIGN_OR_RETURN(uint16_t* const o16, Bf16Out(what, "bf16 score gradient", out16, "scores", g));
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
  return absl::InvalidArgumentError(absl::StrCat(what, ": fused attention needs ", name, " ", bytes,
                                                 "-byte aligned, got ", t.ToString()));
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

#ifdef FSDP_WITH_CUDA
// NOTE [Flash block shapes] (kernels/cuda/flash_attention.h): an unknown
// FSDP_ATTENTION_SHAPES, which the kernels can only answer with cudaErrorInvalidValue, is
// refused here, naming the variable and its value.
absl::Status CheckAttentionSwitches(absl::string_view what) {
  const absl::StatusOr<::kernels::FlashShapePolicy>& policy =
      ::kernels::FlashShapePolicyFromEnvironment();
  return core::Annotate(policy.status(), absl::StrCat(what, ": fused attention"));
}
#endif

// The dtype an output that may be fp32 or bf16 is checked against: its own when bf16.
DType FloatOrBf16(const Tensor& t) {
  return t.defined() && t.dtype() == DType::kBFloat16 ? DType::kBFloat16 : DType::kFloat32;
}

absl::Status CheckShape(absl::string_view what, const char* name, const Tensor& t, DType dtype,
                        const core::Shape& shape, const Tensor& like) {
  RETURN_IF_ERROR(CheckDevices(what, {{name, &t}, {"q, k and v", &like}}));
  RETURN_IF_ERROR(CheckDType(what, name, t, dtype));
  if (t.shape() != shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", name, " must be ", core::ShapeToString(shape), ", got ", t.ToString()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status FusedAttentionForward(absl::string_view what, const Tensor& qkv, int64_t n_head,
                                   float scale, const Tensor& y, const Tensor& lse) {
  ASSIGN_OR_RETURN(const int64_t hd, CheckFusedAttention(what, qkv, n_head));
  const int64_t B = qkv.size(0), T = qkv.size(1), C = n_head * hd;
  RETURN_IF_ERROR(CheckShape(what, "attention output", y, FloatOrBf16(y), {B, T, C}, qkv));
  RETURN_IF_ERROR(
      CheckShape(what, "softmax statistics", lse, DType::kFloat32, {B, n_head, T}, qkv));
  RETURN_IF_ERROR(CheckFusedAligned(what, "attention output", y, 2 * core::DTypeSize(y.dtype())));
  ProfiledOp op(OpCategory::kAttention, "fused_attention.forward", qkv.device(),
                internal::FusedAttentionForwardCost(B, T, n_head, hd, core::DTypeSize(y.dtype())));
  if (qkv.device().is_cuda()) {
#ifdef FSDP_WITH_CUDA
    RETURN_IF_ERROR(CheckAttentionSwitches(what));
#endif
    NN_ON_CUDA(qkv.device(), what, "fused attention forward",
               kc::FlashAttentionForward(static_cast<const uint16_t*>(qkv.raw_data()), y.raw_data(),
                                         IsBf16(y), MutF32(lse), B, T, n_head, hd, scale));
  }
  kcpu::FlashAttentionForward(static_cast<const uint16_t*>(qkv.raw_data()), y.raw_data(), IsBf16(y),
                              MutF32(lse), B, T, n_head, hd, scale);
  return absl::OkStatus();
}

absl::Status FusedAttentionBackward(absl::string_view what, const Tensor& qkv, const Tensor& y,
                                    const Tensor& gy, const Tensor& lse, const Tensor& delta,
                                    int64_t n_head, float scale, const Tensor& gqkv) {
  ASSIGN_OR_RETURN(const int64_t hd, CheckFusedAttention(what, qkv, n_head));
  const int64_t B = qkv.size(0), T = qkv.size(1), C = n_head * hd;
  RETURN_IF_ERROR(CheckShape(what, "attention output", y, FloatOrBf16(y), {B, T, C}, qkv));
  RETURN_IF_ERROR(CheckShape(what, "its gradient", gy, DType::kBFloat16, {B, T, C}, qkv));
  RETURN_IF_ERROR(
      CheckShape(what, "softmax statistics", lse, DType::kFloat32, {B, n_head, T}, qkv));
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
#ifdef FSDP_WITH_CUDA
    RETURN_IF_ERROR(CheckAttentionSwitches(what));
#endif
    NN_ON_CUDA(
        qkv.device(), what, "fused attention backward",
        kc::FlashAttentionBackward(q16, y.raw_data(), IsBf16(y), gy16, F32(lse), MutF32(delta),
                                   gqkv.raw_data(), IsBf16(gqkv), B, T, n_head, hd, scale));
  }
  kcpu::FlashAttentionBackward(q16, y.raw_data(), IsBf16(y), gy16, F32(lse), MutF32(delta),
                               gqkv.raw_data(), IsBf16(gqkv), B, T, n_head, hd, scale);
  return absl::OkStatus();
}

}  // namespace nn
