// Thread-rank tests of the shared-memory backend: the ProcessGroup conformance suite
// (comm/testing/process_group_conformance.h) at N = 1, 2, 3, 4 over both transports, the
// slots and cross-memory attach (the latter with cma_min_bytes 0, so every size goes
// through process_vm_readv), and what is shm's own: every collective at N = 2, 3, 4 over
// fp32/bf16/int32, sum/average/max, sizes 0, 1, 7 and several slots plus a remainder, in
// place and not, checked against values computed here and bitwise against
// GlooProcessGroup run on the same inputs in the same rank threads; the streaming sizes;
// waiting without spinning. Create's checks, /dev/shm hygiene and the transport choice
// are in shm_create_test.cc.
//
// Inputs of the reductions are not small integers: fp32 sums depend on the order, so
// the expected values (accumulated here in rank order, bf16 in fp32 rounded once) and
// the bitwise comparison with gloo's reduce-scatter check the order too. Gloo's
// all-reduce adds in its own (ring) order, so it is compared with ours on integer
// inputs, where every order gives the same bits.
#include "comm/shm_process_group.h"

#include <algorithm>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/testing/process_group_conformance.h"
#include "comm/testing/shm_test_options.h"
#include "comm/testing/thread_ranks.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"

namespace comm {
namespace {

using ::comm::testing::ElementAt;
using ::comm::testing::FilledTensor;
using ::comm::testing::ProcessGroupConformanceTest;
using ::comm::testing::RankContext;
using ::comm::testing::RunThreadRanks;
using ::comm::testing::ShmTestOptions;
using ::comm::testing::ThreadRanksOptions;
using core::BFloat16;
using core::DType;
using core::Tensor;

constexpr absl::Duration kTimeout = absl::Seconds(20);
constexpr int64_t kSlot = ::comm::testing::kShmTestSlotBytes;

ThreadRanksOptions Options() {
  ThreadRanksOptions o;
  o.timeout = absl::Seconds(120);
  o.gloo.rendezvous_timeout = absl::Seconds(20);
  return o;
}

std::string TransportParamName(ShmTransport t) {
  return t == ShmTransport::kSlots ? "Slots" : t == ShmTransport::kAuto ? "Auto" : "Cma";
}

absl::Status Finish(absl::StatusOr<std::shared_ptr<Work>> work) {
  if (!work.ok()) return work.status();
  return (*work)->Wait(kTimeout);
}

// Not exactly representable sums: thirds and sevenths of varying magnitude.
float Inexact(int rank, int call, int64_t i) {
  const int v = static_cast<int>((rank * 7919 + call * 131 + i * 104729) % 2003) - 1001;
  return static_cast<float>(v) / (rank % 2 == 0 ? 3.0f : 7.0f) * (1.0f + 0.25f * (i % 5));
}
// Small integers: sums are exact in any order (in bf16 too, below 256 per rank).
float Exact(int rank, int call, int64_t i) {
  return static_cast<float>(static_cast<int>((rank * 37 + call * 11 + i * 13) % 61) - 30);
}

// The suite's FilledTensor, with int32 elements 3 f(i).
Tensor Filled(int64_t n, DType dtype, const std::function<float(int64_t)>& f) {
  if (dtype != DType::kInt32) return FilledTensor(n, dtype, f);
  return FilledTensor(n, dtype, [&](int64_t i) { return f(i) * 3.0f; });
}

Tensor Copy(const Tensor& t) {
  Tensor c = Tensor::Empty(t.shape(), t.dtype());
  if (t.nbytes() > 0) std::memcpy(c.raw_data(), t.raw_data(), static_cast<size_t>(t.nbytes()));
  return c;
}

// The element as stored, widened to float (int32 values here stay below 2^24).
float At(const Tensor& t, int64_t i) { return static_cast<float>(ElementAt(t, i)); }

// Reduction of `values` (one per rank, as stored) in rank order, as the contract says:
// fp32 accumulation for fp32 and bf16 (bf16 rounded once at the end), int64 for int32.
// Returns the bytes of the result element.
std::string Reduce(DType dtype, ReduceOp op, const std::vector<float>& values) {
  std::string bytes(static_cast<size_t>(core::DTypeSize(dtype)), '\0');
  if (dtype == DType::kInt32) {
    int64_t acc = static_cast<int64_t>(values[0]);
    for (size_t j = 1; j < values.size(); ++j) {
      const auto v = static_cast<int64_t>(values[j]);
      acc = op == ReduceOp::kMax ? std::max(acc, v) : acc + v;
    }
    const auto r = static_cast<int32_t>(acc);
    std::memcpy(bytes.data(), &r, sizeof(r));
    return bytes;
  }
  float acc = values[0];
  for (size_t j = 1; j < values.size(); ++j) {
    acc = op == ReduceOp::kMax ? std::max(acc, values[j]) : acc + values[j];
  }
  if (op == ReduceOp::kAverage) acc = acc / static_cast<float>(values.size());
  if (dtype == DType::kBFloat16) {
    const BFloat16 h = BFloat16::FromFloat(acc);
    std::memcpy(bytes.data(), &h, sizeof(h));
  } else {
    std::memcpy(bytes.data(), &acc, sizeof(acc));
  }
  return bytes;
}

std::string ElementBytes(const Tensor& t, int64_t i) {
  const int64_t e = core::DTypeSize(t.dtype());
  return std::string(static_cast<const char*>(t.raw_data()) + i * e, static_cast<size_t>(e));
}

bool SameBytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0);
}

