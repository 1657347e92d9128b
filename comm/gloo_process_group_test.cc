// Thread-rank tests of the gloo backend: every collective at N = 1, 2, 3, 4 with sizes
// that change from call to call (zero included), fp32/bf16/int32, sum/average/max,
// in-place forms, ordering, byte counters, subgroups, timeouts and dead peers, and
// the blame: which rank a timeout or a closed connection is pinned on, what a store
// that stops answering looks like, and corrupt or forged rendezvous values.
//
// All expected values are exact: inputs are small integers (exact in fp32 and, below
// 256, in bf16), so sums are exact and the only rounding is one division (average) or
// one conversion to bf16, both correctly rounded. Hence EXPECT_EQ, no tolerances.
#include "comm/gloo_process_group.h"

#include <arpa/inet.h>
#include <gloo/transport/tcp/address.h>
#include <netinet/in.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "comm/failure.h"
#include "comm/internal/socket.h"
#include "comm/tcp_store.h"
#include "comm/testing/thread_ranks.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"

namespace comm {
namespace {

using ::comm::testing::RankContext;
using ::comm::testing::RunThreadRanks;
using ::comm::testing::ThreadRanksOptions;
using core::BFloat16;
using core::DType;
using core::Tensor;

// Deadline of each collective in these tests: generous for a loaded 2-core machine,
// short enough that a hang fails well inside the test timeout.
constexpr absl::Duration kTimeout = absl::Seconds(20);

ThreadRanksOptions Options() {
  ThreadRanksOptions o;
  o.timeout = absl::Seconds(50);
  o.gloo.rendezvous_timeout = absl::Seconds(20);
  return o;
}

absl::Status Finish(const std::shared_ptr<Work>& work) { return work->Wait(kTimeout); }

// An element value unique to (rank, call, i), exact in fp32 and int32.
float Value(int rank, int call, int64_t i) {
  return static_cast<float>(rank * 100000 + call * 1000 + (i % 997));
}

Tensor Filled(int64_t n, DType dtype, const std::function<float(int64_t)>& f) {
  Tensor t = Tensor::Empty({n}, dtype);
  for (int64_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DType::kFloat32:
        t.data<float>()[i] = f(i);
        break;
      case DType::kBFloat16:
        t.data<BFloat16>()[i] = BFloat16::FromFloat(f(i));
        break;
      case DType::kInt32:
        t.data<int32_t>()[i] = static_cast<int32_t>(f(i));
        break;
    }
  }
  return t;
}

// The element as the dtype stores it, widened to double for comparison.
double At(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::kFloat32:
      return t.data<float>()[i];
    case DType::kBFloat16:
      return t.data<BFloat16>()[i].ToFloat();
    case DType::kInt32:
      return t.data<int32_t>()[i];
  }
  return 0;
}

// What `v` becomes when stored in `dtype`.
double Stored(DType dtype, float v) {
  if (dtype == DType::kBFloat16) return BFloat16::FromFloat(v).ToFloat();
  if (dtype == DType::kInt32) return static_cast<int32_t>(v);
  return v;
}

class CollectivesTest : public ::testing::TestWithParam<int> {
 protected:
  int n() const { return GetParam(); }
};

TEST_P(CollectivesTest, AllGatherPutsEveryRanksInputInRankOrder) {
  const std::vector<int64_t> sizes = {5, 0, 1, 1000, 3, 65543};
  absl::Status s = RunThreadRanks(n(), [&](RankContext& ctx) -> absl::Status {
    int call = 0;
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kInt32}) {
      for (int64_t k : sizes) {
        ++call;
        Tensor in = Filled(k, dtype, [&](int64_t i) { return Value(ctx.rank, call, i); });
        Tensor out = Tensor::Zeros({ctx.world_size * k}, dtype);
        ASSIGN_OR_RETURN(auto work, ctx.group->AllGather(in, out, AllGatherOptions{}));
        RETURN_IF_ERROR(Finish(work));
        for (int r = 0; r < ctx.world_size; ++r) {
          for (int64_t i = 0; i < k; ++i) {
            if (At(out, r * k + i) != Stored(dtype, Value(r, call, i))) {
              return absl::InternalError(absl::StrCat("call ", call, " slot ", r, " element ", i,
                                                      " is ", At(out, r * k + i)));
            }
          }
        }
      }
    }
    return absl::OkStatus();
  }, Options());
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(CollectivesTest, AllGatherInPlaceFromItsOwnSlot) {
  absl::Status s = RunThreadRanks(n(), [&](RankContext& ctx) -> absl::Status {
    for (int64_t k : {7, 0, 4096}) {
      Tensor out = Tensor::Zeros({ctx.world_size * k});
      ASSIGN_OR_RETURN(Tensor mine, out.View(ctx.rank * k, {k}));
      for (int64_t i = 0; i < k; ++i) mine.data<float>()[i] = Value(ctx.rank, 0, i);
      ASSIGN_OR_RETURN(auto work, ctx.group->AllGather(mine, out, AllGatherOptions{}));
      RETURN_IF_ERROR(Finish(work));
      for (int r = 0; r < ctx.world_size; ++r) {
        for (int64_t i = 0; i < k; ++i) EXPECT_EQ(At(out, r * k + i), Value(r, 0, i));
      }
    }
    return absl::OkStatus();
  }, Options());
  EXPECT_TRUE(s.ok()) << s;
}

// Small positive integers: sums over 4 ranks stay below 256, exact in bf16.
float Small(int rank, int64_t j) { return static_cast<float>((rank + 1) * ((j % 7) + 1)); }

