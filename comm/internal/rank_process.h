// The child processes comm::Launch (comm/launcher.h) runs as ranks: how they ended,
// and their stdout/stderr split into lines prefixed "[rank <r>] ".
//
//   LaunchedRank rank;                      // after fork: pid, pipes (non-blocking)
//   Drain(r, rank.out);                     // when poll says rank.out.fd is readable
//   SignalAll(ranks, SIGTERM);              // every running rank's process group
//   say(DescribeExit(rank.status));         // "exited with code 3"
#ifndef COMM_INTERNAL_RANK_PROCESS_H_
#define COMM_INTERNAL_RANK_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace comm {
namespace internal {

// Writes all of `text` to `fd`, retrying short writes; gives up silently on errors.
void WriteAll(int fd, absl::string_view text);

// "exited with code 3", "killed by signal 9 (Killed)", for a waitpid status.
std::string DescribeExit(int status);
// The exit code a shell would report for the status: the code, or 128 + the signal.
int ExitCodeOf(int status);
// Whether the status is anything but exit code 0.
bool Failed(int status);

// One output stream of one rank, split into lines.
struct RankStream {
  int fd = -1;     // read end; -1 once at EOF
  int out_fd = 1;  // where prefixed lines go
  std::string pending;
};

// A rank process and what the launcher has seen of it.
struct LaunchedRank {
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  // Stopped by a signal (SIGSTOP, SIGTSTP, ...) at some point while running: 0 if never.
  int stopped_by = 0;
  // SIGTERM/SIGKILL sent by the launcher while it was still running.
  bool stopped_by_launcher = false;
  RankStream out, err;
};

// Writes the complete lines of s.pending to s.out_fd, each prefixed "[rank <rank>] ",
// and, with `flush_partial`, the rest as a line of its own.
void Emit(int rank, RankStream& s, bool flush_partial);
// Reads what is available (s.fd is non-blocking) and emits its lines; closes the stream
// at EOF, flushing a partial last line.
void Drain(int rank, RankStream& s);

// Sends `sig` to the process group of every running rank and marks it stopped by the
// launcher.
void SignalAll(std::vector<LaunchedRank>& ranks, int sig);

// Pointers to the strings of `v` followed by a null, for execvpe; valid while `v` is.
std::vector<char*> CStrings(std::vector<std::string>& v);

}  // namespace internal
}  // namespace comm

#endif  // COMM_INTERNAL_RANK_PROCESS_H_