// In a rank function: records a failure and ends the rank (its peers then fail fast).
#define EXPECT_OR_RETURN(cond, msg)                                      \
  do {                                                                   \
    if (!(cond)) {                                                       \
      ADD_FAILURE() << #cond << ": " << msg;                             \
      return absl::InternalError(absl::StrCat("check failed: ", #cond)); \
    }                                                                    \
  } while (0)

std::string Case(const char* what, DType dtype, ReduceOp op, int64_t k, bool flag) {
  return absl::StrCat(what, " ", core::DTypeName(dtype), " ", ReduceOpName(op), " k=", k,
                      " flag=", flag);
}

// This rank of the matrix: its number, the world size and its two groups.
struct MatrixRank {
  int rank;
  int n;
  ProcessGroup& shm;
  ProcessGroup& gloo;
};

// AllGather of k elements, out of place or in place (input: the own chunk of the output).
absl::Status CheckAllGather(const MatrixRank& m, DType dtype, int64_t k, bool in_place, int call) {
  const int rank = m.rank, n = m.n;
  const std::string c = Case("AllGather", dtype, ReduceOp::kSum, k, in_place);
  Tensor in = Filled(k, dtype, [&](int64_t i) { return Inexact(rank, call, i); });
  Tensor out_shm = Filled(n * k, dtype, [](int64_t) { return -1.0f; });
  Tensor out_gloo = Copy(out_shm);
  Tensor in_shm = in;
  Tensor in_gloo = in;
  if (in_place) {
    in_shm = out_shm.View(rank * k, {k}).value();
    in_gloo = out_gloo.View(rank * k, {k}).value();
    std::memcpy(in_shm.raw_data(), in.raw_data(), in.nbytes());
    std::memcpy(in_gloo.raw_data(), in.raw_data(), in.nbytes());
  }
  RETURN_IF_ERROR(Finish(m.shm.AllGather(in_shm, out_shm, AllGatherOptions{})));
  RETURN_IF_ERROR(Finish(m.gloo.AllGather(in_gloo, out_gloo, AllGatherOptions{})));
  EXPECT_OR_RETURN(SameBytes(out_shm, out_gloo), c);
  for (int r = 0; r < n; ++r) {
    Tensor theirs = Filled(k, dtype, [&](int64_t i) { return Inexact(r, call, i); });
    for (int64_t i = 0; i < k; ++i) {
      EXPECT_OR_RETURN(ElementBytes(out_shm, r * k + i) == ElementBytes(theirs, i),
                       c << " rank " << r << " element " << i);
    }
  }
  return absl::OkStatus();
}

// ReduceScatter to k elements, out of place or in place (output: the own chunk of input).
absl::Status CheckReduceScatter(const MatrixRank& m, DType dtype, ReduceOp op, int64_t k,
                                bool in_place, int call) {
  const int rank = m.rank, n = m.n;
  const std::string c = Case("ReduceScatter", dtype, op, k, in_place);
  Tensor in_shm = Filled(n * k, dtype, [&](int64_t i) { return Inexact(rank, call, i); });
  Tensor in_gloo = Copy(in_shm);
  Tensor out_shm = in_place ? in_shm.View(rank * k, {k}).value() : Tensor::Zeros({k}, dtype);
  Tensor out_gloo = in_place ? in_gloo.View(rank * k, {k}).value() : Tensor::Zeros({k}, dtype);
  ReduceScatterOptions o;
  o.reduce_op = op;
  RETURN_IF_ERROR(Finish(m.shm.ReduceScatter(in_shm, out_shm, o)));
  RETURN_IF_ERROR(Finish(m.gloo.ReduceScatter(in_gloo, out_gloo, o)));
  EXPECT_OR_RETURN(SameBytes(out_shm, out_gloo), c);
  std::vector<Tensor> inputs;
  for (int r = 0; r < n; ++r) {
    inputs.push_back(Filled(n * k, dtype, [&](int64_t i) { return Inexact(r, call, i); }));
  }
  for (int64_t i = 0; i < k; ++i) {
    std::vector<float> values;
    for (int r = 0; r < n; ++r) values.push_back(At(inputs[r], rank * k + i));
    EXPECT_OR_RETURN(ElementBytes(out_shm, i) == Reduce(dtype, op, values),
                     c << " element " << i << " got " << At(out_shm, i));
  }
  return absl::OkStatus();
}

// AllReduce of k elements: inexact inputs against the rank-order value; exact ones against
// gloo too.
absl::Status CheckAllReduce(const MatrixRank& m, DType dtype, ReduceOp op, int64_t k, bool exact,
                            int call) {
  const int rank = m.rank, n = m.n;
  const std::string c = Case("AllReduce", dtype, op, k, exact);
  const auto f = exact ? Exact : Inexact;
  Tensor t_shm = Filled(k, dtype, [&](int64_t i) { return f(rank, call, i); });
  Tensor t_gloo = Copy(t_shm);
  AllReduceOptions o;
  o.reduce_op = op;
  RETURN_IF_ERROR(Finish(m.shm.AllReduce(t_shm, o)));
  if (exact) {
    RETURN_IF_ERROR(Finish(m.gloo.AllReduce(t_gloo, o)));
    EXPECT_OR_RETURN(SameBytes(t_shm, t_gloo), c);
  }
  std::vector<Tensor> inputs;
  for (int r = 0; r < n; ++r) {
    inputs.push_back(Filled(k, dtype, [&](int64_t i) { return f(r, call, i); }));
  }
  for (int64_t i = 0; i < k; ++i) {
    std::vector<float> values;
    for (int r = 0; r < n; ++r) values.push_back(At(inputs[r], i));
    EXPECT_OR_RETURN(ElementBytes(t_shm, i) == Reduce(dtype, op, values),
                     c << " element " << i << " got " << At(t_shm, i));
  }
  return absl::OkStatus();
}

// Broadcast of k elements from `root`.
absl::Status CheckBroadcast(const MatrixRank& m, DType dtype, int64_t k, int root, int call) {
  const std::string c = Case("Broadcast", dtype, ReduceOp::kSum, k, root != 0);
  Tensor t_shm = Filled(k, dtype, [&](int64_t i) { return Inexact(m.rank, call, i); });
  Tensor t_gloo = Copy(t_shm);
  BroadcastOptions o;
  o.root = root;
  RETURN_IF_ERROR(Finish(m.shm.Broadcast(t_shm, o)));
  RETURN_IF_ERROR(Finish(m.gloo.Broadcast(t_gloo, o)));
  EXPECT_OR_RETURN(SameBytes(t_shm, t_gloo), c);
  Tensor want = Filled(k, dtype, [&](int64_t i) { return Inexact(root, call, i); });
  EXPECT_OR_RETURN(SameBytes(t_shm, want), c);
  return absl::OkStatus();
}

// Every collective, both backends, every case; `shm` and `gloo` are this rank's groups.
// Each case has its own `call` number, the same on every rank, which seeds its inputs.
absl::Status RunMatrix(int rank, int n, ProcessGroup& shm, ProcessGroup& gloo) {
  const MatrixRank m{rank, n, shm, gloo};
  const int64_t several = 3 * kSlot / 4 + 123;  // fp32 elements: 3 slots and a remainder
  const std::vector<int64_t> sizes = {0, 1, 7, several};
  int call = 0;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kInt32}) {
    for (int64_t k : sizes) {
      for (bool in_place : {false, true}) {
        RETURN_IF_ERROR(CheckAllGather(m, dtype, k, in_place, ++call));
      }
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
        if (dtype == DType::kInt32 && op == ReduceOp::kAverage) continue;
        for (bool in_place : {false, true}) {
          RETURN_IF_ERROR(CheckReduceScatter(m, dtype, op, k, in_place, ++call));
        }
        for (bool exact : {false, true}) {
          RETURN_IF_ERROR(CheckAllReduce(m, dtype, op, k, exact, ++call));
        }
      }
      // From the first and the last rank.
      for (int root : {0, n - 1}) RETURN_IF_ERROR(CheckBroadcast(m, dtype, k, root, ++call));
    }
  }
  RETURN_IF_ERROR(Finish(shm.Barrier(BarrierOptions{})));
  return absl::OkStatus();
}

