// The local launcher: starts N ranks of a program on this machine with the environment
// torchrun sets, prefixes their output with the rank, forwards signals, and stops the
// job when one rank fails. The `launch` binary (launch_main.cc, absl flags) is a thin
// wrapper:
//
//   bazel run //comm:launch -- --nproc=4 -- path/to/trainer --steps=100
//
// A trainer can also start its own ranks: run without RANK in the environment, it
// re-executes itself N times through the launcher (RunLocalRanks) and each copy is one
// rank:
//
//   int main(int argc, char** argv) {
//     absl::ParseCommandLine(argc, argv);
//     if (!comm::IsLaunchedRank()) {
//       absl::StatusOr<int> rc = comm::RunLocalRanks(2, {argv + 1, argv + argc});
//       return rc.ok() ? *rc : 1;
//     }
//     ASSIGN_OR_RETURN(comm::Distributed dist, comm::InitFromEnv({}));  // one rank
//     ...
//   }
//
// Each rank gets RANK, WORLD_SIZE (= nproc), LOCAL_RANK (= RANK), LOCAL_WORLD_SIZE,
// MASTER_ADDR (127.0.0.1 unless --master_addr) and MASTER_PORT (a free port unless
// --master_port), which is what comm::InitFromEnv reads. Every line a rank writes to
// stdout or stderr comes out on the launcher's stdout or stderr as "[rank r] line".
//
// Each rank also gets FSDP_JOB_SECRET (the launcher's own, when set, else a fresh random
// one per job: the rendezvous store admits only clients that prove it) and
// FSDP_ERROR_FILE, where the rank records its failure before tearing anything down
// (comm/failure.h, RecordFailure), and FSDP_RESTART_COUNT, FSDP_INITIAL_WORLD_SIZE and
// FSDP_LOST_RANKS_FILE (NOTE [Restarts], below).
// When the launcher's own environment does not set OMP_NUM_THREADS, each rank gets
// OMP_NUM_THREADS = max(1, hardware threads / nproc), so N ranks of an OpenMP program
// do not oversubscribe the machine; a value the caller set is passed on unchanged.
//
// Failure handling: the first rank to exit with a non-zero status or by a signal is
// reported ("launch: rank 1 failed: killed by signal 9 (Killed)"); the other ranks may end
// by themselves for up to 2 s (or the grace period, if shorter: ranks that agreed on the
// error record it and exit), then get SIGTERM, then SIGKILL after the grace period. Once all have
// ended, the launcher reads the error files and reports the root cause first, then the secondary
// errors (those caused by another rank's failure):
//   launch: root cause: rank 1 at 10:01:02.345678: DATA_LOSS: ... rank-00001-of-00002.bin ...
//   launch: secondary: rank 0 at 10:01:02.346001: DATA_LOSS: secondary (caused by rank 1): ...
//   launch: job failed: root cause rank 1 (exited with code 1); first rank to exit: ...
// The root cause is the earliest error that is not secondary; when no rank recorded one
// (a rank hung or was killed), it is the rank the secondary errors name, with how it
// ended ("stopped by signal 19 ... and hung"). The launcher exits with the root-cause
// rank's status when that rank failed by itself, else with the first failed rank's
// (its exit code, or 128 + signal). SIGINT and SIGTERM sent to the launcher are
// forwarded to every rank, and the launcher then exits with 128 + that signal.
// Each rank runs in its own process group (signals reach its children too) and is
// killed if the launcher itself dies.
#ifndef COMM_LAUNCHER_H_
#define COMM_LAUNCHER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/failure.h"
#include "comm/store.h"

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
  // NOTE [Restarts]: when the job fails (a rank fails; not when the launcher itself is
  // interrupted), every rank is stopped and the root cause reported as always, and then the
  // whole job is started again, up to this many times (--max_restarts, torchelastic's
  // --max-restarts), on a fresh port with a fresh secret. Each rank sees
  // FSDP_RESTART_COUNT (kRestartCountEnv): 0 at the first start, k at the k-th restart. A
  // program that checkpoints resumes by itself (the main job's --resume_from=latest).
  //
  // A restart may continue with fewer ranks (torchelastic's --nnodes=MIN:MAX, on one
  // machine). Every rank sees FSDP_LOST_RANKS_FILE (kLostRanksFileEnv), the path of the
  // lost-ranks file. A line holding a rank number, appended to it (by a rank about
  // itself, by an operator, by a test hook), marks that rank's slot lost for good. When a
  // restart is due, the launcher reads the file: the lost ranks are the distinct numbers
  // in [0, nproc) of the failed start (other lines are ignored, with a line naming them).
  // The next start has nproc - lost ranks, numbered 0..n-1: RANK, WORLD_SIZE,
  // LOCAL_WORLD_SIZE and the default OMP_NUM_THREADS follow the new count. Then the
  // launcher empties the file, so a later restart counts only new losses (numbered in the
  // new start's ranks). A restart with no rank lost keeps the count. When fewer than
  // min_nproc ranks would be left, the launcher does not restart:
  //   launch: rank 2 lost for good; 3 ranks left, fewer than --min_nproc=4: not
  //   restarting; exit status 1
  // and exits with the failed start's status. Otherwise it says:
  //   launch: restarting the job with 3 ranks (restart 1 of 2; rank 2 lost for good)
  //   after exit status 1
  // Every rank also sees FSDP_INITIAL_WORLD_SIZE (kInitialWorldSizeEnv), the first
  // start's nproc, so a program can say "continuing at 2 of 4 ranks". The file is read
  // only when a restart is due: without max_restarts, min_nproc has no effect.
  int max_restarts = 0;
  // The fewest ranks a restart may continue with (--min_nproc), in [0, nproc]; 0 means
  // nproc: never shrink (NOTE [Restarts]).
  int min_nproc = 0;
  // The lost-ranks file (NOTE [Restarts]). "" (the default): the launcher creates one in
  // a fresh temporary directory under $TMPDIR (else /tmp) and removes both at the end. A
  // path given here is created or emptied when Launch starts and left in place.
  std::string lost_ranks_file;
};

