// Tests of the NCCL backend. Tagged "gpu": they need --config=cuda and a usable GPU,
// and skip (saying why) otherwise. On one GPU a communicator has one rank, so these
// check the single-rank semantics, bf16 handling, ordering with the compute stream,
// counters and argument checks; with two or more GPUs a 2-rank test runs too.
// Multi-rank behaviour in general is covered on the CPU by the gloo and shm tests. The
// ProcessGroup conformance suite (comm/testing/process_group_conformance.h) runs at one
// rank on host tensors (staged through the GPU); it skips, like the rest, without a GPU
// or a CUDA build.
//
// Values are small integers, exact in fp32 and bf16, so results compare with EXPECT_EQ.
#include "comm/testing/process_group_conformance.h"
#include "core/cuda_device.h"
#include "gtest/gtest.h"

#ifdef FSDP_WITH_CUDA
#include <optional>
#include <thread>

#include "comm/hash_store.h"
#include "comm/nccl_process_group.h"
#include "core/dtype.h"
#include "core/pinned_buffer.h"
#include "core/tensor.h"
#endif

namespace comm {
namespace {

using ::comm::testing::ProcessGroupConformanceTest;

::comm::testing::ProcessGroupFactory NcclFactory() {
  ::comm::testing::ProcessGroupFactory f;
  f.name = "Nccl";
  f.host_only = false;
#ifdef FSDP_WITH_CUDA
  f.create = [](std::shared_ptr<Store> store, int rank,
                int size) -> absl::StatusOr<std::shared_ptr<ProcessGroup>> {
    return NcclProcessGroup::Create(std::move(store), rank, size, core::Device::Cuda(rank),
                                    NcclOptions{});
  };
  f.skip_reason = []() -> std::string {
    absl::StatusOr<int> n = core::CudaDeviceCount();
    return n.ok() ? "" : std::string(n.status().message());
  };
#else
  f.create = [](std::shared_ptr<Store>, int, int) -> absl::StatusOr<std::shared_ptr<ProcessGroup>> {
    return absl::UnimplementedError("the NCCL backend needs a build with --config=cuda");
  };
  f.skip_reason = [] { return std::string("built without CUDA (--config=cuda)"); };
#endif
  return f;
}

// One GPU per rank, and these machines have one: the suite at one rank.
INSTANTIATE_TEST_SUITE_P(Nccl, ProcessGroupConformanceTest,
                         ::testing::ValuesIn(::comm::testing::ConformanceCases(NcclFactory(), {1})),
                         ::comm::testing::ConformanceCaseName);

#ifndef FSDP_WITH_CUDA

TEST(NcclProcessGroupTest, NeedsACudaBuild) {
  EXPECT_FALSE(core::BuiltWithCuda());
  GTEST_SKIP() << "built without CUDA (--config=cuda): the NCCL backend is not compiled in";
}

#else

using core::DType;
using core::Tensor;

constexpr absl::Duration kTimeout = absl::Seconds(60);

class NcclTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<int> n = core::CudaDeviceCount();
    if (!n.ok()) GTEST_SKIP() << n.status();
    gpus_ = *n;
    auto g = NcclProcessGroup::Create(std::make_shared<HashStore>(), 0, 1, core::Device::Cuda(0),
                                      NcclOptions{});
    ASSERT_TRUE(g.ok()) << g.status();
    group_ = *g;
  }

  Tensor OnGpu(const std::vector<float>& values, DType dtype) {
    Tensor host = Tensor::FromVector(values, {static_cast<int64_t>(values.size())}).value();
    Tensor h = host.ToDType(dtype, core::MemoryTag::kOther).value();
    Tensor d =
        Tensor::Allocate(h.shape(), dtype, core::MemoryTag::kOther, core::Device::Cuda(0)).value();
    EXPECT_TRUE(d.CopyFrom(h).ok());
    return d;
  }

  std::vector<float> ToHost(const Tensor& d) {
    Tensor h = Tensor::Zeros(d.shape(), d.dtype());
    EXPECT_TRUE(h.CopyFrom(d).ok());
    return h.ToVector();
  }

  int gpus_ = 0;
  std::shared_ptr<NcclProcessGroup> group_;
};

