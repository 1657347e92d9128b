#include "comm/launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

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

TEST(LaunchTest, FailingRankStopsTheOthersAndGivesItsExitCode) {
  LaunchOptions o;
  o.nproc = 3;
  o.grace_period = absl::Seconds(5);
  Captured c = RunLaunch(o, "if [ $RANK = 1 ]; then echo bye; exit 7; fi; exec sleep 30");
  EXPECT_EQ(c.exit_code, 7);
  EXPECT_TRUE(Contains(c.err, "rank 1 failed: exited with code 7")) << c.err;
  EXPECT_TRUE(Contains(c.err, "job failed: rank 1")) << c.err;
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
  const char* srcdir = std::getenv("TEST_SRCDIR");
  ASSERT_NE(srcdir, nullptr);
  const std::string launch = absl::StrCat(srcdir, "/fsdp/comm/launch");
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

TEST(ParseLaunchArgsTest, ReadsFlagsAndTheCommand) {
  auto o = ParseLaunchArgs({"--nproc=4", "--master_port", "29500", "--grace_period_s=0.5", "--",
                            "prog", "--flag", "x"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->nproc, 4);
  EXPECT_EQ(o->master_port, 29500);
  EXPECT_EQ(o->grace_period, absl::Milliseconds(500));
  EXPECT_EQ(o->command, (std::vector<std::string>{"prog", "--flag", "x"}));
}

TEST(ParseLaunchArgsTest, BadInputNamesTheFlag) {
  auto no_cmd = ParseLaunchArgs({"--nproc=2"});
  EXPECT_EQ(no_cmd.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(std::string(no_cmd.status().message()), "no program"));
  auto zero = ParseLaunchArgs({"--nproc=0", "--", "x"});
  EXPECT_TRUE(Contains(std::string(zero.status().message()), "--nproc")) << zero.status();
  auto port = ParseLaunchArgs({"--master_port=70000", "--", "x"});
  EXPECT_TRUE(Contains(std::string(port.status().message()), "--master_port")) << port.status();
  auto unknown = ParseLaunchArgs({"--nnodes=2", "--", "x"});
  EXPECT_TRUE(Contains(std::string(unknown.status().message()), "--nnodes")) << unknown.status();
}

}  // namespace
}  // namespace comm
