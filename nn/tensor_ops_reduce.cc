// AccumulateColumnSums of nn/tensor_ops.h, and the CUDA column sums (with their partial
// sums' scratch) that the norms' backward shares (nn/internal/tensor_ops_common.h).
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
using internal::CheckNumel;
using internal::F32;
using internal::IsBf16;
using internal::MutF32;
#ifdef FSDP_WITH_CUDA
namespace kc = ::kernels::cuda;
using internal::ColumnSumsOnCuda;
using internal::Launched;
using internal::UseDevice;
#else
using internal::NoCuda;
#endif

}  // namespace

#ifdef FSDP_WITH_CUDA
namespace internal {

// Declared, with what they do, in nn/internal/tensor_ops_common.h.
absl::StatusOr<Tensor> PartialSums(const core::Device& device, int64_t chunks, int64_t n) {
  if (chunks <= 1) return Tensor();
  return Tensor::Allocate({chunks * n}, DType::kFloat32, core::MemoryTag::kActivation, device);
}

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

}  // namespace internal
#endif

namespace {

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
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": sums ", acc.ToString(), " do not tile input ", x.ToString()));
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

}  // namespace nn