TEST_P(CollectivesTest, ReduceScatterSumAverageMax) {
  absl::Status s = RunThreadRanks(n(), [&](RankContext& ctx) -> absl::Status {
    const int n = ctx.world_size;
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
        for (int64_t k : {3, 0, 1, 257}) {
          for (bool in_place : {false, true}) {
            Tensor in = Filled(n * k, dtype, [&](int64_t j) { return Small(ctx.rank, j); });
            Tensor out = in_place ? in.View(ctx.rank * k, {k}).value() : Tensor::Zeros({k}, dtype);
            ReduceScatterOptions opts;
            opts.reduce_op = op;
            ASSIGN_OR_RETURN(auto work, ctx.group->ReduceScatter(in, out, opts));
            RETURN_IF_ERROR(Finish(work));
            for (int64_t i = 0; i < k; ++i) {
              const int64_t j = ctx.rank * k + i;
              float sum = 0, max = 0;
              for (int r = 0; r < n; ++r) {
                sum += Small(r, j);
                max = std::max(max, Small(r, j));
              }
              const float want = op == ReduceOp::kSum ? sum
                                 : op == ReduceOp::kMax ? max
                                                        : sum / static_cast<float>(n);
              EXPECT_EQ(At(out, i), Stored(dtype, want))
                  << DTypeName(dtype) << " " << ReduceOpName(op) << " k=" << k << " i=" << i
                  << " in_place=" << in_place;
            }
          }
        }
      }
    }
    return absl::OkStatus();
  }, Options());
  EXPECT_TRUE(s.ok()) << s;
}

// Chunks of several pieces (NOTE [Pipelined reduce-scatter]): the result has the bits of
// combining the ranks' chunks in rank order, in place or not, and the group receives
// into a fixed ring of 2 (n - 1) pieces instead of an n x chunk buffer per call.
TEST_P(CollectivesTest, ReduceScatterOfSeveralPiecesInRankOrderWithABoundedRing) {
  absl::Status s = RunThreadRanks(n(), [&](RankContext& ctx) -> absl::Status {
    const int n = ctx.world_size;
    const int64_t piece_f32 = GlooProcessGroup::kReduceScatterPieceBytes / 4;
    const auto value = [](int rank, int64_t j) {
      return static_cast<float>(std::sin(0.001 * static_cast<double>(j) + rank) * (rank + 1.3));
    };
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
      for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
        for (bool in_place : {false, true}) {
          const int64_t k = 2 * piece_f32 + 12345;  // 3 fp32 pieces, 2 bf16 pieces
          Tensor in = Filled(n * k, dtype, [&](int64_t j) { return value(ctx.rank, j); });
          Tensor out = in_place ? in.View(ctx.rank * k, {k}).value() : Tensor::Zeros({k}, dtype);
          ctx.allocator->ResetPeaks();
          ReduceScatterOptions opts;
          opts.reduce_op = op;
          ASSIGN_OR_RETURN(auto work, ctx.group->ReduceScatter(in, out, opts));
          RETURN_IF_ERROR(Finish(work));
          const int64_t ring = 2 * (n - 1) * GlooProcessGroup::kReduceScatterPieceBytes;
          EXPECT_LE(ctx.allocator->Stats().peak(core::MemoryTag::kComm), ring);
          EXPECT_EQ(ctx.allocator->Stats().current(core::MemoryTag::kComm),
                    ctx.allocator->Stats().peak(core::MemoryTag::kComm))
              << "the ring is kept for the next call, nothing else";
          int64_t wrong = 0;
          for (int64_t i = 0; i < k; ++i) {
            const int64_t j = ctx.rank * k + i;
            float acc = Stored(dtype, value(0, j));
            for (int r = 1; r < n; ++r) acc += Stored(dtype, value(r, j));
            if (op == ReduceOp::kAverage) acc /= static_cast<float>(n);
            if (At(out, i) != Stored(dtype, acc)) ++wrong;
          }
          EXPECT_EQ(wrong, 0) << DTypeName(dtype) << " " << ReduceOpName(op)
                              << " in_place=" << in_place;
        }
      }
    }
    return absl::OkStatus();
  }, Options());
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(CollectivesTest, AllReduceSumAverageMaxIdenticalOnEveryRank) {
  // Results of rank r for each case, to compare bits across ranks afterwards.
  std::vector<std::vector<std::vector<double>>> results(n());
  absl::Status s = RunThreadRanks(n(), [&](RankContext& ctx) -> absl::Status {
    const int n = ctx.world_size;
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kInt32}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
        if (dtype == DType::kInt32 && op == ReduceOp::kAverage) continue;  // InvalidArgument
        for (int64_t len : {11, 0, 1, 100003}) {
          Tensor t = Filled(len, dtype, [&](int64_t j) { return Small(ctx.rank, j); });
          AllReduceOptions opts;
          opts.reduce_op = op;
          ASSIGN_OR_RETURN(auto work, ctx.group->AllReduce(t, opts));
          RETURN_IF_ERROR(Finish(work));
          std::vector<double> got(len);
          for (int64_t j = 0; j < len; ++j) {
            got[j] = At(t, j);
            float sum = 0, max = 0;
            for (int r = 0; r < n; ++r) {
              sum += Small(r, j);
              max = std::max(max, Small(r, j));
            }
            const float want = op == ReduceOp::kSum ? sum
                               : op == ReduceOp::kMax ? max
                                                      : sum / static_cast<float>(n);
            if (got[j] != Stored(dtype, want)) {
              return absl::InternalError(absl::StrCat(DTypeName(dtype), " ", ReduceOpName(op),
                                                      " element ", j, " is ", got[j], " not ",
                                                      Stored(dtype, want)));
            }
          }
          results[ctx.rank].push_back(std::move(got));
        }
      }
    }
    return absl::OkStatus();
  }, Options());
  ASSERT_TRUE(s.ok()) << s;
  for (int r = 1; r < n(); ++r) EXPECT_EQ(results[r], results[0]) << "rank " << r;
}

