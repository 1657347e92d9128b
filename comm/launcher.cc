#include "comm/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
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
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "comm/failure.h"
#include "comm/internal/lost_ranks.h"
#include "comm/internal/rank_process.h"
#include "comm/internal/socket.h"
#include "core/errno_text.h"

extern char** environ;

namespace comm {
namespace {

using internal::CStrings;
using internal::DescribeExit;
using internal::Drain;
using internal::ExitCodeOf;
using internal::Failed;
using internal::LaunchedRank;
using internal::LostRanks;
using internal::LostRanksFile;
using internal::RankStream;
using internal::SignalAll;
using internal::WriteAll;

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

// What every rank of one start of the job shares beyond the options (NOTE [Restarts]).
struct StartInfo {
  int restart = 0;
  int initial_nproc = 0;
  std::string lost_ranks_file;
};

std::vector<std::string> ChildEnvironment(const LaunchOptions& o, int rank,
                                          const std::string& secret, const std::string& error_dir,
                                          const StartInfo& start) {
  static const char* kOurs[] = {"RANK=",
                                "WORLD_SIZE=",
                                "LOCAL_RANK=",
                                "LOCAL_WORLD_SIZE=",
                                "MASTER_ADDR=",
                                "MASTER_PORT=",
                                "FSDP_JOB_SECRET=",
                                "FSDP_ERROR_FILE=",
                                "FSDP_RESTART_COUNT=",
                                "FSDP_LOST_RANKS_FILE=",
                                "FSDP_INITIAL_WORLD_SIZE="};
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
  env.push_back(absl::StrCat(kRestartCountEnv, "=", start.restart));
  env.push_back(absl::StrCat(kInitialWorldSizeEnv, "=", start.initial_nproc));
  env.push_back(absl::StrCat(kLostRanksFileEnv, "=", start.lost_ranks_file));
  if (!secret.empty()) env.push_back(absl::StrCat(kJobSecretEnv, "=", secret));
  if (!error_dir.empty())
    env.push_back(absl::StrCat(kErrorFileEnv, "=", ErrorFileOf(error_dir, rank)));
  // Intra-op threads (OpenMP: oneDNN's GEMMs, the library's loops): the hardware threads
  // shared by the ranks, as torchrun does, unless the caller chose a count (kept above).
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    const int hardware = static_cast<int>(std::thread::hardware_concurrency());
    env.push_back(absl::StrCat("OMP_NUM_THREADS=", std::max(1, hardware / std::max(1, o.nproc))));
  }
  return env;
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
std::string DescribeSilentRank(const LaunchedRank& r) {
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
    return a->time_unix_ns != b->time_unix_ns ? a->time_unix_ns < b->time_unix_ns
                                              : a->rank < b->rank;
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
      const std::string how =
          best < static_cast<int>(silent_ranks.size()) ? silent_ranks[best] : "";
      lines.push_back(absl::StrCat("root cause: rank ", best, ", named by the other ranks' errors",
                                   how.empty() ? "" : absl::StrCat(": ", how)));
    }
  }
  for (const FailureRecord* r : secondaries) {
    lines.push_back(absl::StrCat("secondary: ", RecordLine(*r)));
  }
  return lines;
}

absl::StatusOr<LaunchOptions> MakeLaunchOptions(int nproc, std::string master_addr, int master_port,
                                                double grace_period_s,
                                                std::vector<std::string> command, int max_restarts,
                                                int min_nproc) {
  LaunchOptions o;
  if (nproc < 1 || nproc > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("launch: --nproc must be an integer in [1, 4096], got ", nproc));
  }
  o.nproc = nproc;
  if (master_port < 0 || master_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("launch: --master_port must be an integer in [0, 65535], got ", master_port));
  }
  o.master_port = master_port;
  if (master_addr.empty()) return absl::InvalidArgumentError("launch: --master_addr is empty");
  o.master_addr = std::move(master_addr);
  if (!(grace_period_s >= 0) || !std::isfinite(grace_period_s)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "launch: --grace_period_s must be a non-negative number, got ", grace_period_s));
  }
  o.grace_period = absl::Seconds(grace_period_s);
  if (max_restarts < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("launch: --max_restarts must be >= 0, got ", max_restarts));
  }
  o.max_restarts = max_restarts;
  if (min_nproc < 0 || min_nproc > nproc) {
    return absl::InvalidArgumentError(
        absl::StrCat("launch: --min_nproc must be in [0, --nproc=", nproc, "], got ", min_nproc,
                     " (0: never fewer ranks than --nproc)"));
  }
  o.min_nproc = min_nproc;
  if (command.empty()) {
    return absl::InvalidArgumentError(
        "launch: no program given; usage: launch --nproc=N -- program args...");
  }
  o.command = std::move(command);
  return o;
}

