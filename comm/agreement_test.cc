#include "comm/agreement.h"

#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "comm/failure.h"
#include "comm/testing/thread_ranks.h"
#include "gtest/gtest.h"

namespace comm {
namespace {

// Runs AgreeOnStatus on `world` thread ranks with `local(rank)` and returns each rank's result.
std::vector<absl::Status> Agree(int world, std::function<absl::Status(int)> local) {
  std::vector<absl::Status> results(world, absl::InternalError("not run"));
  absl::Mutex mu;
  absl::Status run = testing::RunThreadRanks(world, [&](testing::RankContext& ctx) {
    absl::Status s =
        AgreeOnStatus(ctx.group.get(), local(ctx.rank), "test step", absl::Seconds(30));
    absl::MutexLock lock(&mu);
    results[ctx.rank] = s;
    return absl::OkStatus();
  });
  EXPECT_TRUE(run.ok()) << run;
  return results;
}

TEST(AgreementTest, AllOkIsOkEverywhere) {
  for (const absl::Status& s : Agree(3, [](int) { return absl::OkStatus(); })) {
    EXPECT_TRUE(s.ok()) << s;
  }
}

TEST(AgreementTest, OneRanksErrorReachesEveryRankNamingIt) {
  std::vector<absl::Status> results = Agree(3, [](int rank) {
    return rank == 2 ? absl::DataLossError("rank-00002-of-00003.bin: checksum mismatch")
                     : absl::OkStatus();
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(results[r].code(), absl::StatusCode::kDataLoss) << r;
    EXPECT_NE(results[r].message().find("rank 2: rank-00002-of-00003.bin: checksum mismatch"),
              std::string::npos)
        << results[r];
    // The failing rank holds the root cause; the others a secondary naming rank 2.
    EXPECT_EQ(IsSecondary(results[r]), r != 2) << results[r];
    if (r != 2) {
      EXPECT_EQ(CulpritRanks(results[r]), std::vector<int>{2});
    }
  }
}

TEST(AgreementTest, ARootCauseWinsOverALowerRanksSecondaryError) {
  std::vector<absl::Status> results = Agree(3, [](int rank) {
    if (rank == 0) return MarkSecondary(absl::UnavailableError("peer closed"), {2});
    if (rank == 2) return absl::InvalidArgumentError("--n_layer: must be positive");
    return absl::OkStatus();
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(results[r].code(), absl::StatusCode::kInvalidArgument) << results[r];
    EXPECT_NE(results[r].message().find("rank 2: --n_layer"), std::string::npos) << results[r];
  }
}

TEST(AgreementTest, WorldOfOneReturnsItsOwnStatus) {
  EXPECT_TRUE(AgreeOnStatus(nullptr, absl::OkStatus(), "x").ok());
  absl::Status s = AgreeOnStatus(nullptr, absl::NotFoundError("gone"), "x");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "gone");
  EXPECT_FALSE(IsSecondary(s));
}

TEST(AgreementTest, AllGatherBytesKeepsEachRanksBytes) {
  absl::Mutex mu;
  std::vector<std::vector<std::string>> seen(3);
  absl::Status run = testing::RunThreadRanks(3, [&](testing::RankContext& ctx) {
    const std::string mine(static_cast<size_t>(ctx.rank * 5), static_cast<char>('a' + ctx.rank));
    absl::StatusOr<std::vector<std::string>> all =
        AllGatherBytes(ctx.group.get(), mine, absl::Seconds(30));
    if (!all.ok()) return all.status();
    absl::MutexLock lock(&mu);
    seen[ctx.rank] = *all;
    return absl::OkStatus();
  });
  ASSERT_TRUE(run.ok()) << run;
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(seen[r], (std::vector<std::string>{"", "bbbbb", "cccccccccc"}));
  }
}

}  // namespace
}  // namespace comm
