// launch: starts N local ranks of a program with the torchrun environment. See
// comm/launcher.h for the contract.
//
//   launch --nproc=4 [--master_addr=127.0.0.1] [--master_port=29500]
//          [--grace_period_s=5] [--max_restarts=0] [--min_nproc=0]
//          [--lost_ranks_file=PATH] -- program args...
//
// Flags are absl flags ("--flag=value" or "--flag value"); an unknown flag or a value
// that does not parse ends the launcher with absl's message and status 1, a value out of
// range with a message naming the flag and status 2.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "comm/launcher.h"

ABSL_FLAG(int, nproc, 1, "number of ranks to start, in [1, 4096]");
ABSL_FLAG(std::string, master_addr, "127.0.0.1", "address of the rank-0 store");
ABSL_FLAG(int, master_port, 0, "port of the rank-0 store; 0 picks a free one");
ABSL_FLAG(double, grace_period_s, 5, "seconds between SIGTERM and SIGKILL when stopping ranks");
ABSL_FLAG(int, max_restarts, 0,
          "start the whole job again after a failure, up to this many times (each rank sees "
          "FSDP_RESTART_COUNT)");
ABSL_FLAG(int, min_nproc, 0,
          "the fewest ranks a restart may continue with, in [0, --nproc]: a restart leaves out "
          "the ranks marked lost for good in $FSDP_LOST_RANKS_FILE and renumbers the rest "
          "(comm/launcher.h NOTE [Restarts]); 0 = --nproc: never fewer");
ABSL_FLAG(std::string, lost_ranks_file, "",
          "the lost-ranks file the ranks see in FSDP_LOST_RANKS_FILE, emptied at the start; "
          "empty: a temporary file removed at the end");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Starts N local ranks of a program: launch --nproc=N [flags] -- program args...");
  // Everything after "--" is left alone: it is the program and its arguments.
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  std::vector<std::string> command(rest.begin() + 1, rest.end());
  absl::StatusOr<comm::LaunchOptions> options = comm::MakeLaunchOptions(
      absl::GetFlag(FLAGS_nproc), absl::GetFlag(FLAGS_master_addr),
      absl::GetFlag(FLAGS_master_port), absl::GetFlag(FLAGS_grace_period_s), std::move(command),
      absl::GetFlag(FLAGS_max_restarts), absl::GetFlag(FLAGS_min_nproc));
  if (!options.ok()) {
    const std::string msg = std::string(options.status().message()) + "\n";
    std::fputs(msg.c_str(), stderr);
    return 2;
  }
  options->lost_ranks_file = absl::GetFlag(FLAGS_lost_ranks_file);
  return comm::Launch(*options);
}