bool IsLaunchedRank() {
  const auto set = [](const char* name) { return std::getenv(name) != nullptr; };
  return set("RANK") || set("OMPI_COMM_WORLD_RANK") ||
         (set("SLURM_PROCID") && set("SLURM_STEP_ID"));
}

absl::StatusOr<int> RunLocalRanks(int nproc, const std::vector<std::string>& args,
                                  LaunchOptions options) {
  if (nproc < 1 || nproc > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("RunLocalRanks: the number of ranks must be in [1, 4096], got ", nproc));
  }
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) {
    return absl::NotFoundError(
        absl::StrCat("RunLocalRanks: cannot read /proc/self/exe (the running program): ",
                     core::ErrnoText(errno)));
  }
  self[n] = '\0';
  options.nproc = nproc;
  options.command.clear();
  options.command.push_back(self);
  options.command.insert(options.command.end(), args.begin(), args.end());
  return Launch(options);
}

namespace {

// One job of Launch: its options, its ranks, and what the event loop has seen so far.
class Job {
 public:
  Job(const LaunchOptions& options, StartInfo start) : o_(options), start_(std::move(start)) {}

  // The port, the job secret and the error-file directory; false (said why) if not.
  bool Prepare();
  // Installs the self-pipe signal handlers; false (said why) if the pipe fails.
  bool InstallSignalHandlers();
  // Starts every rank; after a failure, stops those already started.
  void StartRanks();
  // Forwards the ranks' output, signals and failures until every rank has exited and
  // its output is drained.
  void Supervise();
  // Closes the ranks' streams and restores the signal handlers.
  void Cleanup();
  // Reads the ranks' error files, says what happened and returns the exit status.
  int Finish();
  // True when the launcher itself was sent SIGINT or SIGTERM (no restart then).
  bool interrupted() const { return interrupt_ != 0; }

 private:
  void Say(absl::string_view text) const {
    WriteAll(o_.stderr_fd, absl::StrCat("launch: ", text, "\n"));
  }
  // Forks and executes rank `r`; false (said why) if it cannot be started.
  bool StartRank(int r, std::vector<char*>& argv, pid_t launcher_pid);
  // One round of the event loop; false once the loop is over.
  bool SuperviseOnce();
  // Forwards the signals the handler wrote to the self-pipe.
  void HandleSignals();
  // Reaps the ranks that have exited (only our own children, by pid).
  void ReapRanks();
  // SIGTERM at term_at_, SIGKILL at kill_at_.
  void Escalate();
  // The ranks' error files (root cause first, then the secondary errors); `silent`
  // gets what is known of each rank that wrote none. Removes the files.
  std::vector<FailureRecord> ReadErrorFiles(std::vector<std::string>* silent);

