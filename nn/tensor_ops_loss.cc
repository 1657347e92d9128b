// CrossEntropyForwardBackward of nn/tensor_ops.h: the loss rows and their gradient in one
// pass, the mean loss read on the host now or later (NOTE [Deferred loss] in nn/losses.h).
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/cpu/kernels.h"
#include "nn/internal/op_checks.h"
#include "nn/internal/op_costs.h"
#include "nn/tensor_ops.h"

#ifdef FSDP_WITH_CUDA
#include <cuda_runtime_api.h>

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
using internal::CheckDevices;
using internal::CheckDType;
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

absl::StatusOr<double> CrossEntropyForwardBackward(
    absl::string_view what, const Tensor& logits, const Tensor& targets, const Tensor& grad,
    std::function<absl::StatusOr<double>()>* deferred) {
  RETURN_IF_ERROR(
      CheckDevices(what, {{"logits", &logits}, {"targets", &targets}, {"gradient", &grad}}));
  RETURN_IF_ERROR(CheckFp32OrBf16(what, "logits", logits));  // fp32 or bf16
  RETURN_IF_ERROR(CheckDType(what, "targets", targets, DType::kInt32));
  RETURN_IF_ERROR(CheckFp32OrBf16(what, "gradient", grad));  // fp32 or bf16
  RETURN_IF_ERROR(CheckNumel(what, "gradient", grad, logits.numel()));
  float* const grad32 = IsBf16(grad) ? nullptr : MutF32(grad);
  uint16_t* const grad16 = IsBf16(grad) ? static_cast<uint16_t*>(grad.raw_data()) : nullptr;
  const int64_t n = targets.numel();
  if (n == 0 || logits.numel() % n != 0 || logits.numel() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": logits ", logits.ToString(), " are not rows for targets ", targets.ToString()));
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
      ASSIGN_OR_RETURN(
          Tensor row_loss,
          Tensor::Allocate({2 * n}, DType::kInt32, core::MemoryTag::kActivation, logits.device()));
      auto* const losses = static_cast<double*>(row_loss.raw_data());
      RETURN_IF_ERROR(Launched(
          IsBf16(logits)
              ? kc::CrossEntropy(static_cast<const uint16_t*>(logits.raw_data()),
                                 targets.data<int32_t>(), n, V, inv_n, grad32, losses, grad16)
              : kc::CrossEntropy(F32(logits), targets.data<int32_t>(), n, V, inv_n, grad32, losses,
                                 grad16),
          what, "cross-entropy"));
      read = [row_loss, n, mean, what = std::string(what)]() -> absl::StatusOr<double> {
        RETURN_IF_ERROR(UseDevice(row_loss.device(), what));
        std::vector<double> host(static_cast<size_t>(n));
        RETURN_IF_ERROR(
            Launched(cudaMemcpy(host.data(), row_loss.raw_data(),
                                sizeof(double) * static_cast<size_t>(n), cudaMemcpyDeviceToHost),
                     what, "copy of the cross-entropy row losses to the host"));
        return mean(host);
      };
#else
      return NoCuda(logits.device(), what);
#endif
    } else {
      std::vector<double> row_loss(static_cast<size_t>(n));
      if (IsBf16(logits)) {
        kcpu::CrossEntropy(static_cast<const uint16_t*>(logits.raw_data()), targets.data<int32_t>(),
                           n, V, inv_n, grad32, row_loss.data(), grad16);
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

}  // namespace nn
