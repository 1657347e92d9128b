// Real processes through the launcher (comm:launch), meeting over TcpStore and running
// gloo: the happy path at N = 2 and 4, a rank that never joins, and a rank killed
// mid-run; the happy path and the killed rank again over shm (shared memory). Every run
// has a hard deadline; a launcher still running after it is killed and the test fails
// rather than hangs.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace {

struct Result {
  int exit_code = -1;  // -1: had to be killed
  std::string output;
  absl::Duration took;
};

// A binary of this test's data: tests/comm/BUILD passes its runfiles path (relative to
// the working directory, whatever this repository is called) in the variable `env_var`.
std::string Runfile(const char* env_var) {
  const char* path = std::getenv(env_var);
  return path != nullptr ? path : absl::StrCat("<", env_var, " unset>");
}

Result Launch(int nproc, const std::vector<std::string>& worker_args, absl::Duration deadline) {
  static int counter = 0;
  const std::string out_path =
      absl::StrCat(std::getenv("TEST_TMPDIR"), "/launch_", ::getpid(), "_", counter++);
  std::vector<std::string> args = {Runfile("LAUNCH_BINARY"), absl::StrCat("--nproc=", nproc),
                                   "--grace_period_s=10", "--", Runfile("COMM_WORKER_BINARY")};
  args.insert(args.end(), worker_args.begin(), worker_args.end());
  const absl::Time start = absl::Now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(126);
  }
  Result r;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (absl::Now() - start > deadline) {
      ::kill(pid, SIGKILL);  // its ranks die with it (PR_SET_PDEATHSIG)
      ::waitpid(pid, &status, 0);
      status = -1;
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  r.took = absl::Now() - start;
  if (status != -1 && WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  std::ifstream in(out_path);
  std::stringstream ss;
  ss << in.rdbuf();
  r.output = ss.str();
  return r;
}

bool Has(const Result& r, const std::string& s) { return r.output.find(s) != std::string::npos; }

// (backend, number of ranks).
class CollectivesAcrossProcesses : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(CollectivesAcrossProcesses, EveryRankChecksEveryCollective) {
  const std::string backend = std::get<0>(GetParam());
  const int n = std::get<1>(GetParam());
  Result r =
      Launch(n, {"--mode=collectives", absl::StrCat("--backend=", backend)}, absl::Seconds(45));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (int rank = 0; rank < n; ++rank) {
    EXPECT_TRUE(Has(r, absl::StrCat("[rank ", rank, "] worker ", rank, ": joined ", backend,
                                    " group 'world' (rank ", rank, " of ", n, ")")))
        << r.output;
    EXPECT_TRUE(Has(r, absl::StrCat("[rank ", rank, "] worker ", rank, ": ok"))) << r.output;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, CollectivesAcrossProcesses,
                         ::testing::Combine(::testing::Values("gloo", "shm"),
                                            ::testing::Values(2, 4)),
                         [](const ::testing::TestParamInfo<std::tuple<std::string, int>>& info) {
                           return absl::StrCat(std::get<0>(info.param), "N",
                                               std::get<1>(info.param));
                         });

TEST(FaultsAcrossProcesses, RankThatNeverJoinsGivesDeadlineExceededWithinTheTimeout) {
  // Ranks 0 and 1 wait 2 s for rank 2, which sleeps instead of joining.
  Result r = Launch(3, {"--mode=never_join", "--timeout_s=2"}, absl::Seconds(45));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, -1) << "launcher hung:\n" << r.output;
  for (int rank : {0, 1}) {
    EXPECT_TRUE(Has(r, absl::StrCat("[rank ", rank, "] worker ", rank, ": init failed after")))
        << r.output;
  }
  EXPECT_TRUE(Has(r, "DEADLINE_EXCEEDED")) << r.output;
  EXPECT_TRUE(Has(r, "launch: job failed: root cause rank ")) << r.output;
  EXPECT_TRUE(Has(r, "exited with code 3")) << r.output;
  // 2 s timeout, plus process start-up and the never-joiner's SIGTERM; 20 s is slack.
  EXPECT_LT(r.took, absl::Seconds(20)) << r.output;
}

TEST(FaultsAcrossProcesses, RankKilledMidRunMakesTheOthersFailAndTheLauncherNameIt) {
  Result r = Launch(4, {"--mode=die"}, absl::Seconds(45));
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.output;
  EXPECT_TRUE(Has(r, "[rank 1] worker 1: dying now")) << r.output;
  EXPECT_TRUE(Has(r, "launch: rank 1 failed: killed by signal 9")) << r.output;
  EXPECT_TRUE(Has(r, "launch: job failed: root cause rank 1 (killed by signal 9")) << r.output;
  for (int rank : {0, 2, 3}) {
    EXPECT_TRUE(Has(r, absl::StrCat("[rank ", rank, "] worker ", rank, ": collective 2 failed")))
        << r.output;
  }
  EXPECT_FALSE(Has(r, "no failure seen")) << r.output;
  // Survivors notice the closed connections at once (the collective timeout is 20 s).
  EXPECT_LT(r.took, absl::Seconds(15)) << r.output;
}

TEST(FaultsAcrossProcesses, ShmRankKilledMidRunMakesTheOthersFailFastNamingIt) {
  Result r = Launch(4, {"--mode=die", "--backend=shm"}, absl::Seconds(45));
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.output;
  EXPECT_TRUE(Has(r, "[rank 1] worker 1: dying now")) << r.output;
  EXPECT_TRUE(Has(r, "launch: job failed: root cause rank 1 (killed by signal 9")) << r.output;
  for (int rank : {0, 2, 3}) {
    EXPECT_TRUE(Has(r, absl::StrCat("[rank ", rank, "] worker ", rank, ": collective 2 failed")))
        << r.output;
  }
  // At least one survivor found rank 1's process gone (the others may see that
  // survivor's failure first); none waited for the 20 s collective timeout.
  EXPECT_TRUE(Has(r, "rank 1 (pid ")) << r.output;
  EXPECT_TRUE(Has(r, "exited while this rank waited on it")) << r.output;
  EXPECT_FALSE(Has(r, "DEADLINE_EXCEEDED")) << r.output;
  EXPECT_FALSE(Has(r, "no failure seen")) << r.output;
  EXPECT_LT(r.took, absl::Seconds(15)) << r.output;
}

TEST(WorkerFlags, BadFlagsAreRefusedBeforeJoining) {
  Result unknown_mode = Launch(1, {"--mode=bogus"}, absl::Seconds(30));
  EXPECT_EQ(unknown_mode.exit_code, 2) << unknown_mode.output;
  EXPECT_TRUE(Has(unknown_mode, "unknown --mode=bogus")) << unknown_mode.output;
  Result unknown_flag = Launch(1, {"--nodes=2"}, absl::Seconds(30));
  EXPECT_NE(unknown_flag.exit_code, 0) << unknown_flag.output;
  EXPECT_TRUE(Has(unknown_flag, "nodes")) << unknown_flag.output;
  Result bad_timeout = Launch(1, {"--timeout_s=abc"}, absl::Seconds(30));
  EXPECT_NE(bad_timeout.exit_code, 0) << bad_timeout.output;
  EXPECT_TRUE(Has(bad_timeout, "timeout_s")) << bad_timeout.output;
}

}  // namespace
