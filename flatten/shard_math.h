// Shard math for flat sharding: concatenate a unit's parameters, right-pad the
// concatenation to a multiple of the world size, and give rank r the r-th equal chunk.
// FlatParameter, the wrap plan (policy/) and checkpoints all use these functions, so
// every package agrees on which rank holds which element.
//
//   // Two parameters of 5 and 3 elements over 3 ranks: 8 elements padded to 9,
//   // chunks [0, 3), [3, 6), [6, 9); the last element of rank 2's chunk is padding.
//   ASSIGN_OR_RETURN(int64_t padded, flatten::PaddedNumel(8, 3));      // 9
//   ASSIGN_OR_RETURN(flatten::FlatRange c, flatten::RankChunk(8, 3, 1));  // [3, 6)
//   ASSIGN_OR_RETURN(flatten::ShardSlice s,
//                    flatten::IntersectRankChunk(/*param_offset=*/5, /*param_numel=*/3,
//                                                /*total_numel=*/8, /*world_size=*/3,
//                                                /*rank=*/1));
//   // s.begin == 0, s.end == 1, s.shard_offset == 2: rank 1 holds the second
//   // parameter's element 0, at position 2 of its shard.
//
// Padding is explicit: only the end of the flat buffer is padded (by fewer than
// world_size elements, all zero in FlatParameter), never between parameters.
#ifndef FLATTEN_SHARD_MATH_H_
#define FLATTEN_SHARD_MATH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace flatten {

// Largest element count the shard math accepts for a flat buffer (2^50, the same bound
// core::Tensor::Allocate puts on a tensor); larger counts give InvalidArgument.
inline constexpr int64_t kMaxFlatNumel = int64_t{1} << 50;

// A half-open range [begin, end) of element indices in a flat buffer.
struct FlatRange {
  int64_t begin = 0;
  int64_t end = 0;

  int64_t size() const { return end - begin; }
  bool empty() const { return begin == end; }
  bool operator==(const FlatRange& o) const { return begin == o.begin && end == o.end; }
};

// The part of one parameter that one rank's shard holds: the parameter's flat elements
// [begin, end) (0 <= begin <= end <= the parameter's numel), stored in the rank's shard
// from position shard_offset on. An empty slice (begin == end) still has a shard_offset
// in [0, shard numel], so a zero-length view at it is valid.
struct ShardSlice {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t shard_offset = 0;

  int64_t numel() const { return end - begin; }
  bool empty() const { return begin == end; }
  bool operator==(const ShardSlice& o) const {
    return begin == o.begin && end == o.end && shard_offset == o.shard_offset;
  }
};

// "[2, 5) at shard offset 0".
std::string SliceToString(const ShardSlice& slice);

// OK when world_size >= 1; InvalidArgument naming `world_size` otherwise.
absl::Status CheckWorldSize(int world_size);

// OK when 0 <= rank < world_size (and world_size is valid); InvalidArgument naming
// `rank` and `world_size` otherwise.
absl::Status CheckRank(int rank, int world_size);

// Offsets of parameters of the given element counts laid out back to back: element i
// is the sum of numels[0..i). InvalidArgument for a negative count or a total above
// kMaxFlatNumel.
absl::StatusOr<std::vector<int64_t>> FlatOffsets(absl::Span<const int64_t> numels);

// The smallest multiple of world_size that is >= total_numel (0 for 0).
// InvalidArgument for a negative or too large total, or an invalid world size.
absl::StatusOr<int64_t> PaddedNumel(int64_t total_numel, int world_size);

// Elements per rank: PaddedNumel(total_numel, world_size) / world_size.
absl::StatusOr<int64_t> ShardNumel(int64_t total_numel, int world_size);

// Rank `rank`'s chunk of the padded buffer: [rank * s, (rank + 1) * s) with
// s = ShardNumel(total_numel, world_size). Positions >= total_numel are padding.
absl::StatusOr<FlatRange> RankChunk(int64_t total_numel, int world_size, int rank);

// The intersection of a parameter occupying [param_offset, param_offset + param_numel)
// of the flat buffer with rank `rank`'s chunk, in the parameter's own element indices.
// InvalidArgument if the parameter does not lie inside [0, total_numel) or the world
// size or rank is invalid.
absl::StatusOr<ShardSlice> IntersectRankChunk(int64_t param_offset, int64_t param_numel,
                                              int64_t total_numel, int world_size, int rank);

// IntersectRankChunk for every rank 0..world_size-1, in rank order. The slices tile
// [0, param_numel): slice r ends where slice r+1 begins.
absl::StatusOr<std::vector<ShardSlice>> ShardSlices(int64_t param_offset, int64_t param_numel,
                                                    int64_t total_numel, int world_size);

}  // namespace flatten

#endif  // FLATTEN_SHARD_MATH_H_
