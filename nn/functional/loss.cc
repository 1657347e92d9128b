#include "nn/functional/loss.h"

#include <cstdint>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nn/functional/internal/row_ops.h"
#include "nn/functional/internal/tensor_args.h"
#include "nn/internal/op_checks.h"
#include "nn/internal/validate.h"
#include "nn/losses.h"
#include "nn/tensor_ops.h"

namespace nn {
namespace functional {
namespace {

using core::DType;
using core::Tensor;
using ::nn::internal::NewActivation;

// `t` on `device`: itself, or a copy.
absl::StatusOr<Tensor> OnDevice(const Tensor& t, const core::Device& device) {
  if (t.device() == device) return t;
  return t.To(device, core::MemoryTag::kActivation);
}

// Indices on the host (targets, rows) on `device` (NOTE [Index uploads] in nn/tensor_ops.h):
// `t` itself where it is there already (a CPU op reads host indices where they are, and
// the upload the CUDA path makes is recorded), else a copy.
absl::StatusOr<Tensor> IndicesOn(const Tensor& t, const core::Device& device) {
  if (t.device() == device) {
    if (device.is_cpu()) RecordIndexUpload(t);
    return t;
  }
  return t.To(device, core::MemoryTag::kActivation);
}

// A one-element fp32 tensor (shape []) holding `value` on `device`.
absl::StatusOr<Tensor> Scalar(float value, const core::Device& device) {
  ASSIGN_OR_RETURN(const Tensor host, Tensor::FromVector({value}, {}));
  return OnDevice(host, device);
}

// A fresh gradient: `kept` scaled by the incoming gradient g (negated when `negate`).
absl::StatusOr<Tensor> Scaled(const char* op, const char* name, const Tensor& kept, const Tensor& g,
                              bool negate) {
  ASSIGN_OR_RETURN(Tensor out, NewActivation(kept.shape(), kept.device()));
  RETURN_IF_ERROR(internal::ScaleByScalar(op, name, kept, g, negate, out));
  return out;
}

// The rows of CrossEntropy whose targets count: their flat positions and targets.
struct KeptRows {
  std::vector<int32_t> rows, targets;
};

// CrossEntropy's checks; the rows whose targets count (targets read on the host).
absl::StatusOr<KeptRows> CheckCrossEntropy(const Tensor& logits, const Tensor& targets,
                                           int64_t ignore_index) {
  if (!logits.defined()) return absl::InvalidArgumentError("CrossEntropy: logits is undefined");
  if (!targets.defined()) return absl::InvalidArgumentError("CrossEntropy: targets is undefined");
  RETURN_IF_ERROR(::nn::internal::CheckFp32OrBf16("CrossEntropy", "logits", logits));
  RETURN_IF_ERROR(::nn::internal::CheckDType("CrossEntropy", "targets", targets, DType::kInt32));
  const core::Shape& ls = logits.shape();
  if (ls.empty() || targets.shape() != core::Shape(ls.begin(), ls.end() - 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CrossEntropy: logits ", logits.ToString(), " must be [..., V] with targets [...] of ",
        "the leading shape, got targets ", targets.ToString()));
  }
  if (!targets.device().is_cpu() && targets.device() != logits.device()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CrossEntropy: targets ", targets.ToString(), " are on ", targets.device().ToString(),
        " but logits ", logits.ToString(), " on ", logits.device().ToString(),
        "; targets must be on the CPU or the logits' device"));
  }
  const int64_t V = ls.back();
  ASSIGN_OR_RETURN(const Tensor host, OnDevice(targets, core::Device::Cpu()));
  const int32_t* tg = host.data<int32_t>();
  KeptRows kept;
  for (int64_t i = 0; i < host.numel(); ++i) {
    if (tg[i] == ignore_index) continue;
    if (tg[i] < 0 || tg[i] >= V) {
      return absl::InvalidArgumentError(
          absl::StrCat("CrossEntropy: target ", tg[i], " at flat position ", i, " of targets ",
                       core::ShapeToString(targets.shape()), " is outside [0, ", V, ") and is not ",
                       "ignore_index ", ignore_index));
    }
    kept.rows.push_back(static_cast<int32_t>(i));
    kept.targets.push_back(tg[i]);
  }
  return kept;
}

