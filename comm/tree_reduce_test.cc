// TreeReducer and TreeAccumulator (NOTE [Tree reduction]): every result is compared bit
// for bit with a single-threaded recursive tree sum of the same inputs, at N = 1, 2, 4
// and 8 thread ranks over gloo and over shm. The inputs are random floats spanning
// forty binary orders of magnitude, so the order of the additions shows in the bits; a
// test below checks that the left-to-right sum and the tree with its levels reversed both
// give other bits for these inputs, so the comparisons can fail.
#include "comm/tree_reduce.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "comm/shm_process_group.h"
#include "comm/testing/shm_test_options.h"
#include "comm/testing/thread_ranks.h"
#include "core/allocator.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace comm {
namespace {

using ::comm::testing::RankContext;
using ::comm::testing::RunThreadRanks;
using ::comm::testing::ThreadRanksOptions;
using core::DType;
using core::Tensor;
using Values = std::vector<float>;

constexpr absl::Duration kTimeout = absl::Seconds(20);
// Elements per chunk: odd, so no chunk boundary lines up with anything by accident.
constexpr int64_t kChunk = 37;

ThreadRanksOptions Options() {
  ThreadRanksOptions o;
  o.timeout = absl::Seconds(120);
  o.gloo.rendezvous_timeout = kTimeout;
  return o;
}

// `n` floats of random sign and magnitude 2^-20 .. 2^20, fixed by (`seed`, `who`).
Values RandomValues(int64_t n, int who, uint32_t seed) {
  std::mt19937 gen(seed * 1000003u + static_cast<uint32_t>(who));
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  Values v(static_cast<size_t>(n));
  for (float& x : v) x = std::ldexp(mantissa(gen), exponent(gen));
  return v;
}

Values Add(const Values& a, const Values& b) {
  Values c(a.size());
  for (size_t i = 0; i < a.size(); ++i) c[i] = a[i] + b[i];
  return c;
}

// The reference: ((x[lo] + ...) + (... + x[hi - 1])) by recursive halving of [lo, hi).
Values RecursiveTree(const std::vector<Values>& x, size_t lo, size_t hi) {
  if (hi - lo == 1) return x[lo];
  const size_t mid = lo + (hi - lo) / 2;
  return Add(RecursiveTree(x, lo, mid), RecursiveTree(x, mid, hi));
}
Values RecursiveTree(const std::vector<Values>& x) { return RecursiveTree(x, 0, x.size()); }

// (((x0 + x1) + x2) + x3) ...
Values LeftToRight(const std::vector<Values>& x) {
  Values acc = x[0];
  for (size_t i = 1; i < x.size(); ++i) acc = Add(acc, x[i]);
  return acc;
}

// The tree with its levels in the other order: partners differ in the highest bit first,
// ((x0 + x2) + (x1 + x3)) for four terms.
Values ReversedLevels(std::vector<Values> x) {
  while (x.size() > 1) {
    const size_t half = x.size() / 2;
    std::vector<Values> next;
    for (size_t i = 0; i < half; ++i) next.push_back(Add(x[i], x[i + half]));
    x = std::move(next);
  }
  return x[0];
}

Values Slice(const Values& v, int64_t begin, int64_t n) {
  return Values(v.begin() + begin, v.begin() + begin + n);
}

Tensor ToTensor(const Values& v) {
  return Tensor::FromVector(v, {static_cast<int64_t>(v.size())}).value();
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// Bitwise equality of `got` and `want`, naming the first element that differs.
::testing::AssertionResult SameBits(const Values& got, const Values& want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << got.size() << " elements, want " << want.size();
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (Bits(got[i]) != Bits(want[i])) {
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << got[i] << " (0x" << std::hex << Bits(got[i])
             << "), want " << want[i] << " (0x" << Bits(want[i]) << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

int CountDifferentBits(const Values& a, const Values& b) {
  int n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += Bits(a[i]) != Bits(b[i]);
  return n;
}

// Every rank's input of `n` elements for the call numbered `call`.
std::vector<Values> Inputs(int world, int64_t n, uint32_t call) {
  std::vector<Values> x;
  for (int r = 0; r < world; ++r) x.push_back(RandomValues(n, r, call));
  return x;
}

// ---------------------------------------------------------------------------------------
// Local pieces.

TEST(TreeLevelsTest, PowersOfTwoAndTheRest) {
  EXPECT_EQ(TreeLevels(1).value(), 0);
  EXPECT_EQ(TreeLevels(2).value(), 1);
  EXPECT_EQ(TreeLevels(8).value(), 3);
  EXPECT_EQ(TreeLevels(int64_t{1} << 40).value(), 40);
  for (int64_t bad : {0, 3, 6, 12, -4}) {
    absl::StatusOr<int> l = TreeLevels(bad);
    EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(l.status().message().find(absl::StrCat("got ", bad)), std::string::npos)
        << l.status();
  }
}

// The property every other test relies on: for these inputs the order of the additions
// shows in the bits, so a reduction in another order fails the comparisons.
TEST(TreeReferenceTest, OtherOrdersGiveOtherBitsForTheseInputs) {
  for (int n : {4, 8}) {
    const std::vector<Values> x = Inputs(n, n * kChunk, 1);
    const Values tree = RecursiveTree(x);
    EXPECT_GT(CountDifferentBits(tree, LeftToRight(x)), 0) << n;
    EXPECT_GT(CountDifferentBits(tree, ReversedLevels(x)), 0) << n;
    // And the result of one chunk alone, as a rank sees it.
    for (int c = 0; c < n; ++c) {
      std::vector<Values> chunks;
      for (const Values& v : x) chunks.push_back(Slice(v, c * kChunk, kChunk));
      EXPECT_GT(CountDifferentBits(RecursiveTree(chunks), LeftToRight(chunks)), 0)
          << "n " << n << " chunk " << c;
    }
  }
}

TEST(TreeAccumulatorTest, MatchesTheRecursiveTreeBitwise) {
  for (int count : {1, 2, 4, 8}) {
    const std::vector<Values> x = Inputs(count, 301, 2);
    TreeAccumulator acc;
    for (const Values& v : x) ASSERT_TRUE(acc.Add(ToTensor(v)).ok());
    EXPECT_EQ(acc.count(), count);
    absl::StatusOr<Tensor> sum = acc.Finish();
    ASSERT_TRUE(sum.ok()) << sum.status();
    EXPECT_TRUE(SameBits(sum->ToVector(), RecursiveTree(x))) << "count " << count;
    if (count >= 4) {
      EXPECT_GT(CountDifferentBits(sum->ToVector(), LeftToRight(x)), 0) << "count " << count;
    }
    EXPECT_EQ(acc.count(), 0);  // Finish started over
  }
}

TEST(TreeAccumulatorTest, KeepsTheFirstShapeAndStartsOverAfterFinish) {
  TreeAccumulator acc;
  Tensor a = Tensor::FromVector({1, 2, 3, 4, 5, 6}, {2, 3}).value();
  Tensor b = Tensor::FromVector({10, 20, 30, 40, 50, 60}, {6}).value();
  ASSERT_TRUE(acc.Add(a).ok());
  ASSERT_TRUE(acc.Add(b).ok());
  Tensor sum = acc.Finish().value();
  EXPECT_EQ(sum.shape(), (core::Shape{2, 3}));
  EXPECT_EQ(sum.ToVector(), (std::vector<float>{11, 22, 33, 44, 55, 66}));
  EXPECT_FALSE(sum.SharesStorage(a));
  EXPECT_EQ(a.ToVector(), (std::vector<float>{1, 2, 3, 4, 5, 6}));  // terms are not touched
  // A new sum, of another size, after Finish; the first result stays.
  ASSERT_TRUE(acc.Add(Tensor::FromVector({7}, {1}).value()).ok());
  EXPECT_EQ(acc.Finish().value().ToVector(), (std::vector<float>{7}));
  EXPECT_EQ(sum.ToVector(), (std::vector<float>{11, 22, 33, 44, 55, 66}));
}

TEST(TreeAccumulatorTest, HoldsAtMostLog2CountBuffers) {
  constexpr int64_t kN = 64;  // 256 bytes, a multiple of the allocator's alignment
  const std::vector<Values> x = Inputs(8, kN, 3);
  std::vector<Tensor> terms;
  for (const Values& v : x) terms.push_back(ToTensor(v));
  auto allocator = std::make_shared<core::Allocator>(core::Device::Cpu());
  core::ScopedAllocator scope(allocator);
  for (int count : {1, 2, 4, 8}) {
    allocator->ResetPeaks();
    TreeAccumulator acc(core::MemoryTag::kGrad);
    for (int i = 0; i < count; ++i) ASSERT_TRUE(acc.Add(terms[i]).ok());
    const int buffers = std::max(1, TreeLevels(count).value());
    EXPECT_EQ(allocator->Stats().peak(core::MemoryTag::kGrad), buffers * kN * 4) << count;
    ASSERT_TRUE(acc.Finish().ok());
  }
}

TEST(TreeAccumulatorTest, RejectsBadTermsAndCountsThatAreNotPowersOfTwo) {
  TreeAccumulator acc;
  absl::StatusOr<Tensor> empty = acc.Finish();
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(acc.Add(ToTensor({1, 2, 3})).ok());
  absl::Status wrong_size = acc.Add(ToTensor({1, 2}));
  EXPECT_EQ(wrong_size.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_size.message().find("has 2 elements but the first had 3"), std::string::npos)
      << wrong_size;
  absl::Status bf16 = acc.Add(Tensor::Zeros({3}, DType::kBFloat16));
  EXPECT_EQ(bf16.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bf16.message().find("bfloat16"), std::string::npos) << bf16;
  EXPECT_EQ(acc.count(), 1);  // neither was added
  ASSERT_TRUE(acc.Add(ToTensor({1, 2, 3})).ok());
  ASSERT_TRUE(acc.Add(ToTensor({1, 2, 3})).ok());
  absl::StatusOr<Tensor> three = acc.Finish();
  EXPECT_EQ(three.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(three.status().message().find("3 terms"), std::string::npos) << three.status();
  ASSERT_TRUE(acc.Add(ToTensor({1, 2, 3})).ok());  // the refused Finish changed nothing
  EXPECT_EQ(acc.Finish().value().ToVector(), (std::vector<float>{4, 8, 12}));
}

// ---------------------------------------------------------------------------------------
// TreeReducer across thread ranks.

enum class Backend { kGloo, kShm };

std::string BackendName(Backend b) { return b == Backend::kGloo ? "gloo" : "shm"; }

// The rank's group of `backend` over all ranks: the thread ranks' gloo world, or a new
// shm group over the same store.
absl::StatusOr<std::shared_ptr<ProcessGroup>> World(Backend backend, RankContext& ctx) {
  if (backend == Backend::kGloo) return ctx.group;
  ASSIGN_OR_RETURN(std::shared_ptr<ShmProcessGroup> shm,
                   ShmProcessGroup::Create(ctx.store, ctx.rank, ctx.world_size,
                                           ::comm::testing::ShmTestOptions("world-shm")));
  return std::shared_ptr<ProcessGroup>(std::move(shm));
}

// Runs `fn` on `n` thread ranks, each with a TreeReducer over its `backend` world.
absl::Status RunTree(Backend backend, int n,
                     const std::function<absl::Status(RankContext&, TreeReducer&)>& fn) {
  return RunThreadRanks(
      n,
      [&](RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(std::shared_ptr<ProcessGroup> world, World(backend, ctx));
        ASSIGN_OR_RETURN(std::unique_ptr<TreeReducer> tree, TreeReducer::Create(world, kTimeout));
        EXPECT_EQ(tree->levels(), TreeLevels(n).value());
        return fn(ctx, *tree);
      },
      Options());
}

class TreeReducerTest : public ::testing::TestWithParam<std::tuple<Backend, int>> {
 protected:
  Backend backend() const { return std::get<0>(GetParam()); }
  int n() const { return std::get<1>(GetParam()); }
};

TEST_P(TreeReducerTest, ReduceScatterGivesEachRankItsChunkOfTheTreeSum) {
  const int n = this->n();
  const std::vector<Values> x = Inputs(n, n * kChunk, 10);
  const Values want = RecursiveTree(x);
  absl::Status s = RunTree(backend(), n, [&](RankContext& ctx, TreeReducer& tree) {
    Tensor input = ToTensor(x[ctx.rank]);
    Tensor output = Tensor::Zeros({kChunk});
    RETURN_IF_ERROR(tree.ReduceScatter(input, output));
    EXPECT_TRUE(SameBits(output.ToVector(), Slice(want, ctx.rank * kChunk, kChunk)))
        << "rank " << ctx.rank;
    // The cost: log2(n) pair reduce-scatters moving what a plain one over n ranks does.
    const CollectiveStats rs = tree.Stats().of(CollectiveKind::kReduceScatter);
    const Traffic plain =
        ExpectedTraffic(CollectiveKind::kReduceScatter, input.nbytes(), n, ctx.rank);
    EXPECT_EQ(rs.calls, tree.levels());
    EXPECT_EQ(rs.bytes_sent, plain.sent);
    EXPECT_EQ(rs.bytes_received, plain.received);
    EXPECT_EQ(tree.Stats().Total().calls, tree.levels());
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(TreeReducerTest, AllReduceGivesEveryRankTheTreeSum) {
  const int n = this->n();
  constexpr int64_t kNumel = 53;  // not a multiple of n: all-reduce takes any numel
  const std::vector<Values> x = Inputs(n, kNumel, 11);
  const Values want = RecursiveTree(x);
  absl::Status s = RunTree(backend(), n, [&](RankContext& ctx, TreeReducer& tree) {
    Tensor t = ToTensor(x[ctx.rank]);
    RETURN_IF_ERROR(tree.AllReduce(t));
    EXPECT_TRUE(SameBits(t.ToVector(), want)) << "rank " << ctx.rank;
    // The cost: one pair all-reduce of the whole tensor per level, S per level.
    const CollectiveStats ar = tree.Stats().of(CollectiveKind::kAllReduce);
    EXPECT_EQ(ar.calls, tree.levels());
    EXPECT_EQ(ar.bytes_sent, tree.levels() * t.nbytes());
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

// Shard groups of H = 2^h consecutive ranks: rank r gets chunk r mod H of the tree sum
// over all n ranks of the [H * k] inputs, for every h (h = 0: an all-reduce into output).
TEST_P(TreeReducerTest, HybridScattersInsideShardGroupsAndAllReducesAcross) {
  const int n = this->n();
  const int levels = TreeLevels(n).value();
  std::vector<std::vector<Values>> x;
  std::vector<Values> want;
  for (int h = 0; h <= levels; ++h) {
    x.push_back(Inputs(n, (int64_t{1} << h) * kChunk, 20 + h));
    want.push_back(RecursiveTree(x.back()));
  }
  absl::Status s = RunTree(backend(), n, [&](RankContext& ctx, TreeReducer& tree) {
    for (int h = 0; h <= levels; ++h) {
      const int shard = 1 << h;
      const CommStats before = tree.Stats();
      Tensor input = ToTensor(x[h][ctx.rank]);
      Tensor output = Tensor::Zeros({kChunk});
      RETURN_IF_ERROR(tree.ReduceScatter(input, output, /*scatter_levels=*/h));
      EXPECT_TRUE(SameBits(output.ToVector(), Slice(want[h], (ctx.rank % shard) * kChunk, kChunk)))
          << "rank " << ctx.rank << " shard group size " << shard;
      const CommStats after = tree.Stats();
      EXPECT_EQ(after.of(CollectiveKind::kReduceScatter).calls -
                    before.of(CollectiveKind::kReduceScatter).calls,
                h);
      EXPECT_EQ(
          after.of(CollectiveKind::kAllReduce).calls - before.of(CollectiveKind::kAllReduce).calls,
          levels - h);
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(TreeReducerTest, ZeroLengthChunksWork) {
  const int n = this->n();
  absl::Status s = RunTree(backend(), n, [&](RankContext& ctx, TreeReducer& tree) {
    for (int h = 0; h <= tree.levels(); ++h) {
      RETURN_IF_ERROR(tree.ReduceScatter(Tensor::Zeros({0}), Tensor::Zeros({0}), h));
    }
    RETURN_IF_ERROR(tree.AllReduce(Tensor::Zeros({0})));
    // The group still works afterwards.
    Tensor t = Tensor::Zeros({2});
    t.Fill(1.0f);
    RETURN_IF_ERROR(tree.AllReduce(t));
    EXPECT_EQ(t.ToVector(), (std::vector<float>(2, static_cast<float>(n))));
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

// What deterministic mode is for: M micro-batches summed on n ranks (each its aligned
// range, locally with TreeAccumulator, then across ranks) give the bits of one rank
// summing all M with TreeAccumulator.
TEST_P(TreeReducerTest, MicroBatchesOnNRanksGiveTheBitsOfOneRank) {
  const int n = this->n();
  constexpr int kMicroBatches = 8;
  const std::vector<Values> grads = Inputs(kMicroBatches, n * kChunk, 30);
  TreeAccumulator one_rank;
  for (const Values& g : grads) ASSERT_TRUE(one_rank.Add(ToTensor(g)).ok());
  const Values want = one_rank.Finish().value().ToVector();
  ASSERT_GT(CountDifferentBits(want, LeftToRight(grads)), 0);
  absl::Status s = RunTree(backend(), n, [&](RankContext& ctx, TreeReducer& tree) {
    const int per_rank = kMicroBatches / n;
    TreeAccumulator local;
    for (int m = ctx.rank * per_rank; m < (ctx.rank + 1) * per_rank; ++m) {
      RETURN_IF_ERROR(local.Add(ToTensor(grads[m])));
    }
    ASSIGN_OR_RETURN(Tensor partial, local.Finish());
    Tensor summed = partial.Clone(core::MemoryTag::kGrad);
    RETURN_IF_ERROR(tree.AllReduce(summed));
    EXPECT_TRUE(SameBits(summed.ToVector(), want)) << "all-reduce, rank " << ctx.rank;
    Tensor shard = Tensor::Zeros({kChunk});
    RETURN_IF_ERROR(tree.ReduceScatter(partial, shard));
    EXPECT_TRUE(SameBits(shard.ToVector(), Slice(want, ctx.rank * kChunk, kChunk)))
        << "reduce-scatter, rank " << ctx.rank;
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(BackendsAndSizes, TreeReducerTest,
                         ::testing::Combine(::testing::Values(Backend::kGloo, Backend::kShm),
                                            ::testing::Values(1, 2, 4, 8)),
                         [](const ::testing::TestParamInfo<std::tuple<Backend, int>>& info) {
                           return absl::StrCat(BackendName(std::get<0>(info.param)), "_N",
                                               std::get<1>(info.param));
                         });

// Bad arguments are InvalidArgument on every rank, found before anything is sent: the
// next call still works.
TEST(TreeReducerErrorsTest, BadArgumentsAreInvalidArgumentNamingTheSizes) {
  constexpr int n = 4;
  absl::Status s = RunTree(Backend::kGloo, n, [&](RankContext& ctx, TreeReducer& tree) {
    const auto expect_invalid = [&](const absl::Status& status, const std::string& text) {
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
      EXPECT_NE(status.message().find(text), std::string::npos)
          << "want \"" << text << "\" in: " << status;
      EXPECT_NE(status.message().find("gloo group 'world'"), std::string::npos) << status;
    };
    expect_invalid(tree.ReduceScatter(Tensor::Zeros({4 * 5 + 1}), Tensor::Zeros({5})),
                   "input has 21 elements but must have 4 chunks");
    expect_invalid(tree.ReduceScatter(Tensor::Zeros({8}), Tensor::Zeros({5})),
                   "input has 8 elements");
    expect_invalid(tree.ReduceScatter(Tensor::Zeros({10}), Tensor::Zeros({5}), 1 + 2),
                   "scatter_levels 3 is outside [0, 2]");
    expect_invalid(tree.ReduceScatter(Tensor::Zeros({10}), Tensor::Zeros({5}), -1),
                   "scatter_levels -1");
    expect_invalid(tree.ReduceScatter(Tensor::Zeros({8}, DType::kBFloat16), Tensor::Zeros({2})),
                   "input is 8 bfloat16 elements");
    Tensor both = Tensor::Zeros({10});
    expect_invalid(tree.ReduceScatter(both.View(0, {8}).value(), both.View(7, {2}).value()),
                   "overlaps input");
    expect_invalid(tree.AllReduce(Tensor::Zeros({3}, DType::kInt32)), "3 int32 elements");
    // Nothing was sent: the group is in step and works.
    Tensor t = ToTensor({1.0f, 2.0f, 3.0f, 4.0f});
    Tensor out = Tensor::Zeros({1});
    RETURN_IF_ERROR(tree.ReduceScatter(t, out));
    EXPECT_EQ(out.ToVector(), (std::vector<float>{4.0f * (ctx.rank + 1)}));
    EXPECT_EQ(tree.Stats().Total().calls, tree.levels());
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(TreeReducerErrorsTest, CreateRefusesAGroupSizeThatIsNotAPowerOfTwo) {
  absl::Status s = RunThreadRanks(
      3,
      [&](RankContext& ctx) -> absl::Status {
        absl::StatusOr<std::unique_ptr<TreeReducer>> tree =
            TreeReducer::Create(ctx.group, kTimeout);
        EXPECT_EQ(tree.status().code(), absl::StatusCode::kInvalidArgument) << tree.status();
        EXPECT_NE(tree.status().message().find("group size 3 is not a power of two"),
                  std::string::npos)
            << tree.status();
        EXPECT_NE(tree.status().message().find("gloo group 'world'"), std::string::npos)
            << tree.status();
        return absl::OkStatus();
      },
      Options());
  EXPECT_TRUE(s.ok()) << s;
}

TEST(TreeReducerErrorsTest, CreateRefusesANullGroupAndANonPositiveTimeout) {
  EXPECT_EQ(TreeReducer::Create(nullptr, kTimeout).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status s = RunThreadRanks(
      1,
      [&](RankContext& ctx) -> absl::Status {
        absl::StatusOr<std::unique_ptr<TreeReducer>> tree =
            TreeReducer::Create(ctx.group, absl::ZeroDuration());
        EXPECT_EQ(tree.status().code(), absl::StatusCode::kInvalidArgument) << tree.status();
        EXPECT_NE(tree.status().message().find("timeout"), std::string::npos) << tree.status();
        return absl::OkStatus();
      },
      Options());
  EXPECT_TRUE(s.ok()) << s;
}

// The pair subgroups are named after their level and ranks, and a collective that cannot
// finish fails with the timeout given to Create instead of hanging: rank 1 of 2 never
// joins the all-reduce (it keeps its TreeReducer until rank 0 is done, so rank 0 waits
// on a live peer).
TEST(TreeReducerErrorsTest, AMissingPartnerIsDeadlineExceededAfterTheTimeout) {
  auto done = std::make_shared<absl::Notification>();
  absl::Status s = RunThreadRanks(
      2,
      [done](RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(std::unique_ptr<TreeReducer> tree,
                         TreeReducer::Create(ctx.group, absl::Milliseconds(500)));
        if (ctx.rank == 1) {
          done->WaitForNotificationWithTimeout(absl::Seconds(30));
          return absl::OkStatus();
        }
        const absl::Time start = absl::Now();
        absl::Status r = tree->AllReduce(Tensor::Zeros({4}));
        EXPECT_EQ(r.code(), absl::StatusCode::kDeadlineExceeded) << r;
        EXPECT_NE(r.message().find("world/tree0[0,1]"), std::string::npos) << r;
        EXPECT_LT(absl::Now() - start, absl::Seconds(10));
        done->Notify();
        return absl::OkStatus();
      },
      Options());
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace comm