TEST_P(CollectivesTest, BroadcastFromEveryRoot) {
  absl::Status s = RunThreadRanks(n(), [&](RankContext& ctx) -> absl::Status {
    for (int root = 0; root < ctx.world_size; ++root) {
      int call = 0;
      for (int64_t len : {0, 1, 100, 4097}) {
        ++call;
        Tensor t = Filled(len, DType::kFloat32, [&](int64_t i) { return Value(ctx.rank, call, i); });
        BroadcastOptions opts;
        opts.root = root;
        ASSIGN_OR_RETURN(auto work, ctx.group->Broadcast(t, opts));
        RETURN_IF_ERROR(Finish(work));
        for (int64_t i = 0; i < len; ++i) EXPECT_EQ(At(t, i), Value(root, call, i));
      }
    }
    return absl::OkStatus();
  }, Options());
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(CollectivesTest, BarrierWaitsForEveryRank) {
  std::atomic<int> arrived{0};
  absl::Status s = RunThreadRanks(n(), [&](RankContext& ctx) -> absl::Status {
    absl::SleepFor(absl::Milliseconds(40 * ctx.rank));
    arrived.fetch_add(1);
    ASSIGN_OR_RETURN(auto work, ctx.group->Barrier(BarrierOptions{}));
    RETURN_IF_ERROR(Finish(work));
    EXPECT_EQ(arrived.load(), ctx.world_size) << "rank " << ctx.rank << " passed too early";
    return absl::OkStatus();
  }, Options());
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(CollectivesTest, CollectivesCompleteInIssueOrder) {
  absl::Status s = RunThreadRanks(n(), [&](RankContext& ctx) -> absl::Status {
    Tensor big = Filled(1 << 20, DType::kFloat32, [&](int64_t) { return 1.0f; });
    Tensor shard = Filled(3, DType::kFloat32, [&](int64_t i) { return Value(ctx.rank, 0, i); });
    Tensor gathered = Tensor::Zeros({3 * ctx.world_size});
    Tensor b = Filled(5, DType::kFloat32, [&](int64_t) { return static_cast<float>(ctx.rank); });
    ASSIGN_OR_RETURN(auto w1, ctx.group->AllReduce(big, AllReduceOptions{}));
    ASSIGN_OR_RETURN(auto w2, ctx.group->AllGather(shard, gathered, AllGatherOptions{}));
    ASSIGN_OR_RETURN(auto w3, ctx.group->Broadcast(b, BroadcastOptions{}));
    ASSIGN_OR_RETURN(auto w4, ctx.group->Barrier(BarrierOptions{}));
    RETURN_IF_ERROR(Finish(w4));
    // The last one finished, so every earlier one had finished before it.
    EXPECT_TRUE(w1->IsCompleted());
    EXPECT_TRUE(w2->IsCompleted());
    EXPECT_TRUE(w3->IsCompleted());
    RETURN_IF_ERROR(Finish(w1));
    RETURN_IF_ERROR(Finish(w2));
    RETURN_IF_ERROR(Finish(w3));
    EXPECT_EQ(At(big, 12345), ctx.world_size);
    EXPECT_EQ(At(gathered, 3 * (ctx.world_size - 1) + 2), Value(ctx.world_size - 1, 0, 2));
    EXPECT_EQ(At(b, 4), 0.0);
    return absl::OkStatus();
  }, Options());
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(CollectivesTest, ByteCountersFollowTheStandardFormulas) {
  absl::Status s = RunThreadRanks(n(), [&](RankContext& ctx) -> absl::Status {
    const int64_t n = ctx.world_size;
    ProcessGroup& g = *ctx.group;
    g.ResetStats();
    // All-gather of 10 fp32 per rank: S = 40n bytes in total, S(n-1)/n = 40(n-1).
    Tensor ag_in = Tensor::Zeros({10});
    Tensor ag_out = Tensor::Zeros({10 * n});
    RETURN_IF_ERROR(Finish(g.AllGather(ag_in, ag_out, AllGatherOptions{}).value()));
    // Reduce-scatter of 6 bf16 per rank out: S = 12n bytes in, S(n-1)/n = 12(n-1). Twice.
    Tensor rs_in = Tensor::Zeros({6 * n}, DType::kBFloat16);
    Tensor rs_out = Tensor::Zeros({6}, DType::kBFloat16);
    RETURN_IF_ERROR(Finish(g.ReduceScatter(rs_in, rs_out, ReduceScatterOptions{}).value()));
    RETURN_IF_ERROR(Finish(g.ReduceScatter(rs_in, rs_out, ReduceScatterOptions{}).value()));
    // All-reduce of 13 fp32: S = 52, 2S(n-1)/n rounded down.
    Tensor ar = Tensor::Zeros({13});
    RETURN_IF_ERROR(Finish(g.AllReduce(ar, AllReduceOptions{}).value()));
    // A zero-length all-reduce is a call that moves nothing.
    Tensor empty = Tensor::Zeros({0});
    RETURN_IF_ERROR(Finish(g.AllReduce(empty, AllReduceOptions{}).value()));
    // Broadcast of 5 fp32 from root 0: everyone but the root receives 20 bytes,
    // everyone but the chain's last rank (n-1) sends 20.
    Tensor bc = Tensor::Zeros({5});
    RETURN_IF_ERROR(Finish(g.Broadcast(bc, BroadcastOptions{}).value()));
    RETURN_IF_ERROR(Finish(g.Barrier(BarrierOptions{}).value()));

    const CommStats st = g.Stats();
    const auto& agc = st.of(CollectiveKind::kAllGather);
    EXPECT_EQ(agc.calls, 1);
    EXPECT_EQ(agc.bytes_sent, 40 * (n - 1));
    EXPECT_EQ(agc.bytes_received, 40 * (n - 1));
    const auto& rsc = st.of(CollectiveKind::kReduceScatter);
    EXPECT_EQ(rsc.calls, 2);
    EXPECT_EQ(rsc.bytes_sent, 2 * 12 * (n - 1));
    EXPECT_EQ(rsc.bytes_received, 2 * 12 * (n - 1));
    const auto& arc = st.of(CollectiveKind::kAllReduce);
    EXPECT_EQ(arc.calls, 2);
    EXPECT_EQ(arc.bytes_sent, 2 * 52 * (n - 1) / n);
    EXPECT_EQ(arc.bytes_received, 2 * 52 * (n - 1) / n);
    const auto& bcc = st.of(CollectiveKind::kBroadcast);
    EXPECT_EQ(bcc.calls, 1);
    EXPECT_EQ(bcc.bytes_received, ctx.rank == 0 ? 0 : 20);
    EXPECT_EQ(bcc.bytes_sent, ctx.rank == n - 1 ? 0 : 20);
    EXPECT_EQ(st.of(CollectiveKind::kBarrier).calls, 1);
    EXPECT_EQ(st.of(CollectiveKind::kBarrier).bytes_sent, 0);
    EXPECT_EQ(st.Total().calls, 7);

    g.ResetStats();
    EXPECT_EQ(g.Stats().Total().calls, 0);
    EXPECT_EQ(g.Stats().Total().bytes_sent, 0);
    return absl::OkStatus();
  }, Options());
  EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(Ranks, CollectivesTest, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("N", info.param);
                         });

// A reduction that accumulated in bf16 would lose the 1s added to 256 (bf16 keeps 8
// significant bits, so 256 + 1 rounds back to 256); one in fp32 gets 256 + (n - 1).
TEST(GlooBf16Test, ReductionsAccumulateInFp32) {
  for (int n : {3, 4}) {
    absl::Status s = RunThreadRanks(n, [&](RankContext& ctx) -> absl::Status {
      const float mine = ctx.rank == 0 ? 256.0f : 1.0f;
      const double want = BFloat16::FromFloat(256.0f + (n - 1)).ToFloat();
      EXPECT_NE(want, 256.0) << "the case must tell fp32 from bf16 accumulation";
      Tensor t = Filled(9, DType::kBFloat16, [&](int64_t) { return mine; });
      RETURN_IF_ERROR(Finish(ctx.group->AllReduce(t, AllReduceOptions{}).value()));
      for (int64_t i = 0; i < 9; ++i) EXPECT_EQ(At(t, i), want) << "AllReduce n=" << n;
      Tensor in = Filled(2 * n, DType::kBFloat16, [&](int64_t) { return mine; });
      Tensor out = Tensor::Zeros({2}, DType::kBFloat16);
      RETURN_IF_ERROR(Finish(ctx.group->ReduceScatter(in, out, ReduceScatterOptions{}).value()));
      EXPECT_EQ(At(out, 0), want) << "ReduceScatter n=" << n;
      EXPECT_EQ(At(out, 1), want) << "ReduceScatter n=" << n;
      return absl::OkStatus();
    }, Options());
    EXPECT_TRUE(s.ok()) << s;
  }
}

TEST(GlooValidationTest, BadArgumentsAreInvalidArgumentNamingCollectiveAndGroup) {
  absl::Status s = RunThreadRanks(2, [&](RankContext& ctx) -> absl::Status {
    ProcessGroup& g = *ctx.group;
    auto expect_invalid = [&](absl::StatusOr<std::shared_ptr<Work>> w, const std::string& kind,
                              const std::string& detail) {
      EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument) << kind << ": " << w.status();
      EXPECT_NE(w.status().message().find(kind), std::string::npos) << w.status();
      EXPECT_NE(w.status().message().find("'world'"), std::string::npos) << w.status();
      EXPECT_NE(w.status().message().find(detail), std::string::npos) << w.status();
    };
    Tensor in = Tensor::Zeros({3});
    expect_invalid(g.AllGather(in, Tensor::Zeros({5}), AllGatherOptions{}), "AllGather", "5");
    expect_invalid(g.AllGather(in, Tensor::Zeros({6}, DType::kBFloat16), AllGatherOptions{}),
                   "AllGather", "dtypes");
    Tensor out = Tensor::Zeros({6});
    // Overlapping the output, but at the other rank's slot.
    Tensor wrong_slot = out.View(ctx.rank == 0 ? 3 : 0, {3}).value();
    expect_invalid(g.AllGather(wrong_slot, out, AllGatherOptions{}), "AllGather", "overlaps");
    Tensor straddle = out.View(1, {3}).value();
    expect_invalid(g.AllGather(straddle, out, AllGatherOptions{}), "AllGather", "overlaps");
    expect_invalid(g.ReduceScatter(Tensor::Zeros({7}), in, ReduceScatterOptions{}),
                   "ReduceScatter", "7");
    expect_invalid(g.ReduceScatter(out, out.View(ctx.rank == 0 ? 3 : 0, {3}).value(),
                                   ReduceScatterOptions{}),
                   "ReduceScatter", "overlaps");
    ReduceScatterOptions avg;
    avg.reduce_op = ReduceOp::kAverage;
    expect_invalid(g.ReduceScatter(Tensor::Zeros({6}, DType::kInt32),
                                   Tensor::Zeros({3}, DType::kInt32), avg),
                   "ReduceScatter", "average");
    BroadcastOptions bad_root;
    bad_root.root = 2;
    expect_invalid(g.Broadcast(in, bad_root), "Broadcast", "root 2");
    AllReduceOptions no_time;
    no_time.timeout = absl::ZeroDuration();
    expect_invalid(g.AllReduce(in, no_time), "AllReduce", "timeout");
    expect_invalid(g.AllReduce(Tensor(), AllReduceOptions{}), "AllReduce", "undefined");
    // Nothing was sent, so the group still works.
    RETURN_IF_ERROR(Finish(g.AllReduce(in, AllReduceOptions{}).value()));
    return absl::OkStatus();
  }, Options());
  EXPECT_TRUE(s.ok()) << s;
}

TEST(GlooFaultTest, CollectiveAPeerNeverIssuesTimesOutAndBreaksTheGroup) {
  absl::Status s = RunThreadRanks(2, [&](RankContext& ctx) -> absl::Status {
    if (ctx.rank == 1) return absl::OkStatus();  // never issues; keeps its group open
    AllReduceOptions opts;
    opts.timeout = absl::Milliseconds(400);
    Tensor t = Tensor::Zeros({100});
    const absl::Time start = absl::Now();
    ASSIGN_OR_RETURN(auto work, ctx.group->AllReduce(t, opts));
    absl::Status got = work->Wait(kTimeout);
    const absl::Duration took = absl::Now() - start;
    EXPECT_EQ(got.code(), absl::StatusCode::kDeadlineExceeded) << got;
    EXPECT_NE(got.message().find("AllReduce"), std::string::npos) << got;
    EXPECT_NE(got.message().find("'world'"), std::string::npos) << got;
    EXPECT_NE(got.message().find("400ms"), std::string::npos) << got;
    // It gave up at its deadline: not before it, and well before kTimeout (5 s bound is
    // slack for a loaded machine).
    EXPECT_GE(took, absl::Milliseconds(350));
    EXPECT_LT(took, absl::Seconds(5));
    absl::StatusOr<std::shared_ptr<Work>> after = ctx.group->Barrier(BarrierOptions{});
    EXPECT_EQ(after.status().code(), absl::StatusCode::kFailedPrecondition) << after.status();
    EXPECT_NE(after.status().message().find("AllReduce"), std::string::npos) << after.status();
    return absl::OkStatus();
  }, Options());
  EXPECT_TRUE(s.ok()) << s;
}

TEST(GlooFaultTest, RankThatNeverJoinsGivesDeadlineExceededToTheOthers) {
  ThreadRanksOptions opts = Options();
  opts.create_group = false;
  absl::Status s = RunThreadRanks(3, [&](RankContext& ctx) -> absl::Status {
    if (ctx.rank == 2) return absl::OkStatus();  // never joins
    GlooOptions g;
    g.rendezvous_timeout = absl::Milliseconds(500);
    const absl::Time start = absl::Now();
    auto group = GlooProcessGroup::Create(ctx.store, ctx.rank, 3, g);
    const absl::Duration took = absl::Now() - start;
    EXPECT_EQ(group.status().code(), absl::StatusCode::kDeadlineExceeded) << group.status();
    EXPECT_NE(group.status().message().find("world"), std::string::npos) << group.status();
    EXPECT_NE(group.status().message().find("2"), std::string::npos) << group.status();
    // Within the rendezvous timeout plus slack for a loaded machine.
    EXPECT_LT(took, absl::Seconds(5));
    return absl::OkStatus();
  }, opts);
  EXPECT_TRUE(s.ok()) << s;
}

TEST(GlooFaultTest, PeerThatDiesMidRunMakesTheOthersFailFast) {
  absl::Status s = RunThreadRanks(3, [&](RankContext& ctx) -> absl::Status {
    Tensor t = Tensor::Zeros({1000});
    for (int i = 0; i < 3; ++i) RETURN_IF_ERROR(Finish(ctx.group->AllReduce(t, AllReduceOptions{}).value()));
    if (ctx.rank == 1) {
      ctx.group.reset();  // dies: its connections close
      return absl::OkStatus();
    }
    AllReduceOptions opts;
    opts.timeout = absl::Seconds(30);
    const absl::Time start = absl::Now();
    ASSIGN_OR_RETURN(auto work, ctx.group->AllReduce(t, opts));
    absl::Status got = work->Wait(absl::Seconds(40));
    EXPECT_FALSE(got.ok());
    // A closed connection is noticed at once, not at the 30 s deadline.
    EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << got;
    EXPECT_NE(got.message().find("AllReduce"), std::string::npos) << got;
    return absl::OkStatus();
  }, Options());
  EXPECT_TRUE(s.ok()) << s;
}

TEST(GlooWorkTest, ShortWaitOnARunningCollectiveSaysSoAndALaterWaitSucceeds) {
  absl::Status s = RunThreadRanks(2, [&](RankContext& ctx) -> absl::Status {
    Tensor t = Tensor::Zeros({10});
    t.Fill(1.0f);
    if (ctx.rank == 1) absl::SleepFor(absl::Milliseconds(500));
    ASSIGN_OR_RETURN(auto work, ctx.group->AllReduce(t, AllReduceOptions{}));
    if (ctx.rank == 0) {
      absl::Status early = work->Wait(absl::Milliseconds(20));
      EXPECT_EQ(early.code(), absl::StatusCode::kDeadlineExceeded) << early;
      EXPECT_NE(early.message().find("still running"), std::string::npos) << early;
      EXPECT_FALSE(work->IsCompleted());
    }
    RETURN_IF_ERROR(Finish(work));
    EXPECT_TRUE(work->IsCompleted());
    EXPECT_EQ(At(t, 0), 2.0);
    return absl::OkStatus();
  }, Options());
  EXPECT_TRUE(s.ok()) << s;
}

TEST(GlooSubgroupTest, SubgroupsReduceAmongTheirMembersOnly) {
  absl::Status s = RunThreadRanks(4, [&](RankContext& ctx) -> absl::Status {
    std::shared_ptr<ProcessGroup> mine;
    for (const std::vector<int>& ranks : {std::vector<int>{0, 1}, std::vector<int>{2, 3}}) {
      absl::StatusOr<std::shared_ptr<ProcessGroup>> g = ctx.group->NewSubgroup(ranks, {});
      const bool member = std::find(ranks.begin(), ranks.end(), ctx.rank) != ranks.end();
      if (member) {
        if (!g.ok()) return g.status();
        mine = *g;
      } else {
        EXPECT_EQ(g.status().code(), absl::StatusCode::kNotFound) << g.status();
      }
    }
    EXPECT_EQ(mine->size(), 2);
    EXPECT_EQ(mine->rank(), ctx.rank % 2);
    Tensor t = Tensor::Zeros({4});
    t.Fill(static_cast<float>(ctx.rank));
    RETURN_IF_ERROR(Finish(mine->AllReduce(t, AllReduceOptions{}).value()));
    EXPECT_EQ(At(t, 3), ctx.rank < 2 ? 0 + 1 : 2 + 3);
    EXPECT_EQ(mine->Stats().of(CollectiveKind::kAllReduce).calls, 1);
    EXPECT_EQ(ctx.group->Stats().of(CollectiveKind::kAllReduce).calls, 0);

    // Subgroup rank i is ranks[i]: in [3, 1], global rank 3 is the root (rank 0).
    SubgroupOptions named;
    named.name = "odd";
    absl::StatusOr<std::shared_ptr<ProcessGroup>> odd = ctx.group->NewSubgroup({3, 1}, named);
    if (ctx.rank % 2 == 1) {
      if (!odd.ok()) return odd.status();
      EXPECT_EQ((*odd)->rank(), ctx.rank == 3 ? 0 : 1);
      EXPECT_EQ((*odd)->name(), "odd");
      Tensor b = Tensor::Zeros({2});
      b.Fill(static_cast<float>(ctx.rank));
      RETURN_IF_ERROR(Finish((*odd)->Broadcast(b, BroadcastOptions{}).value()));
      EXPECT_EQ(At(b, 1), 3.0);
    } else {
      EXPECT_EQ(odd.status().code(), absl::StatusCode::kNotFound) << odd.status();
    }
    EXPECT_EQ(ctx.group->NewSubgroup({}, {}).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(ctx.group->NewSubgroup({0, 0}, {}).status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(ctx.group->NewSubgroup({4}, {}).status().code(), absl::StatusCode::kInvalidArgument);
    // The world group still works after its subgroups.
    RETURN_IF_ERROR(Finish(ctx.group->Barrier(BarrierOptions{}).value()));
    return absl::OkStatus();
  }, Options());
  EXPECT_TRUE(s.ok()) << s;
}

TEST(GlooCreateTest, BadArgumentsAreInvalidArgument) {
  auto store = std::make_shared<HashStore>();
  EXPECT_EQ(GlooProcessGroup::Create(store, 2, 2, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GlooProcessGroup::Create(nullptr, 0, 1, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  GlooOptions bad_host;
  bad_host.hostname = "no-such-host.invalid";
  EXPECT_EQ(GlooProcessGroup::Create(store, 0, 1, bad_host).status().code(),
            absl::StatusCode::kInvalidArgument);
  GlooOptions not_local;
  not_local.hostname = "192.0.2.1";  // TEST-NET-1: never a local address
  EXPECT_EQ(GlooProcessGroup::Create(store, 0, 1, not_local).status().code(),
            absl::StatusCode::kUnavailable);
}

// ---- Blame: which rank a failure is pinned on (NOTE [Who is to blame]).

// Waits until `*count` reaches `n` (at most 30 s): how a rank that must stay away from
// a collective waits for the others to be done with it, keeping its group open.
void AwaitCount(const std::shared_ptr<std::atomic<int>>& count, int n) {
  const absl::Time end = absl::Now() + absl::Seconds(30);
  while (count->load() < n && absl::Now() < end) absl::SleepFor(absl::Milliseconds(10));
}

TEST(GlooBlameTest, RankThatNeverArrivesIsNamedByTheOthers) {
  auto done = std::make_shared<std::atomic<int>>(0);
  absl::Status s = RunThreadRanks(3, [done](RankContext& ctx) -> absl::Status {
    Tensor t = Tensor::Zeros({16});
    for (int i = 0; i < 2; ++i) {  // collectives #0 and #1
      RETURN_IF_ERROR(Finish(ctx.group->AllReduce(t, AllReduceOptions{}).value()));
    }
    if (ctx.rank == 1) {  // never issues #2; keeps its group open meanwhile
      AwaitCount(done, 2);
      return absl::OkStatus();
    }
    AllReduceOptions opts;
    opts.timeout = absl::Seconds(1);
    const absl::Time start = absl::Now();
    ASSIGN_OR_RETURN(auto work, ctx.group->AllReduce(t, opts));
    absl::Status got = work->Wait(kTimeout);
    const absl::Duration took = absl::Now() - start;
    ++*done;
    EXPECT_EQ(got.code(), absl::StatusCode::kDeadlineExceeded) << got;
    EXPECT_NE(got.message().find("AllReduce #2"), std::string::npos) << got;
    EXPECT_NE(got.message().find("'world'"), std::string::npos) << got;
    EXPECT_NE(got.message().find(
                  "rank 1 did not arrive (last at collective #1); ranks 0, 2 did"),
              std::string::npos)
        << got;
    EXPECT_TRUE(IsSecondary(got)) << got;
    EXPECT_EQ(CulpritRanks(got), std::vector<int>{1}) << got;
    EXPECT_LT(took, absl::Seconds(8)) << got;
    return absl::OkStatus();
  }, Options());
  EXPECT_TRUE(s.ok()) << s;
}

TEST(GlooBlameTest, AWaitThatEndsBeforeTheCollectivesDeadlineAlsoNamesTheMissingRank) {
  auto done = std::make_shared<std::atomic<int>>(0);
  absl::Status s = RunThreadRanks(3, [done](RankContext& ctx) -> absl::Status {
    Tensor t = Tensor::Zeros({16});
    RETURN_IF_ERROR(Finish(ctx.group->AllReduce(t, AllReduceOptions{}).value()));  // #0
    if (ctx.rank == 1) {  // never issues #1
      AwaitCount(done, 2);
      return absl::OkStatus();
    }
    AllReduceOptions opts;
    opts.timeout = absl::Seconds(30);  // the caller gives up long before the collective
    ASSIGN_OR_RETURN(auto work, ctx.group->AllReduce(t, opts));
    const absl::Time start = absl::Now();
    absl::Status got = work->Wait(absl::Seconds(1));
    const absl::Duration took = absl::Now() - start;
    ++*done;
    EXPECT_EQ(got.code(), absl::StatusCode::kDeadlineExceeded) << got;
    EXPECT_NE(got.message().find("Wait(1s) on AllReduce #1"), std::string::npos) << got;
    EXPECT_NE(got.message().find("rank 1 did not arrive (last at collective #0)"),
              std::string::npos)
        << got;
    EXPECT_EQ(CulpritRanks(got), std::vector<int>{1}) << got;
    EXPECT_LT(took, absl::Seconds(8)) << got;
    return absl::OkStatus();
  }, Options());
  EXPECT_TRUE(s.ok()) << s;
}

TEST(GlooBlameTest, PeerThatDestroysItsGroupIsNamedByRank) {
  absl::Status s = RunThreadRanks(3, [](RankContext& ctx) -> absl::Status {
    Tensor t = Tensor::Zeros({1000});
    for (int i = 0; i < 2; ++i) {
      RETURN_IF_ERROR(Finish(ctx.group->AllReduce(t, AllReduceOptions{}).value()));
    }
    if (ctx.rank == 1) {
      ctx.group.reset();  // dies mid-job: its connections close
      return absl::OkStatus();
    }
    AllReduceOptions opts;
    opts.timeout = absl::Seconds(30);
    const absl::Time start = absl::Now();
    ASSIGN_OR_RETURN(auto work, ctx.group->AllReduce(t, opts));
    absl::Status got = work->Wait(absl::Seconds(40));
    EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << got;
    EXPECT_EQ(got.code(), absl::StatusCode::kUnavailable) << got;
    EXPECT_NE(got.message().find("AllReduce #2"), std::string::npos) << got;
    // Named by rank, with the address gloo saw, whether this rank saw rank 1 close or
    // the other survivor close after it.
    EXPECT_NE(got.message().find("rank 1 (127.0.0.1:"), std::string::npos) << got;
    EXPECT_NE(got.message().find("its group was destroyed"), std::string::npos) << got;
    EXPECT_TRUE(IsSecondary(got)) << got;
    EXPECT_EQ(CulpritRanks(got), std::vector<int>{1}) << got;
    return absl::OkStatus();
  }, Options());
  EXPECT_TRUE(s.ok()) << s;
}

// A store over another whose every call blocks while it is closed (at most 20 s).
class GatedStore : public Store {
 public:
  explicit GatedStore(std::shared_ptr<Store> base) : base_(std::move(base)) {}
  void set_open(bool open) {
    absl::MutexLock lock(&mu_);
    open_ = open;
  }
  absl::Status Set(absl::string_view key, absl::string_view value) override {
    Pass();
    return base_->Set(key, value);
  }
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override {
    Pass();
    return base_->Get(key, timeout);
  }
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override {
    Pass();
    return base_->Add(key, delta);
  }
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    Pass();
    return base_->Wait(keys, timeout);
  }
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys) override {
    Pass();
    return base_->Check(keys);
  }

 private:
  void Pass() {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&open_), absl::Seconds(20));
  }
  std::shared_ptr<Store> base_;
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = true;
};

TEST(GlooBlameTest, StoreThatStopsAnsweringIsSaidToAndItsServerBlamed) {
  ThreadRanksOptions topts = Options();
  topts.create_group = false;
  auto done = std::make_shared<std::atomic<int>>(0);
  absl::Status s = RunThreadRanks(2, [done](RankContext& ctx) -> absl::Status {
    auto gated = std::make_shared<GatedStore>(ctx.store);
    GlooOptions g;
    g.rendezvous_timeout = absl::Seconds(20);
    g.store_probe_timeout = absl::Milliseconds(300);
    g.store_server_rank = 1;  // as if rank 1 served the store, and then hung
    ASSIGN_OR_RETURN(auto group, GlooProcessGroup::Create(gated, ctx.rank, 2, g));
    RETURN_IF_ERROR(Finish(group->Barrier(BarrierOptions{}).value()));
    if (ctx.rank == 1) {
      AwaitCount(done, 1);
      return absl::OkStatus();
    }
    gated->set_open(false);
    AllReduceOptions opts;
    opts.timeout = absl::Milliseconds(500);
    Tensor t = Tensor::Zeros({4});
    const absl::Time start = absl::Now();
    ASSIGN_OR_RETURN(auto work, group->AllReduce(t, opts));
    absl::Status got = work->Wait(kTimeout);
    const absl::Duration took = absl::Now() - start;
    EXPECT_EQ(got.code(), absl::StatusCode::kDeadlineExceeded) << got;
    EXPECT_NE(got.message().find("AllReduce #1"), std::string::npos) << got;
    EXPECT_NE(got.message().find("cannot tell which ranks did not arrive"), std::string::npos)
        << got;
    EXPECT_NE(got.message().find("the store (served by rank 1) does not answer"),
              std::string::npos)
        << got;
    EXPECT_NE(got.message().find("rank 1 is gone or stopped"), std::string::npos) << got;
    EXPECT_EQ(CulpritRanks(got), std::vector<int>{1}) << got;
    // The timeout, then at most one probe and one record write of 300 ms each.
    EXPECT_LT(took, absl::Seconds(4)) << got;
    gated->set_open(true);
    ++*done;
    return absl::OkStatus();
  }, topts);
  EXPECT_TRUE(s.ok()) << s;
}

TEST(GlooBlameTest, TcpStoreThatIsGoneIsNamedByAddress) {
  TcpStoreOptions server_options;
  server_options.is_server = true;
  absl::StatusOr<std::shared_ptr<TcpStore>> server = TcpStore::Create(server_options);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  auto server_holder = std::make_shared<std::shared_ptr<TcpStore>>(*server);
  server->reset();
  ThreadRanksOptions topts = Options();
  topts.create_group = false;
  auto joined = std::make_shared<std::atomic<int>>(0);
  auto done = std::make_shared<std::atomic<int>>(0);
  absl::Status s = RunThreadRanks(2, [=](RankContext& ctx) -> absl::Status {
    TcpStoreOptions client;
    client.port = port;
    client.connect_timeout = absl::Milliseconds(300);
    client.request_timeout = absl::Seconds(2);
    ASSIGN_OR_RETURN(std::shared_ptr<TcpStore> store, TcpStore::Create(client));
    GlooOptions g;
    g.rendezvous_timeout = absl::Seconds(20);
    g.store_probe_timeout = absl::Milliseconds(500);
    ASSIGN_OR_RETURN(auto group, GlooProcessGroup::Create(store, ctx.rank, 2, g));
    RETURN_IF_ERROR(Finish(group->Barrier(BarrierOptions{}).value()));
    ++*joined;
    if (ctx.rank == 1) {
      AwaitCount(done, 1);
      return absl::OkStatus();
    }
    AwaitCount(joined, 2);
    server_holder->reset();  // the store's server goes away
    AllReduceOptions opts;
    opts.timeout = absl::Milliseconds(500);
    Tensor t = Tensor::Zeros({4});
    ASSIGN_OR_RETURN(auto work, group->AllReduce(t, opts));
    absl::Status got = work->Wait(kTimeout);
    ++*done;
    EXPECT_EQ(got.code(), absl::StatusCode::kDeadlineExceeded) << got;
    EXPECT_NE(got.message().find(absl::StrCat("the store at 127.0.0.1:", port,
                                              " does not answer")),
              std::string::npos)
        << got;
    EXPECT_NE(got.message().find("the process serving it is gone or stopped"),
              std::string::npos)
        << got;
    EXPECT_TRUE(IsSecondary(got)) << got;
    EXPECT_TRUE(CulpritRanks(got).empty()) << got;  // who serves it is not known
    return absl::OkStatus();
  }, topts);
  EXPECT_TRUE(s.ok()) << s;
}

// ---- Corrupt and forged rendezvous values (NOTE [Gloo TCP addresses]).

// What gloo's rendezvous stores for one listening address ip:port.
std::string GlooAddressBytes(const char* ip, int port) {
  sockaddr_storage ss;
  std::memset(&ss, 0, sizeof(ss));
  auto* in = reinterpret_cast<sockaddr_in*>(&ss);
  in->sin_family = AF_INET;
  in->sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, ip, &in->sin_addr);
  std::vector<char> b = gloo::transport::tcp::Address(ss).bytes();
  return std::string(b.begin(), b.end());
}

std::string RandomBytes(size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(gen() & 0xff);
  return out;
}

// Rank `rank` of a 2-rank group joins alone after another process wrote `value` under
// the key of the other rank (`key`, relative to "world/"); returns its result.
absl::Status JoinAgainstForgery(int rank, const std::string& key, const std::string& value,
                                const std::string& hostname, absl::Duration* took) {
  auto store = std::make_shared<HashStore>();
  const int other = 1 - rank;
  EXPECT_TRUE(store->Set(absl::StrCat("world/rank_", other), "forger-host").ok());
  EXPECT_TRUE(store->Set(absl::StrCat("world/", key), value).ok());
  GlooOptions g;
  g.hostname = hostname;
  g.rendezvous_timeout = absl::Seconds(1);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::shared_ptr<GlooProcessGroup>> group =
      GlooProcessGroup::Create(store, rank, 2, g);
  *took = absl::Now() - start;
  return group.status();
}

TEST(GlooRendezvousTest, RandomBytesInAnAddressKeyAreDataLossNamingKeyAndRank) {
  const std::string one = GlooAddressBytes("127.0.0.1", 40000);
  struct Case {
    std::string value;
    std::string says;
  };
  for (const Case& c : {Case{RandomBytes(200, 1), "holds 200 bytes"},
                        Case{one.substr(0, 100), "holds 100 bytes"},
                        Case{RandomBytes(one.size(), 2), "its address for rank 0"},
                        Case{std::string(), "holds 0 bytes"}}) {
    absl::Duration took;
    absl::Status s = JoinAgainstForgery(0, "1", c.value, "127.0.0.1", &took);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_NE(s.message().find("key 'world/1' (the gloo addresses of rank 1)"),
              std::string::npos)
        << s;
    EXPECT_NE(s.message().find(c.says), std::string::npos) << s;
    EXPECT_NE(s.message().find("gloo group 'world' (rank 0 of 2)"), std::string::npos) << s;
    EXPECT_LT(took, absl::Seconds(1)) << "checked when read, not at the deadline: " << s;
  }
}

TEST(GlooRendezvousTest, RandomBytesInAHostNameKeyAreDataLossNamingKeyAndRank) {
  // Rank 1 reads rank 0's host name first thing.
  auto store = std::make_shared<HashStore>();
  ASSERT_TRUE(store->Set("world/rank_0", RandomBytes(200, 3)).ok());
  GlooOptions g;
  g.rendezvous_timeout = absl::Seconds(1);
  absl::StatusOr<std::shared_ptr<GlooProcessGroup>> group =
      GlooProcessGroup::Create(store, 1, 2, g);
  EXPECT_EQ(group.status().code(), absl::StatusCode::kDataLoss) << group.status();
  EXPECT_NE(group.status().message().find("key 'world/rank_0' (the host name of rank 0)"),
            std::string::npos)
      << group.status();
}

TEST(GlooRendezvousTest, ForgedAddressOfAClosedPortFailsNamingTheRank) {
  // Bound, never listening: connecting there is refused. Rank 0 on 127.0.0.2 sorts
  // after 127.0.0.1, so gloo makes it the connecting side.
  absl::StatusOr<internal::Fd> listener = internal::Listen("127.0.0.1", 0, 1);
  ASSERT_TRUE(listener.ok()) << listener.status();
  const int port = internal::BoundPort(listener->get()).value();
  listener->Reset();
  absl::Duration took;
  absl::Status s =
      JoinAgainstForgery(0, "1", GlooAddressBytes("127.0.0.1", port), "127.0.0.2", &took);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find(absl::StrCat("rank 1 at 127.0.0.1:", port,
                                          " (the address in key 'world/1')")),
            std::string::npos)
      << s;
  EXPECT_LT(took, absl::Seconds(4)) << s;
}

TEST(GlooRendezvousTest, ForgedAddressOfAnotherServiceFailsWithinTheTimeout) {
  // Something listens there (the kernel accepts for it), so gloo's connect succeeds;
  // the connection check finds rank 1 never confirming its side.
  absl::StatusOr<internal::Fd> listener = internal::Listen("127.0.0.1", 0, 16);
  ASSERT_TRUE(listener.ok()) << listener.status();
  const int port = internal::BoundPort(listener->get()).value();
  absl::Duration took;
  absl::Status s =
      JoinAgainstForgery(0, "1", GlooAddressBytes("127.0.0.1", port), "127.0.0.2", &took);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("rank 1 did not confirm its connections"), std::string::npos)
      << s;
  EXPECT_NE(s.message().find("'world/1'"), std::string::npos) << s;
  // rendezvous_timeout is 1 s; the rest is slack for a loaded machine.
  EXPECT_LT(took, absl::Seconds(4)) << s;
}

TEST(GlooRendezvousTest, ForgedAddressWhereThisRankListensFailsWithinTheTimeout) {
  // A forged address that sorts before rank 0's own makes rank 0 the listening side;
  // nobody connects, and gloo's connect wait is kept within rendezvous_timeout.
  absl::Duration took;
  absl::Status s =
      JoinAgainstForgery(0, "1", GlooAddressBytes("127.0.0.3", 9), "127.0.0.2", &took);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s;
  EXPECT_LT(took, absl::Seconds(4)) << s;
}

}  // namespace
}  // namespace comm