  LaunchOptions o_;
  StartInfo start_;  // NOTE [Restarts]
  std::string secret_;
  std::string error_dir_;
  std::vector<LaunchedRank> ranks_;
  struct sigaction old_int_ {
  }, old_term_{}, old_chld_{};
  int exit_code_ = 0;
  bool start_failed_ = false;
  int failed_rank_ = -1;
  int interrupt_ = 0;
  absl::Time kill_at_ = absl::InfiniteFuture();
  absl::Time drain_until_ = absl::InfiniteFuture();
  // After the first failure, the other ranks get a moment to end by themselves (ranks
  // that agreed on the error record it and exit; under load that can take a while)
  // before SIGTERM.
  absl::Time term_at_ = absl::InfiniteFuture();
};

bool Job::Prepare() {
  if (o_.nproc < 1 || o_.command.empty()) {
    Say("nothing to run (nproc < 1 or no command)");
    return false;
  }
  ranks_.resize(o_.nproc);
  if (o_.master_port == 0) {
    absl::StatusOr<int> port = internal::PickFreePort(o_.master_addr);
    if (!port.ok()) {
      Say(absl::StrCat("cannot pick a free port on ", o_.master_addr, ": ",
                       port.status().message()));
      return false;
    }
    o_.master_port = *port;
  }
  if (const char* given = std::getenv(kJobSecretEnv); given != nullptr && *given != '\0') {
    secret_ = given;
  } else {
    secret_ = NewJobSecret();
    if (secret_.empty()) {
      Say("cannot read /dev/urandom for the job secret");
      return false;
    }
  }
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern =
      absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/fsdp-launch-XXXXXX");
  if (::mkdtemp(pattern.data()) == nullptr) {
    Say(absl::StrCat("cannot create a directory for the ranks' error files (", pattern,
                     "): ", core::ErrnoText(errno)));
    return false;
  }
  error_dir_ = pattern;
  return true;
}

bool Job::InstallSignalHandlers() {
  if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    Say("pipe2 failed");
    return false;
  }
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  ::sigaction(SIGINT, &sa, &old_int_);
  ::sigaction(SIGTERM, &sa, &old_term_);
  ::sigaction(SIGCHLD, &sa, &old_chld_);
  return true;
}

bool Job::StartRank(int r, std::vector<char*>& argv, pid_t launcher_pid) {
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
    Say("pipe2 failed");
    return false;
  }
  std::vector<std::string> env_strings = ChildEnvironment(o_, r, secret_, error_dir_, start_);
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
    Say(absl::StrCat("fork failed: ", core::ErrnoText(errno)));
    return false;
  }
  ::setpgid(pid, pid);  // also from here, so signals sent right away reach its group
  LaunchedRank& rank = ranks_[r];
  rank.pid = pid;
  rank.running = true;
  rank.out = RankStream{out[0], o_.stdout_fd, ""};
  rank.err = RankStream{err[0], o_.stderr_fd, ""};
  ::fcntl(out[0], F_SETFL, O_NONBLOCK);
  ::fcntl(err[0], F_SETFL, O_NONBLOCK);
  return true;
}

void Job::StartRanks() {
  std::vector<std::string> argv_strings = o_.command;
  std::vector<char*> argv = CStrings(argv_strings);
  const pid_t launcher_pid = ::getpid();
  for (int r = 0; r < o_.nproc && !start_failed_; ++r) {
    start_failed_ = !StartRank(r, argv, launcher_pid);
  }
  if (start_failed_) {
    exit_code_ = 1;
    SignalAll(ranks_, SIGTERM);
    kill_at_ = absl::Now() + o_.grace_period;
  }
}

void Job::Supervise() {
  while (SuperviseOnce()) {
  }
}

bool Job::SuperviseOnce() {
  int running = 0;
  for (const LaunchedRank& r : ranks_) running += r.running ? 1 : 0;
  if (running == 0 && drain_until_ == absl::InfiniteFuture()) {
    // Give grandchildren that still hold a pipe a moment, then stop reading.
    drain_until_ = absl::Now() + absl::Seconds(1);
  }
  std::vector<pollfd> fds = {{g_signal_pipe[0], POLLIN, 0}};
  std::vector<std::pair<int, RankStream*>> streams;
  for (int r = 0; r < o_.nproc; ++r) {
    for (RankStream* s : {&ranks_[r].out, &ranks_[r].err}) {
      if (s->fd >= 0) {
        fds.push_back({s->fd, POLLIN, 0});
        streams.push_back({r, s});
      }
    }
  }
  if (running == 0 && (streams.empty() || absl::Now() >= drain_until_)) return false;
  absl::Time wake = std::min({kill_at_, drain_until_, term_at_});
  int timeout_ms = -1;
  if (wake != absl::InfiniteFuture()) {
    timeout_ms =
        static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(wake - absl::Now()) + 1));
  }
  const int ready = ::poll(fds.data(), fds.size(), timeout_ms);
  if (ready < 0 && errno != EINTR) {
    Say(absl::StrCat("poll failed: ", core::ErrnoText(errno)));
    SignalAll(ranks_, SIGKILL);
    exit_code_ = 1;
    return false;
  }
  for (size_t i = 0; i < streams.size(); ++i) {
    if (fds[i + 1].revents != 0) Drain(streams[i].first, *streams[i].second);
  }
  if (fds[0].revents != 0) HandleSignals();
  ReapRanks();
  Escalate();
  return true;
}