// The mean loss over the rows `kept` of logits, and into `grad` (logits' shape; fp32, or bf16 when
// every row is kept) its gradient, 0 on the other rows: NOTE [Functional losses]. With `deferred`
// non-null, NaN, and *deferred reads the mean (nn::CrossEntropyForwardBackward's).
absl::StatusOr<double> CrossEntropyRows(const Tensor& logits, const Tensor& targets,
                                        const KeptRows& kept, const Tensor& grad,
                                        std::function<absl::StatusOr<double>()>* deferred) {
  const char* op = "CrossEntropy";
  const core::Device device = logits.device();
  const int64_t n = targets.numel(), V = logits.size(-1);
  if (kept.rows.empty()) {
    RETURN_IF_ERROR(ZeroTensor(op, grad));
    if (deferred != nullptr) *deferred = []() -> absl::StatusOr<double> { return 0.0; };
    return 0.0;
  }
  if (static_cast<int64_t>(kept.rows.size()) == n) {
    ASSIGN_OR_RETURN(const Tensor device_targets, IndicesOn(targets, device));
    return CrossEntropyForwardBackward(op, logits, device_targets, grad, deferred);
  }
  // The kept rows and their targets, gathered as an embedding lookup gathers rows.
  const int64_t m = static_cast<int64_t>(kept.rows.size());
  ASSIGN_OR_RETURN(const Tensor host_rows, Tensor::FromInts(kept.rows, {m}));
  ASSIGN_OR_RETURN(const Tensor rows, IndicesOn(host_rows, device));
  ASSIGN_OR_RETURN(const Tensor host_picked, Tensor::FromInts(kept.targets, {m}));
  ASSIGN_OR_RETURN(const Tensor picked_targets, IndicesOn(host_picked, device));
  ASSIGN_OR_RETURN(const Tensor table, logits.Reshape({n, V}));
  ASSIGN_OR_RETURN(const Tensor picked_logits, NewActivation({m, V}, device));
  RETURN_IF_ERROR(EmbeddingForward(op, table, rows, picked_logits));
  ASSIGN_OR_RETURN(const Tensor picked_grad, NewActivation({m, V}, device));
  ASSIGN_OR_RETURN(const double loss, CrossEntropyForwardBackward(op, picked_logits, picked_targets,
                                                                  picked_grad, deferred));
  // Scattered back: each kept row is added once into zeros, so it keeps its bits.
  RETURN_IF_ERROR(ZeroTensor(op, grad));
  ASSIGN_OR_RETURN(const Tensor grad2d, grad.Reshape({n, V}));
  RETURN_IF_ERROR(EmbeddingBackward(op, rows, picked_grad, grad2d));
  return loss;
}

}  // namespace

absl::StatusOr<Tensor> CrossEntropy(core::Arg logits, core::Arg targets, int64_t ignore_index) {
  CrossEntropyOptions options;
  options.ignore_index = ignore_index;
  return CrossEntropy(std::move(logits), std::move(targets), options);
}

