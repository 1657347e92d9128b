// RankSampler: the part of a global batch that one rank of a data-parallel group trains
// on. Rank r of N gets rows [r B / N, (r + 1) B / N) of every global batch of B rows, as
// views of the global batch (no copy). Over all ranks the parts are disjoint and their
// union, in rank order, is the global batch, so N ranks together see exactly what one
// rank would see alone; averaging their gradients reproduces the single-rank step.
//
//   ASSIGN_OR_RETURN(data::RankSampler sampler, data::RankSampler::Create(rank, world));
//   ASSIGN_OR_RETURN(data::TokenBatch global, language.Batch(step, 32, 128));
//   ASSIGN_OR_RETURN(data::TokenBatch local, sampler.Local(global));  // [32 / world, 128]
#ifndef DATA_SAMPLER_H_
#define DATA_SAMPLER_H_

#include <cstdint>
#include <utility>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "data/markov_language.h"
#include "data/regression.h"

namespace data {

// Rows [begin, end) of `global` along its leading (batch) dimension, as a view sharing its
// storage (0 <= begin <= end <= rows). InvalidArgument naming the rows and the tensor for an
// undefined or 0-dimensional tensor or rows out of range.
absl::StatusOr<core::Tensor> Rows(const core::Tensor& global, int64_t begin, int64_t end);
// The same for both tensors of a batch (their leading dimensions must agree).
absl::StatusOr<TokenBatch> Rows(const TokenBatch& global, int64_t begin, int64_t end);

class RankSampler {
 public:
  // InvalidArgument unless world_size >= 1 and 0 <= rank < world_size.
  static absl::StatusOr<RankSampler> Create(int rank, int world_size);

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }

  // [begin, end) rows of a global batch of `batch_size` rows that this rank gets.
  // InvalidArgument naming the batch size and world size unless batch_size is a
  // non-negative multiple of world_size.
  absl::StatusOr<std::pair<int64_t, int64_t>> Rows(int64_t batch_size) const;

  // This rank's rows of `global` along its leading (batch) dimension, as a view sharing
  // its storage. InvalidArgument for an undefined or 0-dimensional tensor, or as Rows().
  absl::StatusOr<core::Tensor> Local(const core::Tensor& global) const;

  // The same for both tensors of a batch; InvalidArgument also when their leading
  // dimensions differ.
  absl::StatusOr<TokenBatch> Local(const TokenBatch& global) const;
  absl::StatusOr<RegressionBatch> Local(const RegressionBatch& global) const;

 private:
  RankSampler(int rank, int world_size) : rank_(rank), world_size_(world_size) {}

  int rank_;
  int world_size_;
};

}  // namespace data

#endif  // DATA_SAMPLER_H_
