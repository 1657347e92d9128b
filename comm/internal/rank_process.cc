#include "comm/internal/rank_process.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace comm {
namespace internal {

void WriteAll(int fd, absl::string_view text) {
  while (!text.empty()) {
    const ssize_t n = ::write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    text.remove_prefix(static_cast<size_t>(n));
  }
}

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return absl::StrCat("killed by signal ", sig, " (", ::strsignal(sig), ")");
  }
  return absl::StrCat("ended with wait status ", status);
}

int ExitCodeOf(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

bool Failed(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }

void Emit(int rank, RankStream& s, bool flush_partial) {
  const std::string prefix = absl::StrCat("[rank ", rank, "] ");
  size_t start = 0;
  while (true) {
    const size_t nl = s.pending.find('\n', start);
    if (nl == std::string::npos) break;
    WriteAll(s.out_fd,
             absl::StrCat(prefix, absl::string_view(s.pending).substr(start, nl + 1 - start)));
    start = nl + 1;
  }
  s.pending.erase(0, start);
  if (flush_partial && !s.pending.empty()) {
    WriteAll(s.out_fd, absl::StrCat(prefix, s.pending, "\n"));
    s.pending.clear();
  }
}

void Drain(int rank, RankStream& s) {
  char buf[65536];
  while (s.fd >= 0) {
    const ssize_t n = ::read(s.fd, buf, sizeof(buf));
    if (n > 0) {
      s.pending.append(buf, static_cast<size_t>(n));
      Emit(rank, s, false);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    Emit(rank, s, true);
    ::close(s.fd);
    s.fd = -1;
  }
}

std::vector<char*> CStrings(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (std::string& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

void SignalAll(std::vector<LaunchedRank>& ranks, int sig) {
  for (LaunchedRank& r : ranks) {
    if (!r.running) continue;
    ::kill(-r.pid, sig);  // the rank's whole process group
    r.stopped_by_launcher = true;
  }
}

}  // namespace internal
}  // namespace comm
