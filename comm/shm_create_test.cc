// Thread-rank tests of ShmProcessGroup::Create: its argument checks, a rank that never
// joins, ranks that disagree on slot_bytes, no segment left in /dev/shm, and the
// transport choice (the probe's agreement, forced cma that a rank cannot use, ranks
// passing different transports). The collectives are in shm_process_group_test.cc.
#include <dirent.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/failure.h"
#include "comm/hash_store.h"
#include "comm/shm_process_group.h"
#include "comm/testing/shm_test_options.h"
#include "comm/testing/thread_ranks.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"

namespace comm {
namespace {

using ::comm::testing::kShmTestSlotBytes;
using ::comm::testing::RankContext;
using ::comm::testing::RunThreadRanks;
using ::comm::testing::ShmTestOptions;
using ::comm::testing::ThreadRanksOptions;
using core::Tensor;

constexpr absl::Duration kTimeout = absl::Seconds(20);

ThreadRanksOptions Options() {
  ThreadRanksOptions o;
  o.timeout = absl::Seconds(120);
  o.create_group = false;
  return o;
}

absl::Status Finish(absl::StatusOr<std::shared_ptr<Work>> work) {
  if (!work.ok()) return work.status();
  return (*work)->Wait(kTimeout);
}

// Entries of /dev/shm that segments of this process would have: the backend's prefix
// and this pid (other test processes may run at the same time).
std::set<std::string> ShmEntries() {
  std::set<std::string> names;
  const std::string mine = absl::StrCat(kShmSegmentPrefix, getpid(), "_");
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) {
      if (absl::StartsWith(e->d_name, mine)) names.insert(e->d_name);
    }
    closedir(d);
  }
  return names;
}

TEST(ShmCreateTest, NoSegmentIsLeftInDevShmOnceCreateReturns) {
  auto names = std::make_shared<std::vector<std::string>>(3);
  absl::Status s = RunThreadRanks(
      3,
      [names](RankContext& ctx) -> absl::Status {
        ASSIGN_OR_RETURN(auto shm,
                         ShmProcessGroup::Create(ctx.store, ctx.rank, 3, ShmTestOptions()));
        (*names)[ctx.rank] = shm->segment_name();
        // Every rank returns from Create after rank 0 unlinked the name.
        EXPECT_EQ(ShmEntries().count(shm->segment_name().substr(1)), 0u) << shm->segment_name();
        RETURN_IF_ERROR(Finish(shm->Barrier(BarrierOptions{})));
        return absl::OkStatus();
      },
      Options());
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ((*names)[0], (*names)[1]);
  EXPECT_EQ((*names)[0], (*names)[2]);
  EXPECT_TRUE(absl::StartsWith((*names)[0], absl::StrCat("/", kShmSegmentPrefix)));
  EXPECT_EQ(ShmEntries().count((*names)[0].substr(1)), 0u);
}

TEST(ShmCreateTest, RankThatNeverJoinsIsDeadlineExceededAndLeavesNoSegment) {
  const std::set<std::string> before = ShmEntries();
  auto store = std::make_shared<HashStore>();
  ShmOptions o = ShmTestOptions();
  o.rendezvous_timeout = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  auto g = ShmProcessGroup::Create(store, 0, 2, o);  // rank 1 never comes
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  EXPECT_EQ(g.status().code(), absl::StatusCode::kDeadlineExceeded) << g.status();
  EXPECT_NE(g.status().message().find("shm group 'shm' (rank 0 of 2)"), std::string::npos)
      << g.status();
  EXPECT_NE(g.status().message().find("ranks 1 did not attach"), std::string::npos) << g.status();
  EXPECT_EQ(ShmEntries(), before);
  // And a rank whose rank 0 never comes.
  auto lone = ShmProcessGroup::Create(std::make_shared<HashStore>(), 1, 2, o);
  EXPECT_EQ(lone.status().code(), absl::StatusCode::kDeadlineExceeded) << lone.status();
  EXPECT_NE(lone.status().message().find("rank 0"), std::string::npos) << lone.status();
}

