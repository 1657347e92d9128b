// The local launcher: starts N ranks of a program on this machine with the environment
// torchrun sets, prefixes their output with the rank, forwards signals, and stops the
// job when one rank fails. The `launch` binary (launch_main.cc) is a thin wrapper:
//
//   bazel run //comm:launch -- --nproc=4 -- path/to/trainer --steps=100
//
// Each rank gets RANK, WORLD_SIZE (= nproc), LOCAL_RANK (= RANK), LOCAL_WORLD_SIZE,
// MASTER_ADDR (127.0.0.1 unless --master_addr) and MASTER_PORT (a free port unless
// --master_port), which is what comm::InitFromEnv reads. Every line a rank writes to
// stdout or stderr comes out on the launcher's stdout or stderr as "[rank r] line".
//
// Failure handling: the first rank to exit with a non-zero status or by a signal is
// reported ("launch: rank 1 failed: killed by signal 9 (Killed)"); the other ranks get
// SIGTERM, then SIGKILL after the grace period; the launcher exits with that rank's
// status (its exit code, or 128 + signal). SIGINT and SIGTERM sent to the launcher are
// forwarded to every rank, and the launcher then exits with 128 + that signal.
// Each rank runs in its own process group (signals reach its children too) and is
// killed if the launcher itself dies.
#ifndef COMM_LAUNCHER_H_
#define COMM_LAUNCHER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace comm {

struct LaunchOptions {
  // Number of ranks to start (--nproc).
  int nproc = 1;
  // Address and port of the rank-0 store (--master_addr, --master_port); port 0 picks
  // a free one.
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  // Time between SIGTERM and SIGKILL when stopping ranks (--grace_period_s).
  absl::Duration grace_period = absl::Seconds(5);
  // The program and its arguments (everything after "--").
  std::vector<std::string> command;
  // Where the prefixed output goes.
  int stdout_fd = 1;
  int stderr_fd = 2;
};

// Parses `launch [--nproc=N] [--master_addr=A] [--master_port=P] [--grace_period_s=S]
// -- program args...` (flags also as "--flag value"). InvalidArgument naming the flag
// for a bad value, an unknown flag, or a missing command.
absl::StatusOr<LaunchOptions> ParseLaunchArgs(const std::vector<std::string>& args);

// Runs the job and returns the launcher's exit status (see the top of this file).
// Returns 1 with a message on stderr_fd if the job cannot be started at all.
int Launch(const LaunchOptions& options);

}  // namespace comm

#endif  // COMM_LAUNCHER_H_