TEST_F(NcclTest, SingleRankCollectivesKeepOrCopyTheData) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    Tensor in = OnGpu({1, 2, 3}, dtype);
    Tensor out = OnGpu({0, 0, 0}, dtype);
    ASSERT_TRUE(group_->AllGather(in, out, AllGatherOptions{}).value()->Wait(kTimeout).ok());
    EXPECT_EQ(ToHost(out), (std::vector<float>{1, 2, 3}));
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
      Tensor t = OnGpu({4, 5, 6, 7}, dtype);
      AllReduceOptions ar;
      ar.reduce_op = op;
      ASSERT_TRUE(group_->AllReduce(t, ar).value()->Wait(kTimeout).ok());
      EXPECT_EQ(ToHost(t), (std::vector<float>{4, 5, 6, 7})) << ReduceOpName(op);
      Tensor rs_out = OnGpu({0, 0, 0, 0}, dtype);
      ReduceScatterOptions rs;
      rs.reduce_op = op;
      ASSERT_TRUE(group_->ReduceScatter(t, rs_out, rs).value()->Wait(kTimeout).ok());
      EXPECT_EQ(ToHost(rs_out), (std::vector<float>{4, 5, 6, 7})) << ReduceOpName(op);
    }
    Tensor b = OnGpu({9, 8}, dtype);
    ASSERT_TRUE(group_->Broadcast(b, BroadcastOptions{}).value()->Wait(kTimeout).ok());
    EXPECT_EQ(ToHost(b), (std::vector<float>{9, 8}));
  }
  ASSERT_TRUE(group_->Barrier(BarrierOptions{}).value()->Wait(kTimeout).ok());
}

TEST_F(NcclTest, ZeroLengthAndInPlaceWork) {
  Tensor empty = OnGpu({}, DType::kFloat32);
  ASSERT_TRUE(group_->AllReduce(empty, AllReduceOptions{}).value()->Wait(kTimeout).ok());
  Tensor out = OnGpu({5, 6}, DType::kFloat32);
  Tensor slot = out.View(0, {2}).value();
  ASSERT_TRUE(group_->AllGather(slot, out, AllGatherOptions{}).value()->WaitHost(kTimeout).ok());
  EXPECT_EQ(ToHost(out), (std::vector<float>{5, 6}));
  EXPECT_EQ(group_->Stats().of(CollectiveKind::kAllReduce).calls, 1);
}

TEST_F(NcclTest, SeesComputeStreamWritesIssuedBeforeIt) {
  // Fill runs on the legacy default stream; the collective must wait for it.
  Tensor t =
      Tensor::Allocate({1 << 22}, DType::kFloat32, core::MemoryTag::kOther, core::Device::Cuda(0))
          .value();
  t.Fill(3.0f);
  ASSERT_TRUE(group_->AllReduce(t, AllReduceOptions{}).value()->Wait(kTimeout).ok());
  EXPECT_EQ(ToHost(t.View((1 << 22) - 1, {1}).value())[0], 3.0f);
}

