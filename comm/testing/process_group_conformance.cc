#include "comm/testing/process_group_conformance.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"

namespace comm {
namespace testing {

using core::BFloat16;
using core::DType;
using core::Tensor;

std::vector<ConformanceCase> ConformanceCases(const ProcessGroupFactory& backend,
                                              const std::vector<int>& world_sizes) {
  std::vector<ConformanceCase> cases;
  for (int n : world_sizes) cases.push_back(ConformanceCase{backend, n});
  return cases;
}

std::string ConformanceCaseName(const ::testing::TestParamInfo<ConformanceCase>& info) {
  return absl::StrCat(info.param.backend.name, "_N", info.param.world_size);
}

void PrintTo(const ConformanceCase& c, std::ostream* os) {
  *os << c.backend.name << " at N=" << c.world_size;
}

Tensor FilledTensor(int64_t n, DType dtype, const std::function<float(int64_t)>& f) {
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

double ElementAt(const Tensor& t, int64_t i) {
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

double StoredAs(DType dtype, float v) {
  if (dtype == DType::kBFloat16) return BFloat16::FromFloat(v).ToFloat();
  if (dtype == DType::kInt32) return static_cast<int32_t>(v);
  return v;
}

void ProcessGroupConformanceTest::SetUp() {
  if (backend().skip_reason) {
    const std::string why = backend().skip_reason();
    if (!why.empty()) GTEST_SKIP() << backend().name << ": " << why;
  }
}

absl::Status ProcessGroupConformanceTest::Finish(absl::StatusOr<std::shared_ptr<Work>> work) {
  if (!work.ok()) return work.status();
  // WaitHost, not Wait: on a stream-ordered backend (NCCL) Wait returns once the compute
  // stream is ordered after the collective, before it has completed and been counted in
  // Stats(); the counter tests read Stats() right after the last Finish.
  return (*work)->WaitHost(kCollectiveTimeout);
}

absl::Status ProcessGroupConformanceTest::RunRanks(const RankFunction& fn, int world_size) const {
  ThreadRanksOptions options;
  // The whole run's deadline: a hang fails well inside the test timeout.
  options.timeout = absl::Seconds(50);
  options.create_group = false;
  auto create = backend().create;
  return RunThreadRanks(
      world_size > 0 ? world_size : n(),
      [fn, create](RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(ctx.group, create(ctx.store, ctx.rank, ctx.world_size));
        return fn(ctx);
      },
      options);
}

namespace {

// An element value unique to (rank, call, i), exact in fp32 and int32.
float Value(int rank, int call, int64_t i) {
  return static_cast<float>(rank * 100000 + call * 1000 + (i % 997));
}

// Small positive integers: sums over 4 ranks stay below 256, exact in bf16.
float Small(int rank, int64_t j) { return static_cast<float>((rank + 1) * ((j % 7) + 1)); }

TEST_P(ProcessGroupConformanceTest, AllGatherPutsEveryRanksInputInRankOrder) {
  const std::vector<int64_t> sizes = {5, 0, 1, 1000, 3, 65543};
  absl::Status s = RunRanks([&](RankContext& ctx) -> absl::Status {
    int call = 0;
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kInt32}) {
      for (int64_t k : sizes) {
        ++call;
        Tensor in = FilledTensor(k, dtype, [&](int64_t i) { return Value(ctx.rank, call, i); });
        Tensor out = Tensor::Zeros({ctx.world_size * k}, dtype);
        RETURN_IF_ERROR(Finish(ctx.group->AllGather(in, out, AllGatherOptions{})));
        for (int r = 0; r < ctx.world_size; ++r) {
          for (int64_t i = 0; i < k; ++i) {
            if (ElementAt(out, r * k + i) != StoredAs(dtype, Value(r, call, i))) {
              return absl::InternalError(absl::StrCat("call ", call, " slot ", r, " element ", i,
                                                      " is ", ElementAt(out, r * k + i)));
            }
          }
        }
      }
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(ProcessGroupConformanceTest, AllGatherInPlaceFromItsOwnSlot) {
  absl::Status s = RunRanks([&](RankContext& ctx) -> absl::Status {
    for (int64_t k : {7, 0, 4096}) {
      Tensor out = Tensor::Zeros({ctx.world_size * k});
      ASSIGN_OR_RETURN(Tensor mine, out.View(ctx.rank * k, {k}));
      for (int64_t i = 0; i < k; ++i) mine.data<float>()[i] = Value(ctx.rank, 0, i);
      RETURN_IF_ERROR(Finish(ctx.group->AllGather(mine, out, AllGatherOptions{})));
      for (int r = 0; r < ctx.world_size; ++r) {
        for (int64_t i = 0; i < k; ++i) EXPECT_EQ(ElementAt(out, r * k + i), Value(r, 0, i));
      }
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(ProcessGroupConformanceTest, ReduceScatterSumAverageMax) {
  absl::Status s = RunRanks([&](RankContext& ctx) -> absl::Status {
    const int n = ctx.world_size;
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
        for (int64_t k : {3, 0, 1, 257}) {
          for (bool in_place : {false, true}) {
            Tensor in = FilledTensor(n * k, dtype, [&](int64_t j) { return Small(ctx.rank, j); });
            Tensor out = in_place ? in.View(ctx.rank * k, {k}).value() : Tensor::Zeros({k}, dtype);
            ReduceScatterOptions opts;
            opts.reduce_op = op;
            RETURN_IF_ERROR(Finish(ctx.group->ReduceScatter(in, out, opts)));
            for (int64_t i = 0; i < k; ++i) {
              const int64_t j = ctx.rank * k + i;
              float sum = 0, max = 0;
              for (int r = 0; r < n; ++r) {
                sum += Small(r, j);
                max = std::max(max, Small(r, j));
              }
              const float want = op == ReduceOp::kSum   ? sum
                                 : op == ReduceOp::kMax ? max
                                                        : sum / static_cast<float>(n);
              EXPECT_EQ(ElementAt(out, i), StoredAs(dtype, want))
                  << DTypeName(dtype) << " " << ReduceOpName(op) << " k=" << k << " i=" << i
                  << " in_place=" << in_place;
            }
          }
        }
      }
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(ProcessGroupConformanceTest, AllReduceSumAverageMaxIdenticalOnEveryRank) {
  // Results of rank r for each case, to compare bits across ranks afterwards.
  auto results = std::make_shared<std::vector<std::vector<std::vector<double>>>>(n());
  absl::Status s = RunRanks([results](RankContext& ctx) -> absl::Status {
    const int n = ctx.world_size;
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kInt32}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
        if (dtype == DType::kInt32 && op == ReduceOp::kAverage) continue;  // InvalidArgument
        for (int64_t len : {11, 0, 1, 100003}) {
          Tensor t = FilledTensor(len, dtype, [&](int64_t j) { return Small(ctx.rank, j); });
          AllReduceOptions opts;
          opts.reduce_op = op;
          RETURN_IF_ERROR(Finish(ctx.group->AllReduce(t, opts)));
          std::vector<double> got(len);
          for (int64_t j = 0; j < len; ++j) {
            got[j] = ElementAt(t, j);
            float sum = 0, max = 0;
            for (int r = 0; r < n; ++r) {
              sum += Small(r, j);
              max = std::max(max, Small(r, j));
            }
            const float want = op == ReduceOp::kSum   ? sum
                               : op == ReduceOp::kMax ? max
                                                      : sum / static_cast<float>(n);
            if (got[j] != StoredAs(dtype, want)) {
              return absl::InternalError(absl::StrCat(DTypeName(dtype), " ", ReduceOpName(op),
                                                      " element ", j, " is ", got[j], " not ",
                                                      StoredAs(dtype, want)));
            }
          }
          (*results)[ctx.rank].push_back(std::move(got));
        }
      }
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  for (int r = 1; r < n(); ++r) EXPECT_EQ((*results)[r], (*results)[0]) << "rank " << r;
}

// NOTE [Staged collectives]: an all-gather fills its input from stage_from first (cast
// between fp32 and bf16 when the dtypes differ), the reductions copy their result into
// unstage_to, which holds it once WaitHost returns; a misfit option is InvalidArgument
// naming it. (Host tensors here; the NCCL device path is nccl_process_group_test's.)
TEST_P(ProcessGroupConformanceTest, StagedCollectivesCopyInAndOut) {
  absl::Status s = RunRanks([&](RankContext& ctx) -> absl::Status {
    const int n = ctx.world_size;
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      for (int64_t k : {0, 5, 4099}) {
        // All-gather: the input starts as garbage and is staged from an fp32 source.
        Tensor from =
            FilledTensor(k, DType::kFloat32, [&](int64_t i) { return Small(ctx.rank, i) + 0.25f; });
        Tensor in = FilledTensor(k, dtype, [](int64_t) { return -7.0f; });
        Tensor out = Tensor::Zeros({n * k}, dtype);
        AllGatherOptions ag;
        ag.stage_from = from;
        RETURN_IF_ERROR(Finish(ctx.group->AllGather(in, out, ag)));
        for (int r = 0; r < n; ++r) {
          for (int64_t i = 0; i < k; ++i) {
            if (ElementAt(out, r * k + i) != StoredAs(dtype, Small(r, i) + 0.25f)) {
              return absl::InternalError(absl::StrCat("staged all-gather ", DTypeName(dtype),
                                                      " slot ", r, " element ", i, " is ",
                                                      ElementAt(out, r * k + i)));
            }
          }
        }
        // Reduce-scatter and all-reduce: the result also lands in unstage_to.
        Tensor rs_in = FilledTensor(n * k, dtype, [&](int64_t j) { return Small(ctx.rank, j); });
        Tensor rs_out = Tensor::Zeros({k}, dtype);
        Tensor rs_host = FilledTensor(k, dtype, [](int64_t) { return -7.0f; });
        ReduceScatterOptions rs;
        rs.unstage_to = rs_host;
        RETURN_IF_ERROR(Finish(ctx.group->ReduceScatter(rs_in, rs_out, rs)));
        Tensor ar = FilledTensor(k, dtype, [&](int64_t j) { return Small(ctx.rank, j); });
        Tensor ar_host = FilledTensor(k, dtype, [](int64_t) { return -7.0f; });
        AllReduceOptions aro;
        aro.unstage_to = ar_host;
        RETURN_IF_ERROR(Finish(ctx.group->AllReduce(ar, aro)));
        for (int64_t i = 0; i < k; ++i) {
          float rs_sum = 0, ar_sum = 0;
          for (int r = 0; r < n; ++r) {
            rs_sum += Small(r, ctx.rank * k + i);
            ar_sum += Small(r, i);
          }
          if (ElementAt(rs_host, i) != StoredAs(dtype, rs_sum) ||
              ElementAt(rs_host, i) != ElementAt(rs_out, i) ||
              ElementAt(ar_host, i) != StoredAs(dtype, ar_sum)) {
            return absl::InternalError(absl::StrCat("unstaged ", DTypeName(dtype), " element ", i,
                                                    ": reduce-scatter ", ElementAt(rs_host, i),
                                                    " (want ", rs_sum, "), all-reduce ",
                                                    ElementAt(ar_host, i), " (want ", ar_sum, ")"));
          }
        }
      }
    }
    // Misfits are refused, naming the option.
    Tensor in = Tensor::Zeros({4});
    Tensor out = Tensor::Zeros({4 * n});
    AllGatherOptions ag;
    ag.stage_from = Tensor::Zeros({3});
    absl::Status bad = ctx.group->AllGather(in, out, ag).status();
    if (bad.code() != absl::StatusCode::kInvalidArgument ||
        !absl::StrContains(bad.message(), "options.stage_from")) {
      return absl::InternalError(absl::StrCat("a 3-element stage_from for 4: ", bad.ToString()));
    }
    // A conversion into an int32 input, and a source inside the output, are refused too.
    Tensor in32 = Tensor::Zeros({4}, DType::kInt32);
    Tensor out32 = Tensor::Zeros({4 * n}, DType::kInt32);
    ag.stage_from = Tensor::Zeros({4});
    bad = ctx.group->AllGather(in32, out32, ag).status();
    if (bad.code() != absl::StatusCode::kInvalidArgument ||
        !absl::StrContains(bad.message(), "options.stage_from")) {
      return absl::InternalError(absl::StrCat("an fp32 stage_from for int32: ", bad.ToString()));
    }
    ag.stage_from = out.View(0, {4}).value();
    bad = ctx.group->AllGather(in, out, ag).status();
    if (bad.code() != absl::StatusCode::kInvalidArgument ||
        !absl::StrContains(bad.message(), "options.stage_from")) {
      return absl::InternalError(absl::StrCat("a stage_from inside the output: ", bad.ToString()));
    }
    ReduceScatterOptions rs;
    rs.unstage_to = Tensor::Zeros({1}, DType::kBFloat16);
    bad = ctx.group->ReduceScatter(out, in, rs).status();
    if (bad.code() != absl::StatusCode::kInvalidArgument ||
        !absl::StrContains(bad.message(), "options.unstage_to")) {
      return absl::InternalError(absl::StrCat("a misfit unstage_to: ", bad.ToString()));
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

// NOTE [Staged collectives]: ReduceScatterOptions::accumulate_into gets the reduced output
// added to what it held (fp32, a bf16 output widened), where the collective runs.
TEST_P(ProcessGroupConformanceTest, ReduceScatterAccumulatesIntoATensor) {
  absl::Status s = RunRanks([&](RankContext& ctx) -> absl::Status {
    const int n = ctx.world_size;
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      for (int64_t k : {0, 5, 4099}) {
        Tensor in = FilledTensor(n * k, dtype, [&](int64_t j) { return Small(ctx.rank, j); });
        Tensor out = Tensor::Zeros({k}, dtype);
        Tensor into = FilledTensor(k, DType::kFloat32, [](int64_t i) { return 0.5f * i - 3.0f; });
        ReduceScatterOptions rs;
        rs.accumulate_into = into;
        RETURN_IF_ERROR(Finish(ctx.group->ReduceScatter(in, out, rs)));
        for (int64_t i = 0; i < k; ++i) {
          const float want = (0.5f * i - 3.0f) + ElementAt(out, i);
          if (into.data<float>()[i] != want) {
            return absl::InternalError(absl::StrCat("accumulate_into ", DTypeName(dtype),
                                                    " element ", i, " is ", into.data<float>()[i],
                                                    ", want ", want));
          }
        }
      }
    }
    // Misfits are refused, naming the option: a bf16 target, a short one, with unstage_to,
    // one inside the input.
    Tensor in = Tensor::Zeros({4 * n});
    Tensor out = Tensor::Zeros({4});
    for (int misfit = 0; misfit < 4; ++misfit) {
      ReduceScatterOptions rs;
      rs.accumulate_into = misfit == 0   ? Tensor::Zeros({4}, DType::kBFloat16)
                           : misfit == 3 ? in.View(0, {4}).value()
                                         : Tensor::Zeros({misfit == 1 ? 3 : 4});
      if (misfit == 2) rs.unstage_to = Tensor::Zeros({4});
      const absl::Status bad = ctx.group->ReduceScatter(in, out, rs).status();
      if (bad.code() != absl::StatusCode::kInvalidArgument ||
          !absl::StrContains(bad.message(), "options.accumulate_into")) {
        return absl::InternalError(
            absl::StrCat("misfit accumulate_into ", misfit, ": ", bad.ToString()));
      }
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(ProcessGroupConformanceTest, BroadcastFromEveryRoot) {
  absl::Status s = RunRanks([&](RankContext& ctx) -> absl::Status {
    for (int root = 0; root < ctx.world_size; ++root) {
      int call = 0;
      for (int64_t len : {0, 1, 100, 4097}) {
        ++call;
        Tensor t =
            FilledTensor(len, DType::kFloat32, [&](int64_t i) { return Value(ctx.rank, call, i); });
        BroadcastOptions opts;
        opts.root = root;
        RETURN_IF_ERROR(Finish(ctx.group->Broadcast(t, opts)));
        for (int64_t i = 0; i < len; ++i) EXPECT_EQ(ElementAt(t, i), Value(root, call, i));
      }
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(ProcessGroupConformanceTest, BarrierWaitsForEveryRank) {
  auto arrived = std::make_shared<std::atomic<int>>(0);
  absl::Status s = RunRanks([arrived](RankContext& ctx) -> absl::Status {
    absl::SleepFor(absl::Milliseconds(40 * ctx.rank));
    arrived->fetch_add(1);
    RETURN_IF_ERROR(Finish(ctx.group->Barrier(BarrierOptions{})));
    EXPECT_EQ(arrived->load(), ctx.world_size) << "rank " << ctx.rank << " passed too early";
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(ProcessGroupConformanceTest, CollectivesCompleteInIssueOrder) {
  absl::Status s = RunRanks([&](RankContext& ctx) -> absl::Status {
    Tensor big = FilledTensor(1 << 20, DType::kFloat32, [&](int64_t) { return 1.0f; });
    Tensor shard =
        FilledTensor(3, DType::kFloat32, [&](int64_t i) { return Value(ctx.rank, 0, i); });
    Tensor gathered = Tensor::Zeros({3 * ctx.world_size});
    Tensor b =
        FilledTensor(5, DType::kFloat32, [&](int64_t) { return static_cast<float>(ctx.rank); });
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
    EXPECT_EQ(ElementAt(big, 12345), ctx.world_size);
    EXPECT_EQ(ElementAt(gathered, 3 * (ctx.world_size - 1) + 2), Value(ctx.world_size - 1, 0, 2));
    EXPECT_EQ(ElementAt(b, 4), 0.0);
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

// A reduction that accumulated in bf16 would lose the 1s added to 256 (bf16 keeps 8
// significant bits, so 256 + 1 rounds back to 256); one in fp32 gets 256 + (n - 1).
// From 3 ranks: with 2, 256 + 1 rounds back to 256 in bf16 either way.
TEST_P(ProcessGroupConformanceTest, Bf16ReductionsAccumulateInFp32) {
  if (n() < 3) GTEST_SKIP() << "needs at least 3 ranks";
  const int n = this->n();
  absl::Status s = RunRanks([n](RankContext& ctx) -> absl::Status {
    const float mine = ctx.rank == 0 ? 256.0f : 1.0f;
    const double want = BFloat16::FromFloat(256.0f + (n - 1)).ToFloat();
    EXPECT_NE(want, 256.0) << "the case must tell fp32 from bf16 accumulation";
    Tensor t = FilledTensor(9, DType::kBFloat16, [&](int64_t) { return mine; });
    RETURN_IF_ERROR(Finish(ctx.group->AllReduce(t, AllReduceOptions{})));
    for (int64_t i = 0; i < 9; ++i) EXPECT_EQ(ElementAt(t, i), want) << "AllReduce n=" << n;
    Tensor in = FilledTensor(2 * n, DType::kBFloat16, [&](int64_t) { return mine; });
    Tensor out = Tensor::Zeros({2}, DType::kBFloat16);
    RETURN_IF_ERROR(Finish(ctx.group->ReduceScatter(in, out, ReduceScatterOptions{})));
    EXPECT_EQ(ElementAt(out, 0), want) << "ReduceScatter n=" << n;
    EXPECT_EQ(ElementAt(out, 1), want) << "ReduceScatter n=" << n;
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(ProcessGroupConformanceTest, ByteCountersFollowTheStandardFormulas) {
  absl::Status s = RunRanks([&](RankContext& ctx) -> absl::Status {
    const int64_t n = ctx.world_size;
    ProcessGroup& g = *ctx.group;
    g.ResetStats();
    // All-gather of 10 fp32 per rank: S = 40n bytes in total, S(n-1)/n = 40(n-1).
    Tensor ag_in = Tensor::Zeros({10});
    Tensor ag_out = Tensor::Zeros({10 * n});
    RETURN_IF_ERROR(Finish(g.AllGather(ag_in, ag_out, AllGatherOptions{})));
    // Reduce-scatter of 6 bf16 per rank out: S = 12n bytes in, S(n-1)/n = 12(n-1). Twice.
    Tensor rs_in = Tensor::Zeros({6 * n}, DType::kBFloat16);
    Tensor rs_out = Tensor::Zeros({6}, DType::kBFloat16);
    RETURN_IF_ERROR(Finish(g.ReduceScatter(rs_in, rs_out, ReduceScatterOptions{})));
    RETURN_IF_ERROR(Finish(g.ReduceScatter(rs_in, rs_out, ReduceScatterOptions{})));
    // All-reduce of 13 fp32: S = 52, 2S(n-1)/n rounded down.
    Tensor ar = Tensor::Zeros({13});
    RETURN_IF_ERROR(Finish(g.AllReduce(ar, AllReduceOptions{})));
    // A zero-length all-reduce is a call that moves nothing.
    Tensor empty = Tensor::Zeros({0});
    RETURN_IF_ERROR(Finish(g.AllReduce(empty, AllReduceOptions{})));
    // Broadcast of 5 fp32 from root 0: everyone but the root receives 20 bytes,
    // everyone but the chain's last rank (n-1) sends 20.
    Tensor bc = Tensor::Zeros({5});
    RETURN_IF_ERROR(Finish(g.Broadcast(bc, BroadcastOptions{})));
    RETURN_IF_ERROR(Finish(g.Barrier(BarrierOptions{})));

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
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(ProcessGroupConformanceTest, ByteCountersEqualExpectedTraffic) {
  absl::Status s = RunRanks([&](RankContext& ctx) -> absl::Status {
    const int n = ctx.world_size;
    ProcessGroup& g = *ctx.group;
    const int64_t k = 3000;
    Tensor in = Tensor::Zeros({k});
    Tensor full = Tensor::Zeros({n * k});
    RETURN_IF_ERROR(Finish(g.AllGather(in, full, AllGatherOptions{})));
    RETURN_IF_ERROR(Finish(g.ReduceScatter(full, in, ReduceScatterOptions{})));
    Tensor odd = Tensor::Zeros({1001}, DType::kBFloat16);
    RETURN_IF_ERROR(Finish(g.AllReduce(odd, AllReduceOptions{})));
    BroadcastOptions b;
    b.root = n - 1;
    RETURN_IF_ERROR(Finish(g.Broadcast(odd, b)));
    RETURN_IF_ERROR(Finish(g.Barrier(BarrierOptions{})));
    const CommStats stats = g.Stats();
    const auto expect = [&](CollectiveKind kind, const Traffic& t) {
      EXPECT_EQ(stats.of(kind).calls, 1) << CollectiveKindName(kind);
      EXPECT_EQ(stats.of(kind).bytes_sent, t.sent) << CollectiveKindName(kind);
      EXPECT_EQ(stats.of(kind).bytes_received, t.received) << CollectiveKindName(kind);
    };
    expect(CollectiveKind::kAllGather,
           ExpectedTraffic(CollectiveKind::kAllGather, full.nbytes(), n, ctx.rank));
    expect(CollectiveKind::kReduceScatter,
           ExpectedTraffic(CollectiveKind::kReduceScatter, full.nbytes(), n, ctx.rank));
    expect(CollectiveKind::kAllReduce,
           ExpectedTraffic(CollectiveKind::kAllReduce, odd.nbytes(), n, ctx.rank));
    expect(CollectiveKind::kBroadcast,
           ExpectedTraffic(CollectiveKind::kBroadcast, odd.nbytes(), n, ctx.rank, n - 1));
    expect(CollectiveKind::kBarrier, Traffic{});
    g.ResetStats();
    EXPECT_EQ(g.Stats().Total().calls, 0);
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

// Even and odd ranks: each subgroup reduces among its members only, on the backend of
// its parent.
TEST_P(ProcessGroupConformanceTest, SubgroupsReduceAmongTheirMembersOnly) {
  if (n() < 2) GTEST_SKIP() << "needs at least 2 ranks";
  absl::Status s = RunRanks([&](RankContext& ctx) -> absl::Status {
    const int n = ctx.world_size;
    std::vector<int> even, odd;
    for (int r = 0; r < n; ++r) (r % 2 == 0 ? even : odd).push_back(r);
    auto mine = ctx.group->NewSubgroup(even, SubgroupOptions{});
    auto other = ctx.group->NewSubgroup(odd, SubgroupOptions{});
    if (ctx.rank % 2 == 1) std::swap(mine, other);
    EXPECT_EQ(other.status().code(), absl::StatusCode::kNotFound) << other.status();
    RETURN_IF_ERROR(mine.status());
    std::shared_ptr<ProcessGroup> sub = *mine;
    EXPECT_EQ(sub->backend_name(), ctx.group->backend_name());
    Tensor t = Tensor::Zeros({5000});
    t.Fill(static_cast<float>(ctx.rank + 1));
    RETURN_IF_ERROR(Finish(sub->AllReduce(t, AllReduceOptions{})));
    float want = 0;
    for (int r = ctx.rank % 2; r < n; r += 2) want += static_cast<float>(r + 1);
    for (int64_t i = 0; i < t.numel(); i += 777) EXPECT_EQ(t.data<float>()[i], want) << i;
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

// Four ranks: subgroups [0, 1] and [2, 3] keep their own counters; subgroup rank i is
// ranks[i] (in [3, 1], global rank 3 is the root); bad rank lists are InvalidArgument;
// the parent still works afterwards.
TEST_P(ProcessGroupConformanceTest, SubgroupsOfFourRanksFollowTheirRankListsAndCounters) {
  if (n() != 4) GTEST_SKIP() << "a 4-rank case";
  absl::Status s = RunRanks([&](RankContext& ctx) -> absl::Status {
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
    RETURN_IF_ERROR(Finish(mine->AllReduce(t, AllReduceOptions{})));
    EXPECT_EQ(ElementAt(t, 3), ctx.rank < 2 ? 0 + 1 : 2 + 3);
    EXPECT_EQ(mine->Stats().of(CollectiveKind::kAllReduce).calls, 1);
    EXPECT_EQ(ctx.group->Stats().of(CollectiveKind::kAllReduce).calls, 0);

    SubgroupOptions named;
    named.name = "odd";
    absl::StatusOr<std::shared_ptr<ProcessGroup>> odd = ctx.group->NewSubgroup({3, 1}, named);
    if (ctx.rank % 2 == 1) {
      if (!odd.ok()) return odd.status();
      EXPECT_EQ((*odd)->rank(), ctx.rank == 3 ? 0 : 1);
      EXPECT_EQ((*odd)->name(), "odd");
      Tensor b = Tensor::Zeros({2});
      b.Fill(static_cast<float>(ctx.rank));
      RETURN_IF_ERROR(Finish((*odd)->Broadcast(b, BroadcastOptions{})));
      EXPECT_EQ(ElementAt(b, 1), 3.0);
    } else {
      EXPECT_EQ(odd.status().code(), absl::StatusCode::kNotFound) << odd.status();
    }
    EXPECT_EQ(ctx.group->NewSubgroup({}, {}).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(ctx.group->NewSubgroup({0, 0}, {}).status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(ctx.group->NewSubgroup({4}, {}).status().code(), absl::StatusCode::kInvalidArgument);
    RETURN_IF_ERROR(Finish(ctx.group->Barrier(BarrierOptions{})));
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace testing
}  // namespace comm
