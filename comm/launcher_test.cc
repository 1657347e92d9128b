#include "comm/launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace comm {
namespace {

// Runs Launch with stdout and stderr going to temporary files; returns the status.
struct Captured {
  int exit_code = 0;
  std::string out, err;
  absl::Duration took;
};

std::string TempPath(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name, "_", ::getpid());
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Captured RunLaunch(LaunchOptions o, const std::string& script) {
  const std::string out_path = TempPath("out"), err_path = TempPath("err");
  const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  o.stdout_fd = out;
  o.stderr_fd = err;
  o.command = {"/bin/sh", "-c", script};
  const absl::Time start = absl::Now();
  Captured c;
  c.exit_code = Launch(o);
  c.took = absl::Now() - start;
  ::close(out);
  ::close(err);
  c.out = ReadFile(out_path);
  c.err = ReadFile(err_path);
  return c;
}

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// The launch binary: comm/BUILD passes its runfiles path (relative to the test's working
// directory, whatever the repository is called) in LAUNCH_BINARY.
std::string LaunchBinary() {
  const char* path = std::getenv("LAUNCH_BINARY");
  return path != nullptr ? path : "";
}

// Runs the launch binary with `args`; its exit status and stdout + stderr.
Captured RunLaunchBinary(const std::vector<std::string>& args) {
  const std::string out_path = TempPath("binary_out");
  Captured c;
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::string launch = LaunchBinary();
    std::vector<std::string> all = args;
    std::vector<char*> argv = {launch.data()};
    for (std::string& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(126);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  c.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  c.out = ReadFile(out_path);
  return c;
}

TEST(LaunchTest, SetsTheTorchrunEnvironmentAndPrefixesEveryLine) {
  LaunchOptions o;
  o.nproc = 3;
  Captured c = RunLaunch(o,
                         "echo \"env $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE "
                         "$MASTER_ADDR $MASTER_PORT\"; echo second line; printf partial; "
                         "echo oops >&2");
  EXPECT_EQ(c.exit_code, 0) << c.err;
  for (int r = 0; r < 3; ++r) {
    const std::string p = absl::StrCat("[rank ", r, "] ");
    EXPECT_TRUE(Contains(c.out, p + absl::StrCat("env ", r, " 3 ", r, " 3 127.0.0.1 "))) << c.out;
    EXPECT_TRUE(Contains(c.out, p + "second line\n")) << c.out;
    EXPECT_TRUE(Contains(c.out, p + "partial\n")) << c.out;  // flushed at EOF
    EXPECT_TRUE(Contains(c.err, p + "oops\n")) << c.err;
  }
  // Every rank saw the same, chosen, non-zero port.
  const size_t at = c.out.find("127.0.0.1 ");
  ASSERT_NE(at, std::string::npos);
  const std::string port = c.out.substr(at + 10, c.out.find('\n', at) - at - 10);
  EXPECT_NE(port, "0");
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(Contains(c.out, absl::StrCat("127.0.0.1 ", port, "\n"))) << c.out;
  }
}

TEST(LaunchTest, RanksGetHardwareThreadsOverNprocUnlessOmpNumThreadsIsSet) {
  const char* saved = std::getenv("OMP_NUM_THREADS");
  const std::string saved_value = saved != nullptr ? saved : "";
  LaunchOptions o;
  o.nproc = 2;
  const std::string script = "echo \"omp=$OMP_NUM_THREADS\"";
  ASSERT_EQ(::unsetenv("OMP_NUM_THREADS"), 0);
  Captured unset = RunLaunch(o, script);
  ASSERT_EQ(::setenv("OMP_NUM_THREADS", "5", 1), 0);
  Captured set = RunLaunch(o, script);
  if (saved != nullptr) {
    ::setenv("OMP_NUM_THREADS", saved_value.c_str(), 1);
  } else {
    ::unsetenv("OMP_NUM_THREADS");
  }
  EXPECT_EQ(unset.exit_code, 0) << unset.err;
  EXPECT_EQ(set.exit_code, 0) << set.err;
  const int expected = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / 2);
  for (int r = 0; r < 2; ++r) {
    const std::string p = absl::StrCat("[rank ", r, "] ");
    EXPECT_TRUE(Contains(unset.out, p + absl::StrCat("omp=", expected, "\n"))) << unset.out;
    EXPECT_TRUE(Contains(set.out, p + "omp=5\n")) << set.out;
  }
}

