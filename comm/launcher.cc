#include "comm/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "comm/failure.h"
#include "comm/internal/socket.h"

extern char** environ;

namespace comm {
namespace {

// How long the other ranks may take to end by themselves after the first rank failed,
// before they get SIGTERM (NOTE in launcher.h, "Failure handling").
constexpr absl::Duration kFailureSettle = absl::Seconds(2);

// Written by the signal handler, read by the event loop (the self-pipe trick).
int g_signal_pipe[2] = {-1, -1};

void OnSignal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  (void)!::write(g_signal_pipe[1], &b, 1);
  errno = saved;
}

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

// One output stream of one rank, split into lines.
struct Stream {
  int fd = -1;       // read end; -1 once at EOF
  int out_fd = 1;    // where prefixed lines go
  std::string pending;
};

struct Rank {
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  // Stopped by a signal (SIGSTOP, SIGTSTP, ...) at some point while running: 0 if never.
  int stopped_by = 0;
  // SIGTERM/SIGKILL sent by the launcher while it was still running.
  bool stopped_by_launcher = false;
  Stream out, err;
};

void Emit(int rank, Stream& s, bool flush_partial) {
  const std::string prefix = absl::StrCat("[rank ", rank, "] ");
  size_t start = 0;
  while (true) {
    const size_t nl = s.pending.find('\n', start);
    if (nl == std::string::npos) break;
    WriteAll(s.out_fd, absl::StrCat(prefix, absl::string_view(s.pending).substr(start, nl + 1 - start)));
    start = nl + 1;
  }
  s.pending.erase(0, start);
  if (flush_partial && !s.pending.empty()) {
    WriteAll(s.out_fd, absl::StrCat(prefix, s.pending, "\n"));
    s.pending.clear();
  }
}

// Reads what is available; closes the stream at EOF.
void Drain(int rank, Stream& s) {
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

// A fresh random job secret (32 hex digits), or "" when /dev/urandom cannot be read.
std::string NewJobSecret() {
  unsigned char bytes[16];
  FILE* f = std::fopen("/dev/urandom", "rb");
  if (f == nullptr) return "";
  const size_t n = std::fread(bytes, 1, sizeof(bytes), f);
  std::fclose(f);
  if (n != sizeof(bytes)) return "";
  std::string hex;
  for (unsigned char b : bytes) absl::StrAppendFormat(&hex, "%02x", b);
  return hex;
}

std::string ErrorFileOf(const std::string& dir, int rank) {
  return absl::StrCat(dir, "/rank-", rank, ".json");
}

std::vector<std::string> ChildEnvironment(const LaunchOptions& o, int rank,
                                          const std::string& secret,
                                          const std::string& error_dir) {
  static const char* kOurs[] = {"RANK=",        "WORLD_SIZE=",  "LOCAL_RANK=",
                                "LOCAL_WORLD_SIZE=", "MASTER_ADDR=", "MASTER_PORT=",
                                "FSDP_JOB_SECRET=", "FSDP_ERROR_FILE="};
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    bool ours = false;
    for (const char* k : kOurs) ours = ours || absl::StartsWith(*e, k);
    if (!ours) env.emplace_back(*e);
  }
  env.push_back(absl::StrCat("RANK=", rank));
  env.push_back(absl::StrCat("WORLD_SIZE=", o.nproc));
  env.push_back(absl::StrCat("LOCAL_RANK=", rank));
  env.push_back(absl::StrCat("LOCAL_WORLD_SIZE=", o.nproc));
  env.push_back(absl::StrCat("MASTER_ADDR=", o.master_addr));
  env.push_back(absl::StrCat("MASTER_PORT=", o.master_port));
  if (!secret.empty()) env.push_back(absl::StrCat(kJobSecretEnv, "=", secret));
  if (!error_dir.empty()) env.push_back(absl::StrCat(kErrorFileEnv, "=", ErrorFileOf(error_dir, rank)));
  // Intra-op threads (OpenMP: oneDNN's GEMMs, the library's loops): the hardware threads
  // shared by the ranks, as torchrun does, unless the caller chose a count (kept above).
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    const int hardware = static_cast<int>(std::thread::hardware_concurrency());
    env.push_back(absl::StrCat("OMP_NUM_THREADS=", std::max(1, hardware / std::max(1, o.nproc))));
  }
  return env;
}