TEST_F(NcclTest, StagesHostTensorsAndRejectsMixedDevicesAndBadShapes) {
  // All-CPU collectives are staged through the device and complete on return.
  Tensor cpu = Tensor::FromVector({1, 2, 3, 4}, {4}).value();
  auto w = group_->AllReduce(cpu, AllReduceOptions{});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE((*w)->IsCompleted());
  EXPECT_TRUE((*w)->Wait(kTimeout).ok());
  EXPECT_EQ(cpu.ToVector(), (std::vector<float>{1, 2, 3, 4}));
  Tensor ints_in = Tensor::FromInts({7, 8}, {2}).value();
  Tensor ints_out = Tensor::Zeros({2}, DType::kInt32);
  ASSERT_TRUE(
      group_->AllGather(ints_in, ints_out, AllGatherOptions{}).value()->Wait(kTimeout).ok());
  EXPECT_EQ(ints_out.ToVector(), (std::vector<float>{7, 8}));
  // A CPU tensor with a CUDA one is refused, naming the device.
  Tensor gpu = OnGpu({0, 0}, DType::kFloat32);
  auto mixed = group_->AllGather(Tensor::FromVector({1, 2}, {2}).value(), gpu, AllGatherOptions{});
  EXPECT_EQ(mixed.status().code(), absl::StatusCode::kInvalidArgument) << mixed.status();
  EXPECT_NE(mixed.status().message().find("cuda:0"), std::string::npos) << mixed.status();
  Tensor a = OnGpu({1, 2}, DType::kFloat32);
  Tensor b = OnGpu({1, 2, 3}, DType::kFloat32);
  EXPECT_EQ(group_->AllGather(a, b, AllGatherOptions{}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// NOTE [Staged collectives] on the device: the all-gather copies a pinned fp32 host
// source to the device and casts it to its bf16 input on the NCCL stream; a device fp32
// source is cast there too; the reductions copy their results into pinned host tensors
// that hold them once WaitHost returns.
TEST_F(NcclTest, StagedCollectivesCopyAndCastOnTheirStream) {
  auto pinned = [](std::vector<float> values, DType dtype) {
    core::PinnedBuffer buf = core::PinnedBuffer::Allocate(values.size() * 4).value();
    Tensor t = buf.AsTensor(0, {static_cast<int64_t>(values.size())}, dtype).value();
    Tensor src = Tensor::FromVector(values, {static_cast<int64_t>(values.size())}).value();
    EXPECT_TRUE(t.CopyFrom(src).ok());
    return t;
  };
  for (bool from_host : {true, false}) {
    Tensor from = from_host ? pinned({1.5f, 2.25f, 1.0f / 3}, DType::kFloat32)
                            : OnGpu({1.5f, 2.25f, 1.0f / 3}, DType::kFloat32);
    Tensor in = OnGpu({0, 0, 0}, DType::kBFloat16);
    Tensor out = OnGpu({0, 0, 0}, DType::kBFloat16);
    AllGatherOptions ag;
    ag.stage_from = from;
    ASSERT_TRUE(group_->AllGather(in, out, ag).value()->WaitHost(kTimeout).ok());
    EXPECT_EQ(ToHost(out),
              (std::vector<float>{1.5f, 2.25f, core::BFloat16::FromFloat(1.0f / 3).ToFloat()}))
        << (from_host ? "host" : "device") << " source";
  }
  Tensor rs_in = OnGpu({4, 5, 6}, DType::kFloat32);
  Tensor rs_out = OnGpu({0, 0, 0}, DType::kFloat32);
  Tensor rs_host = pinned({0, 0, 0}, DType::kFloat32);
  ReduceScatterOptions rs;
  rs.unstage_to = rs_host;
  ASSERT_TRUE(group_->ReduceScatter(rs_in, rs_out, rs).value()->WaitHost(kTimeout).ok());
  EXPECT_EQ(rs_host.ToVector(), (std::vector<float>{4, 5, 6}));
  // accumulate_into: the output added into a device tensor on the stream (bf16 widened).
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    Tensor in = OnGpu({4, 5, 6}, dtype);
    Tensor out = OnGpu({0, 0, 0}, dtype);
    Tensor into = OnGpu({0.5f, -1, 2}, DType::kFloat32);
    ReduceScatterOptions acc;
    acc.accumulate_into = into;
    ASSERT_TRUE(group_->ReduceScatter(in, out, acc).value()->WaitHost(kTimeout).ok());
    EXPECT_EQ(ToHost(into), (std::vector<float>{4.5f, 4, 8})) << core::DTypeName(dtype);
  }
  Tensor ar = OnGpu({7, 8}, DType::kBFloat16);
  Tensor ar_host = pinned({0, 0}, DType::kBFloat16);
  AllReduceOptions aro;
  aro.unstage_to = ar_host;
  ASSERT_TRUE(group_->AllReduce(ar, aro).value()->WaitHost(kTimeout).ok());
  EXPECT_EQ(ar_host.ToVector(), (std::vector<float>{7, 8}));
}

TEST_F(NcclTest, CountersFollowTheFormulasAtOneRank) {
  group_->ResetStats();
  Tensor t = OnGpu({1, 2, 3, 4}, DType::kFloat32);
  // Counted once the watchdog has seen it succeed: WaitHost returns after that.
  ASSERT_TRUE(group_->AllReduce(t, AllReduceOptions{}).value()->WaitHost(kTimeout).ok());
  const CollectiveStats s = group_->Stats().of(CollectiveKind::kAllReduce);
  EXPECT_EQ(s.calls, 1);
  EXPECT_EQ(s.bytes_sent, 0);  // one rank moves nothing
}

TEST_F(NcclTest, TwoRanksOnTwoGpus) {
  if (gpus_ < 2) GTEST_SKIP() << "needs two GPUs; this machine has " << gpus_;
  auto store = std::make_shared<HashStore>();
  std::vector<absl::Status> results(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      NcclOptions o;
      o.name = "pair";
      auto g = NcclProcessGroup::Create(store, r, 2, core::Device::Cuda(r), o);
      if (!g.ok()) {
        results[r] = g.status();
        return;
      }
      Tensor t =
          Tensor::Allocate({8}, DType::kBFloat16, core::MemoryTag::kOther, core::Device::Cuda(r))
              .value();
      t.Fill(static_cast<float>(r + 1));
      auto w = (*g)->AllReduce(t, AllReduceOptions{});
      results[r] = w.ok() ? (*w)->Wait(kTimeout) : w.status();
      Tensor h = Tensor::Zeros({8}, DType::kBFloat16);
      if (results[r].ok()) results[r] = h.CopyFrom(t);
      if (results[r].ok() && h.ToVector()[7] != 3.0f) results[r] = absl::InternalError("sum");
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(results[r].ok()) << results[r];
}

TEST_F(NcclTest, WaitOrdersTheComputeStreamAndWaitHostCompletesTheWork) {
  // A large reduction: Wait returns without blocking the host, and a kernel queued on
  // the compute stream after it (Fill of a slice) runs after the collective, so the
  // fill is what the host reads back, not the reduction's result.
  Tensor t =
      Tensor::Allocate({1 << 24}, DType::kFloat32, core::MemoryTag::kOther, core::Device::Cuda(0))
          .value();
  t.Fill(1.0f);
  auto work = group_->AllReduce(t, AllReduceOptions{}).value();
  ASSERT_TRUE(work->Wait(kTimeout).ok());
  t.View(0, {1}).value().Fill(7.0f);
  EXPECT_EQ(ToHost(t.View(0, {1}).value())[0], 7.0f);
  EXPECT_EQ(ToHost(t.View((1 << 24) - 1, {1}).value())[0], 1.0f);
  ASSERT_TRUE(work->WaitHost(kTimeout).ok());
  EXPECT_TRUE(work->IsCompleted());
}

// NOTE [Comm overlap] on NCCL: StreamWaitTiming from the events around the collective
// and at its first Wait. The collective is a staged all-gather whose cast of 2^26 floats
// runs on the group's stream (about 0.1 ms on an H200), so it has a run time to measure.
TEST_F(NcclTest, StreamWaitTimingMeasuresRunAndComputeStreamStall) {
  constexpr int64_t kN = int64_t{1} << 26;
  auto device = [](int64_t n, DType dtype) {
    return Tensor::Allocate({n}, dtype, core::MemoryTag::kOther, core::Device::Cuda(0)).value();
  };
  Tensor from = device(kN, DType::kFloat32);
  from.Fill(1.0f);
  Tensor in = device(kN, DType::kBFloat16);
  Tensor out = device(kN, DType::kBFloat16);
  AllGatherOptions ag;
  ag.stage_from = from;
  const auto sync = [&] { ToHost(out.View(kN - 1, {1}).value()); };  // the compute stream
  sync();

  // Waited on only from the host: never stream-ordered, so no timing.
  auto host_only = group_->AllGather(in, out, ag).value();
  ASSERT_TRUE(host_only->WaitHost(kTimeout).ok());
  EXPECT_FALSE(host_only->StreamWaitTiming().has_value());
  // Waited on after it completed: the compute stream did not stand at all.
  ASSERT_TRUE(host_only->Wait(kTimeout).ok());
  std::optional<Work::StreamTiming> t = host_only->StreamWaitTiming();
  ASSERT_TRUE(t.has_value());
  EXPECT_GT(t->run, absl::ZeroDuration());
  EXPECT_EQ(t->wait, absl::ZeroDuration());

  // Waited on at once, the compute stream idle: it stands for (about) the whole run. The
  // stall is measured from the compute stream's event at Wait, recorded after the
  // collective's start on the host, so it is positive and not longer than the run (up to
  // the few microseconds between two idle streams taking their events).
  auto stalled = group_->AllGather(in, out, ag).value();
  ASSERT_TRUE(stalled->Wait(kTimeout).ok());
  ASSERT_TRUE(stalled->WaitHost(kTimeout).ok());
  sync();
  t = stalled->StreamWaitTiming();
  ASSERT_TRUE(t.has_value());
  EXPECT_GT(t->run, absl::ZeroDuration());
  EXPECT_GT(t->wait, absl::ZeroDuration());
  EXPECT_LE(t->wait, t->run + absl::Microseconds(20));

  // Compute queued after the collective and before the Wait (32 fills of 256 MB, several
  // ms) outlasts it: the compute stream reaches the Wait after the collective ended.
  Tensor busy = device(kN, DType::kFloat32);
  auto hidden = group_->AllGather(in, out, ag).value();
  for (int i = 0; i < 32; ++i) busy.Fill(static_cast<float>(i));
  ASSERT_TRUE(hidden->Wait(kTimeout).ok());
  ASSERT_TRUE(hidden->WaitHost(kTimeout).ok());
  sync();
  t = hidden->StreamWaitTiming();
  ASSERT_TRUE(t.has_value());
  EXPECT_GT(t->run, absl::ZeroDuration());
  EXPECT_EQ(t->wait, absl::ZeroDuration());
}

TEST_F(NcclTest, WatchdogFailsACollectiveThatNeverCompletesWithoutAnyoneWaiting) {
  if (gpus_ < 2) {
    GTEST_SKIP() << "needs two GPUs (a 2-rank group where rank 1 never issues); this machine "
                    "has "
                 << gpus_;
  }
  auto store = std::make_shared<HashStore>();
  std::vector<std::shared_ptr<NcclProcessGroup>> groups(2);
  std::vector<absl::Status> created(2);
  {
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        NcclOptions o;
        o.name = "stuck";
        auto g = NcclProcessGroup::Create(store, r, 2, core::Device::Cuda(r), o);
        created[r] = g.status();
        if (g.ok()) groups[r] = *g;
      });
    }
    for (auto& t : threads) t.join();
  }
  ASSERT_TRUE(created[0].ok()) << created[0];
  ASSERT_TRUE(created[1].ok()) << created[1];
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  Tensor t =
      Tensor::Allocate({1024}, DType::kFloat32, core::MemoryTag::kOther, core::Device::Cuda(0))
          .value();
  t.Fill(1.0f);
  AllReduceOptions ar;
  ar.timeout = absl::Seconds(1);
  const absl::Time start = absl::Now();
  auto work = groups[0]->AllReduce(t, ar).value();  // rank 1 never issues its part
  // Nobody waits: the watchdog completes the work on its own at the deadline.
  while (!work->IsCompleted() && absl::Now() - start < absl::Seconds(30)) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_TRUE(work->IsCompleted()) << "the watchdog did not fire within 30s";
  EXPECT_GE(absl::Now() - start, absl::Seconds(1));
  const absl::Status s = work->WaitHost(kTimeout);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("AllReduce #0"), std::string::npos) << s;
  EXPECT_NE(s.message().find("'stuck'"), std::string::npos) << s;
  EXPECT_NE(s.message().find("1s"), std::string::npos) << s;
  EXPECT_EQ(work->Wait(kTimeout).code(), absl::StatusCode::kDeadlineExceeded);
  // The group is broken: the next collective fails at once, quoting the first error.
  auto next = groups[0]->AllReduce(t, ar);
  ASSERT_FALSE(next.ok());
  EXPECT_EQ(next.status().code(), absl::StatusCode::kFailedPrecondition) << next.status();
  EXPECT_NE(next.status().message().find("AllReduce #0"), std::string::npos) << next.status();
  EXPECT_EQ(groups[0]->Stats().of(CollectiveKind::kAllReduce).calls, 0);
}

TEST_F(NcclTest, MissingPeerIsDeadlineExceededNotAHang) {
  NcclOptions o;
  o.name = "lonely";
  o.init_timeout = absl::Seconds(1);
  const absl::Time start = absl::Now();
  // Rank 1 of 2 waits for rank 0's id, which nobody writes.
  auto g = NcclProcessGroup::Create(std::make_shared<HashStore>(), 1, 2, core::Device::Cuda(0), o);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kDeadlineExceeded) << g.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

#endif  // FSDP_WITH_CUDA

}  // namespace
}  // namespace comm