TEST(LaunchTest, FailingRankStopsTheOthersAndGivesItsExitCode) {
  LaunchOptions o;
  o.nproc = 3;
  o.grace_period = absl::Seconds(5);
  Captured c = RunLaunch(o, "if [ $RANK = 1 ]; then echo bye; exit 7; fi; exec sleep 30");
  EXPECT_EQ(c.exit_code, 7);
  EXPECT_TRUE(Contains(c.err, "rank 1 failed: exited with code 7")) << c.err;
  EXPECT_TRUE(Contains(c.err, "job failed: root cause rank 1")) << c.err;
  EXPECT_TRUE(Contains(c.out, "[rank 1] bye")) << c.out;
  // The sleeping ranks were stopped by SIGTERM, not waited for (30 s).
  EXPECT_LT(c.took, absl::Seconds(10));
}

TEST(LaunchTest, RankKilledBySignalIsNamedWithTheSignal) {
  LaunchOptions o;
  o.nproc = 2;
  Captured c = RunLaunch(o, "if [ $RANK = 0 ]; then kill -9 $$; fi; exec sleep 30");
  EXPECT_EQ(c.exit_code, 128 + 9);
  EXPECT_TRUE(Contains(c.err, "rank 0 failed: killed by signal 9")) << c.err;
  EXPECT_LT(c.took, absl::Seconds(10));
}

TEST(LaunchTest, RanksIgnoringSigtermAreKilledAfterTheGracePeriod) {
  LaunchOptions o;
  o.nproc = 2;
  o.grace_period = absl::Milliseconds(500);
  Captured c = RunLaunch(o,
                         "if [ $RANK = 1 ]; then sleep 0.2; exit 3; fi; trap '' TERM; "
                         "while true; do sleep 0.1; done");
  EXPECT_EQ(c.exit_code, 3);
  EXPECT_TRUE(Contains(c.err, "sending SIGKILL")) << c.err;
  EXPECT_LT(c.took, absl::Seconds(8));
}

TEST(LaunchTest, ProgramThatCannotBeExecutedFailsWith127) {
  LaunchOptions o;
  o.nproc = 1;
  o.command = {"/nonexistent/program"};
  const std::string err_path = TempPath("exec_err");
  const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  o.stderr_fd = err;
  EXPECT_EQ(Launch(o), 127);
  ::close(err);
  const std::string text = ReadFile(err_path);
  EXPECT_TRUE(Contains(text, "cannot execute /nonexistent/program")) << text;
  EXPECT_TRUE(Contains(text, "rank 0 failed: exited with code 127")) << text;
}

TEST(LaunchTest, ForwardsSigtermToEveryRank) {
  const std::string launch = LaunchBinary();
  ASSERT_FALSE(launch.empty()) << "LAUNCH_BINARY is not set (comm/BUILD sets it)";
  const std::string out_path = TempPath("fwd_out");
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execl(launch.c_str(), launch.c_str(), "--nproc=2", "--", "/bin/sh", "-c",
            "trap 'echo got TERM; exit 3' TERM; echo ready; while true; do sleep 0.1; done",
            static_cast<char*>(nullptr));
    ::_exit(126);
  }
  // Wait until both ranks are up, then signal the launcher only.
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (absl::Now() < deadline) {
    const std::string text = ReadFile(out_path);
    if (Contains(text, "[rank 0] ready") && Contains(text, "[rank 1] ready")) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  int status = 0;
  // The ranks exit on their own within ~0.1 s; the grace period (5 s) bounds the rest.
  for (int i = 0; i < 200 && ::waitpid(pid, &status, WNOHANG) == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  if (::waitpid(pid, &status, WNOHANG) == 0 && !WIFEXITED(status)) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    FAIL() << "launcher did not exit after SIGTERM";
  }
  const std::string text = ReadFile(out_path);
  EXPECT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM) << text;
  EXPECT_TRUE(Contains(text, "[rank 0] got TERM")) << text;
  EXPECT_TRUE(Contains(text, "[rank 1] got TERM")) << text;
  EXPECT_TRUE(Contains(text, "forwarding it to every rank")) << text;
}