TEST(ShmCreateTest, BadArgumentsAreInvalidArgument) {
  auto store = std::make_shared<HashStore>();
  const auto code = [](const absl::StatusOr<std::shared_ptr<ShmProcessGroup>>& g) {
    return g.status().code();
  };
  EXPECT_EQ(code(ShmProcessGroup::Create(nullptr, 0, 1, ShmTestOptions())),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(ShmProcessGroup::Create(store, 2, 2, ShmTestOptions())),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(ShmProcessGroup::Create(store, -1, 2, ShmTestOptions())),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(ShmProcessGroup::Create(store, 0, 0, ShmTestOptions())),
            absl::StatusCode::kInvalidArgument);
  ShmOptions odd = ShmTestOptions();
  odd.slot_bytes = 5000;
  auto g = ShmProcessGroup::Create(store, 0, 1, odd);
  EXPECT_EQ(code(g), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(g.status().message().find("slot_bytes"), std::string::npos) << g.status();
  ShmOptions no_time = ShmTestOptions();
  no_time.rendezvous_timeout = absl::ZeroDuration();
  EXPECT_EQ(code(ShmProcessGroup::Create(store, 0, 1, no_time)),
            absl::StatusCode::kInvalidArgument);
}

TEST(ShmCreateTest, MismatchedSlotBytesFailsEveryRankAtOnceNamingIt) {
  absl::Status s = RunThreadRanks(
      3,
      [](RankContext& ctx) -> absl::Status {
        ShmOptions o = ShmTestOptions();
        o.rendezvous_timeout = absl::Seconds(30);
        if (ctx.rank == 1) o.slot_bytes = 2 * kShmTestSlotBytes;
        const absl::Time start = absl::Now();
        auto g = ShmProcessGroup::Create(ctx.store, ctx.rank, 3, o);
        // Rank 1's error reaches the others through the store, long before the 30 s timeout.
        EXPECT_LT(absl::Now() - start, absl::Seconds(15)) << g.status();
        EXPECT_EQ(g.status().code(), absl::StatusCode::kFailedPrecondition) << g.status();
        EXPECT_NE(g.status().message().find("slot_bytes"), std::string::npos) << g.status();
        if (ctx.rank == 0) {
          EXPECT_NE(g.status().message().find("ranks 1 could not attach"), std::string::npos)
              << g.status();
          EXPECT_EQ(CulpritRanks(g.status()), std::vector<int>{1}) << g.status();
        }
        if (ctx.rank == 2) {
          EXPECT_NE(g.status().message().find("rank 0 gave up"), std::string::npos) << g.status();
        }
        return absl::OkStatus();
      },
      Options());
  EXPECT_TRUE(s.ok()) << s;
}

// Runs Create on `n` thread ranks with options(rank); the statuses/transports by rank.
struct CreateResults {
  std::vector<absl::Status> status;
  std::vector<std::string> transport;
};
CreateResults CreateOnRanks(int n, const std::function<ShmOptions(int rank)>& options,
                            const std::function<absl::Status(ShmProcessGroup&)>& then = nullptr) {
  auto out = std::make_shared<CreateResults>();
  out->status.resize(n);
  out->transport.resize(n);
  absl::Status s = RunThreadRanks(
      n,
      [&, out](RankContext& ctx) -> absl::Status {
        auto g = ShmProcessGroup::Create(ctx.store, ctx.rank, n, options(ctx.rank));
        out->status[ctx.rank] = g.status();
        if (!g.ok()) return absl::OkStatus();
        out->transport[ctx.rank] = (*g)->transport_name();
        return then ? then(**g) : absl::OkStatus();
      },
      Options());
  EXPECT_TRUE(s.ok()) << s;
  return *out;
}

TEST(ShmTransportTest, AutoPicksCmaHereAndSlotsWhenAsked) {
  // The default is the slots (measured faster on the development machine; see the header).
  EXPECT_EQ(ShmOptions().transport, ShmTransport::kSlots);
  // This machine allows process_vm_readv (no Yama), between threads of one process too.
  for (int n : {1, 2}) {
    CreateResults r = CreateOnRanks(n, [](int) { return ShmTestOptions(); });
    for (int rank = 0; rank < n; ++rank) {
      ASSERT_TRUE(r.status[rank].ok()) << r.status[rank];
      EXPECT_EQ(r.transport[rank], "cma") << "n=" << n << " rank " << rank;
    }
  }
  CreateResults r =
      CreateOnRanks(2, [](int) { return ShmTestOptions("shm", ShmTransport::kSlots); });
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(r.status[rank].ok()) << r.status[rank];
    EXPECT_EQ(r.transport[rank], "slots");
  }
}

TEST(ShmTransportTest, OneRankFailingTheProbeMakesEveryRankUseSlots) {
  // Rank 1 reports EPERM (as under Yama ptrace_scope=1); all three agree on the slots,
  // and the group still reduces correctly (300 KiB: above cma_min_bytes).
  CreateResults r = CreateOnRanks(
      3,
      [](int rank) {
        ShmOptions o = ShmTestOptions();
        if (rank == 1) o.probe_override = [] { return EPERM; };
        return o;
      },
      [](ShmProcessGroup& g) -> absl::Status {
        Tensor t = Tensor::Zeros({75000});
        t.Fill(static_cast<float>(g.rank() + 1));
        RETURN_IF_ERROR(Finish(g.AllReduce(t, AllReduceOptions{})));
        for (int64_t i = 0; i < t.numel(); i += 997) {
          EXPECT_EQ(t.data<float>()[i], 6.0f) << "element " << i;
        }
        return absl::OkStatus();
      });
  for (int rank = 0; rank < 3; ++rank) {
    ASSERT_TRUE(r.status[rank].ok()) << r.status[rank];
    EXPECT_EQ(r.transport[rank], "slots") << "rank " << rank;
  }
}

TEST(ShmTransportTest, ForcedCmaThatARankCannotUseFailsEveryRankNamingItsErrno) {
  CreateResults r = CreateOnRanks(3, [](int rank) {
    ShmOptions o = ShmTestOptions("shm", ShmTransport::kCrossMemoryAttach);
    if (rank == 2) o.probe_override = [] { return EPERM; };
    return o;
  });
  for (int rank = 0; rank < 3; ++rank) {
    const absl::Status& s = r.status[rank];
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find("rank 2 cannot process_vm_readv"), std::string::npos) << s;
    EXPECT_NE(s.message().find(std::strerror(EPERM)), std::string::npos) << s;
    EXPECT_NE(s.message().find("transport"), std::string::npos) << s;
  }
}

TEST(ShmTransportTest, RanksPassingDifferentTransportsFailNamingThem) {
  CreateResults r = CreateOnRanks(2, [](int rank) {
    return ShmTestOptions("shm", rank == 1 ? ShmTransport::kSlots : ShmTransport::kAuto);
  });
  for (int rank = 0; rank < 2; ++rank) {
    const absl::Status& s = r.status[rank];
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find("ShmOptions.transport"), std::string::npos) << s;
    EXPECT_NE(s.message().find(rank == 0 ? "rank 1 passes slots" : "rank 0 passes auto"),
              std::string::npos)
        << s;
  }
}

}  // namespace
}  // namespace comm
