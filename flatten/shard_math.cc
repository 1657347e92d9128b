#include "flatten/shard_math.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace flatten {
namespace {

absl::Status CheckTotal(int64_t total_numel) {
  if (total_numel < 0 || total_numel > kMaxFlatNumel) {
    return absl::InvalidArgumentError(
        absl::StrCat("total_numel must be in [0, 2^50], got ", total_numel));
  }
  return absl::OkStatus();
}

}  // namespace

std::string SliceToString(const ShardSlice& slice) {
  return absl::StrCat("[", slice.begin, ", ", slice.end, ") at shard offset ", slice.shard_offset);
}

absl::Status CheckWorldSize(int world_size) {
  if (world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size must be at least 1, got ", world_size));
  }
  return absl::OkStatus();
}

absl::Status CheckRank(int rank, int world_size) {
  RETURN_IF_ERROR(CheckWorldSize(world_size));
  if (rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank must be in [0, world_size) = [0, ", world_size, "), got ", rank));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> FlatOffsets(absl::Span<const int64_t> numels) {
  std::vector<int64_t> offsets;
  offsets.reserve(numels.size());
  int64_t total = 0;
  for (size_t i = 0; i < numels.size(); ++i) {
    if (numels[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("numels[", i, "] is negative (", numels[i], ")"));
    }
    offsets.push_back(total);
    if (numels[i] > kMaxFlatNumel - total) {
      return absl::InvalidArgumentError(
          absl::StrCat("numels up to index ", i, " sum to more than 2^50 elements"));
    }
    total += numels[i];
  }
  return offsets;
}

absl::StatusOr<int64_t> PaddedNumel(int64_t total_numel, int world_size) {
  RETURN_IF_ERROR(CheckWorldSize(world_size));
  RETURN_IF_ERROR(CheckTotal(total_numel));
  return (total_numel + world_size - 1) / world_size * world_size;
}

absl::StatusOr<int64_t> ShardNumel(int64_t total_numel, int world_size) {
  ASSIGN_OR_RETURN(const int64_t padded, PaddedNumel(total_numel, world_size));
  return padded / world_size;
}

absl::StatusOr<FlatRange> RankChunk(int64_t total_numel, int world_size, int rank) {
  RETURN_IF_ERROR(CheckRank(rank, world_size));
  ASSIGN_OR_RETURN(const int64_t shard, ShardNumel(total_numel, world_size));
  return FlatRange{rank * shard, (rank + 1) * shard};
}

absl::StatusOr<ShardSlice> IntersectRankChunk(int64_t param_offset, int64_t param_numel,
                                              int64_t total_numel, int world_size, int rank) {
  RETURN_IF_ERROR(CheckTotal(total_numel));
  if (param_offset < 0 || param_numel < 0 || param_offset > total_numel ||
      param_numel > total_numel - param_offset) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter range [", param_offset, ", ", param_offset + param_numel,
                     ") does not lie inside the flat buffer [0, ", total_numel, ")"));
  }
  ASSIGN_OR_RETURN(const FlatRange chunk, RankChunk(total_numel, world_size, rank));
  const int64_t param_end = param_offset + param_numel;
  // Clamping both chunk ends into the parameter's range gives an empty range at the
  // nearer end when they do not overlap.
  const int64_t lo = std::clamp(chunk.begin, param_offset, param_end);
  const int64_t hi = std::clamp(chunk.end, param_offset, param_end);
  ShardSlice slice;
  slice.begin = lo - param_offset;
  slice.end = hi - param_offset;
  slice.shard_offset = std::clamp(lo, chunk.begin, chunk.end) - chunk.begin;
  return slice;
}

absl::StatusOr<std::vector<ShardSlice>> ShardSlices(int64_t param_offset, int64_t param_numel,
                                                    int64_t total_numel, int world_size) {
  RETURN_IF_ERROR(CheckWorldSize(world_size));
  std::vector<ShardSlice> slices;
  slices.reserve(world_size);
  for (int r = 0; r < world_size; ++r) {
    ASSIGN_OR_RETURN(ShardSlice s,
                     IntersectRankChunk(param_offset, param_numel, total_numel, world_size, r));
    slices.push_back(s);
  }
  return slices;
}

}  // namespace flatten
