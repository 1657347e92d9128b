#include "nn/embedding.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/random.h"
#include "core/status_macros.h"
#include "nn/internal/validate.h"
#include "nn/ops.h"

namespace nn {

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, uint64_t seed)
    : num_(num_embeddings), dim_(embedding_dim), seed_(seed) {
  config_error_ =
      internal::FirstError({internal::PositiveOrMessage("num_embeddings", num_embeddings),
                            internal::PositiveOrMessage("embedding_dim", embedding_dim)});
  // Sized from user input: an allocation failure is recorded, not fatal
  // (core::Module::AllocateParameter, ConstructionStatus()).
  weight_ = AllocateParameter("weight",
                              {std::max<int64_t>(num_, 0), std::max<int64_t>(dim_, 0)});
  core::Rng rng(seed);
  FillNormal(weight_->data, 0.0f, 1.0f, &rng);
}

absl::StatusOr<core::Tensor> Embedding::ForwardImpl(const core::Tensor& ids) {
  if (!config_error_.empty()) return internal::ModuleError(*this, config_error_);
  RETURN_IF_ERROR(internal::CheckTensor(*this, ids, core::DType::kInt32, "input ids"));
  RETURN_IF_ERROR(internal::CheckParameter(*this, *weight_, "weight", {num_, dim_}));
  const int32_t* id = ids.data<int32_t>();
  for (int64_t i = 0; i < ids.numel(); ++i) {
    if (id[i] < 0 || id[i] >= num_) {
      return internal::ModuleError(
          *this, absl::StrCat("id ", id[i], " at flat position ", i, " of input ",
                              core::ShapeToString(ids.shape()), " is outside [0, ", num_, ")"));
    }
  }
  core::Shape out_shape = ids.shape();
  out_shape.push_back(dim_);
  ASSIGN_OR_RETURN(core::Tensor y, internal::NewActivation(out_shape));
  const float* table = weight_->data.data<float>();
  float* out = y.data<float>();
  for (int64_t i = 0; i < ids.numel(); ++i) {
    std::memcpy(out + i * dim_, table + static_cast<int64_t>(id[i]) * dim_, sizeof(float) * dim_);
  }
  // A private copy: Backward indexes with these ids, so a caller reusing its id buffer
  // must not be able to send it out of bounds.
  ids_ = ids.Clone(core::MemoryTag::kActivation);
  return y;
}

absl::StatusOr<core::Tensor> Embedding::BackwardImpl(const core::Tensor& grad_output) {
  core::Shape out_shape = ids_.shape();
  out_shape.push_back(dim_);
  RETURN_IF_ERROR(internal::CheckGradOutput(*this, ids_.defined(), out_shape, grad_output));
  ASSIGN_OR_RETURN(float* gw, internal::GradBuffer(*this, *weight_, "weight"));
  if (gw != nullptr) {
    const int32_t* id = ids_.data<int32_t>();
    const float* g = grad_output.data<float>();
    for (int64_t i = 0; i < ids_.numel(); ++i) {
      Axpy(dim_, 1.0f, g + i * dim_, gw + static_cast<int64_t>(id[i]) * dim_);
    }
  }
  ids_ = core::Tensor();
  return core::Tensor();
}

}  // namespace nn