void Job::HandleSignals() {
  unsigned char sig;
  while (::read(g_signal_pipe[0], &sig, 1) == 1) {
    if (sig == SIGCHLD) continue;  // reaped below in any case
    if (interrupt_ == 0) {
      interrupt_ = sig;
      Say(absl::StrCat("received signal ", static_cast<int>(sig), " (", ::strsignal(sig),
                       "); forwarding it to every rank"));
      SignalAll(ranks_, sig);
      kill_at_ = std::min(kill_at_, absl::Now() + o_.grace_period);
    }
  }
}

void Job::ReapRanks() {
  for (int r = 0; r < o_.nproc; ++r) {
    if (!ranks_[r].running) continue;
    int status = 0;
    if (::waitpid(ranks_[r].pid, &status, WNOHANG | WUNTRACED) != ranks_[r].pid) continue;
    if (WIFSTOPPED(status)) {
      ranks_[r].stopped_by = WSTOPSIG(status);
      continue;
    }
    ranks_[r].running = false;
    ranks_[r].status = status;
    if (Failed(status) && failed_rank_ < 0 && interrupt_ == 0 && !start_failed_) {
      failed_rank_ = r;
      Say(absl::StrCat("rank ", r, " failed: ", DescribeExit(status),
                       "; stopping the other ranks"));
      term_at_ = absl::Now() + std::min(o_.grace_period, kFailureSettle);
    }
  }
}

void Job::Escalate() {
  if (absl::Now() >= term_at_) {
    SignalAll(ranks_, SIGTERM);
    kill_at_ = std::min(kill_at_, absl::Now() + o_.grace_period);
    term_at_ = absl::InfiniteFuture();
  }
  if (absl::Now() >= kill_at_) {
    bool any = false;
    for (const LaunchedRank& r : ranks_) any = any || r.running;
    if (any) {
      Say(absl::StrCat("ranks still running ", absl::FormatDuration(o_.grace_period),
                       " after SIGTERM; sending SIGKILL"));
      SignalAll(ranks_, SIGKILL);
    }
    kill_at_ = absl::InfiniteFuture();
  }
}

void Job::Cleanup() {
  for (LaunchedRank& r : ranks_) {
    for (RankStream* s : {&r.out, &r.err}) {
      if (s->fd >= 0) {
        ::close(s->fd);
        s->fd = -1;
      }
    }
  }
  ::sigaction(SIGINT, &old_int_, nullptr);
  ::sigaction(SIGTERM, &old_term_, nullptr);
  ::sigaction(SIGCHLD, &old_chld_, nullptr);
  ::close(g_signal_pipe[0]);
  ::close(g_signal_pipe[1]);
  g_signal_pipe[0] = g_signal_pipe[1] = -1;
}

std::vector<FailureRecord> Job::ReadErrorFiles(std::vector<std::string>* silent) {
  std::vector<FailureRecord> records;
  silent->assign(o_.nproc, "");
  for (int r = 0; r < o_.nproc; ++r) {
    absl::StatusOr<FailureRecord> record = ReadFailureRecord(ErrorFileOf(error_dir_, r));
    if (record.ok()) {
      record->rank = r;
      records.push_back(*std::move(record));
    } else if (ranks_[r].pid > 0) {
      (*silent)[r] = DescribeSilentRank(ranks_[r]);
    }
    ::unlink(ErrorFileOf(error_dir_, r).c_str());
  }
  ::rmdir(error_dir_.c_str());
  return records;
}

