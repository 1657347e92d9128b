#include "nn/functional/embedding.h"

#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nn/functional/internal/grad_sink.h"
#include "nn/internal/op_checks.h"
#include "nn/tensor_ops.h"

namespace nn {
namespace functional {

using core::DType;
using core::Tensor;

absl::StatusOr<Tensor> Embedding(core::Arg ids_arg, core::Arg table_arg) {
  RETURN_IF_ERROR(ids_arg.status());
  RETURN_IF_ERROR(table_arg.status());
  const Tensor& ids = ids_arg.tensor();
  const Tensor& table = table_arg.tensor();
  if (!ids.defined()) return absl::InvalidArgumentError("Embedding: ids is undefined");
  if (!table.defined()) return absl::InvalidArgumentError("Embedding: table is undefined");
  RETURN_IF_ERROR(::nn::internal::CheckDType("Embedding", "ids", ids, DType::kInt32));
  RETURN_IF_ERROR(::nn::internal::CheckFp32OrBf16("Embedding", "table", table));
  if (table.dim() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("Embedding: table must be 2-D [V, C], got ", table.ToString()));
  }
  // The table's device decides where the lookup runs; ids may be on the CPU or there.
  const core::Device device = table.device();
  if (!ids.device().is_cpu() && ids.device() != device) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Embedding: ids ", ids.ToString(), " are on ", ids.device().ToString(), " but table ",
        table.ToString(), " is on ", device.ToString(), "; ids must be on the CPU or there"));
  }
  const int64_t num = table.size(0), dim = table.size(1);
  // Checked on the host (one copy back when the ids live on a device).
  Tensor host_ids = ids;
  if (!ids.device().is_cpu()) {
    ASSIGN_OR_RETURN(host_ids,
                     Tensor::Allocate(ids.shape(), DType::kInt32, core::MemoryTag::kActivation));
    RETURN_IF_ERROR(host_ids.CopyFrom(ids));
  }
  const int32_t* id = host_ids.data<int32_t>();
  for (int64_t i = 0; i < host_ids.numel(); ++i) {
    if (id[i] < 0 || id[i] >= num) {
      return absl::InvalidArgumentError(
          absl::StrCat("Embedding: id ", id[i], " at flat position ", i, " of ids ",
                       core::ShapeToString(ids.shape()), " is outside [0, ", num, ")"));
    }
  }
  // The private copy the lookup and the backward index with (NOTE [Index uploads]).
  ASSIGN_OR_RETURN(Tensor kept, Tensor::Allocate(ids.shape(), DType::kInt32,
                                                 core::MemoryTag::kActivation, device));
  RETURN_IF_ERROR(UploadIndices("Embedding", kept, host_ids));
  core::Shape out_shape = ids.shape();
  out_shape.push_back(dim);
  ASSIGN_OR_RETURN(
      Tensor y, Tensor::Allocate(out_shape, DType::kFloat32, core::MemoryTag::kActivation, device));
  RETURN_IF_ERROR(EmbeddingForward("Embedding", table, kept, y));
  RETURN_IF_ERROR(core::RecordFunction(
      "Embedding", {ids, table}, {&y}, {kept},
      [num, dim](const core::BackwardContext& ctx) -> absl::StatusOr<std::vector<Tensor>> {
        const Tensor& g = ctx.grad(0);
        ASSIGN_OR_RETURN(
            const internal::GradSink gw,
            internal::GradSinkFor(ctx, 1, "Embedding", "table", {num, dim}, g.device()));
        if (gw.tensor.defined()) {
          RETURN_IF_ERROR(EmbeddingBackward("Embedding", ctx.saved(0), g, gw.tensor));
        }
        return std::vector<Tensor>{Tensor(), gw.returned()};
      },
      {"ids"}));
  return y;
}

}  // namespace functional
}  // namespace nn