// NOTE [Restarts]: a job that fails is reported and started again, every rank seeing the
// restart count; one that keeps failing ends with its failure after the last restart.
TEST(LaunchTest, AFailedJobIsRestartedUpToMaxRestarts) {
  LaunchOptions o;
  o.nproc = 2;
  o.max_restarts = 2;
  // Rank 1 fails at the first start only.
  Captured c = RunLaunch(o,
                         "echo start $FSDP_RESTART_COUNT; "
                         "if [ $FSDP_RESTART_COUNT = 0 ] && [ $RANK = 1 ]; then exit 7; fi");
  EXPECT_EQ(c.exit_code, 0) << c.err;
  EXPECT_TRUE(Contains(c.err, "job failed: root cause rank 1")) << c.err;
  EXPECT_TRUE(
      Contains(c.err, "restarting the job with 2 ranks (restart 1 of 2) after exit status 7"))
      << c.err;
  EXPECT_FALSE(Contains(c.err, "restart 2 of 2")) << c.err;
  EXPECT_TRUE(Contains(c.out, "[rank 0] start 0")) << c.out;
  EXPECT_TRUE(Contains(c.out, "[rank 0] start 1")) << c.out;
  EXPECT_TRUE(Contains(c.out, "[rank 1] start 1")) << c.out;

  // Always failing: two restarts, then the failure's status.
  Captured always = RunLaunch(o, "echo start $FSDP_RESTART_COUNT; exit 5");
  EXPECT_EQ(always.exit_code, 5);
  EXPECT_TRUE(Contains(always.err, "restart 2 of 2")) << always.err;
  EXPECT_TRUE(Contains(always.out, "[rank 1] start 2")) << always.out;
  EXPECT_FALSE(Contains(always.out, "start 3")) << always.out;

  // Without restarts (the default), the first failure ends the job.
  o.max_restarts = 0;
  Captured once = RunLaunch(o, "exit 5");
  EXPECT_EQ(once.exit_code, 5);
  EXPECT_FALSE(Contains(once.err, "restarting")) << once.err;
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// NOTE [Restarts]: a rank that appends its number to $FSDP_LOST_RANKS_FILE and fails is
// left out of the restart; the others are renumbered 0..n-1 and see the first start's size.
TEST(LaunchShrinkTest, ARestartContinuesWithoutTheRanksMarkedLost) {
  LaunchOptions o;
  o.nproc = 3;
  o.max_restarts = 2;
  o.min_nproc = 2;
  // At the first start rank 1 marks itself lost (twice: counted once), an operator's line
  // and an out-of-range number are ignored, and rank 1 exits 1.
  Captured c = RunLaunch(
      o,
      "echo \"start $FSDP_RESTART_COUNT rank $RANK of $WORLD_SIZE $LOCAL_WORLD_SIZE initial "
      "$FSDP_INITIAL_WORLD_SIZE lines $(wc -l < $FSDP_LOST_RANKS_FILE) file "
      "$FSDP_LOST_RANKS_FILE\"; "
      "if [ $FSDP_RESTART_COUNT = 0 ] && [ $RANK = 1 ]; then "
      "printf '1\\n1\\nrank two\\n7\\n' >> $FSDP_LOST_RANKS_FILE; exit 1; fi");
  EXPECT_EQ(c.exit_code, 0) << c.err;
  EXPECT_TRUE(
      Contains(c.err,
               "restarting the job with 2 ranks (restart 1 of 2; rank 1 lost for good) after exit "
               "status 1"))
      << c.err;
  EXPECT_TRUE(Contains(c.err, "that name no rank in [0, 3): \"rank two\", \"7\"")) << c.err;
  // The restart: two ranks numbered 0 and 1, the file emptied, no third rank.
  EXPECT_TRUE(Contains(c.out, "[rank 0] start 1 rank 0 of 2 2 initial 3 lines 0 file ")) << c.out;
  EXPECT_TRUE(Contains(c.out, "[rank 1] start 1 rank 1 of 2 2 initial 3 lines 0 file ")) << c.out;
  EXPECT_FALSE(Contains(c.out, "rank 2 of 2")) << c.out;
  EXPECT_FALSE(Contains(c.out, "[rank 2] start 1")) << c.out;
  EXPECT_FALSE(Contains(c.err, "restart 2 of 2")) << c.err;
  // The launcher made the file and removed it at the end.
  const size_t at = c.out.find(" file ");
  ASSERT_NE(at, std::string::npos) << c.out;
  const std::string file = c.out.substr(at + 6, c.out.find('\n', at) - at - 6);
  EXPECT_FALSE(file.empty()) << c.out;
  EXPECT_FALSE(Exists(file)) << file;
}

TEST(LaunchShrinkTest, FewerRanksThanMinNprocEndsTheJobWithItsFailure) {
  LaunchOptions o;
  o.nproc = 3;
  o.max_restarts = 2;
  o.min_nproc = 3;
  const std::string lose_rank_1 =
      "echo start $FSDP_RESTART_COUNT; "
      "if [ $RANK = 1 ]; then echo 1 >> $FSDP_LOST_RANKS_FILE; exit 3; fi";
  Captured c = RunLaunch(o, lose_rank_1);
  EXPECT_EQ(c.exit_code, 3) << c.err;
  EXPECT_TRUE(Contains(c.err,
                       "rank 1 lost for good; 2 ranks left, fewer than --min_nproc=3: "
                       "not restarting; exit status 3"))
      << c.err;
  EXPECT_FALSE(Contains(c.err, "restarting the job")) << c.err;
  EXPECT_FALSE(Contains(c.out, "start 1")) << c.out;

  // min_nproc 0 (the default) means nproc: never shrink.
  o.min_nproc = 0;
  Captured never = RunLaunch(o, lose_rank_1);
  EXPECT_EQ(never.exit_code, 3) << never.err;
  EXPECT_TRUE(Contains(never.err,
                       "rank 1 lost for good; 2 ranks left, fewer than --nproc=3 "
                       "(--min_nproc=0: never fewer): not restarting"))
      << never.err;
  EXPECT_FALSE(Contains(never.out, "start 1")) << never.out;
}

TEST(LaunchShrinkTest, ARestartWithoutLostRanksKeepsTheCountAndCountsOnlyNewLosses) {
  LaunchOptions o;
  o.nproc = 3;
  o.max_restarts = 2;
  o.min_nproc = 1;
  // Start 0: rank 1 is lost (3 -> 2 ranks). Start 1: rank 0 fails and marks nothing, so
  // start 2 keeps 2 ranks: the "1" of start 0 is not counted again.
  Captured c = RunLaunch(o,
                         "echo \"start $FSDP_RESTART_COUNT of $WORLD_SIZE\"; "
                         "if [ $FSDP_RESTART_COUNT = 0 ] && [ $RANK = 1 ]; then "
                         "echo 1 >> $FSDP_LOST_RANKS_FILE; exit 4; fi; "
                         "if [ $FSDP_RESTART_COUNT = 1 ] && [ $RANK = 0 ]; then exit 5; fi");
  EXPECT_EQ(c.exit_code, 0) << c.err;
  EXPECT_TRUE(Contains(c.err,
                       "restarting the job with 2 ranks (restart 1 of 2; rank 1 lost "
                       "for good) after exit status 4"))
      << c.err;
  EXPECT_TRUE(Contains(c.err,
                       "restarting the job with 2 ranks (restart 2 of 2) after exit "
                       "status 5"))
      << c.err;
  EXPECT_TRUE(Contains(c.out, "[rank 0] start 2 of 2")) << c.out;
  EXPECT_TRUE(Contains(c.out, "[rank 1] start 2 of 2")) << c.out;

  // From the first start: no rank lost, all three again, each seeing the same size.
  o.max_restarts = 1;
  Captured same = RunLaunch(o,
                            "echo \"start $FSDP_RESTART_COUNT of $WORLD_SIZE initial "
                            "$FSDP_INITIAL_WORLD_SIZE\"; "
                            "if [ $FSDP_RESTART_COUNT = 0 ] && [ $RANK = 2 ]; then exit 6; fi");
  EXPECT_EQ(same.exit_code, 0) << same.err;
  EXPECT_TRUE(Contains(same.err,
                       "restarting the job with 3 ranks (restart 1 of 1) after exit "
                       "status 6"))
      << same.err;
  EXPECT_TRUE(Contains(same.out, "[rank 2] start 1 of 3 initial 3")) << same.out;
}

// A lost-ranks file the caller names is the one the ranks see; stale lines from an
// earlier job are cleared when the launch starts, and the file is kept.
TEST(LaunchShrinkTest, AGivenLostRanksFileIsEmptiedAtTheStartAndKept) {
  LaunchOptions o;
  o.nproc = 2;
  o.max_restarts = 1;
  o.min_nproc = 1;
  o.lost_ranks_file = TempPath("given_lost_ranks");
  { std::ofstream(o.lost_ranks_file) << "0\n1\n"; }
  Captured c = RunLaunch(o,
                         "echo \"start $FSDP_RESTART_COUNT of $WORLD_SIZE $FSDP_LOST_RANKS_FILE\"; "
                         "if [ $FSDP_RESTART_COUNT = 0 ] && [ $RANK = 0 ]; then exit 2; fi");
  EXPECT_EQ(c.exit_code, 0) << c.err;
  EXPECT_TRUE(Contains(c.out, absl::StrCat("[rank 1] start 1 of 2 ", o.lost_ranks_file, "\n")))
      << c.out;
  EXPECT_TRUE(Exists(o.lost_ranks_file));
}

TEST(LaunchShrinkTest, LaunchRefusesAMinNprocOutsideZeroToNproc) {
  LaunchOptions o;
  o.nproc = 2;
  o.min_nproc = 3;
  Captured c = RunLaunch(o, "echo ran");
  EXPECT_EQ(c.exit_code, 1);
  EXPECT_TRUE(Contains(c.err, "--min_nproc must be in [0, --nproc=2], got 3")) << c.err;
  EXPECT_FALSE(Contains(c.out, "ran")) << c.out;
}

// A shell snippet that writes a failure record to $FSDP_ERROR_FILE.
std::string WriteRecord(int code, const std::string& message, bool secondary,
                        const std::string& culprits) {
  return absl::StrCat("printf '{\"rank\":%s,\"time_unix_ns\":%s,\"code\":", code, ",\"message\":\"",
                      message, "\",\"secondary\":", secondary ? "true" : "false",
                      ",\"culprit_ranks\":[", culprits,
                      "]}' $RANK $(date +%s%N) > $FSDP_ERROR_FILE; ");
}

TEST(LaunchTest, RootCauseIsReportedFirstEvenWhenItsRankIsTheLastToExit) {
  LaunchOptions o;
  o.nproc = 3;
  o.grace_period = absl::Seconds(5);
  // Rank 1 records the root cause, then is slow to print and exit (an injected delay);
  // rank 0 fails at once with a secondary error naming rank 1 and is reaped first.
  Captured c = RunLaunch(
      o, absl::StrCat("if [ $RANK = 1 ]; then ",
                      WriteRecord(15, "rank-00001-of-00003.bin: checksum mismatch", false, ""),
                      "sleep 30; echo late; exit 1; fi; "
                      "if [ $RANK = 0 ]; then sleep 0.3; ",
                      WriteRecord(14, "secondary (caused by rank 1): peer closed", true, "1"),
                      "exit 2; fi; exec sleep 30"));
  EXPECT_EQ(c.exit_code, 2) << c.err;  // rank 1 was stopped by the launcher: rank 0's status
  const size_t root = c.err.find("root cause: rank 1 at ");
  const size_t secondary = c.err.find("secondary: rank 0 at ");
  ASSERT_NE(root, std::string::npos) << c.err;
  ASSERT_NE(secondary, std::string::npos) << c.err;
  EXPECT_LT(root, secondary) << c.err;
  EXPECT_TRUE(Contains(c.err, "DATA_LOSS: rank-00001-of-00003.bin: checksum mismatch")) << c.err;
  EXPECT_TRUE(Contains(c.err, "job failed: root cause rank 1")) << c.err;
  EXPECT_FALSE(Contains(c.out, "late")) << c.out;
  EXPECT_LT(c.took, absl::Seconds(10));
}

TEST(LaunchTest, AStoppedRankNamedByTheSurvivorsIsTheRootCause) {
  LaunchOptions o;
  o.nproc = 3;
  o.grace_period = absl::Milliseconds(500);
  Captured c = RunLaunch(
      o, absl::StrCat("if [ $RANK = 1 ]; then kill -STOP $$; exit 0; fi; "
                      "if [ $RANK = 2 ]; then exec sleep 30; fi; sleep 0.5; ",
                      WriteRecord(4, "all_gather #3 timed out: rank 1 did not arrive", true, "1"),
                      "exit 1"));
  EXPECT_EQ(c.exit_code, 1) << c.err;
  EXPECT_TRUE(Contains(c.err,
                       "root cause: rank 1, named by the other ranks' errors: it was "
                       "stopped by signal 19"))
      << c.err;
  EXPECT_TRUE(Contains(c.err, "secondary: rank 0 at ")) << c.err;
  EXPECT_TRUE(Contains(c.err, "job failed: root cause rank 1")) << c.err;
  EXPECT_LT(c.took, absl::Seconds(10));
}

TEST(LaunchTest, EveryRankGetsTheSameFreshJobSecretUnlessOneIsGiven) {
  LaunchOptions o;
  o.nproc = 2;
  ::unsetenv(kJobSecretEnv);
  Captured a = RunLaunch(o, "echo secret=$FSDP_JOB_SECRET");
  Captured b = RunLaunch(o, "echo secret=$FSDP_JOB_SECRET");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  auto secret_of = [](const std::string& out, int rank) {
    const std::string key = absl::StrCat("[rank ", rank, "] secret=");
    const size_t at = out.find(key);
    if (at == std::string::npos) return std::string();
    return out.substr(at + key.size(), out.find('\n', at) - at - key.size());
  };
  EXPECT_EQ(secret_of(a.out, 0).size(), 32u) << a.out;
  EXPECT_EQ(secret_of(a.out, 0), secret_of(a.out, 1)) << a.out;
  EXPECT_NE(secret_of(a.out, 0), secret_of(b.out, 0)) << "a fresh secret per job";
  ::setenv(kJobSecretEnv, "given-by-the-scheduler", 1);
  Captured g = RunLaunch(o, "echo secret=$FSDP_JOB_SECRET");
  ::unsetenv(kJobSecretEnv);
  EXPECT_EQ(secret_of(g.out, 1), "given-by-the-scheduler") << g.out;
}

TEST(ReportFailuresTest, OrdersRootCausesByTimeThenSecondaries) {
  FailureRecord late_root{2, 300, 13, "later", false, {}};
  FailureRecord early_root{1, 200, 15, "first", false, {}};
  FailureRecord secondary{0, 100, 14, "peer closed", true, {1}};
  int root = -2;
  std::vector<std::string> lines =
      ReportFailures({late_root, secondary, early_root}, {"", "", ""}, &root);
  EXPECT_EQ(root, 1);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_TRUE(absl::StartsWith(lines[0], "root cause: rank 1 at ")) << lines[0];
  EXPECT_TRUE(Contains(lines[0], "DATA_LOSS: first")) << lines[0];
  EXPECT_TRUE(absl::StartsWith(lines[1], "also failed: rank 2 at ")) << lines[1];
  EXPECT_TRUE(absl::StartsWith(lines[2], "secondary: rank 0 at ")) << lines[2];
  // No root cause recorded and no culprit named: nothing to blame.
  lines = ReportFailures({FailureRecord{0, 1, 14, "x", true, {}}}, {"", ""}, &root);
  EXPECT_EQ(root, -1);
  ASSERT_EQ(lines.size(), 1u);
}

TEST(MakeLaunchOptionsTest, KeepsValidValues) {
  auto o = MakeLaunchOptions(4, "10.0.0.1", 29500, 0.5, {"prog", "--flag", "x"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->nproc, 4);
  EXPECT_EQ(o->master_addr, "10.0.0.1");
  EXPECT_EQ(o->master_port, 29500);
  EXPECT_EQ(o->grace_period, absl::Milliseconds(500));
  EXPECT_EQ(o->command, (std::vector<std::string>{"prog", "--flag", "x"}));
}

TEST(MakeLaunchOptionsTest, BadValuesNameTheFlag) {
  auto no_cmd = MakeLaunchOptions(2, "127.0.0.1", 0, 5, {});
  EXPECT_EQ(no_cmd.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(std::string(no_cmd.status().message()), "no program"));
  auto zero = MakeLaunchOptions(0, "127.0.0.1", 0, 5, {"x"});
  EXPECT_TRUE(Contains(std::string(zero.status().message()), "--nproc")) << zero.status();
  auto port = MakeLaunchOptions(2, "127.0.0.1", 70000, 5, {"x"});
  EXPECT_TRUE(Contains(std::string(port.status().message()), "--master_port")) << port.status();
  auto addr = MakeLaunchOptions(2, "", 0, 5, {"x"});
  EXPECT_TRUE(Contains(std::string(addr.status().message()), "--master_addr")) << addr.status();
  auto grace = MakeLaunchOptions(2, "127.0.0.1", 0, -1, {"x"});
  EXPECT_TRUE(Contains(std::string(grace.status().message()), "--grace_period_s"))
      << grace.status();
  auto restarts = MakeLaunchOptions(2, "127.0.0.1", 0, 5, {"x"}, -1);
  EXPECT_TRUE(Contains(std::string(restarts.status().message()), "--max_restarts"))
      << restarts.status();
}

TEST(MakeLaunchOptionsTest, MinNprocIsKeptInZeroToNprocAndRefusedOutside) {
  for (int min_nproc : {0, 1, 4}) {
    auto o = MakeLaunchOptions(4, "127.0.0.1", 0, 5, {"x"}, 1, min_nproc);
    ASSERT_TRUE(o.ok()) << o.status();
    EXPECT_EQ(o->min_nproc, min_nproc);
  }
  for (int min_nproc : {-1, 5}) {
    auto o = MakeLaunchOptions(4, "127.0.0.1", 0, 5, {"x"}, 1, min_nproc);
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument) << min_nproc;
    EXPECT_TRUE(Contains(std::string(o.status().message()),
                         absl::StrCat("--min_nproc must be in [0, --nproc=4], got ", min_nproc)))
        << o.status();
  }
}

// The launch binary parses its flags with absl: both "--flag=value" and "--flag value",
// everything after "--" untouched, unknown flags and bad values refused.
TEST(LaunchBinaryTest, ParsesFlagsAndPassesTheCommandThrough) {
  ASSERT_FALSE(LaunchBinary().empty()) << "LAUNCH_BINARY is not set (comm/BUILD sets it)";
  Captured ok = RunLaunchBinary({"--nproc", "2", "--master_port=0", "--", "/bin/sh", "-c",
                                 "echo \"r$RANK of $WORLD_SIZE\"", "--nproc=7"});
  EXPECT_EQ(ok.exit_code, 0) << ok.out;
  EXPECT_TRUE(Contains(ok.out, "[rank 0] r0 of 2")) << ok.out;
  EXPECT_TRUE(Contains(ok.out, "[rank 1] r1 of 2")) << ok.out;

  Captured unknown = RunLaunchBinary({"--nnodes=2", "--", "/bin/true"});
  EXPECT_NE(unknown.exit_code, 0) << unknown.out;
  EXPECT_TRUE(Contains(unknown.out, "nnodes")) << unknown.out;

  Captured not_a_number = RunLaunchBinary({"--nproc=two", "--", "/bin/true"});
  EXPECT_NE(not_a_number.exit_code, 0) << not_a_number.out;
  EXPECT_TRUE(Contains(not_a_number.out, "nproc")) << not_a_number.out;

  Captured out_of_range = RunLaunchBinary({"--nproc=0", "--", "/bin/true"});
  EXPECT_EQ(out_of_range.exit_code, 2) << out_of_range.out;
  EXPECT_TRUE(Contains(out_of_range.out, "--nproc must be an integer in [1, 4096]"))
      << out_of_range.out;

  Captured no_program = RunLaunchBinary({"--nproc=2"});
  EXPECT_EQ(no_program.exit_code, 2) << no_program.out;
  EXPECT_TRUE(Contains(no_program.out, "no program given")) << no_program.out;

  Captured min_too_big = RunLaunchBinary({"--nproc=2", "--min_nproc=3", "--", "/bin/true"});
  EXPECT_EQ(min_too_big.exit_code, 2) << min_too_big.out;
  EXPECT_TRUE(Contains(min_too_big.out, "--min_nproc must be in [0, --nproc=2]"))
      << min_too_big.out;
}

// NOTE [Restarts]: --min_nproc reaches the launcher: a restart continues with one rank.
TEST(LaunchBinaryTest, MinNprocLetsARestartContinueWithFewerRanks) {
  ASSERT_FALSE(LaunchBinary().empty()) << "LAUNCH_BINARY is not set (comm/BUILD sets it)";
  Captured c = RunLaunchBinary(
      {"--nproc=2", "--max_restarts=1", "--min_nproc=1", "--", "/bin/sh", "-c",
       "if [ $FSDP_RESTART_COUNT = 0 ] && [ $RANK = 1 ]; then "
       "echo 1 >> $FSDP_LOST_RANKS_FILE; exit 1; fi; echo \"r$RANK of $WORLD_SIZE\""});
  EXPECT_EQ(c.exit_code, 0) << c.out;
  EXPECT_TRUE(Contains(c.out, "[rank 0] r0 of 1")) << c.out;
  EXPECT_TRUE(Contains(c.out, "restarting the job with 1 rank (restart 1 of 1; rank 1 lost"))
      << c.out;
}

// NOTE [Launch environment]: torchrun's and mpirun's ranks and srun's tasks are ranks; a
// Slurm batch script by itself (SLURM_PROCID without a job step) is not.
TEST(IsLaunchedRankTest, TorchrunOpenMpiAndSrunTasksAreRanksABatchScriptIsNot) {
  if (IsLaunchedRank()) GTEST_SKIP() << "this process is itself a launched rank";
  const auto with = [](const std::vector<std::pair<const char*, const char*>>& vars) {
    for (const auto& [name, value] : vars) ::setenv(name, value, 1);
    const bool launched = IsLaunchedRank();
    for (const auto& [name, value] : vars) ::unsetenv(name);
    return launched;
  };
  EXPECT_FALSE(with({}));
  EXPECT_TRUE(with({{"RANK", "0"}}));
  EXPECT_TRUE(with({{"OMPI_COMM_WORLD_RANK", "3"}}));
  EXPECT_FALSE(with({{"SLURM_PROCID", "0"}}));
  EXPECT_TRUE(with({{"SLURM_PROCID", "0"}, {"SLURM_STEP_ID", "0"}}));
}

// RunLocalRanks re-executes this test binary as 3 ranks; each rank (RANK set) runs only
// this test, sees IsLaunchedRank() and writes what it got.
TEST(RunLocalRanksTest, StartsNCopiesOfThisProgramAsRanks) {
  if (IsLaunchedRank()) {
    const char* dir = std::getenv("RUN_LOCAL_RANKS_TEST_DIR");
    ASSERT_NE(dir, nullptr);
    std::ofstream out(absl::StrCat(dir, "/rank-", std::getenv("RANK")));
    out << std::getenv("RANK") << " " << std::getenv("WORLD_SIZE") << " "
        << (std::getenv(kJobSecretEnv) != nullptr ? "secret" : "no-secret");
    return;
  }
  const std::string dir = TempPath("run_local_ranks");
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  ::setenv("RUN_LOCAL_RANKS_TEST_DIR", dir.c_str(), 1);
  LaunchOptions options;
  const std::string out_path = TempPath("run_local_ranks_out");
  const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  options.stdout_fd = out;
  options.stderr_fd = out;
  absl::StatusOr<int> rc = RunLocalRanks(
      3, {"--gtest_filter=RunLocalRanksTest.StartsNCopiesOfThisProgramAsRanks"}, options);
  ::close(out);
  ::unsetenv("RUN_LOCAL_RANKS_TEST_DIR");
  ASSERT_TRUE(rc.ok()) << rc.status();
  EXPECT_EQ(*rc, 0) << ReadFile(out_path);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(ReadFile(absl::StrCat(dir, "/rank-", r)), absl::StrCat(r, " 3 secret"));
  }
  // Every line the ranks wrote came back prefixed with their rank.
  EXPECT_TRUE(Contains(ReadFile(out_path), "[rank 2] ")) << ReadFile(out_path);

  EXPECT_EQ(RunLocalRanks(0, {}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace comm