int Job::Finish() {
  std::vector<std::string> silent;
  const std::vector<FailureRecord> records = ReadErrorFiles(&silent);
  if (failed_rank_ >= 0 || interrupt_ != 0) {
    std::vector<std::string> others;
    for (int r = 0; r < o_.nproc; ++r) {
      if (r != failed_rank_ && ranks_[r].pid > 0) {
        others.push_back(absl::StrCat("rank ", r, " ", DescribeExit(ranks_[r].status)));
      }
    }
    if (!others.empty()) Say(absl::StrCat("then: ", absl::StrJoin(others, ", ")));
  }
  if (failed_rank_ >= 0) {
    int root = -1;
    for (const std::string& line : ReportFailures(records, silent, &root)) Say(line);
    if (root < 0 || root >= o_.nproc) root = failed_rank_;
    const LaunchedRank& first = ranks_[failed_rank_];
    const int code = Failed(ranks_[root].status) && !ranks_[root].stopped_by_launcher
                         ? ExitCodeOf(ranks_[root].status)
                         : ExitCodeOf(first.status);
    Say(absl::StrCat("job failed: root cause rank ", root, " (", DescribeExit(ranks_[root].status),
                     "); first rank to exit: rank ", failed_rank_, " (", DescribeExit(first.status),
                     "); exit status ", code));
    return code;
  }
  if (interrupt_ != 0) return 128 + interrupt_;
  return exit_code_;
}

// "rank 2" or "ranks 0, 2".
std::string RankList(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ", "));
}

// "1 rank", "3 ranks".
std::string RankCount(int n) { return absl::StrCat(n, n == 1 ? " rank" : " ranks"); }

}  // namespace

int Launch(const LaunchOptions& options) {
  const auto say = [&options](absl::string_view text) {
    WriteAll(options.stderr_fd, absl::StrCat("launch: ", text, "\n"));
  };
  if (options.min_nproc < 0 || options.min_nproc > options.nproc) {
    say(absl::StrCat("--min_nproc must be in [0, --nproc=", options.nproc, "], got ",
                     options.min_nproc));
    return 1;
  }
  // NOTE [Restarts]: removed at the end when the launcher created it.
  LostRanksFile lost_file;
  if (absl::Status s = lost_file.Open(options.lost_ranks_file); !s.ok()) {
    say(s.message());
    return 1;
  }
  const int min_nproc = options.min_nproc > 0 ? options.min_nproc : options.nproc;
  LaunchOptions current = options;
  for (int restart = 0;; ++restart) {
    Job job(current, StartInfo{restart, options.nproc, lost_file.path()});
    if (!job.Prepare() || !job.InstallSignalHandlers()) return 1;
    job.StartRanks();
    job.Supervise();
    job.Cleanup();
    const int code = job.Finish();
    if (code == 0 || job.interrupted() || restart >= options.max_restarts) return code;
    // NOTE [Restarts]: the root cause is reported above; the job starts again without the
    // slots marked lost for good, unless that leaves fewer than min_nproc.
    absl::StatusOr<LostRanks> lost = lost_file.Read(current.nproc);
    if (!lost.ok()) {
      say(absl::StrCat(lost.status().message(), "; counting no rank lost"));
      lost = LostRanks{};
    }
    if (!lost->ignored.empty()) {
      say(absl::StrCat("ignoring line(s) of ", lost_file.path(), " that name no rank in [0, ",
                       current.nproc, "): \"", absl::StrJoin(lost->ignored, "\", \""), "\""));
    }
    const int left = current.nproc - static_cast<int>(lost->ranks.size());
    const std::string lost_text =
        lost->ranks.empty() ? "" : absl::StrCat("; ", RankList(lost->ranks), " lost for good");
    if (left < min_nproc) {
      const std::string floor =
          options.min_nproc > 0
              ? absl::StrCat("--min_nproc=", options.min_nproc)
              : absl::StrCat("--nproc=", options.nproc, " (--min_nproc=0: never fewer)");
      say(absl::StrCat(RankList(lost->ranks), " lost for good; ", RankCount(left),
                       " left, fewer than ", floor, ": not restarting; exit status ", code));
      return code;
    }
    if (absl::Status s = lost_file.Truncate(); !s.ok()) {
      say(absl::StrCat(s.message(), "; not restarting (a later restart would count these ",
                       "losses again)"));
      return code;
    }
    say(absl::StrCat("restarting the job with ", RankCount(left), " (restart ", restart + 1, " of ",
                     options.max_restarts, lost_text, ") after exit status ", code));
    current.nproc = left;
  }
}

}  // namespace comm