class ShmCollectivesTest : public ::testing::TestWithParam<std::tuple<int, ShmTransport>> {
 protected:
  int n() const { return std::get<0>(GetParam()); }
  ShmTransport transport() const { return std::get<1>(GetParam()); }
  ShmOptions Shm() const { return ShmTestOptions("shm", transport()); }
  std::string want_transport() const {
    return transport() == ShmTransport::kSlots ? "slots" : "cma";
  }
};

TEST_P(ShmCollectivesTest, EveryCollectiveMatchesTheReferenceAndGlooBitwise) {
  const int n = this->n();
  absl::Status s = RunThreadRanks(
      n,
      [&](RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(auto shm, ShmProcessGroup::Create(ctx.store, ctx.rank, n, Shm()));
        EXPECT_EQ(shm->transport_name(), want_transport());
        EXPECT_EQ(shm->backend_name(), "shm");
        EXPECT_EQ(shm->rank(), ctx.rank);
        EXPECT_EQ(shm->size(), n);
        return RunMatrix(ctx.rank, n, *shm, *ctx.group);
      },
      Options());
  EXPECT_TRUE(s.ok()) << s;
}

// Outputs of at least 4 MiB go through the streaming (non-temporal) copies and the
// fp32 streaming reduction (NOTE [Streaming copies]); the same checks at that size, with
// the default slot size.
TEST_P(ShmCollectivesTest, LargeCollectivesStreamAndKeepTheBits) {
  const int n = this->n();
  absl::Status s = RunThreadRanks(
      n,
      [&](RankContext& ctx) -> absl::Status {
        const int rank = ctx.rank;
        ShmOptions o = Shm();
        o.slot_bytes = ShmOptions().slot_bytes;
        ASSIGN_OR_RETURN(auto shm, ShmProcessGroup::Create(ctx.store, rank, n, o));
        ProcessGroup& gloo = *ctx.group;
        // Per-rank elements: a reduce-scatter output of more than 4 MiB in fp32, and an odd
        // count so pieces end in a remainder.
        const int64_t k = (int64_t{4} << 20) / 4 + 1027;
        int call = 1000;
        for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
          ++call;
          {
            Tensor in = Filled(k, dtype, [&](int64_t i) { return Inexact(rank, call, i); });
            Tensor out_shm = Tensor::Zeros({n * k}, dtype);
            Tensor out_gloo = Tensor::Zeros({n * k}, dtype);
            RETURN_IF_ERROR(Finish(shm->AllGather(in, out_shm, AllGatherOptions{})));
            RETURN_IF_ERROR(Finish(gloo.AllGather(in, out_gloo, AllGatherOptions{})));
            EXPECT_OR_RETURN(SameBytes(out_shm, out_gloo),
                             "large AllGather " << core::DTypeName(dtype));
            Tensor own = out_shm.View(rank * k, {k}).value();
            EXPECT_OR_RETURN(SameBytes(own, in), "large AllGather own block");
          }
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
            ++call;
            Tensor in = Filled(n * k, dtype, [&](int64_t i) { return Inexact(rank, call, i); });
            Tensor out_shm = Tensor::Zeros({k}, dtype);
            Tensor out_gloo = Tensor::Zeros({k}, dtype);
            ReduceScatterOptions rs;
            rs.reduce_op = op;
            RETURN_IF_ERROR(Finish(shm->ReduceScatter(in, out_shm, rs)));
            RETURN_IF_ERROR(Finish(gloo.ReduceScatter(in, out_gloo, rs)));
            EXPECT_OR_RETURN(SameBytes(out_shm, out_gloo), "large ReduceScatter "
                                                               << core::DTypeName(dtype) << " "
                                                               << ReduceOpName(op));
            // Spot checks against the rank-order reference.
            for (int64_t i : {int64_t{0}, k / 3, k - 1}) {
              std::vector<float> values;
              for (int r = 0; r < n; ++r) {
                values.push_back(At(
                    Filled(1, dtype, [&](int64_t) { return Inexact(r, call, rank * k + i); }), 0));
              }
              EXPECT_OR_RETURN(ElementBytes(out_shm, i) == Reduce(dtype, op, values),
                               "large ReduceScatter element " << i);
            }
            // All-reduce of the same input (integer-valued, so gloo's order gives the same
            // bits) over a size that does not divide by n.
            ++call;
            Tensor t_shm =
                Filled(n * k + 1, dtype, [&](int64_t i) { return Exact(rank, call, i); });
            Tensor t_gloo = Copy(t_shm);
            AllReduceOptions ar;
            ar.reduce_op = op;
            RETURN_IF_ERROR(Finish(shm->AllReduce(t_shm, ar)));
            RETURN_IF_ERROR(Finish(gloo.AllReduce(t_gloo, ar)));
            EXPECT_OR_RETURN(SameBytes(t_shm, t_gloo), "large AllReduce " << core::DTypeName(dtype)
                                                                          << " "
                                                                          << ReduceOpName(op));
          }
          ++call;
          Tensor b_shm = Filled(n * k, dtype, [&](int64_t i) { return Inexact(rank, call, i); });
          BroadcastOptions bo;
          bo.root = n - 1;
          RETURN_IF_ERROR(Finish(shm->Broadcast(b_shm, bo)));
          Tensor want = Filled(n * k, dtype, [&](int64_t i) { return Inexact(n - 1, call, i); });
          EXPECT_OR_RETURN(SameBytes(b_shm, want), "large Broadcast");
        }
        return absl::OkStatus();
      },
      Options());
  EXPECT_TRUE(s.ok()) << s;
}

