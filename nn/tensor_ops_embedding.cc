// The embedding ops of nn/tensor_ops.h: the gather forward and the scatter-add backward.
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/cpu/kernels.h"
#include "nn/internal/op_checks.h"
#include "nn/internal/op_costs.h"
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
using internal::CheckFp32OrBf16;
using internal::CheckNumel;
using internal::F32;
using internal::IsBf16;
using internal::MutF32;
#ifdef FSDP_WITH_CUDA
namespace kc = ::kernels::cuda;
#endif

// NOTE [Index uploads]: the record a host -> device Tensor::CopyFrom makes on CUDA.
core::OpCost UploadCost(const Tensor& host) {
  return core::OpCost{0, 2.0 * static_cast<double>(host.nbytes()), 0, core::OpEngine::kHostSync};
}

}  // namespace

void RecordIndexUpload(const Tensor& host) {
  core::RecordOp(OpCategory::kHostSync, "copy", UploadCost(host));
}

absl::Status UploadIndices(absl::string_view what, const Tensor& dst, const Tensor& host) {
  RETURN_IF_ERROR(CheckDType(what, "indices", host, DType::kInt32));
  RETURN_IF_ERROR(CheckDType(what, "their copy", dst, DType::kInt32));
  if (!host.device().is_cpu()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": indices to upload must be on the CPU, got ", host.ToString()));
  }
  if (!dst.device().is_cpu()) {
    // On CUDA CopyFrom records the upload itself (a host sync).
    return core::Annotate(dst.CopyFrom(host), what);
  }
  RecordIndexUpload(host);
  core::ScopedOpProfile unrecorded(nullptr);  // a memcpy here, not the CUDA path's copy
  return core::Annotate(dst.CopyFrom(host), what);
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
               kc::EmbeddingForward(ids.data<int32_t>(), n, table.raw_data(), IsBf16(table), num,
                                    dim, MutF32(y)));
  }
  kcpu::EmbeddingForward(ids.data<int32_t>(), n, table.raw_data(), IsBf16(table), num, dim,
                         MutF32(y));
  return absl::OkStatus();
}

absl::Status EmbeddingBackward(absl::string_view what, const Tensor& ids, const Tensor& g,
                               const Tensor& gw) {
  RETURN_IF_ERROR(
      CheckDevices(what, {{"weight gradient", &gw}, {"ids", &ids}, {"grad_output", &g}}));
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
    RETURN_IF_ERROR(internal::Launched(kc::EmbeddingBackwardScratchBytes(n, &scratch_bytes), what,
                                       "embedding gradient scratch size"));
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

}  // namespace nn
