#include "nn/embedding.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/random.h"
#include "core/status_macros.h"
#include "nn/internal/validate.h"
#include "nn/ops.h"
#include "nn/tensor_ops.h"

namespace nn {

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, uint64_t seed)
    : num_(num_embeddings), dim_(embedding_dim), seed_(seed) {
  config_error_ =
      internal::FirstError({internal::PositiveOrMessage("num_embeddings", num_embeddings),
                            internal::PositiveOrMessage("embedding_dim", embedding_dim)});
  // Sized from user input: an allocation failure is recorded, not fatal
  // (core::Module::AllocateParameter, ConstructionStatus()).
  weight_ = AllocateParameter("weight", {std::max<int64_t>(num_, 0), std::max<int64_t>(dim_, 0)},
                              core::ParamInit::Normal(seed, 0, 0.0f, 1.0f));
}

absl::StatusOr<core::Tensor> Embedding::ForwardImpl(const core::Tensor& ids) {
  if (!config_error_.empty()) return internal::ModuleError(*this, config_error_);
  RETURN_IF_ERROR(internal::CheckTensor(*this, ids, core::DType::kInt32, "input ids"));
  // The weight's device decides where the lookup runs; ids may be on the CPU or there.
  const core::Device device =
      weight_->data.defined() ? weight_->data.device() : core::Device::Cpu();
  RETURN_IF_ERROR(internal::CheckParameter(*this, *weight_, "weight", {num_, dim_}, device));
  if (!ids.device().is_cpu() && ids.device() != device) {
    return internal::CheckDevice(*this, ids, "input ids", device, "the weight");
  }
  // The ids are checked on the host (one copy back when they live on a device), and a
  // private copy is kept on the weight's device: Backward indexes with these ids, so a
  // caller reusing its id buffer must not be able to send it out of bounds.
  core::Tensor host_ids = ids;
  if (!ids.device().is_cpu()) {
    ASSIGN_OR_RETURN(host_ids, core::Tensor::Allocate(ids.shape(), core::DType::kInt32,
                                                      core::MemoryTag::kActivation));
    RETURN_IF_ERROR(host_ids.CopyFrom(ids));
  }
  const int32_t* id = host_ids.data<int32_t>();
  for (int64_t i = 0; i < host_ids.numel(); ++i) {
    if (id[i] < 0 || id[i] >= num_) {
      return internal::ModuleError(
          *this, absl::StrCat("id ", id[i], " at flat position ", i, " of input ",
                              core::ShapeToString(ids.shape()), " is outside [0, ", num_, ")"));
    }
  }
  ASSIGN_OR_RETURN(core::Tensor cached,
                   core::Tensor::Allocate(ids.shape(), core::DType::kInt32,
                                          core::MemoryTag::kActivation, device));
  // NOTE [Index uploads] (nn/tensor_ops.h).
  RETURN_IF_ERROR(UploadIndices(internal::What(*this), cached, host_ids));
  core::Shape out_shape = ids.shape();
  out_shape.push_back(dim_);
  ASSIGN_OR_RETURN(core::Tensor y, internal::NewActivation(out_shape, device));
  RETURN_IF_ERROR(EmbeddingForward(internal::What(*this), weight_->data, cached, y));
  ids_ = std::move(cached);
  return y;
}

absl::StatusOr<core::Tensor> Embedding::BackwardImpl(const core::Tensor& grad_output) {
  core::Shape out_shape = ids_.shape();
  out_shape.push_back(dim_);
  RETURN_IF_ERROR(internal::CheckGradOutput(*this, ids_.defined(), out_shape, grad_output));
  RETURN_IF_ERROR(
      internal::CheckDevice(*this, grad_output, "grad_output", ids_.device(), "the weight"));
  ASSIGN_OR_RETURN(core::Tensor gw, internal::GradTensor(*this, *weight_, "weight"));
  if (gw.defined()) {
    RETURN_IF_ERROR(EmbeddingBackward(internal::What(*this), ids_, grad_output, gw));
  }
  ids_ = core::Tensor();
  return core::Tensor();
}

}  // namespace nn
