#include "data/sampler.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace data {
namespace {

absl::Status CheckPair(const core::Tensor& inputs, const core::Tensor& targets) {
  if (!inputs.defined() || !targets.defined() || inputs.dim() == 0 || targets.dim() == 0 ||
      inputs.size(0) != targets.size(0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a batch needs inputs and targets with the same leading (batch) "
                     "dimension; got inputs ",
                     inputs.ToString(), " and targets ", targets.ToString()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RankSampler> RankSampler::Create(int rank, int world_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("RankSampler: rank ", rank, " of world size ", world_size,
                     "; need world_size >= 1 and 0 <= rank < world_size"));
  }
  return RankSampler(rank, world_size);
}

absl::StatusOr<std::pair<int64_t, int64_t>> RankSampler::Rows(int64_t batch_size) const {
  if (batch_size < 0 || batch_size % world_size_ != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RankSampler: global batch size ", batch_size, " is not divisible by world size ",
        world_size_, "; choose a global batch size that is a multiple of the world size"));
  }
  const int64_t per_rank = batch_size / world_size_;
  return std::make_pair(rank_ * per_rank, (rank_ + 1) * per_rank);
}

absl::StatusOr<core::Tensor> Rows(const core::Tensor& global, int64_t begin, int64_t end) {
  if (!global.defined() || global.dim() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Rows: need a tensor with a leading batch dimension, got ", global.ToString()));
  }
  if (begin < 0 || end < begin || end > global.size(0)) {
    return absl::InvalidArgumentError(absl::StrCat("Rows: rows [", begin, ", ", end, ") of ",
                                                   global.ToString(), " are out of range"));
  }
  core::Shape shape = global.shape();
  shape[0] = end - begin;
  const int64_t row_numel = global.size(0) == 0 ? 0 : global.numel() / global.size(0);
  return global.View(begin * row_numel, shape);
}

absl::StatusOr<TokenBatch> Rows(const TokenBatch& global, int64_t begin, int64_t end) {
  RETURN_IF_ERROR(CheckPair(global.inputs, global.targets));
  ASSIGN_OR_RETURN(core::Tensor inputs, Rows(global.inputs, begin, end));
  ASSIGN_OR_RETURN(core::Tensor targets, Rows(global.targets, begin, end));
  return TokenBatch{std::move(inputs), std::move(targets)};
}

absl::StatusOr<core::Tensor> RankSampler::Local(const core::Tensor& global) const {
  if (!global.defined() || global.dim() == 0) return data::Rows(global, 0, 0);  // its error
  ASSIGN_OR_RETURN(auto rows, Rows(global.size(0)));
  return data::Rows(global, rows.first, rows.second);
}

absl::StatusOr<TokenBatch> RankSampler::Local(const TokenBatch& global) const {
  RETURN_IF_ERROR(CheckPair(global.inputs, global.targets));
  ASSIGN_OR_RETURN(core::Tensor inputs, Local(global.inputs));
  ASSIGN_OR_RETURN(core::Tensor targets, Local(global.targets));
  return TokenBatch{std::move(inputs), std::move(targets)};
}

absl::StatusOr<RegressionBatch> RankSampler::Local(const RegressionBatch& global) const {
  RETURN_IF_ERROR(CheckPair(global.inputs, global.targets));
  ASSIGN_OR_RETURN(core::Tensor inputs, Local(global.inputs));
  ASSIGN_OR_RETURN(core::Tensor targets, Local(global.targets));
  return RegressionBatch{std::move(inputs), std::move(targets)};
}

}  // namespace data
