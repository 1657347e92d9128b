#include "data/permutation.h"

#include <cstdint>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace data {
namespace {

std::vector<int64_t> All(const Permutation& p) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < p.size(); ++i) out.push_back(p.At(i));
  return out;
}

// A bijection of [0, n) for every n, powers of two and their neighbours included.
TEST(PermutationTest, EveryValueAppearsExactlyOnce) {
  std::vector<int64_t> sizes;
  for (int64_t n = 1; n <= 70; ++n) sizes.push_back(n);
  for (int64_t n : {127, 128, 129, 255, 256, 257, 1000, 4095, 4096, 4097, 100003}) {
    sizes.push_back(n);
  }
  for (int64_t n : sizes) {
    for (uint64_t key : {0ull, 1ull, 0xdeadbeefcafef00dull}) {
      const Permutation p = Permutation::Create(n, key).value();
      EXPECT_EQ(p.size(), n);
      std::vector<bool> seen(static_cast<size_t>(n), false);
      for (int64_t v : All(p)) {
        ASSERT_GE(v, 0) << "n " << n;
        ASSERT_LT(v, n) << "n " << n;
        EXPECT_FALSE(seen[static_cast<size_t>(v)]) << "n " << n << ": " << v << " twice";
        seen[static_cast<size_t>(v)] = true;
      }
    }
  }
}

// The key picks the order; the same (n, key) always gives the same one.
TEST(PermutationTest, TheKeyChoosesTheOrderAndOnlyTheKey) {
  const std::vector<int64_t> a = All(Permutation::Create(1000, 1).value());
  EXPECT_EQ(a, All(Permutation::Create(1000, 1).value()));
  const std::vector<int64_t> b = All(Permutation::Create(1000, 2).value());
  EXPECT_NE(a, b);
  // Not the identity, and far from it: few fixed points.
  int fixed = 0;
  for (int64_t i = 0; i < 1000; ++i) fixed += a[static_cast<size_t>(i)] == i;
  EXPECT_LT(fixed, 20);
  // Positions where two keys agree: about 1 in 1000 for independent orders.
  int same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i] == b[i];
  EXPECT_LT(same, 20);
}

// NOTE [Keyed permutation]: no table, so a permutation of 10^12 values costs nothing to
// make and answers any position at once; distinct positions give distinct values.
TEST(PermutationTest, HugeDomainsNeedNoMemory) {
  EXPECT_LE(sizeof(Permutation), 3 * sizeof(int64_t));
  const int64_t n = 1'000'000'000'000;
  const Permutation p = Permutation::Create(n, 42).value();
  std::set<int64_t> values;
  for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{999'999}, n / 2, n - 2, n - 1}) {
    const int64_t v = p.At(i);
    EXPECT_GE(v, 0);
    EXPECT_LT(v, n);
    values.insert(v);
  }
  EXPECT_EQ(values.size(), 6u);
  const Permutation largest = Permutation::Create(int64_t{1} << 62, 3).value();
  EXPECT_GE(largest.At((int64_t{1} << 62) - 1), 0);
}

TEST(PermutationTest, BadSizesAndPositions) {
  EXPECT_EQ(Permutation::Create(0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Permutation::Create(-5, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Permutation::Create((int64_t{1} << 62) + 1, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  const Permutation one = Permutation::Create(1, 9).value();
  EXPECT_EQ(one.At(0), 0);
  EXPECT_EQ(one.At(1), -1);
  EXPECT_EQ(one.At(-1), -1);
}

}  // namespace
}  // namespace data