// The conformance suite over each transport, with small slots (so its larger cases span
// several) and, for cma, every size through process_vm_readv.
::comm::testing::ProcessGroupFactory ShmFactory(ShmTransport transport) {
  return {absl::StrCat("Shm_", TransportParamName(transport)),
          [transport](std::shared_ptr<Store> store, int rank,
                      int size) -> absl::StatusOr<std::shared_ptr<ProcessGroup>> {
            return ShmProcessGroup::Create(std::move(store), rank, size,
                                           ShmTestOptions("world", transport));
          }};
}

INSTANTIATE_TEST_SUITE_P(Slots, ProcessGroupConformanceTest,
                         ::testing::ValuesIn(::comm::testing::ConformanceCases(
                             ShmFactory(ShmTransport::kSlots), {1, 2, 3, 4})),
                         ::comm::testing::ConformanceCaseName);
INSTANTIATE_TEST_SUITE_P(Cma, ProcessGroupConformanceTest,
                         ::testing::ValuesIn(::comm::testing::ConformanceCases(
                             ShmFactory(ShmTransport::kCrossMemoryAttach), {1, 2, 3, 4})),
                         ::comm::testing::ConformanceCaseName);

INSTANTIATE_TEST_SUITE_P(RanksAndTransports, ShmCollectivesTest,
                         ::testing::Combine(::testing::Values(2, 3, 4),
                                            ::testing::Values(ShmTransport::kSlots,
                                                              ShmTransport::kCrossMemoryAttach)),
                         [](const ::testing::TestParamInfo<std::tuple<int, ShmTransport>>& info) {
                           return absl::StrCat("N", std::get<0>(info.param), "_",
                                               TransportParamName(std::get<1>(info.param)));
                         });