absl::StatusOr<Tensor> CrossEntropy(core::Arg logits_arg, core::Arg targets_arg,
                                    const CrossEntropyOptions& options) {
  RETURN_IF_ERROR(logits_arg.status());
  RETURN_IF_ERROR(targets_arg.status());
  const Tensor& logits = logits_arg.tensor();
  const Tensor& targets = targets_arg.tensor();
  ASSIGN_OR_RETURN(const KeptRows kept, CheckCrossEntropy(logits, targets, options.ignore_index));
  // NOTE [bf16 logits] (nn/gpt.h): a head whose bf16 GEMMs round the logits' gradient anyway takes
  // it bf16, each value the fp32 one rounded once (when every row counts).
  const bool grad16 = static_cast<int64_t>(kept.rows.size()) == targets.numel() &&
                      internal::ProducerTakesBf16Grad(logits);
  ASSIGN_OR_RETURN(Tensor grad, NewActivation(logits.shape(), logits.device(),
                                              grad16 ? DType::kBFloat16 : DType::kFloat32));
  // NOTE [Deferred loss] (nn/losses.h): the value stays where it was computed until read.
  const bool defer = options.read_loss != nullptr;
  std::function<absl::StatusOr<double>()> read;
  ASSIGN_OR_RETURN(const double mean,
                   CrossEntropyRows(logits, targets, kept, grad, defer ? &read : nullptr));
  Tensor loss;
  if (defer) {
    ASSIGN_OR_RETURN(loss, NewActivation({}, logits.device()));
    RETURN_IF_ERROR(loss.TryFill(std::numeric_limits<float>::quiet_NaN()));
    // The value the undeferred call holds, rounded to float the same way.
    *options.read_loss = [read = std::move(read)]() -> absl::StatusOr<double> {
      ASSIGN_OR_RETURN(const double m, read());
      return static_cast<double>(static_cast<float>(m));
    };
  } else {
    // Rounded to float as nn::CrossEntropyLoss rounds it.
    ASSIGN_OR_RETURN(loss, Scalar(static_cast<float>(mean), logits.device()));
  }
  RETURN_IF_ERROR(core::RecordFunction(
      "CrossEntropy", {logits, targets}, {&loss}, {grad},
      [](const core::BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
        const Tensor& kept = ctx.saved(0);
        // Backward(loss)'s seed 1: the kept gradient as it is (its bits times 1).
        if (core::IsUnitSeed(ctx.grad(0))) return std::vector<Tensor>{kept, Tensor()};
        Tensor kept32 = kept;
        if (kept.dtype() == DType::kBFloat16) {
          ASSIGN_OR_RETURN(kept32, kept.ToDType(DType::kFloat32, core::MemoryTag::kActivation));
        }
        ASSIGN_OR_RETURN(Tensor g, Scaled("CrossEntropy", "cross_entropy.backward", kept32,
                                          ctx.grad(0), /*negate=*/false));
        return std::vector<Tensor>{g, Tensor()};
      },
      {"logits gradient"}));
  return loss;
}

absl::StatusOr<Tensor> Mse(core::Arg a_arg, core::Arg b_arg) {
  RETURN_IF_ERROR(a_arg.status());
  RETURN_IF_ERROR(b_arg.status());
  const Tensor& a = a_arg.tensor();
  const Tensor& b = b_arg.tensor();
  RETURN_IF_ERROR(::nn::internal::CheckDevices("Mse", {{"a", &a}, {"b", &b}}));
  RETURN_IF_ERROR(::nn::internal::CheckDType("Mse", "a", a, DType::kFloat32));
  RETURN_IF_ERROR(::nn::internal::CheckDType("Mse", "b", b, DType::kFloat32));
  if (a.shape() != b.shape()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Mse: a ", a.ToString(), " and b ", b.ToString(), " differ in shape"));
  }
  if (a.numel() == 0) {
    return absl::InvalidArgumentError(absl::StrCat("Mse: a ", a.ToString(), " is empty"));
  }
  ASSIGN_OR_RETURN(LossResult r, MseLoss(a, b));
  ASSIGN_OR_RETURN(Tensor loss, Scalar(r.loss, a.device()));
  RETURN_IF_ERROR(core::RecordFunction(
      "Mse", {a, b}, {&loss}, {r.grad},
      [](const core::BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
        std::vector<Tensor> grads(2);
        for (int i = 0; i < 2; ++i) {
          if (!ctx.needs_grad(i)) continue;
          ASSIGN_OR_RETURN(grads[i], Scaled("Mse", "mse.backward", ctx.saved(0), ctx.grad(0),
                                            /*negate=*/i == 1));
        }
        return grads;
      },
      {"gradient"}));
  return loss;
}

}  // namespace functional
}  // namespace nn
