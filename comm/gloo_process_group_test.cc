// Thread-rank tests of the gloo backend: the ProcessGroup conformance suite
// (comm/testing/process_group_conformance.h) at N = 1, 2, 3, 4, and what is gloo's own:
// the pipelined reduce-scatter's bounded ring, Create's checks, the blame (which rank a
// timeout or a closed connection is pinned on, what a store that stops answering looks
// like) and corrupt or forged rendezvous values.
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
#include "comm/testing/process_group_conformance.h"
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
using ::comm::testing::StoredAs;
using ::comm::testing::ThreadRanksOptions;
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

INSTANTIATE_TEST_SUITE_P(Gloo, ProcessGroupConformanceTest,
                         ::testing::ValuesIn(::comm::testing::ConformanceCases(
                             {"Gloo",
                              [](std::shared_ptr<Store> store, int rank,
                                 int size) -> absl::StatusOr<std::shared_ptr<ProcessGroup>> {
                                GlooOptions g;
                                g.rendezvous_timeout = absl::Seconds(20);
                                return GlooProcessGroup::Create(std::move(store), rank, size, g);
                              }},
                             {1, 2, 3, 4})),
                         ::comm::testing::ConformanceCaseName);

class CollectivesTest : public ::testing::TestWithParam<int> {
 protected:
  int n() const { return GetParam(); }
};

// Chunks of several pieces (NOTE [Pipelined reduce-scatter]): the result has the bits of
// combining the ranks' chunks in rank order, in place or not, and the group receives
// into a fixed ring of 2 (n - 1) pieces instead of an n x chunk buffer per call.
TEST_P(CollectivesTest, ReduceScatterOfSeveralPiecesInRankOrderWithABoundedRing) {
  absl::Status s = RunThreadRanks(
      n(),
      [&](RankContext& ctx) -> absl::Status {
        const int n = ctx.world_size;
        const int64_t piece_f32 = GlooProcessGroup::kReduceScatterPieceBytes / 4;
        const auto value = [](int rank, int64_t j) {
          return static_cast<float>(std::sin(0.001 * static_cast<double>(j) + rank) * (rank + 1.3));
        };
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
          for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
            for (bool in_place : {false, true}) {
              const int64_t k = 2 * piece_f32 + 12345;  // 3 fp32 pieces, 2 bf16 pieces
              Tensor in = FilledTensor(n * k, dtype, [&](int64_t j) { return value(ctx.rank, j); });
              Tensor out =
                  in_place ? in.View(ctx.rank * k, {k}).value() : Tensor::Zeros({k}, dtype);
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
                float acc = StoredAs(dtype, value(0, j));
                for (int r = 1; r < n; ++r) acc += StoredAs(dtype, value(r, j));
                if (op == ReduceOp::kAverage) acc /= static_cast<float>(n);
                if (ElementAt(out, i) != StoredAs(dtype, acc)) ++wrong;
              }
              EXPECT_EQ(wrong, 0) << DTypeName(dtype) << " " << ReduceOpName(op)
                                  << " in_place=" << in_place;
            }
          }
        }
        return absl::OkStatus();
      },
      Options());
  EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(Ranks, CollectivesTest, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("N", info.param);
                         });

TEST(GlooFaultTest, RankThatNeverJoinsGivesDeadlineExceededToTheOthers) {
  ThreadRanksOptions opts = Options();
  opts.create_group = false;
  absl::Status s = RunThreadRanks(
      3,
      [&](RankContext& ctx) -> absl::Status {
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
      },
      opts);
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
  absl::Status s = RunThreadRanks(
      3,
      [done](RankContext& ctx) -> absl::Status {
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
        EXPECT_NE(
            got.message().find("rank 1 did not arrive (last at collective #1); ranks 0, 2 did"),
            std::string::npos)
            << got;
        EXPECT_TRUE(IsSecondary(got)) << got;
        EXPECT_EQ(CulpritRanks(got), std::vector<int>{1}) << got;
        EXPECT_LT(took, absl::Seconds(8)) << got;
        return absl::OkStatus();
      },
      Options());
  EXPECT_TRUE(s.ok()) << s;
}

TEST(GlooBlameTest, AWaitThatEndsBeforeTheCollectivesDeadlineAlsoNamesTheMissingRank) {
  auto done = std::make_shared<std::atomic<int>>(0);
  absl::Status s = RunThreadRanks(
      3,
      [done](RankContext& ctx) -> absl::Status {
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
      },
      Options());
  EXPECT_TRUE(s.ok()) << s;
}

TEST(GlooBlameTest, PeerThatDestroysItsGroupIsNamedByRank) {
  absl::Status s = RunThreadRanks(
      3,
      [](RankContext& ctx) -> absl::Status {
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
      },
      Options());
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
  absl::Status s = RunThreadRanks(
      2,
      [done](RankContext& ctx) -> absl::Status {
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
      },
      topts);
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
  absl::Status s = RunThreadRanks(
      2,
      [=](RankContext& ctx) -> absl::Status {
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
        EXPECT_NE(
            got.message().find(absl::StrCat("the store at 127.0.0.1:", port, " does not answer")),
            std::string::npos)
            << got;
        EXPECT_NE(got.message().find("the process serving it is gone or stopped"),
                  std::string::npos)
            << got;
        EXPECT_TRUE(IsSecondary(got)) << got;
        EXPECT_TRUE(CulpritRanks(got).empty()) << got;  // who serves it is not known
        return absl::OkStatus();
      },
      topts);
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
  for (const Case& c :
       {Case{RandomBytes(200, 1), "holds 200 bytes"}, Case{one.substr(0, 100), "holds 100 bytes"},
        Case{RandomBytes(one.size(), 2), "its address for rank 0"},
        Case{std::string(), "holds 0 bytes"}}) {
    absl::Duration took;
    absl::Status s = JoinAgainstForgery(0, "1", c.value, "127.0.0.1", &took);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_NE(s.message().find("key 'world/1' (the gloo addresses of rank 1)"), std::string::npos)
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
  EXPECT_NE(s.message().find(
                absl::StrCat("rank 1 at 127.0.0.1:", port, " (the address in key 'world/1')")),
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
  EXPECT_NE(s.message().find("rank 1 did not confirm its connections"), std::string::npos) << s;
  EXPECT_NE(s.message().find("'world/1'"), std::string::npos) << s;
  // rendezvous_timeout is 1 s; the rest is slack for a loaded machine.
  EXPECT_LT(took, absl::Seconds(4)) << s;
}

TEST(GlooRendezvousTest, ForgedAddressWhereThisRankListensFailsWithinTheTimeout) {
  // A forged address that sorts before rank 0's own makes rank 0 the listening side;
  // nobody connects, and gloo's connect wait is kept within rendezvous_timeout.
  absl::Duration took;
  absl::Status s = JoinAgainstForgery(0, "1", GlooAddressBytes("127.0.0.3", 9), "127.0.0.2", &took);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s;
  EXPECT_LT(took, absl::Seconds(4)) << s;
}

}  // namespace
}  // namespace comm