TEST(ShmWaitTest, AWaitingRankSleepsInsteadOfSpinning) {
  // Rank 1 issues its all-reduce 500 ms after rank 0: rank 0's worker must not burn
  // that time on the CPU (NOTE [Waiting]). Process CPU time covers all threads, so
  // measure it around the wait, with rank 1's thread idle (sleeping) meanwhile.
  ThreadRanksOptions opts = Options();
  opts.create_group = false;
  absl::Status s = RunThreadRanks(
      2,
      [&](RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(auto shm,
                         ShmProcessGroup::Create(ctx.store, ctx.rank, 2, ShmTestOptions("world")));
        Tensor t = Tensor::Zeros({100});
        RETURN_IF_ERROR(Finish(shm->Barrier(BarrierOptions{})));
        if (ctx.rank == 1) {
          absl::SleepFor(absl::Milliseconds(500));
          return Finish(shm->AllReduce(t, AllReduceOptions{}));
        }
        const clock_t cpu0 = clock();
        const absl::Time start = absl::Now();
        RETURN_IF_ERROR(Finish(shm->AllReduce(t, AllReduceOptions{})));
        const double cpu_s = static_cast<double>(clock() - cpu0) / CLOCKS_PER_SEC;
        const absl::Duration wall = absl::Now() - start;
        EXPECT_GE(wall, absl::Milliseconds(400));
        // A spinning waiter would use about as much CPU as wall time.
        EXPECT_LT(cpu_s, 0.25 * absl::ToDoubleSeconds(wall)) << "cpu " << cpu_s << " s";
        return absl::OkStatus();
      },
      opts);
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace comm