std::vector<char*> CStrings(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (std::string& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

void SignalAll(std::vector<Rank>& ranks, int sig) {
  for (Rank& r : ranks) {
    if (!r.running) continue;
    ::kill(-r.pid, sig);  // the rank's whole process group
    r.stopped_by_launcher = true;
  }
}

std::string FormatTime(int64_t unix_ns) {
  return absl::FormatTime("%H:%M:%E6S", absl::FromUnixNanos(unix_ns), absl::LocalTimeZone());
}

std::string RecordLine(const FailureRecord& r) {
  return absl::StrCat("rank ", r.rank, " at ", FormatTime(r.time_unix_ns), ": ",
                      absl::StatusCodeToString(static_cast<absl::StatusCode>(r.code)), ": ",
                      r.message);
}

// How a rank that recorded no error ended, for a root-cause line.
std::string DescribeSilentRank(const Rank& r) {
  if (r.stopped_by != 0) {
    return absl::StrCat("it was stopped by signal ", r.stopped_by, " (", ::strsignal(r.stopped_by),
                        ") and hung (ended: ", DescribeExit(r.status),
                        r.stopped_by_launcher ? ", sent by the launcher)" : ")");
  }
  if (r.stopped_by_launcher && WIFSIGNALED(r.status)) {
    return absl::StrCat("it hung: the other ranks waited for it in vain (ended: ",
                        DescribeExit(r.status), ", sent by the launcher)");
  }
  return absl::StrCat("it recorded no error (ended: ", DescribeExit(r.status), ")");
}

}  // namespace

std::vector<std::string> ReportFailures(const std::vector<FailureRecord>& records,
                                        const std::vector<std::string>& silent_ranks,
                                        int* root_rank) {
  std::vector<const FailureRecord*> roots, secondaries;
  for (const FailureRecord& r : records) (r.secondary ? secondaries : roots).push_back(&r);
  auto by_time = [](const FailureRecord* a, const FailureRecord* b) {
    return a->time_unix_ns != b->time_unix_ns ? a->time_unix_ns < b->time_unix_ns : a->rank < b->rank;
  };
  std::sort(roots.begin(), roots.end(), by_time);
  std::sort(secondaries.begin(), secondaries.end(), by_time);
  std::vector<std::string> lines;
  *root_rank = -1;
  if (!roots.empty()) {
    *root_rank = roots[0]->rank;
    lines.push_back(absl::StrCat("root cause: ", RecordLine(*roots[0])));
    for (size_t i = 1; i < roots.size(); ++i) {
      lines.push_back(absl::StrCat("also failed: ", RecordLine(*roots[i])));
    }
  } else {
    // Nobody recorded a root cause: blame the rank the secondary errors name most.
    std::map<int, int> votes;
    for (const FailureRecord* r : secondaries) {
      for (int c : r->culprit_ranks) ++votes[c];
    }
    int best = -1, best_votes = 0;
    for (const auto& [rank, n] : votes) {
      if (n > best_votes) best = rank, best_votes = n;
    }
    if (best >= 0) {
      *root_rank = best;
      const std::string how = best < static_cast<int>(silent_ranks.size()) ? silent_ranks[best] : "";
      lines.push_back(absl::StrCat("root cause: rank ", best, ", named by the other ranks' errors",
                                   how.empty() ? "" : absl::StrCat(": ", how)));
    }
  }
  for (const FailureRecord* r : secondaries) {
    lines.push_back(absl::StrCat("secondary: ", RecordLine(*r)));
  }
  return lines;
}

absl::StatusOr<LaunchOptions> MakeLaunchOptions(int nproc, std::string master_addr,
                                                int master_port, double grace_period_s,
                                                std::vector<std::string> command) {
  LaunchOptions o;
  if (nproc < 1 || nproc > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("launch: --nproc must be an integer in [1, 4096], got ", nproc));
  }
  o.nproc = nproc;
  if (master_port < 0 || master_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "launch: --master_port must be an integer in [0, 65535], got ", master_port));
  }
  o.master_port = master_port;
  if (master_addr.empty()) return absl::InvalidArgumentError("launch: --master_addr is empty");
  o.master_addr = std::move(master_addr);
  if (!(grace_period_s >= 0) || !std::isfinite(grace_period_s)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "launch: --grace_period_s must be a non-negative number, got ", grace_period_s));
  }
  o.grace_period = absl::Seconds(grace_period_s);
  if (command.empty()) {
    return absl::InvalidArgumentError(
        "launch: no program given; usage: launch --nproc=N -- program args...");
  }
  o.command = std::move(command);
  return o;
}

