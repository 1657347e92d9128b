#include "nn/losses.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/status_macros.h"
#include "nn/tensor_ops.h"

namespace nn {
namespace {

absl::Status CheckType(absl::string_view loss, absl::string_view what, const core::Tensor& t,
                       core::DType dtype) {
  if (!t.defined() || t.dtype() != dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat(loss, ": ", what, " must be a ", core::DTypeName(dtype), " tensor, got ",
                     t.defined() ? t.ToString() : std::string("undefined")));
  }
  return absl::OkStatus();
}

absl::StatusOr<core::Tensor> NewGrad(const core::Shape& shape, const core::Device& device) {
  return core::Tensor::Allocate(shape, core::DType::kFloat32, core::MemoryTag::kActivation, device);
}

// `t` itself when on the CPU, else a host copy (synchronises with the device).
absl::StatusOr<core::Tensor> OnHost(const core::Tensor& t) {
  if (t.device().is_cpu()) return t;
  ASSIGN_OR_RETURN(core::Tensor host,
                   core::Tensor::Allocate(t.shape(), t.dtype(), core::MemoryTag::kActivation));
  RETURN_IF_ERROR(host.CopyFrom(t));
  return host;
}

}  // namespace

absl::StatusOr<LossResult> MseLoss(const core::Tensor& pred, const core::Tensor& target) {
  RETURN_IF_ERROR(CheckType("MseLoss", "pred", pred, core::DType::kFloat32));
  RETURN_IF_ERROR(CheckType("MseLoss", "target", target, core::DType::kFloat32));
  if (pred.shape() != target.shape()) {
    return absl::InvalidArgumentError(
        absl::StrCat("MseLoss: pred ", core::ShapeToString(pred.shape()), " and target ",
                     core::ShapeToString(target.shape()), " differ in shape"));
  }
  if (pred.device() != target.device()) {
    return absl::InvalidArgumentError(absl::StrCat("MseLoss: pred is on ", pred.device().ToString(),
                                                   " but target on ", target.device().ToString()));
  }
  const int64_t n = pred.numel();
  if (n == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("MseLoss: pred ", core::ShapeToString(pred.shape()), " is empty"));
  }
  // Computed on the host (a small loss; device tensors are copied there and back).
  ASSIGN_OR_RETURN(core::Tensor hp, OnHost(pred));
  ASSIGN_OR_RETURN(core::Tensor ht, OnHost(target));
  ASSIGN_OR_RETURN(core::Tensor grad, NewGrad(pred.shape(), core::Device::Cpu()));
  const float* p = hp.data<float>();
  const float* t = ht.data<float>();
  float* g = grad.data<float>();
  double sum = 0.0;
  const double scale = 2.0 / static_cast<double>(n);
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(p[i]) - t[i];
    sum += d * d;
    g[i] = static_cast<float>(scale * d);
  }
  LossResult r;
  r.loss = static_cast<float>(sum / static_cast<double>(n));
  if (pred.device().is_cpu()) {
    r.grad = std::move(grad);
  } else {
    ASSIGN_OR_RETURN(r.grad, NewGrad(pred.shape(), pred.device()));
    RETURN_IF_ERROR(r.grad.CopyFrom(grad));
  }
  return r;
}

absl::StatusOr<LossResult> CrossEntropyLoss(const core::Tensor& logits, const core::Tensor& targets,
                                            core::DType grad_dtype, bool defer_read) {
  if (!logits.defined() ||
      (logits.dtype() != core::DType::kFloat32 && logits.dtype() != core::DType::kBFloat16)) {
    return absl::InvalidArgumentError(
        absl::StrCat("CrossEntropyLoss: logits must be a float32 or bfloat16 tensor, got ",
                     logits.defined() ? logits.ToString() : std::string("undefined")));
  }
  if (grad_dtype != core::DType::kFloat32 && grad_dtype != core::DType::kBFloat16) {
    return absl::InvalidArgumentError(absl::StrCat("CrossEntropyLoss: grad_dtype must be ",
                                                   "float32 or bfloat16, got ",
                                                   core::DTypeName(grad_dtype)));
  }
  RETURN_IF_ERROR(CheckType("CrossEntropyLoss", "targets", targets, core::DType::kInt32));
  const core::Shape& ls = logits.shape();
  const core::Shape leading(ls.begin(), ls.empty() ? ls.end() : ls.end() - 1);
  if (ls.empty() || targets.shape() != leading) {
    return absl::InvalidArgumentError(absl::StrCat("CrossEntropyLoss: logits ",
                                                   core::ShapeToString(ls),
                                                   " must be [..., V] with targets [...]"
                                                   " of the leading shape, got targets ",
                                                   core::ShapeToString(targets.shape())));
  }
  const core::Device device = logits.device();
  if (!targets.device().is_cpu() && targets.device() != device) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CrossEntropyLoss: targets are on ", targets.device().ToString(), " but logits on ",
        device.ToString(), "; targets must be on the CPU or the logits' device"));
  }
  const int64_t V = ls.back();
  const int64_t n = targets.numel();
  if (n == 0 || V == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CrossEntropyLoss: logits ", core::ShapeToString(ls), " has no tokens or classes"));
  }
  // Targets are checked on the host (copied back when they live on a device).
  ASSIGN_OR_RETURN(core::Tensor host_targets, OnHost(targets));
  const int32_t* tg = host_targets.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    if (tg[i] < 0 || tg[i] >= V) {
      return absl::InvalidArgumentError(
          absl::StrCat("CrossEntropyLoss: target ", tg[i], " at flat position ", i, " of targets ",
                       core::ShapeToString(targets.shape()), " is outside [0, ", V, ")"));
    }
  }
  // NOTE [Index uploads] (nn/tensor_ops.h).
  core::Tensor device_targets = targets;
  if (device.is_cpu()) RecordIndexUpload(targets);
  if (targets.device() != device) {
    ASSIGN_OR_RETURN(device_targets, core::Tensor::Allocate(targets.shape(), core::DType::kInt32,
                                                            core::MemoryTag::kActivation, device));
    RETURN_IF_ERROR(device_targets.CopyFrom(targets));
  }
  LossResult r;
  ASSIGN_OR_RETURN(r.grad,
                   core::Tensor::Allocate(ls, grad_dtype, core::MemoryTag::kActivation, device));
  std::function<absl::StatusOr<double>()> read;
  ASSIGN_OR_RETURN(double loss,
                   CrossEntropyForwardBackward("CrossEntropyLoss", logits, device_targets, r.grad,
                                               defer_read ? &read : nullptr));
  r.loss = static_cast<float>(loss);
  if (defer_read) {
    // NOTE [Deferred loss]: the value `loss` would have held, rounded to float the same way.
    r.read_loss = [read = std::move(read)]() -> absl::StatusOr<double> {
      ASSIGN_OR_RETURN(const double mean, read());
      return static_cast<double>(static_cast<float>(mean));
    };
  }
  return r;
}

}  // namespace nn