// The environment variable holding the restart count (NOTE [Restarts]).
inline constexpr char kRestartCountEnv[] = "FSDP_RESTART_COUNT";
// The environment variable holding the lost-ranks file's path (NOTE [Restarts]).
inline constexpr char kLostRanksFileEnv[] = "FSDP_LOST_RANKS_FILE";
// The environment variable holding the first start's number of ranks (NOTE [Restarts]).
inline constexpr char kInitialWorldSizeEnv[] = "FSDP_INITIAL_WORLD_SIZE";

// The options of `launch --nproc=N --master_addr=A --master_port=P --grace_period_s=S
// --max_restarts=R --min_nproc=M -- program args...` once its flags are parsed
// (launch_main.cc parses them with absl flags). InvalidArgument naming the flag for a
// value out of range (--nproc outside [1, 4096], --master_port outside [0, 65535], an
// empty --master_addr, a negative or non-finite --grace_period_s, a negative
// --max_restarts, --min_nproc outside [0, nproc]) or naming the missing program.
absl::StatusOr<LaunchOptions> MakeLaunchOptions(int nproc, std::string master_addr, int master_port,
                                                double grace_period_s,
                                                std::vector<std::string> command,
                                                int max_restarts = 0, int min_nproc = 0);

// Runs the job and returns the launcher's exit status (see the top of this file).
// Returns 1 with a message on stderr_fd if the job cannot be started at all (min_nproc
// outside [0, nproc] and a lost-ranks file that cannot be created included).
int Launch(const LaunchOptions& options);

// True when this process is one rank of a launched job (NOTE [Launch environment] in
// comm/init_from_env.h): RANK is set (by this launcher or torchrun-style ones),
// OMPI_COMM_WORLD_RANK (mpirun), or SLURM_PROCID with SLURM_STEP_ID (a task srun started;
// a batch script alone is not a rank).
bool IsLaunchedRank();

// Starts `nproc` ranks of the running program itself (/proc/self/exe) with arguments
// `args` (without the program name) through Launch, on this machine, and returns the
// launcher's exit status once every rank has ended (0 when all succeeded). Each rank
// sees the environment Launch gives (RANK, WORLD_SIZE, ...), so IsLaunchedRank() is
// true there. `options` supplies everything but nproc and command (output fds, master
// address and port, grace period, restarts, min_nproc, lost-ranks file). InvalidArgument for nproc
// outside [1, 4096]; NotFound when /proc/self/exe cannot be read. Call it before starting threads
// that must not be forked around (it forks and execs only, so this is just a precaution).
absl::StatusOr<int> RunLocalRanks(int nproc, const std::vector<std::string>& args,
                                  LaunchOptions options = {});

// The report lines of a failed job (without the "launch: " prefix): "root cause: ..."
// first (the earliest record that is not secondary, or else the rank the secondary
// records name most, described by silent_ranks[rank]: how a rank that recorded nothing
// ended), then "also failed: ..." for later root causes, then "secondary: ..." in time
// order. *root_rank is the root-cause rank, or -1 when nothing names one.
std::vector<std::string> ReportFailures(const std::vector<FailureRecord>& records,
                                        const std::vector<std::string>& silent_ranks,
                                        int* root_rank);

}  // namespace comm

#endif  // COMM_LAUNCHER_H_
