#include "nn/losses.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/status_macros.h"

namespace nn {
namespace {

absl::Status CheckCpu(absl::string_view loss, absl::string_view what, const core::Tensor& t,
                      core::DType dtype) {
  if (!t.defined() || !t.device().is_cpu() || t.dtype() != dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat(loss, ": ", what, " must be a ", core::DTypeName(dtype), " CPU tensor, got ",
                     t.defined() ? t.ToString() : std::string("undefined")));
  }
  return absl::OkStatus();
}

absl::StatusOr<core::Tensor> NewGrad(const core::Shape& shape) {
  return core::Tensor::Allocate(shape, core::DType::kFloat32, core::MemoryTag::kActivation);
}

}  // namespace

absl::StatusOr<LossResult> MseLoss(const core::Tensor& pred, const core::Tensor& target) {
  RETURN_IF_ERROR(CheckCpu("MseLoss", "pred", pred, core::DType::kFloat32));
  RETURN_IF_ERROR(CheckCpu("MseLoss", "target", target, core::DType::kFloat32));
  if (pred.shape() != target.shape()) {
    return absl::InvalidArgumentError(
        absl::StrCat("MseLoss: pred ", core::ShapeToString(pred.shape()), " and target ",
                     core::ShapeToString(target.shape()), " differ in shape"));
  }
  const int64_t n = pred.numel();
  if (n == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("MseLoss: pred ", core::ShapeToString(pred.shape()), " is empty"));
  }
  LossResult r;
  ASSIGN_OR_RETURN(r.grad, NewGrad(pred.shape()));
  const float* p = pred.data<float>();
  const float* t = target.data<float>();
  float* g = r.grad.data<float>();
  double sum = 0.0;
  const double scale = 2.0 / static_cast<double>(n);
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(p[i]) - t[i];
    sum += d * d;
    g[i] = static_cast<float>(scale * d);
  }
  r.loss = static_cast<float>(sum / static_cast<double>(n));
  return r;
}

absl::StatusOr<LossResult> CrossEntropyLoss(const core::Tensor& logits,
                                            const core::Tensor& targets) {
  RETURN_IF_ERROR(CheckCpu("CrossEntropyLoss", "logits", logits, core::DType::kFloat32));
  RETURN_IF_ERROR(CheckCpu("CrossEntropyLoss", "targets", targets, core::DType::kInt32));
  const core::Shape& ls = logits.shape();
  const core::Shape leading(ls.begin(), ls.empty() ? ls.end() : ls.end() - 1);
  if (ls.empty() || targets.shape() != leading) {
    return absl::InvalidArgumentError(absl::StrCat("CrossEntropyLoss: logits ",
                                                   core::ShapeToString(ls),
                                                   " must be [..., V] with targets [...]"
                                                   " of the leading shape, got targets ",
                                                   core::ShapeToString(targets.shape())));
  }
  const int64_t V = ls.back();
  const int64_t n = targets.numel();
  if (n == 0 || V == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CrossEntropyLoss: logits ", core::ShapeToString(ls), " has no tokens or classes"));
  }
  const int32_t* tg = targets.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    if (tg[i] < 0 || tg[i] >= V) {
      return absl::InvalidArgumentError(
          absl::StrCat("CrossEntropyLoss: target ", tg[i], " at flat position ", i, " of targets ",
                       core::ShapeToString(targets.shape()), " is outside [0, ", V, ")"));
    }
  }
  LossResult r;
  ASSIGN_OR_RETURN(r.grad, NewGrad(ls));
  const double inv_n = 1.0 / static_cast<double>(n);
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float* row = logits.data<float>() + i * V;
    float* grow = r.grad.data<float>() + i * V;
    const double max = *std::max_element(row, row + V);
    double sum = 0.0;
    for (int64_t j = 0; j < V; ++j) sum += std::exp(static_cast<double>(row[j]) - max);
    const double log_sum = std::log(sum);
    total += log_sum + max - row[tg[i]];
    for (int64_t j = 0; j < V; ++j) {
      const double p = std::exp(static_cast<double>(row[j]) - max - log_sum);
      grow[j] = static_cast<float>((p - (j == tg[i] ? 1.0 : 0.0)) * inv_n);
    }
  }
  r.loss = static_cast<float>(total * inv_n);
  return r;
}

}  // namespace nn
