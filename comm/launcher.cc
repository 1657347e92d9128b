#include "comm/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "comm/internal/socket.h"

extern char** environ;

namespace comm {
namespace {

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

std::vector<std::string> ChildEnvironment(const LaunchOptions& o, int rank) {
  static const char* kOurs[] = {"RANK=",        "WORLD_SIZE=",  "LOCAL_RANK=",
                                "LOCAL_WORLD_SIZE=", "MASTER_ADDR=", "MASTER_PORT="};
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
    if (r.running) ::kill(-r.pid, sig);  // the rank's whole process group
  }
}

}  // namespace

absl::StatusOr<LaunchOptions> ParseLaunchArgs(const std::vector<std::string>& args) {
  LaunchOptions o;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      ++i;
      break;
    }
    std::string flag = a, value;
    const size_t eq = a.find('=');
    if (eq != std::string::npos) {
      flag = a.substr(0, eq);
      value = a.substr(eq + 1);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat("launch: ", a, " needs a value"));
    }
    int64_t number = 0;
    const bool numeric = absl::SimpleAtoi(value, &number);
    if (flag == "--nproc") {
      if (!numeric || number < 1 || number > 4096) {
        return absl::InvalidArgumentError(
            absl::StrCat("launch: --nproc must be an integer in [1, 4096], got \"", value, "\""));
      }
      o.nproc = static_cast<int>(number);
    } else if (flag == "--master_port") {
      if (!numeric || number < 0 || number > 65535) {
        return absl::InvalidArgumentError(absl::StrCat(
            "launch: --master_port must be an integer in [0, 65535], got \"", value, "\""));
      }
      o.master_port = static_cast<int>(number);
    } else if (flag == "--master_addr") {
      if (value.empty()) return absl::InvalidArgumentError("launch: --master_addr is empty");
      o.master_addr = value;
    } else if (flag == "--grace_period_s") {
      double seconds = 0;
      if (!absl::SimpleAtod(value, &seconds) || seconds < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "launch: --grace_period_s must be a non-negative number, got \"", value, "\""));
      }
      o.grace_period = absl::Seconds(seconds);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "launch: unknown flag ", flag,
          " (flags: --nproc, --master_addr, --master_port, --grace_period_s; then -- program)"));
    }
  }
  o.command.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  if (o.command.empty()) {
    return absl::InvalidArgumentError(
        "launch: no program given; usage: launch --nproc=N -- program args...");
  }
  return o;
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
    std::vector<std::string> env_strings = ChildEnvironment(o, r);
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
    absl::Time wake = std::min(kill_at, drain_until);
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
      if (::waitpid(ranks[r].pid, &status, WNOHANG) != ranks[r].pid) continue;
      ranks[r].running = false;
      ranks[r].status = status;
      if (Failed(status) && failed_rank < 0 && interrupt == 0 && !start_failed) {
        failed_rank = r;
        say(absl::StrCat("rank ", r, " failed: ", DescribeExit(status),
                         "; stopping the other ranks"));
        SignalAll(ranks, SIGTERM);
        kill_at = absl::Now() + o.grace_period;
      }
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
    const int code = ExitCodeOf(ranks[failed_rank].status);
    say(absl::StrCat("job failed: rank ", failed_rank, " ", DescribeExit(ranks[failed_rank].status),
                     "; exit status ", code));
    return code;
  }
  if (interrupt != 0) return 128 + interrupt;
  return exit_code;
}

}  // namespace comm