bool IsLaunchedRank() { return std::getenv("RANK") != nullptr; }

absl::StatusOr<int> RunLocalRanks(int nproc, const std::vector<std::string>& args,
                                  LaunchOptions options) {
  if (nproc < 1 || nproc > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RunLocalRanks: the number of ranks must be in [1, 4096], got ", nproc));
  }
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) {
    return absl::NotFoundError(absl::StrCat(
        "RunLocalRanks: cannot read /proc/self/exe (the running program): ",
        std::strerror(errno)));
  }
  self[n] = '\0';
  options.nproc = nproc;
  options.command.clear();
  options.command.push_back(self);
  options.command.insert(options.command.end(), args.begin(), args.end());
  return Launch(options);
}

int Launch(const LaunchOptions& in) {
  LaunchOptions o = in;
  auto say = [&](absl::string_view text) { WriteAll(o.stderr_fd, absl::StrCat("launch: ", text, "\n")); };
  if (o.nproc < 1 || o.command.empty()) {
    say("nothing to run (nproc < 1 or no command)");
    return 1;
  }
  if (o.master_port == 0) {
    absl::StatusOr<int> port = internal::PickFreePort(o.master_addr);
    if (!port.ok()) {
      say(absl::StrCat("cannot pick a free port on ", o.master_addr, ": ", port.status().message()));
      return 1;
    }
    o.master_port = *port;
  }
  std::string secret;
  if (const char* given = std::getenv(kJobSecretEnv); given != nullptr && *given != '\0') {
    secret = given;
  } else {
    secret = NewJobSecret();
    if (secret.empty()) {
      say("cannot read /dev/urandom for the job secret");
      return 1;
    }
  }
  std::string error_dir;
  {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/fsdp-launch-XXXXXX");
    if (::mkdtemp(pattern.data()) == nullptr) {
      say(absl::StrCat("cannot create a directory for the ranks' error files (", pattern,
                       "): ", std::strerror(errno)));
      return 1;
    }
    error_dir = pattern;
  }
  if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    say("pipe2 failed");
    return 1;
  }
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  struct sigaction old_int {}, old_term {}, old_chld {};
  ::sigaction(SIGINT, &sa, &old_int);
  ::sigaction(SIGTERM, &sa, &old_term);
  ::sigaction(SIGCHLD, &sa, &old_chld);

  std::vector<std::string> argv_strings = o.command;
  std::vector<char*> argv = CStrings(argv_strings);
  const pid_t launcher_pid = ::getpid();
  std::vector<Rank> ranks(o.nproc);
  int exit_code = 0;
  bool start_failed = false;
  for (int r = 0; r < o.nproc && !start_failed; ++r) {
    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
      say("pipe2 failed");
      start_failed = true;
      break;
    }
    std::vector<std::string> env_strings = ChildEnvironment(o, r, secret, error_dir);
    std::vector<char*> envp = CStrings(env_strings);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != launcher_pid) ::_exit(1);  // the launcher died already
      ::signal(SIGINT, SIG_DFL);
      ::signal(SIGTERM, SIG_DFL);
      ::signal(SIGCHLD, SIG_DFL);
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      ::execvpe(argv[0], argv.data(), envp.data());
      const std::string msg =
          absl::StrCat("launch: cannot execute ", argv[0], ": ", std::strerror(errno), "\n");
      (void)!::write(2, msg.data(), msg.size());
      ::_exit(127);
    }
    ::close(out[1]);
    ::close(err[1]);
    if (pid < 0) {
      ::close(out[0]);
      ::close(err[0]);
      say(absl::StrCat("fork failed: ", std::strerror(errno)));
      start_failed = true;
      break;
    }
    ::setpgid(pid, pid);  // also from here, so signals sent right away reach its group
    Rank& rank = ranks[r];
    rank.pid = pid;
    rank.running = true;
    rank.out = Stream{out[0], o.stdout_fd, ""};
    rank.err = Stream{err[0], o.stderr_fd, ""};
    ::fcntl(out[0], F_SETFL, O_NONBLOCK);
    ::fcntl(err[0], F_SETFL, O_NONBLOCK);
  }

  int failed_rank = -1;
  int interrupt = 0;
  absl::Time kill_at = absl::InfiniteFuture();
  if (start_failed) {
    exit_code = 1;
    SignalAll(ranks, SIGTERM);
    kill_at = absl::Now() + o.grace_period;
  }
  absl::Time drain_until = absl::InfiniteFuture();
  // After the first failure, the other ranks get a moment to end by themselves (ranks
  // that agreed on the error record it and exit; under load that can take a while)
  // before SIGTERM.
  absl::Time term_at = absl::InfiniteFuture();
  while (true) {
    int running = 0;
    for (const Rank& r : ranks) running += r.running ? 1 : 0;
    if (running == 0 && drain_until == absl::InfiniteFuture()) {
      // Give grandchildren that still hold a pipe a moment, then stop reading.
      drain_until = absl::Now() + absl::Seconds(1);
    }
    std::vector<pollfd> fds = {{g_signal_pipe[0], POLLIN, 0}};
    std::vector<std::pair<int, Stream*>> streams;
    for (int r = 0; r < o.nproc; ++r) {
      for (Stream* s : {&ranks[r].out, &ranks[r].err}) {
        if (s->fd >= 0) {
          fds.push_back({s->fd, POLLIN, 0});
          streams.push_back({r, s});
        }
      }
    }
    if (running == 0 && (streams.empty() || absl::Now() >= drain_until)) break;
    absl::Time wake = std::min({kill_at, drain_until, term_at});
    int timeout_ms = -1;
    if (wake != absl::InfiniteFuture()) {
      timeout_ms = static_cast<int>(
          std::max<int64_t>(0, absl::ToInt64Milliseconds(wake - absl::Now()) + 1));
    }
    const int ready = ::poll(fds.data(), fds.size(), timeout_ms);
    if (ready < 0 && errno != EINTR) {
      say(absl::StrCat("poll failed: ", std::strerror(errno)));
      SignalAll(ranks, SIGKILL);
      exit_code = 1;
      break;
    }
    for (size_t i = 0; i < streams.size(); ++i) {
      if (fds[i + 1].revents != 0) Drain(streams[i].first, *streams[i].second);
    }
    if (fds[0].revents != 0) {
      unsigned char sig;
      while (::read(g_signal_pipe[0], &sig, 1) == 1) {
        if (sig == SIGCHLD) continue;  // reaped below in any case
        if (interrupt == 0) {
          interrupt = sig;
          say(absl::StrCat("received signal ", static_cast<int>(sig), " (", ::strsignal(sig),
                           "); forwarding it to every rank"));
          SignalAll(ranks, sig);
          kill_at = std::min(kill_at, absl::Now() + o.grace_period);
        }
      }
    }
    // Reap the ranks that have exited (only our own children, by pid).
    for (int r = 0; r < o.nproc; ++r) {
      if (!ranks[r].running) continue;
      int status = 0;
      if (::waitpid(ranks[r].pid, &status, WNOHANG | WUNTRACED) != ranks[r].pid) continue;
      if (WIFSTOPPED(status)) {
        ranks[r].stopped_by = WSTOPSIG(status);
        continue;
      }
      ranks[r].running = false;
      ranks[r].status = status;
      if (Failed(status) && failed_rank < 0 && interrupt == 0 && !start_failed) {
        failed_rank = r;
        say(absl::StrCat("rank ", r, " failed: ", DescribeExit(status),
                         "; stopping the other ranks"));
        term_at = absl::Now() + std::min(o.grace_period, kFailureSettle);
      }
    }
    if (absl::Now() >= term_at) {
      SignalAll(ranks, SIGTERM);
      kill_at = std::min(kill_at, absl::Now() + o.grace_period);
      term_at = absl::InfiniteFuture();
    }
    if (absl::Now() >= kill_at) {
      bool any = false;
      for (const Rank& r : ranks) any = any || r.running;
      if (any) {
        say(absl::StrCat("ranks still running ", absl::FormatDuration(o.grace_period),
                         " after SIGTERM; sending SIGKILL"));
        SignalAll(ranks, SIGKILL);
      }
      kill_at = absl::InfiniteFuture();
    }
  }
  for (Rank& r : ranks) {
    for (Stream* s : {&r.out, &r.err}) {
      if (s->fd >= 0) {
        ::close(s->fd);
        s->fd = -1;
      }
    }
  }
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);
  ::sigaction(SIGCHLD, &old_chld, nullptr);
  ::close(g_signal_pipe[0]);
  ::close(g_signal_pipe[1]);
  g_signal_pipe[0] = g_signal_pipe[1] = -1;

  // The ranks' error files: the root cause first, then the secondary errors.
  std::vector<FailureRecord> records;
  std::vector<std::string> silent(o.nproc);
  for (int r = 0; r < o.nproc; ++r) {
    absl::StatusOr<FailureRecord> record = ReadFailureRecord(ErrorFileOf(error_dir, r));
    if (record.ok()) {
      record->rank = r;
      records.push_back(*std::move(record));
    } else if (ranks[r].pid > 0) {
      silent[r] = DescribeSilentRank(ranks[r]);
    }
    ::unlink(ErrorFileOf(error_dir, r).c_str());
  }
  ::rmdir(error_dir.c_str());

  if (failed_rank >= 0 || interrupt != 0) {
    std::vector<std::string> others;
    for (int r = 0; r < o.nproc; ++r) {
      if (r != failed_rank && ranks[r].pid > 0) {
        others.push_back(absl::StrCat("rank ", r, " ", DescribeExit(ranks[r].status)));
      }
    }
    if (!others.empty()) say(absl::StrCat("then: ", absl::StrJoin(others, ", ")));
  }
  if (failed_rank >= 0) {
    int root = -1;
    for (const std::string& line : ReportFailures(records, silent, &root)) say(line);
    if (root < 0 || root >= o.nproc) root = failed_rank;
    const int code = Failed(ranks[root].status) && !ranks[root].stopped_by_launcher
                         ? ExitCodeOf(ranks[root].status)
                         : ExitCodeOf(ranks[failed_rank].status);
    say(absl::StrCat("job failed: root cause rank ", root, " (", DescribeExit(ranks[root].status),
                     "); first rank to exit: rank ", failed_rank, " (",
                     DescribeExit(ranks[failed_rank].status), "); exit status ", code));
    return code;
  }
  if (interrupt != 0) return 128 + interrupt;
  return exit_code;
}

}  // namespace comm
