#include "flatten/shard_math.h"

#include <cstdint>
#include <vector>

#include "core/random.h"
#include "gtest/gtest.h"

namespace flatten {
namespace {

TEST(ShardMathTest, PaddedNumelIsSmallestMultipleOfWorldSizeAtLeastTotal) {
  core::Rng rng(11);
  for (int trial = 0; trial < 2000; ++trial) {
    const int world = 1 + static_cast<int>(rng.UniformInt(8));
    const int64_t total = static_cast<int64_t>(rng.UniformInt(200));
    const int64_t padded = PaddedNumel(total, world).value();
    EXPECT_EQ(padded % world, 0) << total << " over " << world;
    EXPECT_GE(padded, total);
    EXPECT_LT(padded - total, world) << "padding must be less than one element per rank";
    EXPECT_EQ(ShardNumel(total, world).value() * world, padded);
  }
  EXPECT_EQ(PaddedNumel(0, 4).value(), 0);
  EXPECT_EQ(PaddedNumel(8, 3).value(), 9);
  EXPECT_EQ(PaddedNumel(9, 3).value(), 9);
}

TEST(ShardMathTest, RankChunksTileThePaddedBuffer) {
  core::Rng rng(12);
  for (int trial = 0; trial < 500; ++trial) {
    const int world = 1 + static_cast<int>(rng.UniformInt(8));
    const int64_t total = static_cast<int64_t>(rng.UniformInt(100));
    int64_t expected_begin = 0;
    for (int r = 0; r < world; ++r) {
      const FlatRange c = RankChunk(total, world, r).value();
      EXPECT_EQ(c.begin, expected_begin);
      EXPECT_EQ(c.size(), ShardNumel(total, world).value());
      expected_begin = c.end;
    }
    EXPECT_EQ(expected_begin, PaddedNumel(total, world).value());
  }
}

TEST(ShardMathTest, FlatOffsetsArePrefixSums) {
  EXPECT_EQ(FlatOffsets({5, 0, 3, 1}).value(), (std::vector<int64_t>{0, 5, 5, 8}));
  EXPECT_TRUE(FlatOffsets({}).value().empty());
  EXPECT_EQ(FlatOffsets({2, -1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(FlatOffsets({2, -1}).status().message().find("numels[1]"), std::string::npos);
  EXPECT_EQ(FlatOffsets({kMaxFlatNumel, 1}).status().code(), absl::StatusCode::kInvalidArgument);
}

// Against a brute-force oracle: flat element e belongs to rank e / shard_numel at
// position e % shard_numel. Every element of every parameter must be found in exactly
// the slice of that rank, at that position.
TEST(ShardMathTest, IntersectionMatchesElementwiseOwnership) {
  core::Rng rng(13);
  for (int trial = 0; trial < 300; ++trial) {
    const int world = 1 + static_cast<int>(rng.UniformInt(8));
    const int num_params = 1 + static_cast<int>(rng.UniformInt(6));
    std::vector<int64_t> numels;
    for (int i = 0; i < num_params; ++i) {
      // One in four parameters is empty, to cover zero-numel ones between others.
      numels.push_back(rng.UniformInt(4) == 0 ? 0 : static_cast<int64_t>(rng.UniformInt(20)));
    }
    const std::vector<int64_t> offsets = FlatOffsets(numels).value();
    int64_t total = 0;
    for (int64_t n : numels) total += n;
    const int64_t shard = ShardNumel(total, world).value();
    for (int i = 0; i < num_params; ++i) {
      const std::vector<ShardSlice> slices =
          ShardSlices(offsets[i], numels[i], total, world).value();
      ASSERT_EQ(static_cast<int>(slices.size()), world);
      // Tiling in rank order.
      EXPECT_EQ(slices.front().begin, 0);
      EXPECT_EQ(slices.back().end, numels[i]);
      for (int r = 0; r + 1 < world; ++r) EXPECT_EQ(slices[r].end, slices[r + 1].begin);
      for (int r = 0; r < world; ++r) {
        const ShardSlice& s = slices[r];
        EXPECT_LE(s.begin, s.end);
        EXPECT_GE(s.shard_offset, 0);
        EXPECT_LE(s.shard_offset + s.numel(), shard) << SliceToString(s);
        EXPECT_EQ(s, IntersectRankChunk(offsets[i], numels[i], total, world, r).value());
      }
      for (int64_t k = 0; k < numels[i]; ++k) {
        const int64_t e = offsets[i] + k;
        const int owner = static_cast<int>(e / shard);
        const ShardSlice& s = slices[owner];
        EXPECT_TRUE(k >= s.begin && k < s.end)
            << "element " << k << " of param " << i << " not in rank " << owner << "'s slice "
            << SliceToString(s);
        EXPECT_EQ(s.shard_offset + (k - s.begin), e % shard);
      }
    }
  }
}

TEST(ShardMathTest, InvalidArgumentsNameTheOption) {
  absl::Status s = PaddedNumel(4, 0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("world_size"), std::string::npos) << s;
  s = RankChunk(4, 2, 2).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("rank"), std::string::npos) << s;
  EXPECT_EQ(RankChunk(4, 2, -1).status().code(), absl::StatusCode::kInvalidArgument);
  s = PaddedNumel(-1, 2).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("total_numel"), std::string::npos) << s;
  EXPECT_EQ(PaddedNumel(kMaxFlatNumel + 1, 2).status().code(), absl::StatusCode::kInvalidArgument);
  s = IntersectRankChunk(3, 2, 4, 2, 0).status();  // [3, 5) is outside [0, 4)
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("[3, 5)"), std::string::npos) << s;
  EXPECT_EQ(IntersectRankChunk(-1, 1, 4, 2, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(IntersectRankChunk(0, -1, 4, 2, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShardSlices(0, 1, 4, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckRank(0, 1).ok());
}

}  // namespace
}  // namespace flatten
